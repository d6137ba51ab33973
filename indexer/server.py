"""The daemon's HTTP API on 127.0.0.1 (FastAPI, served by uvicorn): the only way to query an embedded store,
which one process at a time can hold. Request and answer types are ``indexer.schema``'s, so ``/openapi.json``
is the contract.

=========  ===========  ==========================================================================================
method     path         answer
=========  ===========  ==========================================================================================
GET        /health      ``Health``: ``{"status": "ok", "ready": bool}``; ready once the first full index has finished
GET        /status      ``Status``: per-collection files and chunks, ``queue_depth``, embeddings since start
POST       /search      body ``SearchRequest``; ``SearchResponse`` ``{"hits": [Hit, ...]}`` (see ``indexer.search``)
POST       /recall      body ``RecallRequest``; ``SearchResponse``; query ``*``/``all``/empty lists every memory file
POST       /boot        body ``BootRequest``; ``BootContext`` (see ``indexer.recall.boot_context``)
GET        /get         ``?path=&agent=&from=1&lines=&max_chars=``: ``Page``, a page of one memory file
POST/GET   /mcp         the MCP tools (``indexer.mcp``) over streamable HTTP, stateless, JSON answers
=========  ===========  ==========================================================================================

Errors are JSON ``{"detail": "..."}`` with 400 (bad parameters), 403 (not a memory file: traversal, symlink...),
404 (unknown agent or collection, missing file), 422 (a body that does not fit the schema) or 503 (Qdrant
unreachable). OpenAPI docs at ``/docs``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import FastAPI, HTTPException, Query

from indexer import __version__
from indexer.daemon import Indexer
from indexer.points import parse_since
from indexer.recall import boot_context, read_memory, recall
from indexer.schema import (
    DEFAULT_BUDGET_CHARS,
    DEFAULT_K,
    DEFAULT_MAX_CHARS,
    BootContext,
    BootRequest,
    ErrorDetail,
    Health,
    Hit,
    Page,
    RecallRequest,
    SearchRequest,
    SearchResponse,
    Status,
    error_answer,
)
from indexer.search import SearchParams

T = TypeVar("T")

_ERRORS = {
    400: "a bad value (mode, since, from, lines...)",
    403: "not a memory file of the workspace (traversal, symlink, outside path, non-text file)",
    404: "unknown agent or collection, or a missing file",
    503: "Qdrant unreachable",
}


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for the error answers ``codes``."""
    return {code: {"model": ErrorDetail, "description": _ERRORS[code]} for code in codes}


def _answer(call: Callable[[], T]) -> T:
    """Run ``call``, turning the daemon's errors into HTTP errors (``indexer.schema.error_answer``)."""
    try:
        return call()
    except Exception as exc:
        known = error_answer(exc)
        if known is None:
            raise
        raise HTTPException(status_code=known[0], detail=known[1]) from None


def _as_tuple(value: list[str] | str | None) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


class LocalMemory:
    """The daemon's answers in-process, with ``indexer.client.Client``'s methods and answer types (so the MCP tools
    run on either). Errors are the daemon's own: ``KeyError`` (unknown agent or collection), ``ReadRefused``,
    ``FileNotFoundError``, ``ValueError``, ``StoreUnavailable`` (``indexer.schema.error_answer`` maps them)."""

    def __init__(self, indexer: Indexer) -> None:
        self.indexer = indexer
        self.searcher = indexer.searcher()

    def health(self) -> Health:
        return {"status": self.indexer.health(), "ready": self.indexer.ready.is_set()}  # type: ignore[typeddict-item]

    def status(self) -> Status:
        return self.indexer.status()  # type: ignore[return-value]

    def search(self, query: str, k: int = DEFAULT_K, agent: str | None = None,
               collection: str | list[str] | None = None, mode: str | None = None, path_prefix: str | None = None,
               kind: str | list[str] | None = None, min_score: float | None = None,
               since: str | None = None) -> list[Hit]:
        since_ns = parse_since(since) if since is not None else None  # ValueError: 400
        return self.searcher.search(SearchParams(  # type: ignore[return-value]
            query=query, k=k, agent=agent, collections=_as_tuple(collection), mode=mode, path_prefix=path_prefix,
            kinds=_as_tuple(kind), min_score=min_score, since_ns=since_ns))

    def recall(self, query: str = "*", k: int = DEFAULT_K, agent: str | None = None) -> list[Hit]:
        return recall(self.searcher, query, k, agent)  # type: ignore[return-value]

    def boot_context(self, budget_chars: int = DEFAULT_BUDGET_CHARS, agent: str | None = None,
                     query: str | None = None) -> BootContext:
        return boot_context(self.searcher, budget_chars, agent, query,  # type: ignore[return-value]
                            self.indexer.registry.classify_text)

    def get(self, path: str, from_line: int = 1, lines: int | None = None, max_chars: int | None = None,
            agent: str | None = None) -> Page:
        return read_memory(self.indexer.collections, path, from_line, lines,  # type: ignore[return-value]
                           DEFAULT_MAX_CHARS if max_chars is None else max_chars, agent,
                           self.indexer.registry.classify_text)


def create_app(indexer: Indexer) -> FastAPI:
    """The API app over an opened ``indexer``, with the MCP tools at ``/mcp``. ``/mcp`` is a route of this app,
    so middleware added to the app wraps it too; it needs the app's lifespan to run, once (uvicorn
    ``lifespan="on"``, or ``with TestClient(app)``); a request without it is a 500."""
    from indexer.mcp import build_server

    memory = LocalMemory(indexer)
    mcp_server = build_server(memory)
    # stateless: every POST carries a whole exchange, so nothing is held between calls and JSON answers suffice.
    # host: the SDK's own Host/Origin check against DNS rebinding is on for a loopback bind.
    mcp_http = mcp_server.streamable_http_app(stateless_http=True, json_response=True, host=indexer.settings.host)
    app = FastAPI(title="qmd-indexer", version=__version__, summary="Semantic search over an agent's memory files",
                  lifespan=lambda _app: mcp_server.session_manager.run())
    app.router.routes.extend(mcp_http.routes)  # the /mcp route itself, not a sub-app: no redirect, same middleware

    @app.get("/health")
    def health() -> Health:
        return memory.health()

    @app.get("/status")
    def status() -> Status:
        return memory.status()

    @app.post("/search", responses=_errors(400, 404, 503))
    def search(body: SearchRequest) -> SearchResponse:
        request = body.model_dump()
        wait_s = request.pop("wait_s")
        if wait_s:
            indexer.wait_pending(body.agent, wait_s)
        return {"hits": _answer(lambda: memory.search(**request)), "pending": indexer.pending(body.agent)}

    @app.post("/recall", responses=_errors(404, 503))
    def recall_(body: RecallRequest) -> SearchResponse:
        return {"hits": _answer(lambda: memory.recall(body.query, body.k, body.agent)),
                "pending": indexer.pending(body.agent)}

    @app.post("/boot", responses=_errors(400, 404, 503))
    def boot(body: BootRequest) -> BootContext:
        context = _answer(lambda: memory.boot_context(body.budget_chars, body.agent, body.query))
        return {**context, "pending": indexer.pending(body.agent)}

    @app.get("/get", responses=_errors(400, 403, 404))
    def get(path: str = Query(description="A memory file, workspace-relative (or absolute inside it)."),
            agent: str | None = Query(default=None, description="Whose workspace `path` is relative to."),
            from_: int = Query(default=1, alias="from", description="First line to read (1-based)."),
            lines: int | None = Query(default=None, description="At most this many lines."),
            max_chars: int = Query(default=DEFAULT_MAX_CHARS, description="At most this many characters.")) -> Page:
        return _answer(lambda: memory.get(path, from_, lines, max_chars, agent))

    return app
