"""The daemon's parts and its whole-index operations: ``Indexer.open`` builds one (plugins loaded, store and cache
open, collections connected); ``connect`` opens the planned collections and reads what is indexed; ``scan`` walks
them (a reconcile, once ready); ``rebuild`` fills new collections beside the live ones and swaps them in.

Who owns what:

- ``IndexState`` (``indexer.state``): the plan (settings + collections, swapped whole by a reload) and what is
  indexed; changed only by the worker thread, through its methods.
- ``Sync`` (``indexer.sync``): prepare -> embed -> points -> write for one batch; the only caller of the pipeline
  and the only writer of points.
- ``StatusView`` (``indexer.report``): what the API, MCP, ``/metrics`` and ``status`` read; never writes.
- the worker (``indexer.worker``): the one thread that drives all of it: ``worker.run(indexer, stop)``
  (``qmd-indexer run``, through ``indexer.service.serve``) or ``worker.index_once(indexer)`` (``index --once``).

A file event's walk runs one way: watcher -> ``Settler`` (debounce) -> worker -> ``Sync`` -> ``Pipeline`` (and its
collection's reader, ``indexer.sources``) -> ``Store``.

Recovery is not a step: the store's payloads say which content hash each file was indexed at and whether all its
points were written (``chunk_count``), so after a crash or ``SIGKILL`` the next scan redoes exactly the files whose
points are missing, mixed or stale; deterministic point ids make redoing idempotent.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path

import structlog

from indexer import report
from indexer.bm25 import Bm25Terms
from indexer.cache import EmbeddingCache
from indexer.config import Settings
from indexer.errors import CollectionMismatch
from indexer.metrics import Metrics
from indexer.pipeline import Pipeline
from indexer.plugins import Registry, load_registry, plugin_configs
from indexer.rebuild import attest, check_identity, daemon_options, rebuild_beside
from indexer.rename import placed
from indexer.report import StatusView
from indexer.sources import reader
from indexer.sources.base import unchanged_by_stat
from indexer.state import NO_DRIFT, Indexed, IndexState, Plan
from indexer.statedir import attestations, edge_store, embedding_cache, hold_state_lock
from indexer.store import Store, open_store
from indexer.sync import Pace, Sync
from indexer.walk import missing_workspaces, overlaps, walk_paths
from indexer.watcher import Settler
from indexer.workspace import Collection

log = structlog.get_logger("qmd_indexer.daemon")


class Indexer:
    """The parts of one daemon (or one ``index --once``); see the module for who owns what.

    Build it with ``Indexer.open``; ``__init__`` takes the parts already made. ``clock`` drives the debounce
    (seconds, monotonic); ``polling`` makes the watcher poll instead of using inotify. ``reindex`` asks for a
    ``rebuild()`` (the worker runs it once connected).
    """

    def __init__(self, settings: Settings, registry: Registry, store: Store, cache: EmbeddingCache,
                 terms: Bm25Terms, clock: Callable[[], float] = time.monotonic, polling: bool = False,
                 reindex: bool = False) -> None:
        self.store, self.terms, self.polling, self._cache = store, terms, polling, cache
        self.state = IndexState(Plan.of(settings))
        self.pipeline = Pipeline(registry, cache, settings.max_file_bytes, terms, settings)
        self.settler = Settler(settings.settle_s, clock, settings.settle_max_s)  # debounce queue
        self.metrics = Metrics()  # GET /metrics
        self.view = StatusView(self.state, self.settler, store, self.pipeline, terms, self.metrics)
        self.sync = Sync(self.state, self.pipeline, store, self.metrics)
        if reindex:
            self.state.rebuild_requested.set()

    @property
    def registry(self) -> Registry:
        """The loaded plugins: the pipeline's, their one holder (a reload that finds new ones swaps them there)."""
        return self.pipeline.registry

    @property
    def settings(self) -> Settings:
        """The settings of the current plan."""
        return self.state.plan.settings

    @property
    def collections(self) -> tuple[Collection, ...]:
        """The collections of the current plan."""
        return self.state.plan.collections

    @classmethod
    def open(cls, settings: Settings, registry: Registry | None = None, store: Store | None = None,
             reindex: bool = False, connect: bool = True, terms: Bm25Terms | None = None,
             polling: bool = False) -> Indexer:
        """An ``Indexer`` ready to use: plugins loaded (unless ``registry`` is given: tests share one model), the
        store (unless given) and the embedding cache opened under ``settings.state_dir``; with ``connect``, also
        ``connect()``-ed to its collections (``reindex`` asks the worker for a rebuild). ``terms``: the BM25
        term builder (``None``: the product's).

        Raises ``StoreLocked`` when another process holds the state dir (``hold_state_lock``), ``StateReadOnly``
        when it is read-only, ``ConfigError`` for conflicting plugins, ``PluginError`` without a text embedder (or when
        the one ``prefer.text`` chooses failed to load),
        ``OSError`` when the state directory cannot be used, and what ``connect`` raises.
        """
        hold_state_lock(settings.state_dir)  # first: nothing is created before the lock is ours
        if registry is None:
            registry = load_registry(settings.plugins, plugin_configs(settings), settings.prefer,
                                     reranker=settings.reranker)
            registry.check_text_choice(settings.prefer)
        registry.check_multimodal({w.agent: w.multimodal.modalities for w in settings.workspace
                                   if w.multimodal.enabled})
        if store is None:
            store = open_store(edge_store(settings.state_dir), settings.qdrant_url, settings.qdrant_api_key,
                               daemon_options(settings, registry.embedders), settings.state_min_free_bytes)
        cache = EmbeddingCache(embedding_cache(settings.state_dir))
        indexer = cls(settings, registry, store, cache, terms if terms is not None else Bm25Terms(settings.bm25),
                      polling=polling, reindex=reindex)
        for overlap in overlaps(indexer.collections):
            log.warning("workspaces_overlap", detail=overlap)
        if connect:
            indexer.connect()
        return indexer

    def connect(self, plan: Plan | None = None) -> None:
        """Sweep what an interrupted rebuild left, create or check every collection of ``plan`` (the current one by
        default) and read what is indexed; then run ``plan``. A new plan (a reload) becomes visible to searches only
        once its collections exist, so an agent it adds is unknown (404) until then, never an error.

        Raises ``CollectionMismatch`` when a collection was built for another model (unless a rebuild is requested:
        the rebuild replaces it), ``StoreUnavailable`` when Qdrant cannot be reached (or the embedded store is held
        by another process); the running plan is then unchanged.
        """
        state = self.state
        plan = plan or Plan.of(state.plan.settings)  # whole again: an agent refused before may be claimed now
        plan = placed(self.store, plan, self.pipeline.dense_dims())  # layout settled, agents claimed, names moved
        check_identity(plan.settings, [c.name for c in plan.collections], self.registry.embedders,
                       state.rebuild_requested)
        dims = self.pipeline.dense_dims()
        indexed: dict[str, Indexed] = {}
        for collection in plan.collections:
            swept = self.store.sweep(collection.name)
            if swept:
                log.info("rebuild_leftovers_swept", collection=collection.name, swept=swept)
            try:
                self.store.ensure_collection(collection.name, dims)
            except CollectionMismatch as exc:
                if not state.rebuild_requested.is_set():
                    raise
                log.warning("collection_replaced_by_rebuild", collection=collection.name, reason=str(exc))
                continue
            # what the reader keeps in the store (a transcript's tail) read back, so a restart reads what was appended
            states = reader(collection).restore(self.store, collection.name, self.store.file_states(collection.name),
                                                self.state.indexed)
            for abs_path, file_state in states.items():
                indexed[abs_path] = Indexed(collection.name, file_state)
        state.swap_plan(plan)
        state.reset(indexed)
        state.connected.set()
        self._attest()
        log.info("store_opened", backend=self.store.kind, collections=[c.name for c in plan.collections],
                 files=len(indexed))

    def close(self) -> None:
        """Stop the watcher, flush and close the store, close the cache and the plugins' connections. A store or
        cache that cannot be written now (a read-only state dir) is logged (``store_close_failed``,
        ``cache_close_failed``), not raised: what was written stays, and the next start's scan redoes what is
        missing."""
        if self.state.watcher:
            self.state.watcher.stop()
        try:
            self.store.flush()
            self.store.close()
        except Exception as exc:
            log.error("store_close_failed", error=f"{type(exc).__name__}: {exc}"[:500],
                      hint="the next start reconciles what was not written")
        try:
            self._cache.close()
        except Exception as exc:
            log.error("cache_close_failed", error=f"{type(exc).__name__}: {exc}"[:500])
        registry = self.pipeline.registry  # remote plugins' connections (reopened by their next request)
        for plugin in [*registry.embedders.values(), registry.reranker]:
            with contextlib.suppress(Exception):
                getattr(plugin, "close", lambda: None)()

    def _attest(self) -> bool:
        """``rebuild.attest`` the workspaces; the files of one whose path now names another directory lose the
        stat shortcut, so each is re-hashed once instead of trusting sizes and mtimes that may match by accident
        (unchanged text still costs no embedding). True if any changed."""
        changed = attest(self.settings.workspace, attestations(self.settings.state_dir))
        for ws in changed:
            self.state.unstat_under(str(ws.path).rstrip("/") + "/")
        return bool(changed)

    # -- scanning -----------------------------------------------------------------------------------------------
    def scan(self, reason: str = "periodic", reconcile: bool = True) -> list[Path]:
        """Walk every collection's roots; delete points of files no longer memory; return the paths to check. Once
        ready, a scan is a reconcile, for ``reason`` (``periodic``, ``queue_overflow``...), unless ``reconcile`` is
        false (after a config reload): it records as drift what it found the watcher had missed (files not indexed,
        indexed files gone, files changed since indexed; a path still pending behind the debounce is not missed).
        The scan before ready is recorded as the first reconcile (reason ``start``), with no drift.
        Files indexed whole whose ``lstat`` is what they were indexed at are not returned. Raises
        ``StoreUnavailable`` when a delete found the store so."""
        started, state = time.monotonic(), self.state
        if self._attest() and state.watcher is not None:  # the old watches follow the old directory
            state.watcher.refresh()
        found, skips, stats = walk_paths(self.collections)
        self.sync.report_skips(skips)
        problems = report.problems(state, skips)
        on_disk = {path for _, path in found}
        indexed = state.indexed
        away = tuple(missing_workspaces(self.collections))  # their files keep their points (``workspace_missing``)
        gone = {p for p in indexed.keys() - on_disk if not p.startswith(away)}
        if reconcile and state.ready.is_set():  # a reconcile: what it finds is what the watcher missed
            pending = {str(p) for p in [*self.settler.paths(), *state.hand]}
            drift = {"not_indexed": len(on_disk - indexed.keys() - state.ledger.marks.keys() - pending),
                     "gone": len(gone - pending),
                     "changed": sum(report.changed(state, p) for p in (on_disk & indexed.keys()) - pending)}
            state.record_reconcile(drift, reason)
            if any(drift.values()):
                log.warning("reconcile_drift", **drift, reason=reason,
                            hint="the watcher missed these; indexing them now")
        elif reconcile:  # the start's scan compares disk and index too; what changed while down is not drift
            state.record_reconcile(NO_DRIFT, "start")
        for abs_path in gone:
            self.sync.remove(abs_path, reason="gone")
        state.ledger.keep_only(on_disk | {str(s.path) for s in skips})  # gone, or no longer a candidate
        to_check = [Path(path) for collection, path in found
                    if not self._unchanged(collection, path, stats[path])]
        state.record_scan(time.monotonic() - started, problems)
        return to_check

    def _unchanged(self, collection: Collection, path: str, st: os.stat_result) -> bool:
        """Whether ``path``, found by the walk for ``collection`` with ``lstat`` result ``st``, is indexed there
        whole at that stat: then nothing is queued for it (the walk never enters a symlink, so the path is as safe
        as when indexed). A file past its source's retention (``Reader.expired``) is queued, to lose its points."""
        entry = self.state.indexed.get(path)
        return (entry is not None and entry.collection == collection.name
                and unchanged_by_stat(entry.state, st, self.pipeline.redactor(collection).version)
                and not reader(collection).expired(collection, st))

    # -- rebuilding ---------------------------------------------------------------------------------------------
    def rebuild(self, pace: Pace | None = None) -> bool:
        """``indexer.rebuild.rebuild_beside`` this daemon's collections (the worker calls it, with its ``Pace``)."""
        return rebuild_beside(self, pace)
