"""An optional rerank stage: a cross-encoder scores (query, hit text) pairs for the first hits of the fused list.

Rerank is off unless the ``reranker`` setting names a plugin of the ``qmd_indexer.rerankers`` group (built in:
``cross-encoder``, ``indexer.builtin.cross_encoder``; ``http``, ``indexer.builtin.http_rerank``). ``rerank`` applies
any ``indexer.api.Reranker`` and fails open: on an error, or when scoring took longer than ``budget_s`` (handed to
the plugin as ``timeout_s`` when its ``score`` takes one, so a remote reranker stops waiting then:
``indexer.builtin.http_rerank``), the fused order is returned unchanged, the search's answer says so in ``degraded``
(``DEGRADED``) and ``RerankStats`` counts it (``status`` and ``/metrics`` show the counters), so a slow or broken
model never breaks a search.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog

from indexer.api import Reranker
from indexer.points import Hit
from indexer.status import RerankStatus

__all__ = ["DEGRADED", "RerankStats", "Reranker", "rerank", "rerank_status"]

#: the answer's ``degraded`` reason when the fused order was kept: the reranker took longer than its budget
#: (``"timeout"``) or failed (``"error"``)
DEGRADED = {"timeout": "fusion order: rerank timeout", "error": "fusion order: rerank error"}

log = structlog.get_logger("qmd_indexer.rerank")


@dataclass
class RerankStats:
    """Counters for ``status``: searches reranked, and those that kept the fused order (``failed``: the reranker
    raised or answered the wrong number of scores; ``over_budget``: it took longer than the budget), with the last
    failure (``None`` once a rerank succeeds again)."""

    reranked: int = 0
    failed: int = 0
    over_budget: int = 0
    last_error: str | None = None


def takes_timeout(reranker: Reranker) -> bool:
    """Whether ``reranker.score`` accepts the ``timeout_s`` keyword (a ``score(query, texts)`` of a plugin written
    before it existed does not)."""
    try:
        params = inspect.signature(reranker.score).parameters
    except (TypeError, ValueError):
        return False
    return "timeout_s" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def rerank(hits: Sequence[Hit], query: str, reranker: Reranker, top_n: int, budget_s: float,
           stats: RerankStats, clock: Callable[[], float] = time.monotonic,
           degraded: list[str] | None = None) -> list[Hit]:
    """The first ``top_n`` hits reordered by ``reranker``'s scores (which become their ``score``), the rest after
    them in fused order. ``budget_s`` is handed to ``reranker.score`` as ``timeout_s`` when it takes one
    (``takes_timeout``). Fails open: an exception, a wrong number of scores, or scoring slower than ``budget_s``
    seconds (a ``TimeoutError`` from the plugin, or the time taken) returns ``hits`` unchanged, counts it in
    ``stats`` (``failed`` or ``over_budget``) and appends the reason (``DEGRADED``) to ``degraded`` when given."""
    head, tail = list(hits[:top_n]), list(hits[top_n:])
    if len(head) < 2:
        return list(hits)
    texts = [str(h.payload.get("text", "")) for h in head]
    started = clock()
    try:
        if takes_timeout(reranker):
            scores = reranker.score(query, texts, timeout_s=budget_s)
        else:
            scores = reranker.score(query, texts)  # a plugin whose score has no timeout_s
        if len(scores) != len(head):
            raise ValueError(f"{len(scores)} scores for {len(head)} texts")
    except TimeoutError as exc:
        return _over_budget(hits, clock() - started, budget_s, stats, degraded, f"{exc}")
    except Exception as exc:  # noqa: BLE001  (fail open: a plugin's failure must not fail the search)
        stats.failed += 1
        error = f"{type(exc).__name__}: {exc}"
        if error != stats.last_error:  # one line per distinct failure, not one per search
            log.warning("rerank_failed", model_id=getattr(reranker, "model_id", "?"), error=error,
                        hint="searches keep the fused order until it works; status counts them")
        stats.last_error = error
        if degraded is not None:
            degraded.append(DEGRADED["error"])
        return list(hits)
    if clock() - started > budget_s:
        return _over_budget(hits, clock() - started, budget_s, stats, degraded)
    stats.reranked += 1
    stats.last_error = None
    order = sorted(range(len(head)), key=lambda i: -scores[i])
    return [Hit(head[i].id, scores[i], head[i].payload, rerank_score=scores[i]) for i in order] + tail


def _over_budget(hits: Sequence[Hit], seconds: float, budget_s: float, stats: RerankStats,
                 degraded: list[str] | None, error: str | None = None) -> list[Hit]:
    stats.over_budget += 1
    log.warning("rerank_over_budget", seconds=round(seconds, 3), budget_s=budget_s,
                **({"error": error} if error else {}))
    if degraded is not None:
        degraded.append(DEGRADED["timeout"])
    return list(hits)


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
