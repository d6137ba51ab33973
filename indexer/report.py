"""What a daemon reports, read-only: ``StatusView`` is what the HTTP API, the MCP tools, ``/metrics`` and
``qmd-indexer status`` see of it: its counters (``GET /status``), health (``GET /health``), the files changed on disk
and not yet indexed (``pending`` in every search answer; ``search --wait``), a ``Searcher`` over the current plan,
and the one request a reader may make of the worker (``request_rebuild``, ``POST /reindex``).

It reads the ``IndexState`` (``indexer.state``) and the parts of the daemon; it changes nothing. ``changed`` and
``problems`` are what a reconcile reads (``Indexer.scan``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any, Literal

import structlog

from indexer.append import append_state
from indexer.arguments import MAX_WAIT_S
from indexer.bm25 import Bm25Terms
from indexer.calibration import Floor
from indexer.contract import EMBEDDERS, declared
from indexer.metrics import Metrics
from indexer.pipeline import Pipeline, Stats
from indexer.plugins import Registry
from indexer.points import stat_identity
from indexer.rerank import RerankStats, rerank_status
from indexer.schema import Indexing
from indexer.search import FallbackStats, Searcher
from indexer.sources import reader
from indexer.state import IndexState, Plan
from indexer.status import CollectionStatus, Health, SessionsStatus, Status
from indexer.store import Store
from indexer.walk import Problem, path_problems
from indexer.watcher import Settler
from indexer.workspace import Skip, select

log = structlog.get_logger("qmd_indexer.daemon")

FAILED_LISTED = 20  # the failing files ``status`` names (``failed_files``); ``files_failed`` counts them all


class StatusView:
    """A read-only view of one daemon (see the module). ``pipeline``: whose plugins (``registry``) and counters
    since start (``stats``) it reports; ``metrics``: the daemon's metrics (a reader records its searches there and
    serves the scrape)."""

    def __init__(self, state: IndexState, settler: Settler, store: Store, pipeline: Pipeline, terms: Bm25Terms,
                 metrics: Metrics) -> None:
        self.state, self.settler, self.store, self.pipeline = state, settler, store, pipeline
        self.terms, self.metrics = terms, metrics
        self.rerank_stats = RerankStats()  # shared by the searchers made here; ``status`` reports it
        self.fallback_stats = FallbackStats(metrics.error)  # searches answered from keyword search, likewise
        metrics.read_from(self)

    @property
    def registry(self) -> Registry:
        """The loaded plugins (the pipeline's: a reload that finds new ones swaps them there)."""
        return self.pipeline.registry

    @property
    def stats(self) -> Stats:
        return self.pipeline.stats

    @property
    def plan(self) -> Plan:
        """The plan the daemon runs now (a reload swaps it whole)."""
        return self.state.plan

    def ready(self) -> bool:
        """Whether the first full index has finished."""
        return self.state.ready.is_set()

    def searcher(self, plan: Plan | None = None, **overrides: Any) -> Searcher:
        """A ``Searcher`` over ``plan``'s collections (the current plan's by default) with the configured defaults
        (``Searcher.from_settings``; ``overrides`` replace any)."""
        plan = plan or self.plan
        return Searcher.from_settings(plan.settings, plan.collections, self.store, self.registry, self.terms,
                                      **{"rerank_stats": self.rerank_stats, "fallback_stats": self.fallback_stats,
                                         **overrides})

    def failures(self) -> dict[str, int]:
        """Files failed since start, by reason (the ledger's tally)."""
        return dict(self.state.ledger.failures)

    def request_rebuild(self) -> None:
        """Ask the worker to rebuild every collection beside the live one (``POST /reindex``); returns at once."""
        self.state.rebuild_requested.set()
        self.settler.wake()

    def health(self) -> Literal["ok", "degraded"]:
        """``"degraded"`` while any of ``health_reasons()`` holds, else ``"ok"``."""
        return "degraded" if self.health_reasons() else "ok"

    def health_reasons(self) -> list[str]:
        """Why the daemon is degraded, one short line per cause (empty when it is not): the watcher is dead, the last
        reconcile found drift, store writes fail (a full state dir), the state dir cannot be written (indexing waits),
        the embedder cannot answer (files wait, retried; or a search or an idle probe could not reach it), it answered
        vectors that cannot be stored (files failed with ``bad_vectors``), a model is still loading (searches answer
        from keyword search meanwhile), or a plugin meant to run failed to load (``Registry.failures``)."""
        watcher, reasons = self.state.watcher, []
        if watcher is not None and (watcher.dead or not watcher.alive()):
            reasons.append("file watcher is dead")
        drift = sum(self.state.reconcile.drift.values())
        if drift:
            reasons.append(f"last reconcile found {drift} file(s) the watcher had missed")
        if self.store.degraded:
            reasons.append("store writes are failing (retried)")
        for agent, other in sorted(self.store.refused_agents().items()):
            reasons.append(f"agent {agent!r} not served: another daemon ({other.by()}) holds it on this Qdrant server")
        if not self.state.writable:
            reasons.append("state dir not writable")
        outage = self.state.ledger.outage
        if outage.reason is not None:
            reasons.append(f"embedder unavailable: {outage.reason} ({len(outage.waiting)} file(s) waiting, retried)")
        else:  # nothing to index: what the last search (or an idle probe) met, where the embedder can tell
            for modality, embedder in sorted(self.registry.embedders.items()):
                unavailable = declared(EMBEDDERS, embedder, "unavailable")
                reason = unavailable() if unavailable is not None else None
                if reason:
                    reasons.append(f"embedder unavailable: {reason} ({modality}: searches answer from keyword search)")
        marks = self.state.ledger.marks
        bad = sorted(path for path, mark in list(marks.items()) if mark[3] == "bad_vectors")
        if bad:
            reasons.append(f"embedder answered bad vectors for {len(bad)} file(s), which keep their old points: "
                           f"{self.state.ledger.details.get(bad[0], '')[:200]}")
        if any(declared(EMBEDDERS, e, "loading") for e in self.registry.embedders.values()):
            reasons.append("model loading")
        reasons += self.registry.failures
        return reasons

    def health_answer(self) -> Health:
        """``GET /health``: ``status`` and ``ready``, ``reasons`` when degraded, and whether each agent takes appends
        now (``append``: on, off, or unavailable with why; ``indexer.append.append_state``)."""
        reasons = self.health_reasons()
        answer: Health = {"status": "degraded" if reasons else "ok", "ready": self.ready(),
                          "append": {ws.agent: append_state(ws) for ws in self.plan.settings.workspace}}
        if reasons:
            answer["reasons"] = reasons
        return answer

    def pending(self, agent: str | None = None) -> list[str]:
        """Workspace-relative paths (sorted, ``/`` separators) of ``agent``'s collections (every agent's when
        ``None``) changed on disk and not yet indexed: queued behind the debounce or in hand. A path that is not
        memory (outside every root) is left out; a deleted file still counts (its points are still served)."""
        out: set[str] = set()
        collections = self.plan.collections
        for path in [*self.settler.paths(), *self.state.hand]:
            for collection in collections:
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

    def wait_pending(self, agent: str | None, timeout_s: float) -> list[str]:
        """Wait up to ``timeout_s`` seconds (capped at ``MAX_WAIT_S``) until the first index has finished
        (``ready``) and ``pending(agent)`` is empty; returns what is still pending."""
        deadline = time.monotonic() + min(max(timeout_s, 0.0), MAX_WAIT_S)
        self.state.ready.wait(max(0.0, deadline - time.monotonic()))
        still = self.pending(agent)
        while still and time.monotonic() < deadline:
            time.sleep(0.05)
            still = self.pending(agent)
        return still

    def indexing(self, agent: str | None = None) -> Indexing | None:
        """``{"done", "total"}`` files of ``agent``'s collections (every agent's when ``None``) while the first
        index is being built: indexed so far, and indexed plus ``pending``; ``None`` once it has finished."""
        if self.ready():
            return None
        names = {c.name for c in select(self.plan.collections, agent)}
        done = sum(1 for entry in list(self.state.indexed.values()) if entry.collection in names)
        return {"done": done, "total": done + len(self.pending(agent))}

    def status(self) -> Status:
        """``GET /status``, ``qmd-indexer status``: per-collection files and chunks, per agent with a ``sessions``
        folder its sessions and their turns (``sessions``: from each transcript's ``Tail``, which chunk 0 stores, so
        a restart knows them without reading a transcript), queue, embeddings since start, watch modes, reconcile
        drift, the models, and the address the API listens on (``bind``)."""
        state, plan = self.state, self.plan
        per, sessions = self._counts()
        text = self.registry.embedders.get("text")
        watcher, store, settings, reconcile = state.watcher, self.store, plan.settings, state.reconcile
        return {
            "ready": state.ready.is_set(),
            "store_connected": state.connected.is_set(),
            "store_degraded": store.degraded,  # writes failing (being retried)
            "backend": store.kind,
            "tenancy": store.tenancy,  # a server's layout: collections, shared (auto until connected)
            "state_dir": str(settings.state_dir),
            "uptime_s": round(time.time() - state.started_at, 1),
            "queue_depth": len(self.settler) + len(state.hand),
            "rebuilding": state.rebuilding,
            "hnsw": {name: dict(build) for name, build in list(state.hnsw.items())},
            "embedder_unavailable": {"reason": state.ledger.outage.reason, "since": state.ledger.outage.since,
                                     "deferred": state.ledger.outage.deferred,
                                     "files_waiting": len(state.ledger.outage.waiting)},
            "search_fallback": self.fallback_stats.as_dict(),
            "models": self._models(),
            "chunks_embedded": self.stats.chunks_embedded,
            "cache_hits": self.stats.cache_hits,
            "files_failed": state.ledger.files_failed,
            "failed_files": state.ledger.failed(FAILED_LISTED),  # the first ones by path, each with its reason
            "files_skipped": state.ledger.skipped(),
            "last_scan_s": state.last_scan_s,
            # the precision the text embedder runs at (``precision = "auto"`` resolves per CPU), and its model_id
            # and, with int8, the ONNX file single queries run on (``query-v1.onnx``; ``model.onnx`` if unavailable)
            "embedding": {"model_id": text.model_id, "precision": declared(EMBEDDERS, text, "precision"),
                          "query_file": declared(EMBEDDERS, text, "query_file"),
                          "relevance_floor": _described(Floor(settings.relevance_floor, text, settings.state_dir))
                          } if text else None,
            "watch": watcher.modes() if watcher is not None else {},
            "watch_polled": dict(watcher.poll_reasons) if watcher is not None else {},
            "last_reconcile": reconcile.at,
            "last_reconcile_reason": reconcile.reason,
            "recovered": sum(reconcile.drift.values()),  # files the last reconcile found missed, indexed since
            "recovered_total": reconcile.recovered_total,
            "drift": dict(reconcile.drift),
            "rerank": rerank_status(settings.reranker, self.registry.configured_reranker(settings.reranker),
                                    settings.rerank_top_n, settings.rerank_budget_s, self.rerank_stats),
            # loaded plugins running without something (an extractor's ``notice``, e.g. OCR without Tesseract)
            "plugin_notices": {r.name: r.reason for r in self.registry.records if r.status == "loaded" and r.reason},
            "problems": [{"kind": p.kind, "agent": p.agent, "path": str(p.path), "detail": p.detail}
                         for p in state.problems],
            "plugin_errors": self.registry.failures,
            "bind": f"{settings.host}:{settings.port}",
            "collections": per,
            "sessions": sessions,
        }


    def _counts(self) -> tuple[dict[str, CollectionStatus], dict[str, SessionsStatus]]:
        """Files and chunks per collection of the plan; sessions and turns per agent with a ``sessions`` folder."""
        plan = self.plan
        per: dict[str, CollectionStatus] = {
            c.name: {"agent": c.agent, "role": c.role, "root": str(c.root), "files": 0, "chunks": 0}
            for c in plan.collections
        }
        of_sessions = {c.name: c.agent for c in plan.collections if reader(c).sessions}
        sessions: dict[str, SessionsStatus] = {agent: {"count": 0, "turns": 0} for agent in of_sessions.values()}
        for entry in list(self.state.indexed.values()):
            if entry.collection in per:
                per[entry.collection]["files"] += 1
                per[entry.collection]["chunks"] += entry.state.points
                if entry.collection in of_sessions:
                    counts, tail = sessions[of_sessions[entry.collection]], entry.state.tail
                    counts["count"] += 1
                    counts["turns"] += tail.turns if tail is not None else 0
        return per, sessions

    def _models(self) -> dict[str, Any]:
        """Per modality, the embedder's model id, identity, precision and, while it loads, ``{phase, percent}``."""
        return {modality: {"model_id": e.model_id, "identity": declared(EMBEDDERS, e, "identity") or e.model_id,
                           "precision": declared(EMBEDDERS, e, "precision"),
                           # while the model loads (a first start exports it too): {phase, percent}
                           **({"loading": p} if (p := declared(EMBEDDERS, e, "load_progress")) else {})}
                for modality, e in self.registry.embedders.items()}

def changed(state: IndexState, abs_path: str) -> bool:
    """Whether the stat identity of indexed ``abs_path`` differs from the one it was indexed at (-1: unknown);
    ``False`` when the file cannot be stat'ed (a reconcile counts it as gone instead)."""
    try:
        st = os.lstat(abs_path)
    except OSError:
        return False
    return any(was not in (-1, got) for was, got in zip(state.indexed[abs_path].state.identity(), stat_identity(st)))


#: what is logged when a missing path of that kind is there again
FOUND = {"extra_path_missing": "extra_path_found", "workspace_missing": "workspace_found"}


def problems(state: IndexState, skips: Sequence[Skip]) -> list[Problem]:
    """The configured paths not usable as meant, for ``status``: the workspaces' and extra paths'
    (``walk.path_problems``; each logged once when it appears, and a missing one that appears is logged as
    ``extra_path_found`` or ``workspace_found``) and the
    directories the scan could not list (``skips``; logged by the ledger)."""
    collections, known = state.plan.collections, state.problems
    current = path_problems(collections)
    for problem in current:
        if problem not in known:
            log.warning(problem.kind, agent=problem.agent, path=str(problem.path), detail=problem.detail)
    for problem in known:
        if problem.kind in FOUND and problem not in current:
            log.info(FOUND[problem.kind], agent=problem.agent, path=str(problem.path))
    unreadable = []
    for skip in skips:
        if skip.reason == "unreadable_directory":
            agent = next((c.agent for c in collections if c.role != "root" and (
                skip.path == c.root or c.root in skip.path.parents)), "")
            unreadable.append(Problem(skip.reason, agent, skip.path, state.ledger.explain(skip.reason)))
    return current + unreadable


def _described(floor: Floor) -> str | None:
    """``status``'s line for a searcher's relevance floor (``Calibration.describe``), ``None`` before the probe ran."""
    known = floor.known()
    return known.describe() if known is not None else None
