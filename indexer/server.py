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
                        "relevance": {"level", "reason"}, "pending": [path, ...]}`` (``relevant``: anything relevant
                        found, ``indexer.relevance.judge``; ``indexing`` while the first index is built)
POST       /recall      body ``RecallRequest``; ``SearchResponse``; query ``*``/``all``/empty lists every memory file,
                        a page of at most ``LIST_CAP`` files from ``offset``, with ``total`` and ``next_offset``
POST       /boot        body ``BootRequest``; ``BootContext`` (see ``indexer.recall.boot_context``)
GET        /get         ``GetRequest`` as query parameters (``?path=&agent=&from=1&lines=&max_chars=``): ``Page``,
                        a page of one memory file
GET        /media       ``?path=&agent=``: the bytes of a picture among the memory files (PNG, JPEG, GIF, WebP; 403
                        for any other file), for the web page; ``/get`` of it answers its extracted (OCR) text
POST       /append      body ``AppendRequest``; ``AppendResponse`` ``{"path", "from", "to", "citation"...}``: appends
                        to a memory file, on workspaces with ``append = true`` (``indexer.append``; else 403)
POST       /reindex     ``{"rebuilding": true}``: rebuild every collection beside the live one, then swap
POST/GET   /mcp         the MCP tools (``indexer.mcp``) over streamable HTTP, stateless, JSON answers
GET        /metrics     Prometheus text exposition (``indexer.metrics``; OpenMetrics if ``Accept`` asks); not in
                        ``/openapi.json``, which describes the JSON contract
=========  ===========  ==========================================================================================

Limits: request bodies ``MAX_BODY_BYTES`` (1 MiB, else 413), queries ``indexer.memory.MAX_QUERY_CHARS`` characters
(else 400); a page of ``/get`` holds at most ``MAX_PAGE_CHARS`` characters and ``MAX_PAGE_LINES`` lines whatever
``max_chars`` and ``lines`` ask (it is then ``truncated`` with ``next_from``).

Each route is one call of ``indexer.memory.LocalMemory`` with its request model, which scopes the agent (a request
without ``agent``, or with ``""``, is about ``default_agent`` when configured, else the only agent; with several
agents and no ``default_agent`` it is refused, 400 naming the agents), checks the query, caps pages and attaches
``pending`` and ``degraded``. The MCP tools answer through the same ``LocalMemory``.

Every request passes ``indexer.guard.Guard`` first (Host, Origin, bearer token, body size); ``/mcp`` is a route of
the same app. Errors are JSON ``{"detail": "..."}`` with 400 (bad parameters, no agent where several exist), 401
(token missing or wrong), 403 (not a memory file: traversal, symlink...; permission denied; a foreign Host or
Origin), 404 (unknown agent or collection, missing file), 413 (body too large), 422 (a body that does not fit the
schema) or 503 (Qdrant unreachable). The contract is ``/openapi.json``; no docs page is served (its assets would
load from a CDN).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from importlib import resources
from typing import Annotated, Any, TypeVar

import structlog
from fastapi import FastAPI, HTTPException, Query, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from starlette.concurrency import run_in_threadpool
from starlette.routing import Route

from indexer import __version__
from indexer.errors import error_answer
from indexer.guard import Guard
from indexer.mcp import McpEndpoint
from indexer.memory import LocalMemory
from indexer.report import StatusView
from indexer.schema import (
    AppendRequest,
    AppendResponse,
    BootContext,
    BootRequest,
    ErrorDetail,
    GetRequest,
    Page,
    RecallRequest,
    SearchRequest,
    SearchResponse,
)
from indexer.status import Health, Reindex, Status

T = TypeVar("T")
log = structlog.get_logger("qmd_indexer.api")

_ERRORS = {
    400: "a bad value (mode, since, from, lines...), a query over the length limit, or no agent where several exist",
    403: "not a memory file of the workspace (traversal, symlink, outside path, non-text file), or permission denied",
    404: "unknown agent or collection, or a missing file",
    413: "an entry over append_max_bytes, or a file it would take over append_max_file_bytes",
    503: "Qdrant unreachable, or the daemon cannot write the workspace (an append on a read-only file system)",
}


#: the web page and its static files (``indexer/web``): route -> (file, media type). ``GET`` needs no token for these
PAGE_FILES = {"/": ("index.html", "text/html; charset=utf-8"), "/web/app.js": ("app.js", "text/javascript"),
              "/web/app.css": ("app.css", "text/css"), "/web/favicon.svg": ("favicon.svg", "image/svg+xml"),
              "/favicon.ico": ("favicon.svg", "image/svg+xml")}  # the icon where a browser asks without the page
#: the page's own script and style only, API calls to this origin only, no frames, forms or plugins
PAGE_HEADERS = {"content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src "
                "'self'; img-src 'self' blob:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
                "x-content-type-options": "nosniff", "referrer-policy": "no-referrer", "cache-control": "no-cache"}


#: a picture served by ``GET /media``: never run as a document, never sniffed as another type, never cached
MEDIA_HEADERS = {"content-security-policy": "default-src 'none'; sandbox", "x-content-type-options": "nosniff",
                 "content-disposition": "inline", "cache-control": "no-store"}


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
    """Run ``call``, turning the daemon's errors into HTTP errors (``indexer.errors.error_answer``); ``path`` is the
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


async def _invalid(_request: Request, exc: Exception) -> Response:
    """FastAPI's 422 answer to a ``RequestValidationError``, as ASCII JSON: it echoes the refused input, which may
    hold a lone surrogate that UTF-8 cannot encode (the default handler then failed with a 500)."""
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    body = json.dumps({"detail": jsonable_encoder(errors)}, ensure_ascii=True)
    return Response(content=body, status_code=422, media_type="application/json")


def _add_memory_routes(app: FastAPI, memory: LocalMemory) -> None:
    """One route per memory operation: its request model validated (a body, or ``GET /get``'s query parameters),
    one call of ``memory``, its errors answered as statuses (``_answer``)."""
    # async, the search itself in the thread pool: FastAPI validates a sync endpoint's answer in a second thread-pool
    # hop, an async one's on the event loop. Client minus server time of a search, daemon at 100k, 2 CPUs: 4.5 -> 4.0 ms
    @app.post("/search", responses=_errors(400, 404, 503))
    async def search(body: SearchRequest) -> SearchResponse:
        return await run_in_threadpool(lambda: _answer(lambda: memory.search(body)))

    @app.post("/recall", responses=_errors(400, 404, 503))
    def recall_(body: RecallRequest) -> SearchResponse:
        return _answer(lambda: memory.recall(body))

    @app.post("/boot", responses=_errors(400, 404, 503))
    def boot(body: BootRequest) -> BootContext:
        return _answer(lambda: memory.boot(body))

    @app.get("/get", responses=_errors(400, 403, 404))
    def get(query: Annotated[GetRequest, Query()]) -> Page:
        return _answer(lambda: memory.get(query), path=query.path)

    @app.get("/media", include_in_schema=False)  # bytes, not JSON (as /metrics): not in /openapi.json
    def media(path: str, agent: str | None = None) -> Response:
        """The bytes of a picture among the agent's memory files (a media file a plugin indexed: PNG, JPEG, GIF or
        WebP), read beneath the workspace, for the web page to show beside the text it was read to."""
        data, media_type = _answer(lambda: memory.media(path, agent), path=path)
        return Response(data, media_type=media_type, headers=MEDIA_HEADERS)

    @app.post("/append", responses=_errors(400, 403, 404, 413, 503))
    def append(body: AppendRequest) -> AppendResponse:
        """Append ``text`` to ``path`` (default: today's daily note), on workspaces with ``append = true``."""
        return _answer(lambda: memory.append(body), path=body.path)


def create_app(view: StatusView, mcp_later: bool = False) -> FastAPI:
    """The API app over a daemon's ``view`` (``Indexer.view``), with the web page at ``/`` and the MCP tools at
    ``/mcp``. ``/mcp`` is a route of this app, so the ``Guard`` middleware (Host, Origin, token, body size) wraps it
    too; it needs the app's lifespan to run, once (uvicorn ``lifespan="on"``, or ``with TestClient(app)``); a request
    without it is a 500. ``mcp_later``: ``/mcp`` is built once the app runs (``indexer.mcp.McpEndpoint``), answering
    503 until then."""
    memory = LocalMemory(view)
    settings = view.plan.settings  # host, port and token are read once at start (a reload does not change them)
    mcp = McpEndpoint(memory, settings.host, append=any(ws.append for ws in settings.workspace), later=mcp_later)
    app = FastAPI(title="qmd-indexer", version=__version__, summary="Semantic search over an agent's memory files",
                  lifespan=mcp.lifespan, docs_url=None, redoc_url=None)
    app.add_middleware(Guard, host=settings.host, port=settings.port, token=settings.token,
                       public=frozenset(PAGE_FILES))
    _add_page(app)
    app.router.routes.append(Route("/mcp", mcp))  # the /mcp route itself, not a sub-app: no redirect, same middleware
    app.add_exception_handler(RequestValidationError, _invalid)

    @app.get("/health")
    def health() -> Health:
        return memory.health()

    @app.get("/status")
    def status() -> Status:
        return memory.status()

    _add_memory_routes(app, memory)

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
