"""An optional rerank stage: a cross-encoder scores (query, hit text) pairs for the first hits of the fused list.

``CrossEncoderReranker`` (the built-in plugin ``cross-encoder`` of the ``qmd_indexer.rerankers`` entry-point group)
wraps sentence-transformers' ``CrossEncoder``, loaded lazily and offline from ``model`` (a local directory; no
cross-encoder weights ship in any package here, so rerank is off unless the ``reranker`` setting names a plugin).
``rerank`` applies any ``indexer.api.Reranker`` and fails open: on an error, or when scoring took longer than
``budget_s``, the fused order is returned unchanged and ``RerankStats`` counts it (``status`` shows the counters), so
a slow or broken model never breaks a search.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from indexer.api import LazyModel, Reranker
from indexer.points import Hit
from indexer.schema import RerankStatus

__all__ = ["CrossEncoderReranker", "RerankStats", "Reranker", "rerank", "rerank_status"]

log = structlog.get_logger("qmd_indexer.rerank")


class CrossEncoderReranker:
    """The built-in reranker plugin ``cross-encoder``: a sentence-transformers ``CrossEncoder`` (one relevance logit
    per (query, text) pair) from ``config["model"]`` (a local model directory, ``~`` expanded, or a name already in
    the local Hugging Face cache), ``device`` (default ``cpu``) and ``batch_size`` (default 32). Raises
    ``ValueError`` without a model; the model loads on the first ``score`` (offline unless ``HF_HUB_OFFLINE`` says
    otherwise), which raises ``OSError`` while it is not on disk and loads it once it is."""

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        config = dict(config or {})
        if not config.get("model"):
            raise ValueError("the cross-encoder reranker needs `model` (a local model directory): set it in "
                             "[plugin.cross-encoder]")
        self.model_id = os.path.expanduser(str(config["model"]))
        self.device = str(config.get("device", "cpu"))
        self.batch_size = int(config.get("batch_size", 32))
        self._model: LazyModel[Any] = LazyModel(self._load)

    @property
    def model(self) -> Any:
        """The loaded ``CrossEncoder`` (loaded on first use; a failed load is tried again on the next)."""
        return self._model.get()

    def _load(self) -> Any:
        from indexer.model_loading import quiet_offline_hub

        quiet_offline_hub()
        from sentence_transformers import CrossEncoder

        return CrossEncoder(self.model_id, device=self.device)

    def score(self, query: str, texts: Sequence[str]) -> list[float]:
        scores = self.model.predict([(query, text) for text in texts], batch_size=self.batch_size,
                                    show_progress_bar=False, convert_to_numpy=True)
        return [float(s) for s in scores]


@dataclass
class RerankStats:
    """Counters for ``status``: searches reranked, and those that kept the fused order (``failed``: the reranker
    raised or answered the wrong number of scores; ``over_budget``: it took longer than the budget), with the last
    failure (``None`` once a rerank succeeds again)."""

    reranked: int = 0
    failed: int = 0
    over_budget: int = 0
    last_error: str | None = None


def rerank(hits: Sequence[Hit], query: str, reranker: Reranker, top_n: int, budget_s: float,
           stats: RerankStats, clock: Callable[[], float] = time.monotonic) -> list[Hit]:
    """The first ``top_n`` hits reordered by ``reranker``'s scores (which become their ``score``), the rest after
    them in fused order. Fails open: an exception, a wrong number of scores, or scoring slower than ``budget_s``
    seconds returns ``hits`` unchanged and counts it in ``stats``."""
    head, tail = list(hits[:top_n]), list(hits[top_n:])
    if len(head) < 2:
        return list(hits)
    started = clock()
    try:
        scores = reranker.score(query, [str(h.payload.get("text", "")) for h in head])
        if len(scores) != len(head):
            raise ValueError(f"{len(scores)} scores for {len(head)} texts")
    except Exception as exc:  # noqa: BLE001  (fail open: a plugin's failure must not fail the search)
        stats.failed += 1
        error = f"{type(exc).__name__}: {exc}"
        if error != stats.last_error:  # one line per distinct failure, not one per search
            log.warning("rerank_failed", model_id=getattr(reranker, "model_id", "?"), error=error,
                        hint="searches keep the fused order until it works; status counts them")
        stats.last_error = error
        return list(hits)
    if clock() - started > budget_s:
        stats.over_budget += 1
        log.warning("rerank_over_budget", seconds=round(clock() - started, 3), budget_s=budget_s)
        return list(hits)
    stats.reranked += 1
    stats.last_error = None
    order = sorted(range(len(head)), key=lambda i: -scores[i])
    return [Hit(head[i].id, scores[i], head[i].payload) for i in order] + tail


def rerank_status(name: str, reranker: Reranker | None, top_n: int, budget_s: float,
                  stats: RerankStats) -> RerankStatus | None:
    """The ``rerank`` entry of ``status``: ``None`` when no reranker is configured (``name`` empty), else the
    configured plugin ``name``, its ``model_id`` (``None`` when the plugin failed to load: searches then keep the
    fused order; ``qmd-indexer plugins`` says why), ``top_n``, ``budget_s`` and the counters of ``stats``."""
    if not name:
        return None
    model_id = None if reranker is None else str(getattr(reranker, "model_id", "?"))
    return {"reranker": name, "model_id": model_id, "top_n": top_n, "budget_s": budget_s,
            "reranked": stats.reranked, "failed": stats.failed, "over_budget": stats.over_budget,
            "last_error": stats.last_error}
