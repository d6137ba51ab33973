"""The daemon's HTTP API on 127.0.0.1 (FastAPI, served by uvicorn): the only way to query an embedded store,
which one process at a time can hold.

=========  ===========  ==========================================================================================
method     path         answer
=========  ===========  ==========================================================================================
GET        /health      ``{"status": "ok", "ready": bool}``; ``ready`` once the first full index has finished
GET        /status      ``Indexer.status()``: per-collection files and chunks, ``queue_depth``, embeddings since start
POST       /search      body ``SearchBody``; ``{"hits": [hit, ...], "relevant": bool | null}`` (see ``indexer.search``;
                        ``relevant`` is false when no hit clears the ``relevance_floor``: "nothing relevant")
POST       /recall      body ``RecallBody``; ``{"hits": [...]}``; query ``*``/``all``/empty lists every memory file
POST       /boot        body ``BootBody``; the boot context (see ``indexer.recall.boot_context``)
GET        /get         ``?path=&agent=&from=1&lines=&max_chars=``: a page of one memory file (``read_memory``)
=========  ===========  ==========================================================================================

Errors are JSON ``{"detail": "..."}`` with 400 (bad parameters), 403 (not a memory file: traversal, symlink...),
404 (unknown agent or collection, missing file) or 503 (Qdrant unreachable). OpenAPI docs at ``/docs``.
"""

from __future__ import annotations

from typing import Any, Literal

from collections.abc import Callable

from fastapi import FastAPI, HTTPException, Query
from pydantic import BaseModel, Field

from indexer.daemon import Indexer
from indexer.errors import ReadRefused, StoreUnavailable
from indexer.recall import DEFAULT_MAX_CHARS, boot_context, read_memory, recall
from indexer.search import SearchParams, Searcher, relevant


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


def _answer(call: Callable[[], Any]) -> Any:
    """Run ``call``, turning our errors into HTTP errors."""
    try:
        return call()
    except ReadRefused as exc:
        raise HTTPException(status_code=403, detail=str(exc)) from None
    except (KeyError, FileNotFoundError) as exc:
        detail = exc.args[0] if isinstance(exc, KeyError) else f"no such file: {exc.filename or exc}"
        raise HTTPException(status_code=404, detail=str(detail)) from None
    except ValueError as exc:
        raise HTTPException(status_code=400, detail=str(exc)) from None
    except StoreUnavailable as exc:
        raise HTTPException(status_code=503, detail=str(exc)) from None


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
                    min_scores={"image": s.image_min_score}, mmr_lambda=s.mmr_lambda,
                    half_life_days=s.temporal_half_life_days)


def create_app(indexer: Indexer) -> FastAPI:
    """The API app over an opened ``indexer``."""
    app = FastAPI(title="qmd-indexer", version="0.1.0", summary="Semantic search over an agent's memory files")
    searcher = make_searcher(indexer)

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "ready": indexer.ready.is_set()}

    @app.get("/status")
    def status() -> dict[str, Any]:
        return indexer.status()

    @app.post("/search")
    def search(body: SearchBody) -> dict[str, Any]:
        params = SearchParams(body.query, body.k, body.agent, _as_tuple(body.collection), body.mode,
                              body.path_prefix, _as_tuple(body.kind), body.min_score)
        hits = _answer(lambda: searcher.search(params))
        return {"hits": hits, "relevant": relevant(hits, indexer.settings.relevance_floor)}

    @app.post("/recall")
    def recall_(body: RecallBody) -> dict[str, Any]:
        return {"hits": _answer(lambda: recall(searcher, body.query, body.top_k, body.agent))}

    @app.post("/boot")
    def boot(body: BootBody) -> dict[str, Any]:
        return _answer(lambda: boot_context(searcher, body.budget_chars, body.agent, body.query,
                                            indexer.registry.classify))

    @app.get("/get")
    def get(path: str, agent: str | None = None, from_: int = Query(default=1, alias="from"),
            lines: int | None = None, max_chars: int = DEFAULT_MAX_CHARS) -> dict[str, Any]:
        return _answer(lambda: read_memory(indexer.collections, path, from_, lines, max_chars, agent,
                                           indexer.registry.classify))

    return app
