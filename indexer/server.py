"""The daemon's HTTP API on 127.0.0.1 (FastAPI, served by uvicorn): the only way to query an embedded store,
which one process at a time can hold. Request and answer types are ``indexer.schema``'s, so ``/openapi.json``
is the contract.

=========  ===========  ==========================================================================================
method     path         answer
=========  ===========  ==========================================================================================
GET        /            the web page (``PAGE_FILES``, from ``indexer/web``): search, file and status views over
                        these routes; its static files hold no data, so they need no token (the page asks for it)
GET        /health      ``Health``: ``{"status": "ok", "ready": bool}``; ready once the first full index has finished
GET        /status      ``Status``: per-collection files and chunks, ``queue_depth``, embeddings since start
POST       /search      body ``SearchRequest``; ``SearchResponse`` ``{"hits": [Hit, ...], "relevant": bool | null,
                        "pending": [path, ...]}`` (``relevant`` is false when no hit clears ``relevance_floor``)
POST       /recall      body ``RecallRequest``; ``SearchResponse``; query ``*``/``all``/empty lists every memory file,
                        a page of at most ``LIST_CAP`` files from ``offset``, with ``total`` and ``next_offset``
POST       /boot        body ``BootRequest``; ``BootContext`` (see ``indexer.recall.boot_context``)
GET        /get         ``?path=&agent=&from=1&lines=&max_chars=``: ``Page``, a page of one memory file
POST       /append      body ``AppendRequest``; ``AppendResponse`` ``{"path", "from", "to", "citation"...}``: appends
                        to a memory file, on workspaces with ``append = true`` (``indexer.append``; else 403)
POST       /reindex     ``{"rebuilding": true}``: rebuild every collection beside the live one, then swap
POST/GET   /mcp         the MCP tools (``indexer.mcp``) over streamable HTTP, stateless, JSON answers
GET        /metrics     Prometheus text exposition (``indexer.metrics``; OpenMetrics if ``Accept`` asks); not in
                        ``/openapi.json``, which describes the JSON contract
=========  ===========  ==========================================================================================

Limits: request bodies ``MAX_BODY_BYTES`` (1 MiB, else 413), queries ``MAX_QUERY_CHARS`` characters (else 400); a
page of ``/get`` holds at most ``MAX_PAGE_CHARS`` characters and ``MAX_PAGE_LINES`` lines whatever ``max_chars``
and ``lines`` ask (it is then ``truncated`` with ``next_from``).

Agent scope: a request without ``agent`` (or with ``""``) is scoped to ``default_agent`` when configured, else to
the only agent; with several agents and no ``default_agent`` it is refused (400 naming the agents). The same holds
for the MCP tools, which answer through ``LocalMemory`` too.

Every request passes ``indexer.guard.Guard`` first (Host, Origin, bearer token, body size); ``/mcp`` is a route of
the same app. Errors are JSON ``{"detail": "..."}`` with 400 (bad parameters, no agent where several exist), 401
(token missing or wrong), 403 (not a memory file: traversal, symlink...; permission denied; a foreign Host or
Origin), 404 (unknown agent or collection, missing file), 413 (body too large), 422 (a body that does not fit the
schema) or 503 (Qdrant unreachable). The contract is ``/openapi.json``; no docs page is served (its assets would
load from a CDN).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from importlib import resources
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import structlog
from fastapi import FastAPI, HTTPException, Query, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from starlette.concurrency import run_in_threadpool
from starlette.routing import Route

from indexer import __version__
from indexer.append import append_entry
from indexer.guard import Guard
from indexer.recall import boot_context, read_memory, recall
from indexer.report import StatusView
from indexer.schema import (
    DEFAULT_BUDGET_CHARS,
    DEFAULT_MAX_CHARS,
    AppendRequest,
    AppendResponse,
    BootContext,
    BootRequest,
    ErrorDetail,
    Health,
    Hit,
    Page,
    RecallRequest,
    Reindex,
    SearchRequest,
    SearchResponse,
    Status,
    error_answer,
)
from indexer.search import Searcher, join_degraded, relevant
from indexer.state import Plan

T = TypeVar("T")
log = structlog.get_logger("qmd_indexer.api")

MAX_QUERY_CHARS = 10_000  # a query longer than a page of text is a mistake or an attack
MAX_PAGE_CHARS = 100_000  # characters of one /get page, whatever max_chars asks
MAX_PAGE_LINES = 10_000  # lines of one /get page, whatever lines asks

_ERRORS = {
    400: "a bad value (mode, since, from, lines...), a query over the length limit, or no agent where several exist",
    403: "not a memory file of the workspace (traversal, symlink, outside path, non-text file), or permission denied",
    404: "unknown agent or collection, or a missing file",
    413: "an entry over append_max_bytes, or a file it would take over append_max_file_bytes",
    503: "Qdrant unreachable",
}


#: the web page and its static files (``indexer/web``): route -> (file, media type). ``GET`` needs no token for these
PAGE_FILES = {"/": ("index.html", "text/html; charset=utf-8"), "/web/app.js": ("app.js", "text/javascript"),
              "/web/app.css": ("app.css", "text/css"), "/web/favicon.svg": ("favicon.svg", "image/svg+xml"),
              "/favicon.ico": ("favicon.svg", "image/svg+xml")}  # the icon where a browser asks without the page
#: the page's own script and style only, API calls to this origin only, no frames, forms or plugins
PAGE_HEADERS = {"content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src "
                "'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
                "x-content-type-options": "nosniff", "referrer-policy": "no-referrer", "cache-control": "no-cache"}


def _add_page(app: FastAPI) -> None:
    """Serve ``PAGE_FILES`` (read once, here) with ``PAGE_HEADERS``: the page calls the JSON routes itself."""
    def static(body: bytes, media_type: str) -> Callable[[], Response]:
        return lambda: Response(body, media_type=media_type, headers=PAGE_HEADERS)

    for route, (name, media_type) in PAGE_FILES.items():
        body = (resources.files("indexer") / "web" / name).read_bytes()
        app.add_api_route(route, static(body, media_type), methods=["GET"], include_in_schema=False)


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for the error answers ``codes``."""
    return {code: {"model": ErrorDetail, "description": _ERRORS[code]} for code in codes}


def _answer(call: Callable[[], T], path: str | None = None) -> T:
    """Run ``call``, turning the daemon's errors into HTTP errors (``indexer.schema.error_answer``); ``path`` is the
    file asked for, if any (for the log line of a permission error)."""
    try:
        return call()
    except Exception as exc:
        if isinstance(exc, PermissionError):
            log.warning("read_refused", path=path, reason="permission_denied")
        known = error_answer(exc)
        if known is None:
            raise
        raise HTTPException(status_code=known[0], detail=known[1]) from None


def check_query(query: str | None) -> None:
    """Raise ``ValueError`` (400) for a query over ``MAX_QUERY_CHARS`` characters."""
    if query is not None and len(query) > MAX_QUERY_CHARS:
        raise ValueError(f"query is {len(query)} characters; the limit is {MAX_QUERY_CHARS}")


def scope_agent(plan: Plan, agent: str | None) -> str | None:
    """The agent a request is about: ``agent`` when given, else the configured ``default_agent``, else the only
    agent. Raises ``ValueError`` (400) naming the agents when several are configured and none applies, so an
    unscoped request never spans agents (fail closed)."""
    if agent:
        return agent
    if plan.settings.default_agent:
        return plan.settings.default_agent
    agents = plan.agents()
    if len(agents) <= 1:
        return agents[0] if agents else None
    raise ValueError(f"several agents are configured ({', '.join(agents)}): name one with agent, or set "
                     f"default_agent in the config")


class LocalMemory:
    """The daemon's answers in-process, with ``indexer.client.Client``'s methods and answer types (so the MCP tools
    run on either). Errors are the daemon's own: ``KeyError`` (unknown agent or collection), ``ReadRefused``,
    ``FileNotFoundError``, ``ValueError``, ``StoreUnavailable`` (``indexer.schema.error_answer`` maps them)."""

    def __init__(self, view: StatusView) -> None:
        self.view = view
        self._plan = view.plan
        self._searcher = view.searcher(self._plan)

    @property
    def searcher(self) -> Searcher:
        """The searcher over the daemon's current plan (made again when a reload swapped it)."""
        plan = self.view.plan
        if plan is not self._plan:
            self._searcher, self._plan = self.view.searcher(plan), plan
        return self._searcher

    def scope(self, agent: str | None) -> str | None:
        """``scope_agent`` under the current plan."""
        return scope_agent(self.view.plan, agent)

    def health(self) -> Health:
        return self.view.health_answer()

    def status(self) -> Status:
        return self.view.status()

    def search(self, request: SearchRequest, /, degraded: list[str] | None = None) -> list[Hit]:
        """The hits for ``request`` (its ``wait_s`` is the HTTP route's), scoped to one agent (``scope_agent``);
        ``degraded`` collects why the answer is less than the configured search (``Searcher.retrieve``)."""
        check_query(request.query)
        searcher = self.searcher
        scoped = request.model_copy(update={"agent": self.scope(request.agent)})
        with self.view.metrics.search_timer() as timer:
            hits = searcher.search(scoped, degraded)  # ValueError (a bad since): 400
            timer.mode = request.mode or searcher.mode  # a refused mode raised above: never a label
        return hits

    def search_response(self, request: SearchRequest, /) -> SearchResponse:
        """``POST /search``'s answer: after waiting up to ``request.wait_s`` seconds for the agent's pending files,
        ``{"hits", "relevant", "pending"}`` (``relevant``: ``indexer.search.relevant`` against ``relevance_floor``;
        ``pending``: the scoped agent's files changed on disk and not yet indexed)."""
        agent = self.scope(request.agent)
        if request.wait_s:
            self.view.wait_pending(agent, request.wait_s)
        notes: list[str] = []
        hits = self.search(request, notes)
        answer: SearchResponse = {"hits": hits, "relevant": relevant(hits, self.view.plan.settings.relevance_floor),
                                  "pending": self.view.pending(agent)}
        reason = join_degraded(notes)
        if reason:
            answer["degraded"] = reason
        return answer

    def recall(self, query: str = "*", k: int | None = None, agent: str | None = None) -> list[Hit]:
        """The hits of ``recall_response``."""
        return self.recall_response(query, k, agent)["hits"]

    def recall_response(self, query: str = "*", k: int | None = None, agent: str | None = None,
                        offset: int = 0) -> SearchResponse:
        """``POST /recall``'s answer: ``indexer.recall.recall`` (a listing pages with ``offset`` and says ``total``
        and ``next_offset``) plus ``pending``, the scoped agent's files not yet indexed, and ``degraded`` as
        ``search_response``'s."""
        check_query(query)
        scoped = self.scope(agent)
        notes: list[str] = []
        answer = recall(self.searcher, query, k, scoped, offset, self.view.plan.settings.relevance_floor, notes)
        reason = join_degraded(notes)
        if reason:
            answer["degraded"] = reason
        return {**answer, "pending": self.view.pending(scoped)}

    def boot_context(self, budget_chars: int = DEFAULT_BUDGET_CHARS, agent: str | None = None,
                     query: str | None = None) -> BootContext:
        check_query(query)
        return boot_context(self.searcher, budget_chars, self.scope(agent), query, self.view.registry.classify_text)

    def get(self, path: str, from_line: int = 1, lines: int | None = None, max_chars: int | None = None,
            agent: str | None = None) -> Page:
        """A page of ``path``; pages hold at most ``MAX_PAGE_CHARS`` characters and ``MAX_PAGE_LINES`` lines
        whatever ``max_chars`` and ``lines`` ask (a bigger ask gets a capped page, ``truncated`` with ``next_from``)."""
        page_lines = min(lines, MAX_PAGE_LINES) if lines is not None else MAX_PAGE_LINES
        page_chars = min(DEFAULT_MAX_CHARS if max_chars is None else max_chars, MAX_PAGE_CHARS)
        return read_memory(self.view.plan.collections, path, from_line, page_lines, page_chars, self.scope(agent),
                           self.view.registry.classify_text)

    def append(self, text: str, path: str | None = None, agent: str | None = None) -> AppendResponse:
        """Append ``text`` to ``path`` (default: today's daily note) of the scoped agent's workspace
        (``indexer.append.append_entry``: its errors, its answer); the watcher indexes it."""
        plan = self.view.plan
        return append_entry(plan.collections, plan.settings, text, path, self.scope(agent))


class LaterMcp:
    """``/mcp`` built after the API listens (``create_app(..., mcp_later=True)``, the daemon's): importing the MCP
    SDK and building its server cost more than the rest of the API's start (docs/benchmarks.md, "Restart"), and a
    restart should answer searches first. The app's lifespan builds it on a worker thread, then runs its session
    manager; until then ``/mcp`` answers 503 with ``Retry-After: 1``."""

    def __init__(self, memory: LocalMemory, host: str) -> None:
        self.memory, self.host = memory, host
        self.app: Callable[..., Any] | None = None  # the built route's ASGI app

    def build(self) -> Any:
        """The MCP server and its streamable HTTP app (stateless, JSON answers; see ``create_app``)."""
        from indexer.mcp import ParseableBody, build_server

        settings = self.memory.view.plan.settings
        server = build_server(self.memory, append=any(ws.append for ws in settings.workspace))
        http = server.streamable_http_app(stateless_http=True, json_response=True, host=self.host)
        for route in http.routes:  # read every POST through ``parseable`` (indexer.mcp)
            route.app = ParseableBody(route.app)  # type: ignore[attr-defined]
        return server, http

    @contextlib.asynccontextmanager
    async def lifespan(self, _app: Any) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(self._serve)
            yield
            tasks.cancel_scope.cancel()

    async def _serve(self) -> None:
        server, http = await anyio.to_thread.run_sync(self.build)
        async with server.session_manager.run():
            self.app = http.routes[0].app
            await anyio.sleep_forever()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self.app is None:
            await Response("MCP is starting; retry in a second", 503, {"Retry-After": "1"})(scope, receive, send)
            return
        await self.app(scope, receive, send)



def create_app(view: StatusView, mcp_later: bool = False) -> FastAPI:
    """The API app over a daemon's ``view`` (``Indexer.view``), with the web page at ``/`` and the MCP tools at
    ``/mcp``. ``/mcp`` is a route of this app, so the ``Guard`` middleware (Host, Origin, token, body size) wraps it
    too; it needs the app's lifespan to run, once (uvicorn ``lifespan="on"``, or ``with TestClient(app)``); a request
    without it is a 500. ``mcp_later``: ``/mcp`` is built once the app runs (``LaterMcp``), answering 503 until then."""
    memory = LocalMemory(view)
    settings = view.plan.settings  # host, port and token are read once at start (a reload does not change them)
    later = LaterMcp(memory, settings.host)
    if mcp_later:
        lifespan: Callable[[Any], Any] = later.lifespan
    else:
        mcp_server, mcp_http = later.build()
        lifespan = lambda _app: mcp_server.session_manager.run()  # noqa: E731
    app = FastAPI(title="qmd-indexer", version=__version__, summary="Semantic search over an agent's memory files",
                  lifespan=lifespan, docs_url=None, redoc_url=None)
    app.add_middleware(Guard, host=settings.host, port=settings.port, token=settings.token,
                       public=frozenset(PAGE_FILES))
    _add_page(app)
    # the /mcp route itself, not a sub-app: no redirect, same middleware
    app.router.routes.extend([Route("/mcp", later)] if mcp_later else mcp_http.routes)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> Response:
        """FastAPI's 422 answer, as ASCII JSON: it echoes the refused input, which may hold a lone surrogate that
        UTF-8 cannot encode (the default handler then failed with a 500)."""
        body = json.dumps({"detail": jsonable_encoder(exc.errors())}, ensure_ascii=True)
        return Response(content=body, status_code=422, media_type="application/json")

    @app.get("/health")
    def health() -> Health:
        return memory.health()

    @app.get("/status")
    def status() -> Status:
        return memory.status()

    # async, the search itself in the thread pool: FastAPI validates a sync endpoint's answer in a second thread-pool
    # hop, an async one's on the event loop. Client minus server time of a search, daemon at 100k, 2 CPUs: 4.5 -> 4.0 ms
    @app.post("/search", responses=_errors(400, 404, 503))
    async def search(body: SearchRequest) -> SearchResponse:
        return await run_in_threadpool(lambda: _answer(lambda: memory.search_response(body)))

    @app.post("/recall", responses=_errors(400, 404, 503))
    def recall_(body: RecallRequest) -> SearchResponse:
        return _answer(lambda: memory.recall_response(body.query, body.k, body.agent, body.offset))

    @app.post("/boot", responses=_errors(400, 404, 503))
    def boot(body: BootRequest) -> BootContext:
        context = _answer(lambda: memory.boot_context(body.budget_chars, body.agent, body.query))
        return {**context, "pending": view.pending(body.agent)}

    @app.get("/get", responses=_errors(400, 403, 404))
    def get(path: str = Query(description="A memory file, workspace-relative (or absolute inside it)."),
            agent: str | None = Query(default=None, description=(
                "Whose workspace `path` is relative to. Optional when the daemon has one agent or a configured "
                "default_agent (then that one); with several agents and no default_agent it is required.")),
            from_: int = Query(default=1, ge=1, alias="from", description="First line to read (1-based)."),
            lines: int | None = Query(default=None, ge=1, description="At most this many lines."),
            max_chars: int = Query(default=DEFAULT_MAX_CHARS, ge=1,
                                   description="At most this many characters.")) -> Page:
        return _answer(lambda: memory.get(path, from_, lines, max_chars, agent), path=path)

    @app.post("/append", responses=_errors(400, 403, 404, 413))
    def append(body: AppendRequest) -> AppendResponse:
        """Append ``text`` to ``path`` (default: today's daily note), on workspaces with ``append = true``."""
        return _answer(lambda: memory.append(body.text, body.path, body.agent), path=body.path)

    @app.get("/metrics", include_in_schema=False)
    def metrics(request: Request) -> Response:
        """Prometheus metrics (``indexer.metrics``): the text format, or OpenMetrics when ``Accept`` asks."""
        body, content_type = view.metrics.exposition(request.headers.get("accept", ""))
        return Response(content=body, media_type=content_type)

    @app.post("/reindex")
    def reindex() -> Reindex:
        """Rebuild every collection beside the live one and swap it in when complete (searches keep answering from
        the old one meanwhile); returns at once. ``GET /status`` says ``rebuilding`` until it is done."""
        view.request_rebuild()
        return {"rebuilding": True}

    return app
