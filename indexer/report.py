"""What an ``Indexer`` reports: its counters (``GET /status``, ``qmd-indexer status``), its health (``GET /health``),
the files changed on disk and not yet indexed (``pending`` in every search answer; ``search --wait``), and what a
reconcile finds (``changed`` stat identities, the configured paths' ``problems``).

Each function reads the indexer's state and changes nothing (``problems`` logs what is new); ``Indexer.status``,
``health``, ``pending`` and ``scan`` call them.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

import structlog

from indexer.points import stat_identity
from indexer.rerank import rerank_status
from indexer.workspace import Problem, Skip, path_problems

if TYPE_CHECKING:
    from indexer.daemon import Indexer

log = structlog.get_logger("qmd_indexer.daemon")

MAX_WAIT_S = 10.0  # the longest a search waits for pending changes (``search --wait``)


def health(indexer: Indexer) -> str:
    """``"degraded"`` while the watcher is dead, the last reconcile found drift or store writes fail (a full state
    dir), else ``"ok"``."""
    watcher = indexer.watcher
    dead = watcher is not None and (watcher.dead or not watcher.alive())
    return "degraded" if dead or any(indexer.drift.values()) or indexer.store.degraded else "ok"


def pending(indexer: Indexer, agent: str | None = None) -> list[str]:
    """Workspace-relative paths (sorted, ``/`` separators) of ``agent``'s collections (every agent's when ``None``)
    changed on disk and not yet indexed: queued behind the debounce or in hand. A path that is not memory (outside
    every root) is left out; a deleted file still counts (its points are still served)."""
    out: set[str] = set()
    for path in [*indexer.settler.paths(), *indexer.hand]:
        for collection in indexer.collections:
            if agent is not None and collection.agent != agent:
                continue
            ws = collection.workspace.path
            inside = path.parent == ws if collection.role == "root" else (
                path == collection.root or collection.root in path.parents)
            if inside:
                try:
                    out.add(path.relative_to(ws).as_posix())
                except ValueError:
                    out.add(str(path))
                break
    return sorted(out)


def wait_pending(indexer: Indexer, agent: str | None, timeout_s: float) -> list[str]:
    """Wait up to ``timeout_s`` seconds (capped at ``MAX_WAIT_S``) until ``pending(indexer, agent)`` is empty;
    returns what is still pending."""
    deadline = time.monotonic() + min(max(timeout_s, 0.0), MAX_WAIT_S)
    still = pending(indexer, agent)
    while still and time.monotonic() < deadline:
        time.sleep(0.05)
        still = pending(indexer, agent)
    return still


def status(indexer: Indexer) -> dict[str, Any]:
    """Counters for ``qmd-indexer status``: per-collection files and chunks, queue, embeddings since start."""
    per: dict[str, dict[str, Any]] = {
        c.name: {"agent": c.agent, "role": c.role, "root": str(c.root), "files": 0, "chunks": 0}
        for c in indexer.collections
    }
    for entry in list(indexer.indexed.values()):
        if entry.collection in per:
            per[entry.collection]["files"] += 1
            per[entry.collection]["chunks"] += entry.state.points
    stats = indexer.pipeline.stats
    embedders = indexer.registry.embedders
    text = embedders.get("text")
    watcher, store, settings = indexer.watcher, indexer.store, indexer.settings
    return {
        "ready": indexer.ready.is_set(),
        "store_connected": indexer.connected.is_set(),
        "store_degraded": store.degraded,  # writes failing (being retried)
        "backend": store.kind,
        "state_dir": str(indexer.settings.state_dir),
        "uptime_s": round(time.time() - indexer.started_at, 1),
        "queue_depth": len(indexer.settler) + indexer.in_hand,
        "rebuilding": indexer.rebuilding or indexer.rebuild_requested.is_set(),
        "hnsw": {name: dict(build) for name, build in list(indexer.hnsw.items())},
        "models": {modality: {"model_id": e.model_id, "identity": getattr(e, "identity", e.model_id),
                              "precision": getattr(e, "precision", None)}
                   for modality, e in embedders.items()},
        "chunks_embedded": stats.chunks_embedded,
        "cache_hits": stats.cache_hits,
        "files_failed": indexer.ledger.files_failed,
        "last_scan_s": indexer.last_scan_s,
        # the precision the text embedder runs at (``precision = "auto"`` resolves per CPU), and its model_id
        # and, with int8, the ONNX file single queries run on (``query-v1.onnx``; ``model.onnx`` if unavailable)
        "embedding": {"model_id": text.model_id, "precision": getattr(text, "precision", None),
                      "query_file": getattr(text, "query_file", None)} if text else None,
        "watch": watcher.modes() if watcher is not None else {},
        "watch_polled": dict(watcher.poll_reasons) if watcher is not None else {},
        "last_reconcile": indexer.last_reconcile,
        "last_reconcile_reason": indexer.last_reconcile_reason,
        "recovered": sum(indexer.drift.values()),  # files the last reconcile found missed, indexed since
        "recovered_total": indexer.recovered_total,
        "drift": dict(indexer.drift),
        "rerank": rerank_status(settings.reranker, indexer.registry.configured_reranker(settings.reranker),
                                settings.rerank_top_n, settings.rerank_budget_s, indexer.rerank_stats),
        "problems": [{"kind": p.kind, "agent": p.agent, "path": str(p.path), "detail": p.detail}
                     for p in indexer.problems],
        "collections": per,
    }


def changed(indexer: Indexer, abs_path: str) -> bool:
    """Whether the stat identity of indexed ``abs_path`` differs from the one it was indexed at (-1: unknown);
    ``False`` when the file cannot be stat'ed (a reconcile counts it as gone instead)."""
    try:
        st = os.lstat(abs_path)
    except OSError:
        return False
    return any(was not in (-1, got) for was, got in zip(indexer.indexed[abs_path].state.identity(), stat_identity(st)))


def problems(indexer: Indexer, skips: list[Skip]) -> list[Problem]:
    """The configured paths not usable as meant, for ``status``: the extra paths' (``workspace.path_problems``; each
    logged once when it appears, and a missing one that appears is logged as ``extra_path_found``) and the
    directories the scan could not list (``skips``; logged by the ledger)."""
    current = path_problems(indexer.collections)
    for problem in current:
        if problem not in indexer.problems:
            log.warning(problem.kind, agent=problem.agent, path=str(problem.path), detail=problem.detail)
    for problem in indexer.problems:
        if problem.kind == "extra_path_missing" and problem not in current:
            log.info("extra_path_found", agent=problem.agent, path=str(problem.path))
    unreadable = []
    for skip in skips:
        if skip.reason == "unreadable_directory":
            agent = next((c.agent for c in indexer.collections if c.role != "root" and (
                skip.path == c.root or c.root in skip.path.parents)), "")
            unreadable.append(Problem(skip.reason, agent, skip.path, indexer.ledger.explain(skip.reason)))
    return current + unreadable
