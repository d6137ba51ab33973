"""HTTP to a model server the user runs, with one wall-clock deadline per request and a cap on the answer's size.

httpx's timeouts bound each connect, write and read, not the whole request: a server that trickles its answer a byte
at a time keeps a "5 s" request alive for minutes, and an answer of any size is read whole into memory. Here each
request runs as a coroutine of ``httpx.AsyncClient`` on the client's own event loop (one daemon thread), under
``asyncio.timeout``: it is cancelled at its deadline whatever the server's pace, and its connection dropped. The
answer is read in pieces and refused once it passes ``max_bytes`` (a larger ``Content-Length`` is refused before any
body is read). Any number of threads may call ``post`` at once; the requests share the client's connection pool.
The retries of such a request honour the server's ``Retry-After`` (``retry_after``, ``server_retrying``).
Used by the ``openai`` embedder (``indexer.builtin.openai_embed``) and the ``http`` reranker
(``indexer.builtin.http_rerank``).
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
from tenacity import RetryCallState, Retrying, retry_if_exception_type

__all__ = ["Answer", "AnswerTooLarge", "DeadlineClient", "DeadlineExceeded", "RemoteError", "Unreachable", "describe",
           "retry_after", "server_retrying"]


def describe(exc: BaseException) -> str:
    """``Name: message`` of a transport error, with the operating system's reason when one lies beneath it: httpx's
    async connect says only "All connection attempts failed", and the reason a user acts on ("Connection refused",
    "Name or service not known") is the ``OSError`` it wraps."""
    text = f"{type(exc).__name__}: {exc}"
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, OSError) and cause.errno is not None:
            reason = os.strerror(cause.errno)
            return text if reason in text else f"{text} ({reason})"
        cause = cause.__cause__ or cause.__context__
    return text


class RemoteError(Exception):
    """A request that got no whole answer; the message names the URL and why, ready for the caller's own error."""


class DeadlineExceeded(RemoteError, TimeoutError):
    """The whole request (connect, send, headers, body) did not finish within its deadline."""


class AnswerTooLarge(RemoteError, ValueError):
    """The answer's body passed the request's ``max_bytes``; it was not read further."""


class Unreachable(RemoteError):
    """The transport failed (cannot connect, connection dropped, ...): ``<url>: <describe(httpx error)>``."""


@dataclass(frozen=True)
class Answer:
    """A whole answer: HTTP ``status``, ``headers`` and the (decoded) ``body`` bytes."""

    status: int
    headers: httpx.Headers
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        """The body parsed as JSON; raises ``ValueError`` when it is not."""
        return json.loads(self.body)


class DeadlineClient:
    """``post`` with a deadline and a size cap (see the module). ``headers``: sent with every request;
    ``max_connections``: the pool's size. The loop thread starts at the first ``post``; ``close`` stops it."""

    def __init__(self, headers: dict[str, str] | None = None, max_connections: int = 10) -> None:
        self._headers = dict(headers or {})
        self._max_connections = max_connections
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._client: httpx.AsyncClient | None = None

    def _started(self) -> tuple[asyncio.AbstractEventLoop, httpx.AsyncClient]:
        with self._lock:
            if self._loop is None or self._client is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="remote-http", daemon=True)
                thread.start()

                async def make() -> httpx.AsyncClient:
                    return httpx.AsyncClient(headers=self._headers,
                                             limits=httpx.Limits(max_connections=self._max_connections))

                self._client = asyncio.run_coroutine_threadsafe(make(), loop).result()
                self._loop, self._thread = loop, thread
            return self._loop, self._client

    def post(self, url: str, body: Any, deadline_s: float, max_bytes: int,
             headers: dict[str, str] | None = None) -> Answer:
        """POST ``body`` as JSON to ``url``; the whole answer within ``deadline_s`` seconds and ``max_bytes`` bytes.
        Raises a ``RemoteError``: ``DeadlineExceeded``, ``AnswerTooLarge``, or ``Unreachable`` (cannot connect,
        connection dropped, ...). An HTTP error status is an ``Answer`` like any other."""
        loop, client = self._started()
        deadline_s = max(0.001, float(deadline_s))
        future = asyncio.run_coroutine_threadsafe(self._post(client, url, body, deadline_s, max_bytes, headers), loop)
        return future.result()

    @staticmethod
    async def _post(client: httpx.AsyncClient, url: str, body: Any, deadline_s: float, max_bytes: int,
                    headers: dict[str, str] | None) -> Answer:
        try:
            async with asyncio.timeout(deadline_s):
                async with client.stream("POST", url, json=body, headers=headers, timeout=deadline_s) as response:
                    length = response.headers.get("content-length", "")
                    if length.isdigit() and int(length) > max_bytes:
                        raise AnswerTooLarge(f"{url} answered {int(length)} bytes, more than the {max_bytes} allowed")
                    parts, size = [], 0
                    async for part in response.aiter_bytes():
                        size += len(part)
                        if size > max_bytes:
                            raise AnswerTooLarge(f"{url} answered more than the {max_bytes} bytes allowed")
                        parts.append(part)
                    return Answer(response.status_code, response.headers, b"".join(parts))
        except (TimeoutError, httpx.TimeoutException) as exc:
            raise DeadlineExceeded(f"{url}: no whole answer within {deadline_s:g} s") from exc
        except httpx.HTTPError as exc:
            raise Unreachable(f"{url}: {describe(exc)}") from exc

    def close(self) -> None:
        """Close the connections and stop the loop thread (a later ``post`` starts them again)."""
        with self._lock:
            loop, client, thread = self._loop, self._client, self._thread
            self._loop = self._client = self._thread = None
        if loop is None:
            return
        if client is not None:
            asyncio.run_coroutine_threadsafe(client.aclose(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(10)
        loop.close()


def retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date), ``None`` when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    with contextlib.suppress(ValueError):
        return max(0.0, float(value))
    with contextlib.suppress(TypeError, ValueError):
        when = email.utils.parsedate_to_datetime(value)
        return max(0.0, when.timestamp() - time.time())
    return None


def server_retrying(retry_on: type[BaseException], attempts: int, max_retry_after_s: float,
                    on_retry: Callable[[], None]) -> Retrying:
    """tenacity ``Retrying`` of a request while it raises ``retry_on``: ``attempts`` in all, waiting 0.5 s, 1 s,
    2 s, ... (at most 8 s) or the ``retry_after_s`` the error carries (the server's ``Retry-After``), calling
    ``on_retry()`` before each wait; an error asking for more than ``max_retry_after_s`` is not waited for but
    raised, as is the last one."""

    def asked(state: RetryCallState) -> float | None:
        exc = state.outcome.exception() if state.outcome else None
        value: float | None = getattr(exc, "retry_after_s", None)
        return value

    def stop(state: RetryCallState) -> bool:
        wait = asked(state)
        return state.attempt_number >= attempts or (wait is not None and wait > max_retry_after_s)

    def wait(state: RetryCallState) -> float:
        return max(min(8.0, 0.5 * 2 ** (state.attempt_number - 1)), asked(state) or 0.0)

    return Retrying(retry=retry_if_exception_type(retry_on), stop=stop, wait=wait, reraise=True,
                    before_sleep=lambda state: on_retry())
