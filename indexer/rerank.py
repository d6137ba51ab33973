"""An optional rerank stage: a cross-encoder scores (query, hit text) pairs for the first hits of the fused list.

``CrossEncoderReranker`` wraps sentence-transformers' ``CrossEncoder``, loaded lazily and offline from ``model`` (a
local directory; no cross-encoder weights ship in any package here, so it is off unless configured). ``rerank``
applies any reranker and fails open: on an error, or when scoring took longer than ``budget_s``, the fused order is
returned unchanged and ``RerankStats`` counts it, so a slow or broken model never breaks a search.

Meant to be registered as a plugin of a ``qmd_indexer.rerankers`` entry-point group: an object with ``model_id``
and ``score(query, texts) -> list[float]`` (higher is more relevant).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import structlog

from indexer.points import Hit

log = structlog.get_logger("qmd_indexer.rerank")


@runtime_checkable
class Reranker(Protocol):
    """Scores how well each text answers ``query``: ``score(query, texts)`` returns one float per text, higher is
    better; raises on failure (``rerank`` then keeps the fused order)."""

    model_id: str

    def score(self, query: str, texts: Sequence[str]) -> list[float]: ...


class CrossEncoderReranker:
    """A sentence-transformers ``CrossEncoder`` from ``config["model"]`` (local directory), ``device`` (default
    ``cpu``) and ``batch_size`` (default 32). Raises ``ValueError`` without a model; ``OSError`` on first use when
    the model is not on disk."""

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        config = dict(config or {})
        if not config.get("model"):
            raise ValueError("the cross-encoder reranker needs `model` (a local model directory)")
        self.model_id = str(config["model"])
        self.device = str(config.get("device", "cpu"))
        self.batch_size = int(config.get("batch_size", 32))
        self._model: Any = None
        self._lock = threading.Lock()

    @property
    def model(self) -> Any:
        if self._model is None:
            with self._lock:
                if self._model is None:
                    import os

                    os.environ.setdefault("HF_HUB_OFFLINE", "1")
                    from sentence_transformers import CrossEncoder

                    self._model = CrossEncoder(self.model_id, device=self.device)
        return self._model

    def score(self, query: str, texts: Sequence[str]) -> list[float]:
        scores = self.model.predict([(query, text) for text in texts], batch_size=self.batch_size,
                                    show_progress_bar=False, convert_to_numpy=True)
        return [float(s) for s in scores]


@dataclass
class RerankStats:
    """Counters for ``status``: searches reranked, and those that kept the fused order (error or over budget)."""

    reranked: int = 0
    failed: int = 0
    over_budget: int = 0


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
        log.warning("rerank_failed", model_id=getattr(reranker, "model_id", "?"),
                    error=f"{type(exc).__name__}: {exc}")
        return list(hits)
    if clock() - started > budget_s:
        stats.over_budget += 1
        log.warning("rerank_over_budget", seconds=round(clock() - started, 3), budget_s=budget_s)
        return list(hits)
    stats.reranked += 1
    order = sorted(range(len(head)), key=lambda i: -scores[i])
    return [Hit(head[i].id, scores[i], head[i].payload) for i in order] + tail
