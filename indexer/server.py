"""The daemon's HTTP API on 127.0.0.1 (FastAPI, served by uvicorn): the only way to query an embedded store,
which one process at a time can hold.

=========  ===========  ==========================================================================================
method     path         answer
=========  ===========  ==========================================================================================
GET        /health      ``{"status": "ok", "ready": bool}``; ``ready`` once the first full index has finished
GET        /status      ``Indexer.status()``: per-collection files and chunks, ``queue_depth``, embeddings since start
POST       /search      body ``SearchBody``; ``{"hits": [hit, ...]}`` (see ``indexer.search``)
=========  ===========  ==========================================================================================

Errors are JSON ``{"detail": "..."}`` with 400 (bad parameters), 404 (unknown agent or collection) or 503
(Qdrant unreachable). OpenAPI docs at ``/docs``.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field

from indexer.daemon import Indexer
from indexer.errors import StoreUnavailable
from indexer.search import SearchParams, Searcher


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


def _as_tuple(value: list[str] | str | None) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


def make_searcher(indexer: Indexer) -> Searcher:
    """A ``Searcher`` over the indexer's collections, store and embedders, with the configured defaults."""
    s = indexer.settings
    assert indexer.pipeline is not None and indexer.store is not None and indexer.registry is not None
    return Searcher(indexer.collections, indexer.store, indexer.registry.embedders, indexer.pipeline.bm25,
                    mode=s.search_mode, fusion=s.fusion, rrf_k=s.rrf_k, prefetch_limit=s.prefetch_limit)


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
        try:
            return {"hits": searcher.search(params)}
        except KeyError as exc:
            raise HTTPException(status_code=404, detail=str(exc.args[0])) from None
        except ValueError as exc:
            raise HTTPException(status_code=400, detail=str(exc)) from None
        except StoreUnavailable as exc:
            raise HTTPException(status_code=503, detail=str(exc)) from None

    return app
