"""Python client of the daemon's HTTP API. Imports urllib3 and the wire types (``indexer.schema``, pydantic): no
torch, no model, so a search from a script or the shell costs one HTTP round trip.

    >>> from indexer.client import Client
    >>> hits = Client(port=8743).search("deploy windows", k=3, since="30d")
    >>> hits[0]["path"], hits[0]["start_line"], hits[0]["score"]
    >>> answer = Client(port=8743).search_response("deploy windows")  # the whole answer, as MCP and --json give it
    >>> answer["hits"], answer["relevant"], answer["pending"]

Answers are plain dicts typed by ``indexer.schema`` (``Hit``, ``SearchResponse``, ``Page``, ``BootContext``) and
``indexer.status`` (``Status``, ``Health``). Every operation is one request model sent by one helper,
``Client.ask`` (``ROUTES``: the model's method and path); the keyword methods build the model from their arguments.
``RemoteMemory`` is the ``indexer.memory.Memory`` of a daemon over this client (the ``qmd-indexer mcp`` tools).
Raises ``DaemonUnavailable`` when nothing answers on the port, ``ClientError`` for an error answer (its message
is the daemon's ``detail``).

urllib3, not httpx: a search through this client, daemon at 100,000 chunks, 200 queries with cached embeddings
taking turns (AMD EPYC, 2 CPUs): p50 8.3-9.7 ms on httpx, 7.6-8.9 ms on urllib3; client CPU 2.0-2.3 -> 1.2-1.4 ms
a request. Importing it takes about half of httpx's time, which a CLI call pays each time.
"""

from __future__ import annotations

from typing import Any, TypeVar

import urllib3
from pydantic import ValidationError

from indexer.schema import (
    AppendRequest,
    AppendResponse,
    BootContext,
    BootRequest,
    GetRequest,
    Hit,
    Page,
    RecallRequest,
    Request,
    SearchRequest,
    SearchResponse,
    search_request,
)
from indexer.status import Health, Status

DEFAULT_PORT = 8743
#: each request model's route: (method, path); a ``GET``'s model goes as query parameters, a ``POST``'s as the body
ROUTES: dict[type[Request], tuple[str, str]] = {
    SearchRequest: ("POST", "/search"), RecallRequest: ("POST", "/recall"), GetRequest: ("GET", "/get"),
    BootRequest: ("POST", "/boot"), AppendRequest: ("POST", "/append")}
R = TypeVar("R", bound=Request)


class ClientError(Exception):
    """The daemon answered with an error; ``status_code`` is the HTTP status."""

    def __init__(self, message: str, status_code: int = 0) -> None:
        super().__init__(message)
        self.status_code = status_code


class DaemonUnavailable(ClientError):
    """Nothing answers at the daemon's address."""


class Client:
    """Talks to ``http://host:port``; ``timeout_s`` bounds each request (seconds); ``token`` is sent as
    ``Authorization: Bearer`` (needed when the daemon has one configured)."""

    def __init__(self, port: int = DEFAULT_PORT, host: str = "127.0.0.1", timeout_s: float = 30.0,
                 token: str | None = None) -> None:
        self.port = port
        self.base_url = f"http://{host if ':' not in host else f'[{host}]'}:{port}"
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # keep-alive connections (a dropped one is replaced before use), no retries: a refused connection is
        # reported at once; no proxy from the environment (the daemon is local)
        self._http = urllib3.HTTPConnectionPool(host, port, timeout=urllib3.Timeout(total=timeout_s),
                                                maxsize=4, retries=False, headers=headers)
        self.pending: list[str] = []  # the last search/recall/boot answer's ``pending`` (files not yet indexed)

    def _call(self, method: str, path: str, json: dict[str, Any] | None = None,
              params: dict[str, Any] | None = None) -> Any:
        """The JSON answer of ``method path`` with ``json`` as the body or ``params`` in the query string; raises
        ``DaemonUnavailable`` on a connection error or timeout, ``ClientError`` for a 4xx/5xx answer."""
        try:
            response = self._http.request(method, path, json=json, fields=params)
        except urllib3.exceptions.HTTPError as exc:
            raise DaemonUnavailable(
                f"no qmd-indexer daemon answers at {self.base_url} (port {self.port}: {exc.__class__.__name__}); "
                f"start one with `qmd-indexer run --workspace PATH --agent ID --port {self.port}`, or pass the running "
                f"daemon's --port (or its --config)"
            ) from None
        if response.status >= 400:
            text = response.data.decode("utf-8", "replace")
            try:
                detail = response.json().get("detail", text)
            except ValueError:
                detail = text
            if isinstance(detail, list):  # FastAPI's validation errors (422): one line per bad field
                detail = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', [])[1:])}: {e.get('msg')}" for e in detail)
            raise ClientError(str(detail), response.status)
        return response.json()

    def health(self) -> Health:
        """``{"status": "ok", "ready": bool}``."""
        return self._call("GET", "/health")

    def status(self) -> Status:
        """The daemon's counters (see ``StatusView.status``)."""
        return self._call("GET", "/status")

    def reindex(self) -> dict[str, bool]:
        """Ask the daemon to rebuild its collections beside the live ones and swap them in (``POST /reindex``);
        returns at once with ``{"rebuilding": true}``."""
        return self._call("POST", "/reindex")

    def ask(self, request: Request) -> Any:
        """The daemon's answer to ``request`` (any request model of ``indexer.schema``), sent to its route
        (``ROUTES``) by the API's names (``from``), without the fields left at ``None``; ``self.pending`` is set from
        an answer that carries ``pending``. Raises ``DaemonUnavailable`` and ``ClientError`` as ``_call``."""
        method, path = ROUTES[type(request)]
        values = request.model_dump(mode="json", exclude_none=True, by_alias=True)  # the API's names: from
        answer = self._call(method, path, **{"params" if method == "GET" else "json": values})
        if "pending" in answer:
            self.pending = list(answer["pending"])
        return answer

    def search(self, query: str | SearchRequest, /, **fields: Any) -> list[Hit]:
        """The hits of ``search_response`` alone (``self.pending`` then holds its ``pending``)."""
        return self.search_response(query, **fields)["hits"]

    def search_response(self, query: str | SearchRequest, /, **fields: Any) -> SearchResponse:
        """``POST /search``'s whole answer, as every face gives it: ``{"hits": [Hit, ...], "relevant": bool | None,
        "relevance": {"level", "reason"}, "pending": [path, ...]}`` and ``indexing: {"done", "total"}`` while the
        daemon's first index is being built. ``hits`` are the ``k`` best, best first (see ``indexer.search`` for
        their keys); ``relevant`` is false when nothing relevant was found (``indexer.relevance.judge``), null for a
        keyword-only search, and ``relevance`` grades it (high, medium, low, none) with its reason; ``pending``
        lists the workspace-relative paths changed on disk and not yet indexed (the answer may miss them).
        ``query`` is a ``SearchRequest``, or its query with any other of its fields as keywords, e.g.
        ``search_response("deploy", k=3, since="7d")`` (``since`` keeps files modified since a duration or an ISO
        date/date-time; ``wait_s``, at most 10, first waits until the first index is built and no file of the
        agent's collections is pending). An unknown keyword is a ``TypeError``; a value that does not fit the
        request is a ``ClientError`` (status 422) before anything is sent. ``self.pending`` is set too."""
        try:
            request = search_request(query, **fields)
        except ValidationError as exc:
            raise _invalid(exc) from None
        answer: SearchResponse = self.ask(request)
        return answer

    def recall(self, query: str = "*", k: int | None = None, agent: str | None = None, *, top_k: int | None = None,
               **fields: Any) -> list[Hit]:
        """The hits of ``recall_response`` alone (``top_k`` is the former name of ``k``, still accepted)."""
        return self.recall_response(query, k=k if top_k is None else top_k, agent=agent, **fields)["hits"]

    def recall_response(self, query: str = "*", **fields: Any) -> SearchResponse:
        """``POST /recall``'s whole answer: the ``k`` (default 6) best memories for ``query`` as
        ``{"hits", "relevant", "pending"}`` like ``search_response``; ``*``, ``all`` or ``""`` lists every memory
        file instead, in path order: a page of at most ``k`` files (default and at most ``LIST_CAP``, 1000) from
        ``offset`` (0-based), with ``total`` (files in all) and ``next_offset`` (the next page's ``offset``, null
        after the last) and ``relevant`` null. ``fields``: ``RecallRequest``'s (``k``, ``offset``, ``agent``)."""
        answer: SearchResponse = self.ask(_model(RecallRequest, query=query, **fields))
        return answer

    def boot_context(self, **fields: Any) -> BootContext:
        """Memory packed into ``budget_chars`` characters: ``{"text", "used_chars", "included", "omitted",
        "pending"...}``; ``fields``: ``BootRequest``'s (``budget_chars``, ``agent``, ``query``)."""
        answer: BootContext = self.ask(_model(BootRequest, **fields))
        return answer

    def get(self, path: str, from_line: int | None = None, **fields: Any) -> Page:
        """A page of memory file ``path`` from line ``from_line`` (the API's ``from``, default 1; see
        ``indexer.recall.read_memory``); ``next_from`` continues it. ``path`` may be a hit's ``citation``
        (``memory/x.md#L3-L5``): its lines, unless ``from_line`` or ``lines`` is given. ``fields``: ``GetRequest``'s
        (``lines``, ``max_chars``, ``agent``)."""
        answer: Page = self.ask(_model(GetRequest, path=path, from_line=from_line, **fields))
        return answer

    def append(self, text: str, **fields: Any) -> AppendResponse:
        """Append ``text`` to ``path`` (a markdown file under ``memory/``, workspace-relative; default: today's daily
        note) of ``agent``'s workspace (``POST /append``; the workspace needs ``append = true``). Returns ``{"agent",
        "path", "from", "to", "citation", "bytes"}``: the entry's lines. ``ClientError`` with ``status_code`` 403
        (append off, a path refused), 404 (unknown agent), 413 (entry or file over its cap), 400 or 422 (bad value;
        422 before anything is sent)."""
        answer: AppendResponse = self.ask(_model(AppendRequest, text=text, **fields))
        return answer

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RemoteMemory:
    """``indexer.memory.Memory`` over a ``Client``: each operation is ``client.ask(request)``."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def search(self, request: SearchRequest, /) -> SearchResponse:
        answer: SearchResponse = self.client.ask(request)
        return answer

    def recall(self, request: RecallRequest, /) -> SearchResponse:
        answer: SearchResponse = self.client.ask(request)
        return answer

    def get(self, request: GetRequest, /) -> Page:
        answer: Page = self.client.ask(request)
        return answer

    def boot(self, request: BootRequest, /) -> BootContext:
        answer: BootContext = self.client.ask(request)
        return answer

    def append(self, request: AppendRequest, /) -> AppendResponse:
        answer: AppendResponse = self.client.ask(request)
        return answer

    def status(self) -> Status:
        return self.client.status()


def _model(model: type[R], **fields: Any) -> R:
    """``model(**fields)`` without the fields given as ``None`` (left to the model's defaults); a value that does
    not fit, or a field it does not have, is a ``ClientError`` (422) before anything is sent."""
    try:
        return model(**{name: value for name, value in fields.items() if value is not None})
    except ValidationError as exc:
        raise _invalid(exc) from None


def _invalid(exc: ValidationError) -> ClientError:
    """A ``ClientError`` (422) of one line per bad field, as the daemon's 422 reads."""
    return ClientError("; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()), 422)
