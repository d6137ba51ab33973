"""The daemon's HTTP API on 127.0.0.1 (FastAPI, served by uvicorn): the only way to query an embedded store,
which one process at a time can hold.

=========  ===========  ==========================================================================================
method     path         answer
=========  ===========  ==========================================================================================
GET        /health      ``{"status": "ok", "ready": bool}``; ``ready`` once the first full index has finished
GET        /status      ``Indexer.status()``: per-collection files and chunks, ``queue_depth``, embeddings since start
POST       /search      body ``SearchBody``; ``{"hits": [hit, ...]}`` (see ``indexer.search``)
POST       /recall      body ``RecallBody``; ``{"hits": [...]}``; query ``*``/``all``/empty lists every memory file
POST       /boot        body ``BootBody``; the boot context (see ``indexer.recall.boot_context``)
GET        /get         ``?path=&agent=&from=1&lines=&max_chars=``: a page of one memory file (``read_memory``)
=========  ===========  ==========================================================================================

Limits: request bodies ``MAX_BODY_BYTES`` (1 MiB, else 413), queries ``MAX_QUERY_CHARS`` characters (else 400); a
page of ``/get`` holds at most ``MAX_PAGE_CHARS`` characters and ``MAX_PAGE_LINES`` lines whatever ``max_chars``
and ``lines`` ask (it is then ``truncated`` with ``next_from``).

Agent scope: a request without ``agent`` (or with ``""``) is scoped to ``default_agent`` when configured, else to
the only agent; with several agents and no ``default_agent`` it is refused (400 naming the agents).

Every request passes ``indexer.guard.Guard`` first (Host, Origin, bearer token, body size). Errors are JSON
``{"detail": "..."}`` with 400 (bad parameters, no agent where several exist), 401 (token missing or wrong), 403
(not a memory file: traversal, symlink...; permission denied; a foreign Host or Origin), 404 (unknown agent or
collection, missing file), 413 (body too large) or 503 (Qdrant unreachable). OpenAPI docs at ``/docs``.
"""

from __future__ import annotations

from typing import Any, Literal

from collections.abc import Callable

import structlog
from fastapi import FastAPI, HTTPException, Query
from pydantic import BaseModel, Field

from indexer.daemon import Indexer
from indexer.errors import ReadRefused, StoreUnavailable
from indexer.guard import Guard
from indexer.recall import DEFAULT_MAX_CHARS, boot_context, read_memory, recall
from indexer.search import SearchParams, Searcher


log = structlog.get_logger("qmd_indexer.api")

MAX_QUERY_CHARS = 10_000  # a query longer than a page of text is a mistake or an attack
MAX_PAGE_CHARS = 100_000  # characters of one /get page, whatever max_chars asks
MAX_PAGE_LINES = 10_000  # lines of one /get page, whatever lines asks


class SearchBody(BaseModel):
    """``POST /search``: ``collection`` may be one name or several."""

    query: str
    k: int = Field(default=6, ge=1, le=1000)
    agent: str | None = None
    collection: list[str] | str | None = None
    mode: Literal["hybrid", "dense", "keyword"] | None = None
    path_prefix: str | None = None
    kind: list[str] | str | None = None
    min_score: float | None = None


class RecallBody(BaseModel):
    """``POST /recall``."""

    query: str = ""
    top_k: int = Field(default=6, ge=1, le=10_000)
    agent: str | None = None


class BootBody(BaseModel):
    """``POST /boot``: ``budget_chars`` in characters."""

    budget_chars: int = Field(default=4000, ge=1, le=1_000_000)
    agent: str | None = None
    query: str | None = None


def _answer(call: Callable[[], Any], path: str | None = None) -> Any:
    """Run ``call``, turning our errors into HTTP errors; ``path`` is the file asked for, if any (for the log)."""
    try:
        return call()
    except ReadRefused as exc:
        raise HTTPException(status_code=403, detail=str(exc)) from None
    except PermissionError:
        log.warning("read_refused", path=path, reason="permission_denied")
        raise HTTPException(status_code=403, detail="permission denied") from None
    except (KeyError, FileNotFoundError, NotADirectoryError) as exc:
        detail = exc.args[0] if isinstance(exc, KeyError) else f"no such file: {path or exc.filename or exc}"
        raise HTTPException(status_code=404, detail=str(detail)) from None
    except ValueError as exc:
        raise HTTPException(status_code=400, detail=str(exc)) from None
    except StoreUnavailable as exc:
        raise HTTPException(status_code=503, detail=str(exc)) from None
    except OSError as exc:  # a name too long, a directory given as a file...: the request's fault
        raise HTTPException(status_code=400, detail=f"cannot read {path}: {exc.strerror or exc}") from None


def _check_query(query: str | None) -> None:
    if query is not None and len(query) > MAX_QUERY_CHARS:
        raise HTTPException(status_code=400, detail=f"query is {len(query)} characters; the limit is "
                                                    f"{MAX_QUERY_CHARS}")


def scope_agent(indexer: Indexer, agent: str | None) -> str | None:
    """The agent a request is about: ``agent`` when given, else the configured ``default_agent``, else the only
    agent. Raises a 400 ``HTTPException`` naming the agents when several are configured and none applies, so an
    unscoped request never spans agents (fail closed)."""
    if agent:
        return agent
    if indexer.settings.default_agent:
        return indexer.settings.default_agent
    agents = list(dict.fromkeys(c.agent for c in indexer.collections))
    if len(agents) <= 1:
        return agents[0] if agents else None
    raise HTTPException(status_code=400, detail=f"several agents are configured ({', '.join(agents)}): name one "
                                                f"with agent, or set default_agent in the config")


def _as_tuple(value: list[str] | str | None) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


def make_searcher(indexer: Indexer) -> Searcher:
    """A ``Searcher`` over the indexer's collections, store and embedders, with the configured defaults."""
    s = indexer.settings
    assert indexer.pipeline is not None and indexer.store is not None and indexer.registry is not None
    return Searcher(indexer.collections, indexer.store, indexer.registry.embedders, indexer.pipeline.bm25,
                    mode=s.search_mode, fusion=s.fusion, rrf_k=s.rrf_k, prefetch_limit=s.prefetch_limit,
                    min_scores={"image": s.image_min_score})


def create_app(indexer: Indexer) -> FastAPI:
    """The API app over an opened ``indexer``."""
    app = FastAPI(title="qmd-indexer", version="0.1.0", summary="Semantic search over an agent's memory files")
    settings = indexer.settings
    app.add_middleware(Guard, host=settings.host, port=settings.port, token=settings.token)
    searcher = make_searcher(indexer)

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "ready": indexer.ready.is_set()}

    @app.get("/status")
    def status() -> dict[str, Any]:
        return {**indexer.status(), "bind": f"{settings.host}:{settings.port}"}

    @app.post("/search")
    def search(body: SearchBody) -> dict[str, Any]:
        _check_query(body.query)
        params = SearchParams(body.query, body.k, scope_agent(indexer, body.agent), _as_tuple(body.collection),
                              body.mode, body.path_prefix, _as_tuple(body.kind), body.min_score)
        return {"hits": _answer(lambda: searcher.search(params))}

    @app.post("/recall")
    def recall_(body: RecallBody) -> dict[str, Any]:
        _check_query(body.query)
        agent = scope_agent(indexer, body.agent)
        return {"hits": _answer(lambda: recall(searcher, body.query, body.top_k, agent))}

    @app.post("/boot")
    def boot(body: BootBody) -> dict[str, Any]:
        _check_query(body.query)
        agent = scope_agent(indexer, body.agent)
        return _answer(lambda: boot_context(searcher, body.budget_chars, agent, body.query,
                                            indexer.registry.classify))

    @app.get("/get")
    def get(path: str = Query(description="workspace-relative (or absolute) path of a memory file",
                              examples=["MEMORY.md", "memory/2026-11-27.md", "memory/link.md", "../outside.md"]),
            agent: str | None = None, from_: int = Query(default=1, alias="from"),
            lines: int | None = Query(default=None, description=f"at most this many lines; capped at {MAX_PAGE_LINES}"),
            max_chars: int = Query(default=DEFAULT_MAX_CHARS,
                                   description=f"at most this many characters; capped at {MAX_PAGE_CHARS}")
            ) -> dict[str, Any]:
        """A page of one memory file. Pages are capped at ``MAX_PAGE_CHARS`` characters and ``MAX_PAGE_LINES``
        lines; a bigger ask gets a capped page, ``truncated`` with ``next_from``."""
        scoped = scope_agent(indexer, agent)
        page_lines = min(lines, MAX_PAGE_LINES) if lines is not None else MAX_PAGE_LINES
        return _answer(lambda: read_memory(indexer.collections, path, from_, page_lines,
                                           min(max_chars, MAX_PAGE_CHARS), scoped, indexer.registry.classify),
                       path=path)

    return app
