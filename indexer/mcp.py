"""Memory tools for AI agents over the Model Context Protocol (the official ``mcp`` SDK, 2.x ``MCPServer``).

The same five tools are served two ways:

- ``qmd-indexer mcp``: stdio, for an agent that starts its MCP servers itself. It talks to the running daemon
  through ``indexer.client`` (the embedded store is single-process, so this process never opens it, and it
  imports no torch); when no daemon answers, every tool call is a tool error naming the port and how to start one.
- ``/mcp`` on the daemon's own port: streamable HTTP, answered in-process (``indexer.server.LocalMemory``) and
  behind whatever middleware wraps the API.

=================  =====================================================================  =====================
tool               arguments                                                              returns
=================  =====================================================================  =====================
memory_search      ``SearchRequest``'s fields but ``wait_s``                              ``SearchResponse``
memory_get         path, from, lines, max_chars, agent                                    ``Page``
memory_recall      query, k, offset, agent                                                ``SearchResponse``
memory_boot        budget_chars, agent, query                                             ``BootContext``
memory_status      (none)                                                                 ``Status``
memory_append      text, path, agent (only listed where a workspace has ``append = true``) ``AppendResponse``
=================  =====================================================================  =====================

``memory_append`` is the one tool that writes, and it is listed only when the server is built with ``append=True``:
the daemon's ``/mcp`` when a workspace of its config has ``append = true``; ``qmd-indexer mcp`` when the config it
reads (the same file, normally) says so. An agent that may not write never sees a write tool. Listed, it is still
the daemon that decides per workspace and per call (a workspace without ``append``, or turned off by a reload, is
refused with an error saying how to enable it).

Argument and answer types are ``indexer.schema``'s, so the tools take the API's names and aliases (``q``;
``top_k``/``limit``; ``from_line``; ``budget``) and publish the API's output schemas; ``memory_search`` takes its
arguments from ``SearchRequest`` itself (``request_signature``), so a field added there is a tool argument too.
Errors the model should read (unknown agent or collection, path refused, missing file, bad value, daemon or Qdrant
unavailable) are raised as the SDK's ``ToolError``: the call returns ``is_error`` with the message as text.
Arguments that do not fit the schema return the validation message the same way.

JSON may carry an unpaired UTF-16 surrogate (``"\\ud800"``), which the SDK's JSON parser refuses as a parse error of
the whole message (no id: the agent cannot tell which call failed; over stdio it waits for an answer that never
comes). Both transports read messages through ``parseable`` first, so such a message reaches the tools with each
unpaired surrogate read as ``?``, as the HTTP API reads the query (``indexer.schema``).
"""

from __future__ import annotations

import inspect
import io
import json
import re
import sys
import typing
from collections.abc import AsyncIterable, AsyncIterator, Callable, Collection
from typing import Any, Protocol, TypeVar, cast

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.stdio import stdio_server
from mcp.types import ToolAnnotations
from pydantic import BaseModel
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from indexer import __version__
from indexer.client import ClientError
from indexer.schema import (
    DEFAULT_BUDGET_CHARS,
    DEFAULT_MAX_CHARS,
    Agent,
    AppendPath,
    AppendResponse,
    AppendText,
    BootContext,
    BootQuery,
    BudgetChars,
    FromLine,
    Lines,
    MaxChars,
    MemoryPath,
    Offset,
    Page,
    RecallK,
    RecallQuery,
    SearchRequest,
    SearchResponse,
    Status,
    clean_text,
    error_answer,
)

T = TypeVar("T")

INSTRUCTIONS = """\
Long-term memory of this agent: MEMORY.md and the notes under memory/, indexed for search by meaning and by exact
words. Use memory_search before answering anything about earlier work, decisions, people, preferences or dates;
cite hits by their `citation`. Use memory_get to read more around a hit (from = its start_line). At the start of
a session, memory_boot gives a compact context; memory_status says whether the index is ready."""


class Memory(Protocol):
    """What the tools need: ``indexer.client.Client`` (the stdio server) or ``indexer.server.LocalMemory`` (the
    daemon's ``/mcp``). Errors are ``ClientError`` or the daemon's own (see ``indexer.schema.error_answer``)."""

    def search_response(self, request: SearchRequest, /) -> SearchResponse: ...

    def get(self, path: str, from_line: int = ..., lines: int | None = ..., max_chars: int | None = ...,
            agent: str | None = ...) -> Page: ...

    def recall_response(self, query: str = ..., k: int | None = ..., agent: str | None = ...,
                        offset: int = ...) -> SearchResponse: ...

    def boot_context(self, budget_chars: int = ..., agent: str | None = ...,
                     query: str | None = ...) -> BootContext: ...

    def status(self) -> Status: ...

    def append(self, text: str, path: str | None = ..., agent: str | None = ...) -> AppendResponse: ...


def _ask(call: Callable[[], T]) -> T:
    """``call()``, with the errors meant for the caller raised as ``ToolError`` (their message reaches the model)."""
    try:
        return call()
    except ClientError as exc:  # includes DaemonUnavailable
        raise ToolError(str(exc)) from None
    except Exception as exc:
        known = error_answer(exc)
        if known is None:
            raise
        raise ToolError(known[1]) from None


def request_signature(model: type[BaseModel], exclude: Collection[str] = ()) -> Callable[[Callable[..., T]],
                                                                                      Callable[..., T]]:
    """Decorator: give a tool function taking ``**arguments`` one keyword argument per field of ``model`` (but
    ``exclude``), annotated and defaulted as the model declares it. The SDK builds the tool's input schema and
    argument validation from the signature, so the tool takes exactly the model's fields, with their descriptions,
    bounds and aliases."""
    hints = typing.get_type_hints(model, include_extras=True)

    def decorate(fn: Callable[..., T]) -> Callable[..., T]:
        params = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=hints[name],
                                    default=inspect.Parameter.empty if field.is_required() else field.default)
                  for name, field in model.model_fields.items() if name not in exclude]
        returns = typing.get_type_hints(fn)["return"]
        tool: Any = fn  # a function object takes the attributes inspect reads
        tool.__signature__ = inspect.Signature(params, return_annotation=returns)
        tool.__annotations__ = {**{p.name: p.annotation for p in params}, "return": returns}
        return fn

    return decorate


def build_server(memory: Memory, append: bool = False) -> MCPServer:
    """An ``MCPServer`` named ``qmd-indexer`` with the five memory tools over ``memory``, and ``memory_append`` when
    ``append``. Serve it with ``.run("stdio")`` or mount ``.streamable_http_app()`` (see
    ``indexer.server.create_app``)."""
    server = MCPServer("qmd-indexer", title="Agent memory (qmd-indexer)", instructions=INSTRUCTIONS,
                       version=__version__)
    read_only = ToolAnnotations(read_only_hint=True, open_world_hint=False)

    def tool(fn: Callable[..., T]) -> Callable[..., T]:
        server.add_tool(fn, description=inspect.cleandoc(fn.__doc__ or ""), annotations=read_only)
        return fn

    @tool
    @request_signature(SearchRequest, exclude={"wait_s"})
    def memory_search(**arguments: Any) -> SearchResponse:
        """Search the agent's long-term memory (MEMORY.md and notes under memory/) by meaning and exact words.

        Use it before answering anything about earlier conversations, decisions, people, preferences, projects
        or dates. Returns {"hits": [...], "relevant": ..., "pending": [...]}: hits best first, each with path,
        start_line, end_line, score, a snippet of at most 700 characters, and a citation (path#Lstart-Lend) to
        quote; `relevant` false means nothing relevant was found (no hit reaches the relevance floor: do not treat
        the hits as an answer); `pending` lists files changed on disk and not indexed yet (the answer may miss
        them). Read more around a hit with memory_get(path, from=start_line). Errors name an unknown agent or
        collection, a missing agent where several exist, or a bad `since`.
        """
        return _ask(lambda: memory.search_response(SearchRequest(**arguments)))

    @tool
    def memory_get(path: MemoryPath, from_line: FromLine = 1, lines: Lines = None,
                   max_chars: MaxChars = DEFAULT_MAX_CHARS, agent: Agent = None) -> Page:
        """Read one memory file, or part of it, by line: the full text around a search hit, or a whole note.

        Returns whole lines `from`..`to` as `text`; when `truncated` is true, call again with from=`next_from`
        to continue. Only memory files of the workspace are readable: paths outside it, symlinks and non-memory
        files are refused with an error saying so.
        """
        return _ask(lambda: memory.get(path, from_line, lines, max_chars, agent))

    @tool
    def memory_recall(query: RecallQuery = "*", k: RecallK = None, offset: Offset = 0,
                      agent: Agent = None) -> SearchResponse:
        """Recall memories for a topic, or list every memory file with query "*".

        Returns {"hits": [...], "relevant": ..., "pending": [...]} like memory_search (k hits, default 6). With
        "*", "all" or "" it lists memory files instead, sorted by path, each hit one file (its first lines as
        snippet, score null): a page of at most k files (default and at most 1000) from `offset`, with `total`
        (how many files there are) and `next_offset` (call again with offset=next_offset; null at the end).
        """
        return _ask(lambda: memory.recall_response(query, k, agent, offset))

    @tool
    def memory_boot(budget_chars: BudgetChars = DEFAULT_BUDGET_CHARS, agent: Agent = None,
                    query: BootQuery = None) -> BootContext:
        """Memory to load at the start of a session, packed into `budget_chars` characters.

        Returns `text` (the root memory file first, then the most recently changed notes, or with `query` its
        best hits; whole lines, each piece under a `## path#La-Lb` header), `included` citations, and `omitted`
        pieces that did not fit (read them with memory_get when needed).
        """
        return _ask(lambda: memory.boot_context(budget_chars, agent, query))

    @tool
    def memory_status() -> Status:
        """Whether memory search is ready, and what is indexed.

        Returns `ready` (the first full index has finished), `queue_depth` (files waiting), `files_failed`, and
        per collection its agent, files and chunks. Use it when a search returns nothing unexpectedly.
        """
        return _ask(memory.status)

    def memory_append(text: AppendText, path: AppendPath = None, agent: Agent = None) -> AppendResponse:
        """Write to long-term memory: append an entry to today's daily note (memory/YYYY-MM-DD.md), or to a
        markdown file under memory/ named by `path` (workspace-relative, e.g. memory/projects/acme.md; created
        if missing).

        Use it for facts, decisions and summaries worth remembering in later sessions. Returns {"path", "from",
        "to", "citation", "bytes"}: where the entry landed (lines from..to); memory_search finds it within about
        a second. Errors say why nothing was written: appends off for this workspace, a path outside memory/ or
        not .md, a symlink, an entry or file over its size limit.
        """
        return _ask(lambda: memory.append(text, path, agent))

    if append:
        writes = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False,
                                 open_world_hint=False)
        server.add_tool(memory_append, description=inspect.cleandoc(memory_append.__doc__ or ""), annotations=writes)
    return server


#: a JSON ``\\u`` escape of a UTF-16 surrogate, paired or not: only a message holding one is re-read by ``parseable``
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def parseable(message: str) -> str:
    """One JSON-RPC message (a line of stdio, a POST body) that the SDK's parser accepts: ``message`` itself, or
    when it holds an unpaired surrogate escape, the same JSON with each one read as ``?`` (every string, keys too).
    A message that is not JSON at all is returned as it is, for the SDK to answer its parse error."""
    if not _SURROGATE_ESCAPE.search(message):
        return message
    try:
        value = json.loads(message)  # Python's parser keeps unpaired surrogates
    except ValueError:
        return message
    return json.dumps(_cleaned(value), ensure_ascii=False)


def _cleaned(value: Any) -> Any:
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, list):
        return [_cleaned(item) for item in value]
    if isinstance(value, dict):
        return {clean_text(key): _cleaned(item) for key, item in value.items()}
    return value


class ParseableBody:
    """ASGI wrapper of the ``/mcp`` endpoint: a POST body is read whole (the ``Guard`` caps its size) and handed on
    through ``parseable``; other requests pass untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left
                await self.app(scope, _replay([message]), send)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        try:
            body = parseable(body.decode("utf-8")).encode("utf-8")
        except UnicodeDecodeError:
            pass  # not UTF-8: the SDK answers its parse error
        await self.app(scope, _replay([{"type": "http.request", "body": body, "more_body": False}], receive), send)


def _replay(messages: list[Message], then: Receive | None = None) -> Receive:
    async def receive() -> Message:
        if messages:
            return messages.pop(0)
        if then is None:
            return {"type": "http.disconnect"}
        return await then()

    return receive


async def _parseable_lines(lines: AsyncIterable[str]) -> AsyncIterator[str]:
    async for line in lines:
        yield parseable(line)


def serve_stdio(server: MCPServer) -> None:
    """``server.run("stdio")`` with each line read through ``parseable``. The SDK takes an explicit stdin stream only
    at its low level, so this is its ``run_stdio_async`` with that one argument added; stdout is the SDK's own (it
    diverts fd 1 to stderr meanwhile, so stray output never reaches the wire)."""

    async def run() -> None:
        stdin = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace")
        lines = cast(anyio.AsyncFile[str], _parseable_lines(anyio.wrap_file(stdin)))
        lowlevel = server._lowlevel_server  # noqa: SLF001 (see the docstring)
        async with stdio_server(stdin=lines) as (read_stream, write_stream):
            await lowlevel.run(read_stream, write_stream, lowlevel.create_initialization_options())

    anyio.run(run)
