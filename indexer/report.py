"""What an ``Indexer`` reports: its counters (``GET /status``, ``qmd-indexer status``), its health (``GET /health``)
and the files changed on disk and not yet indexed (``pending`` in every search answer; ``search --wait``).

Each function reads the indexer's state and changes nothing; ``Indexer.status``, ``health`` and ``pending`` call
them.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from indexer.daemon import Indexer

MAX_WAIT_S = 10.0  # the longest a search waits for pending changes (``search --wait``)


def health(indexer: Indexer) -> str:
    """``"degraded"`` while the watcher is dead or the last reconcile found drift, else ``"ok"``."""
    watcher = indexer.watcher
    dead = watcher is not None and (watcher.dead or not watcher.alive())
    return "degraded" if dead or any(indexer.drift.values()) else "ok"


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
    watcher, store = indexer.watcher, indexer.store
    return {
        "ready": indexer.ready.is_set(),
        "store_connected": indexer.connected.is_set(),
        "store_degraded": store.degraded,  # writes failing (being retried)
        "backend": store.kind,
        "state_dir": str(indexer.settings.state_dir),
        "uptime_s": round(time.time() - indexer.started_at, 1),
        "queue_depth": len(indexer.settler) + indexer.in_hand,
        "rebuilding": indexer.rebuilding or indexer.rebuild_requested.is_set(),
        "models": {modality: {"model_id": e.model_id, "identity": getattr(e, "identity", e.model_id),
                              "precision": getattr(e, "precision", None)}
                   for modality, e in embedders.items()},
        "chunks_embedded": stats.chunks_embedded,
        "cache_hits": stats.cache_hits,
        "files_failed": indexer.ledger.files_failed,
        "last_scan_s": indexer.last_scan_s,
        # the precision the text embedder runs at (``precision = "auto"`` resolves per CPU), and its model_id
        "embedding": {"model_id": text.model_id, "precision": getattr(text, "precision", None)} if text else None,
        "watch": watcher.modes() if watcher is not None else {},
        "watch_polled": dict(watcher.poll_reasons) if watcher is not None else {},
        "last_reconcile": indexer.last_reconcile,
        "drift": dict(indexer.drift),
        "collections": per,
    }
