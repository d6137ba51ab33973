"""Memory tools for AI agents over the Model Context Protocol (the official ``mcp`` SDK, 2.x ``MCPServer``).

The same tools are served two ways, over the same ``indexer.memory.Memory`` operations:

- ``qmd-indexer mcp``: stdio, for an agent that starts its MCP servers itself. It talks to the running daemon
  through ``indexer.client.RemoteMemory`` (the embedded store is single-process, so this process never opens it, and
  it imports no torch); when no daemon answers, every tool call is a tool error naming the port and how to start one.
- ``/mcp`` on the daemon's own port (``McpEndpoint``): streamable HTTP, answered in-process
  (``indexer.memory.LocalMemory``) and behind whatever middleware wraps the API.

=================  =========================================================  ======================================
tool               arguments: the fields of                                   returns
=================  =========================================================  ======================================
memory_search      ``SearchRequest`` but ``wait_s``                           ``SearchResponse``
memory_get         ``GetRequest`` (path, from, lines, max_chars, agent)       ``Page``
memory_recall      ``RecallRequest`` (query, k, offset, agent)                ``SearchResponse``
memory_boot        ``BootRequest`` (budget_chars, agent, query)               ``BootContext`` (with ``pending``)
memory_status      (none)                                                     ``Status``
memory_append      ``AppendRequest`` (text, path, agent); only listed where   ``AppendResponse``
                   a workspace has ``append = true``
=================  =========================================================  ======================================

Each tool is built from its row of ``TOOLS``: its arguments are the request model's fields (``request_parameters``),
with their descriptions, bounds and aliases (``q``; ``top_k``/``limit``; ``from_line``; ``budget``), so a field
added to a request is a tool argument too; the tool builds the model and calls the operation. An argument the model
does not have is refused, as the HTTP API refuses it (422): the call returns ``is_error`` naming it.

``memory_append`` is the one tool that writes, and it is listed only when the server is built with ``append=True``:
the daemon's ``/mcp`` when a workspace of its config has ``append = true``; ``qmd-indexer mcp`` when the daemon says
so (``/health``'s ``append``, read once at start: ``daemon_appends``), or, with no daemon answering then, the config
it reads. An agent that may not write never sees a write tool. Listed, it is still the daemon that decides per
workspace and per call (a workspace without ``append``, or turned off by a reload, is refused with an error saying
how to enable it; one the daemon cannot write answers why).

``agent`` (``qmd-indexer mcp --agent ID``) scopes every tool to one agent of a multi-agent daemon: the tools no
longer take ``agent`` as an argument, and every call is made for that agent.

Errors the model should read (unknown agent or collection, path refused, missing file, bad value, daemon or Qdrant
unavailable) are raised as the SDK's ``ToolError``: the call returns ``is_error`` with the message as text.
Arguments that do not fit the schema return the validation message the same way.

JSON may carry an unpaired UTF-16 surrogate (``"\\ud800"``), which the SDK's JSON parser refuses as a parse error of
the whole message (no id: the agent cannot tell which call failed; over stdio it waits for an answer that never
comes). Both transports read messages through ``parseable`` first, so such a message reaches the tools with each
unpaired surrogate read as ``?``, as the HTTP API reads the query (``indexer.schema``).

The SDK is imported where a server is built, not with this module: the daemon's API answers before it is loaded
(``McpEndpoint(later=True)``).
"""

from __future__ import annotations

import contextlib
import inspect
import io
import json
import re
import sys
import typing
from collections.abc import AsyncIterable, AsyncIterator, Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

import anyio
import anyio.to_thread
from pydantic import ConfigDict
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from indexer import __version__
from indexer.arguments import clean_text
from indexer.client import Client, ClientError, RemoteMemory
from indexer.errors import error_answer, unknown_agent
from indexer.schema import (
    AppendRequest,
    AppendResponse,
    BootContext,
    BootRequest,
    GetRequest,
    Page,
    RecallRequest,
    Request,
    SearchRequest,
    SearchResponse,
)
from indexer.status import Status

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.tools import Tool

    from indexer.memory import Memory

T = TypeVar("T")

INSTRUCTIONS = """\
Long-term memory of this agent: MEMORY.md, the notes under memory/ and, where configured, its past session
transcripts (sessions/<file>.jsonl), indexed for search by meaning and by exact words. Use memory_search before
answering anything about earlier work, decisions, people, preferences or dates; cite hits by their `citation`. Use
memory_get to read more around a hit (from = its start_line). At the start of a session, memory_boot gives a
compact context; memory_status says whether the index is ready."""


@dataclass(frozen=True)
class ToolSpec:
    """One tool: its ``name``, the ``Memory`` ``operation`` it calls with a ``request`` model (``None``: no
    arguments) built from its arguments (the model's fields but ``exclude``), the answer type, whether it
    ``writes``, and the description the model reads."""

    name: str
    operation: str
    request: type[Request] | None
    answer: Any
    description: str
    writes: bool = False
    exclude: frozenset[str] = frozenset()


TOOLS = (
    ToolSpec("memory_search", "search", SearchRequest, SearchResponse, """\
        Search the agent's long-term memory (MEMORY.md, notes under memory/, and past session transcripts named
        sessions/<file>.jsonl where configured: `corpus` memory, sessions or all) by meaning and exact words.

        Use it before answering anything about earlier conversations, decisions, people, preferences, projects
        or dates. Returns {"hits": [...], "relevant": ..., "relevance": {...}, "pending": [...]}: hits best first,
        each with path, start_line, end_line, score, a snippet of at most 700 characters, and a citation
        (path#Lstart-Lend) to quote; `relevant` false means nothing relevant was found (do not treat the hits as an
        answer); `relevance` grades it (high, medium, low, none) and says why; `pending` lists files changed on
        disk and not indexed yet (the answer may miss them); `indexing` {done, total} is there while the first
        index is still being built. Read more around a hit with memory_get(path, from=start_line). Errors name an
        unknown agent or collection, a missing agent where several exist, or a bad `since`.""",
             exclude=frozenset({"wait_s"})),
    ToolSpec("memory_get", "get", GetRequest, Page, """\
        Read one memory file, or part of it, by line: the full text around a search hit, or a whole note.
        `path` may be a hit's `citation` (`memory/x.md#L3-L5`): its lines, unless `from` or `lines` is given.

        Returns whole lines `from`..`to` as `text`; when `truncated` is true, call again with from=`next_from`
        to continue. Only memory files of the workspace are readable: paths outside it, symlinks and non-memory
        files are refused with an error saying so."""),
    ToolSpec("memory_recall", "recall", RecallRequest, SearchResponse, """\
        Recall memories for a topic, or list every memory file with query "*".

        Returns {"hits": [...], "relevant": ..., "pending": [...]} like memory_search (k hits, default 6). With
        "*", "all" or "" it lists memory files instead, sorted by path, each hit one file (its first lines as
        snippet, score null): a page of at most k files (default and at most 1000) from `offset`, with `total`
        (how many files there are) and `next_offset` (call again with offset=next_offset; null at the end)."""),
    ToolSpec("memory_boot", "boot", BootRequest, BootContext, """\
        Memory to load at the start of a session, packed into `budget_chars` characters.

        Returns `text` (the root memory file first, then the most recently changed notes, or with `query` its
        best hits; whole lines, each piece under a `## path#La-Lb` header), `included` citations, `omitted`
        pieces that did not fit (read them with memory_get when needed), and `pending` (files changed on disk and
        not indexed yet)."""),
    ToolSpec("memory_status", "status", None, Status, """\
        Whether memory search is ready, and what is indexed.

        Returns `ready` (the first full index has finished), `queue_depth` (files waiting), `files_failed`, and
        per collection its agent, files and chunks. Use it when a search returns nothing unexpectedly."""),
    ToolSpec("memory_append", "append", AppendRequest, AppendResponse, """\
        Write to long-term memory: append an entry to today's daily note (memory/YYYY-MM-DD.md), or to a
        markdown file under memory/ named by `path` (workspace-relative, e.g. memory/projects/acme.md; created
        if missing).

        Use it for facts, decisions and summaries worth remembering in later sessions. Returns {"path", "from",
        "to", "citation", "bytes"}: where the entry landed (lines from..to); memory_search finds it within about
        a second. Errors say why nothing was written: appends off for this workspace, a path outside memory/ or
        not .md, a symlink, an entry or file over its size limit.""", writes=True),
)


def _ask(call: Callable[[], T]) -> T:
    """``call()``, with the errors meant for the caller raised as ``ToolError`` (their message reaches the model)."""
    from mcp.server.mcpserver.exceptions import ToolError

    try:
        return call()
    except ClientError as exc:  # includes DaemonUnavailable
        raise ToolError(str(exc)) from None
    except Exception as exc:
        known = error_answer(exc)
        if known is None:
            raise
        raise ToolError(known[1]) from None


def request_parameters(model: type[Request], exclude: Collection[str] = ()) -> list[inspect.Parameter]:
    """One keyword parameter per field of ``model`` (but ``exclude``), annotated and defaulted as the model declares
    it: the SDK builds a tool's input schema and argument validation from its signature, so the tool takes exactly
    the model's fields, with their descriptions, bounds and aliases."""
    hints = typing.get_type_hints(model, include_extras=True)
    return [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=hints[name],
                              default=inspect.Parameter.empty if field.is_required() else field.default)
            for name, field in model.model_fields.items() if name not in exclude]


def build_tool(memory: Memory, spec: ToolSpec, agent: str | None = None) -> Tool:
    """The SDK ``Tool`` of ``spec`` over ``memory``: arguments from its request model, the operation called with
    the model built from them, any other argument refused (its arguments model forbids extra keys, and its
    published input schema says ``additionalProperties: false``). With ``agent``, the request's ``agent`` is that
    one and not an argument."""
    from mcp.server.mcpserver.tools import Tool
    from mcp.types import ToolAnnotations

    call = getattr(memory, spec.operation)
    model = spec.request
    fixed = {"agent": agent} if agent is not None and model is not None and "agent" in model.model_fields else {}

    defaults = {name: f.default for name, f in model.model_fields.items()} if model is not None else {}

    def run(**arguments: Any) -> Any:
        # the SDK hands every argument, defaults filled in: leave those out, so the model tells "not given" (a
        # citation's lines apply) from "given" (``memory_get(path="x.md#L3-L4")`` read lines 1-5 otherwise)
        given = {k: v for k, v in arguments.items() if k not in defaults or v != defaults[k]}
        return _ask(lambda: call(model(**given, **fixed)) if model is not None else call())

    params = request_parameters(model, spec.exclude | fixed.keys()) if model is not None else []
    tool_fn: Any = run  # a function object takes the attributes inspect reads
    tool_fn.__name__ = spec.name
    tool_fn.__signature__ = inspect.Signature(params, return_annotation=spec.answer)
    tool_fn.__annotations__ = {**{p.name: p.annotation for p in params}, "return": spec.answer}
    annotations = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False,
                                  open_world_hint=False) if spec.writes else ToolAnnotations(
        read_only_hint=True, open_world_hint=False)
    tool = Tool.from_function(tool_fn, name=spec.name, description=inspect.cleandoc(spec.description),
                              annotations=annotations)
    base = tool.fn_metadata.arg_model
    strict = type(base.__name__, (base,), {"model_config": ConfigDict(extra="forbid"), "__module__": __name__})
    return tool.model_copy(update={"fn_metadata": tool.fn_metadata.model_copy(update={"arg_model": strict}),
                                   "parameters": {**tool.parameters, "additionalProperties": False}})


def build_server(memory: Memory | Client, append: bool = False, agent: str | None = None) -> MCPServer:
    """An ``MCPServer`` named ``qmd-indexer`` with the memory tools of ``TOOLS`` over ``memory`` (a ``Client`` is
    asked through ``RemoteMemory``), ``memory_append`` only when ``append``, each scoped to ``agent`` when given
    (see the module). Serve it with ``serve_stdio`` or over HTTP with ``McpEndpoint``."""
    from mcp.server.mcpserver import MCPServer

    if isinstance(memory, Client):
        memory = RemoteMemory(memory)

    tools = [build_tool(memory, spec, agent) for spec in TOOLS if append or not spec.writes]
    return MCPServer("qmd-indexer", title="Agent memory (qmd-indexer)", instructions=INSTRUCTIONS,
                     version=__version__, tools=tools)


def daemon_appends(client: Client, agent: str | None) -> bool | None:
    """Whether the daemon behind ``client`` takes appends for ``agent`` (any agent when ``None``): its ``/health``
    says ``append`` is not ``off`` (``on``, or unavailable now: listed, a call says why). ``None`` when no daemon
    answers, or one too old to say. Raises ``KeyError`` naming the known agents for an agent it does not have."""
    try:
        states = client.health().get("append")
    except ClientError:
        return None
    if states is None:
        return None
    if agent is not None and agent not in states:
        raise KeyError(unknown_agent(agent, list(states)))
    return any(state != "off" for name, state in states.items() if agent in (None, name))


class McpEndpoint:
    """``/mcp`` of the daemon's API: the tools over ``memory`` (``LocalMemory``) on the SDK's streamable HTTP app
    (stateless, JSON answers), every POST read through ``ParseableBody``. The app's ``lifespan`` runs the SDK's
    session manager (a request without it is a 500). With ``later`` (the daemon's) the server is built on a worker
    thread once the app runs, since importing the SDK and building its server cost more than the rest of the API's
    start (docs/benchmarks.md, "Restart") and a restart should answer searches first; until then ``/mcp`` answers
    503 with ``Retry-After: 1``."""

    def __init__(self, memory: Memory, host: str, append: bool = False, later: bool = False) -> None:
        self.memory, self.host, self.append = memory, host, append
        self.app: ASGIApp | None = None  # the SDK's endpoint behind ParseableBody, once built
        self._server: MCPServer | None = None
        if not later:
            self._server, self.app = self._make()

    def _make(self) -> tuple[MCPServer, ASGIApp]:
        """The server and its endpoint: the SDK app's one route (``/mcp``), read and wrapped, never changed."""
        server = build_server(self.memory, append=self.append)
        http = server.streamable_http_app(stateless_http=True, json_response=True, host=self.host)
        return server, ParseableBody(cast(Route, http.routes[0]).app)

    @contextlib.asynccontextmanager
    async def lifespan(self, _app: Any) -> AsyncIterator[None]:
        if self._server is not None:
            async with self._server.session_manager.run():
                yield
            return
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(self._serve_later)
            yield
            tasks.cancel_scope.cancel()

    async def _serve_later(self) -> None:
        server, app = await anyio.to_thread.run_sync(self._make)
        async with server.session_manager.run():
            self.app = app  # answered from now on, with its session manager running
            await anyio.sleep_forever()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.app is None:
            await Response("MCP is starting; retry in a second", 503, {"Retry-After": "1"})(scope, receive, send)
            return
        await self.app(scope, receive, send)


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

    from mcp.server.stdio import stdio_server

    async def run() -> None:
        stdin = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace")
        lines = cast(anyio.AsyncFile[str], _parseable_lines(anyio.wrap_file(stdin)))
        lowlevel = server._lowlevel_server  # noqa: SLF001 (see the docstring)
        async with stdio_server(stdin=lines) as (read_stream, write_stream):
            await lowlevel.run(read_stream, write_stream, lowlevel.create_initialization_options())

    anyio.run(run)
