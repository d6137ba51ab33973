"""The indexing service's state and per-file orchestration: keeps every collection equal to the memory files on disk.

Data flows one way: watcher event or scan -> ``Settler`` -> worker -> ``Pipeline`` -> ``Store``. The worker (one
thread, ``indexer.worker``) is the only writer; the HTTP API only reads. ``Indexer.open(settings)`` builds one ready
to use (plugins loaded, store and cache open, collections connected); then either

- ``worker.run(indexer, stop)`` (``qmd-indexer run``, through ``indexer.service.serve``): watch, scan, index until
  ``stop`` is set, rescanning every ``rescan_interval_s`` (the watcher is a fast path, never the only path); or
- ``worker.index_once(indexer)`` (``qmd-indexer index --once``): scan and process everything, then return.

Rebuilds (``--reindex``, ``POST /reindex``, a model change) and each collection's model identity are
``indexer.rebuild``'s: the worker runs ``rebuild(indexer)``, which fills new collections beside the live ones and
swaps them in; ``connect()`` checks the identities and sweeps what an interrupted rebuild left. What the indexer
reports (status, health, pending files) is ``indexer.report``'s.

Recovery is not a step: the store's payloads say which content hash each file was indexed at and whether all its
points were written (``chunk_count``), so after a crash or ``SIGKILL`` the next scan redoes exactly the files whose
points are missing, mixed or stale; deterministic point ids make redoing idempotent.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import structlog

from indexer import report
from indexer.bm25 import Bm25Terms
from indexer.cache import EmbeddingCache
from indexer.config import Settings
from indexer.errors import (
    CollectionMismatch,
    EmbedError,
    ExtractError,
    FileSkipped,
    StateDirFull,
    StoreUnavailable,
)
from indexer.ledger import FAILURES, Ledger
from indexer.metrics import Metrics
from indexer.pipeline import Interrupted, Pipeline, Prepared, Unchanged, unchanged_by_stat
from indexer.plugins import Registry, load_registry, plugin_configs
from indexer.points import FileState
from indexer.rebuild import check_identity, hold_state_lock
from indexer.rerank import RerankStats
from indexer.search import Searcher
from indexer.store import ServerOptions, Store, open_store
from indexer.watcher import Settler, Watcher
from indexer.workspace import (
    Collection,
    Problem,
    Skip,
    attest,
    overlaps,
    plan_collections,
    route,
    walk_dir,
    walk_paths,
)

log = structlog.get_logger("qmd_indexer.daemon")

GROUP_CHUNKS = 256  # chunks embedded and written together; smaller files of a batch go first
RETRY_AFTER_S = 5.0  # a store found unreachable is tried again after this long (connecting, or a file's write)


@dataclass(slots=True)
class Indexed:
    """What the daemon knows is in the store for one file."""

    collection: str
    state: FileState


class Indexer:
    """The collections, store, pipeline and index state of one daemon (or one ``index --once``).

    Build it with ``Indexer.open``; ``__init__`` takes the parts already made. ``clock`` drives the debounce
    (seconds, monotonic); ``polling`` makes the watcher poll instead of using inotify. ``reindex`` asks for a
    ``rebuild.rebuild(indexer)`` (the worker runs it once connected).
    """

    def __init__(self, settings: Settings, registry: Registry, store: Store, cache: EmbeddingCache,
                 terms: Bm25Terms, clock: Callable[[], float] = time.monotonic, polling: bool = False,
                 reindex: bool = False) -> None:
        self.settings = settings
        self.collections: list[Collection] = plan_collections(settings.workspace, settings.collection_prefix)
        self.registry = registry
        self.store = store
        self.terms = terms
        self.pipeline = Pipeline(registry, cache, settings.max_file_bytes, terms)
        self.settler = Settler(settings.settle_s, clock, settings.settle_max_s)  # debounce queue
        self.polling = polling
        self.indexed: dict[str, Indexed] = {}
        self.ledger = Ledger()
        self.metrics = Metrics(self)  # GET /metrics
        self.ready = threading.Event()
        self.connected = threading.Event()
        self.stopping = threading.Event()  # set by the worker's stop event: embedding gives up between slices
        self.watcher: Watcher | None = None  # set by the worker while it runs
        self.started_at = time.time()
        self.last_scan_s: float | None = None
        self.in_hand = 0  # paths taken from the queue and not yet processed
        self.beat: Callable[[], None] = lambda: None  # called where the worker makes progress (systemd watchdog)
        self.hand: list[Path] = []  # those paths
        self.last_reconcile: float | None = None  # wall-clock time of the last scan once ready (a reconcile)
        self.drift = {"not_indexed": 0, "gone": 0, "changed": 0}  # what the last reconcile found the watcher missed
        self.last_reconcile_reason: str | None = None  # periodic, queue_overflow, watch_limit_reached...
        self.recovered_total = 0  # files all reconciles since start found missed (and so indexed or removed)
        self.problems: list[Problem] = []  # configured paths not usable as meant (``workspace.path_problems``)
        self._cache = cache
        self.rebuild_requested = threading.Event()  # the worker rebuilds every collection when it is set
        self.rerank_stats = RerankStats()  # shared by this daemon's searchers; ``status`` reports it
        self.rebuilding = False
        # HNSW builds of Edge collections (``worker.build_indexes``): name -> {"state", "points", "seconds"|"error"}
        self.hnsw: dict[str, dict[str, Any]] = {}
        if reindex:
            self.rebuild_requested.set()

    @classmethod
    def open(cls, settings: Settings, registry: Registry | None = None, store: Store | None = None,
             reindex: bool = False, connect: bool = True, terms: Bm25Terms | None = None,
             polling: bool = False) -> Indexer:
        """An ``Indexer`` ready to use: plugins loaded (unless ``registry`` is given: tests share one model), the
        store (unless given) and the embedding cache opened under ``settings.state_dir``; with ``connect``, also
        ``connect()``-ed to its collections (``reindex`` asks the worker for a rebuild). ``terms``: the BM25
        term builder (``None``: the product's).

        Raises ``StoreLocked`` when another process holds the state dir (``hold_state_lock``), ``StateReadOnly``
        when it is read-only, ``ConfigError`` for conflicting plugins, ``PluginError`` without a text embedder,
        ``OSError`` when the state directory cannot be used, and what ``connect`` raises.
        """
        hold_state_lock(settings.state_dir)  # first: nothing is created before the lock is ours
        if registry is None:
            registry = load_registry(settings.plugins, plugin_configs(settings), settings.prefer,
                                     reranker=settings.reranker)
        registry.check_multimodal({w.agent: w.multimodal.modalities for w in settings.workspace
                                   if w.multimodal.enabled})
        if store is None:
            store = open_store(settings.state_dir, settings.qdrant_url, settings.qdrant_api_key,
                               ServerOptions.from_settings(settings), settings.state_min_free_bytes)
        cache = EmbeddingCache(settings.state_dir / "embeddings.sqlite3")
        indexer = cls(settings, registry, store, cache, terms if terms is not None else Bm25Terms(settings.bm25),
                      polling=polling, reindex=reindex)
        for overlap in overlaps(indexer.collections):
            log.warning("workspaces_overlap", detail=overlap)
        if connect:
            indexer.connect()
        return indexer

    def connect(self) -> None:
        """Sweep what an interrupted rebuild left, create or check every collection and read what is indexed.

        Raises ``CollectionMismatch`` when a collection was built for another model (unless a rebuild is requested:
        the rebuild replaces it), ``StoreUnavailable`` when Qdrant cannot be reached (or the embedded store is held
        by another process).
        """
        check_identity(self)
        dims = self.pipeline.dense_dims()
        indexed: dict[str, Indexed] = {}
        for collection in self.collections:
            swept = self.store.sweep(collection.name)
            if swept:
                log.info("rebuild_leftovers_swept", collection=collection.name, swept=swept)
            try:
                self.store.ensure_collection(collection.name, dims)
            except CollectionMismatch as exc:
                if not self.rebuild_requested.is_set():
                    raise
                log.warning("collection_replaced_by_rebuild", collection=collection.name, reason=str(exc))
                continue
            for abs_path, state in self.store.file_states(collection.name).items():
                indexed[abs_path] = Indexed(collection.name, state)
        self.indexed = indexed
        self.connected.set()
        self._attest()
        log.info("store_opened", backend=self.store.kind, collections=[c.name for c in self.collections],
                 files=len(self.indexed))

    def close(self) -> None:
        """Stop the watcher, flush and close the store, close the cache."""
        if self.watcher:
            self.watcher.stop()
        self.store.flush()
        self.store.close()
        self._cache.close()

    def searcher(self, **overrides: Any) -> Searcher:
        """A ``Searcher`` over these collections with the configured defaults (``Searcher.from_settings``)."""
        return Searcher.from_settings(self.settings, self.collections, self.store, self.registry, self.terms,
                                      **{"rerank_stats": self.rerank_stats, **overrides})

    def _attest(self) -> bool:
        """``workspace.attest`` the workspaces; the files of one whose path now names another directory lose the
        stat shortcut, so each is re-hashed once instead of trusting sizes and mtimes that may match by accident
        (unchanged text still costs no embedding). True if any changed."""
        changed = attest(self.settings.workspace, self.settings.state_dir / "attestations.json")
        for ws in changed:
            prefix = str(ws.path).rstrip("/") + "/"
            for abs_path, entry in self.indexed.items():
                if abs_path.startswith(prefix):
                    entry.state = replace(entry.state, size_bytes=-1, mtime_ns=-1)
        return bool(changed)

    # -- scanning -----------------------------------------------------------------------------------------------
    def scan(self, reason: str = "periodic", reconcile: bool = True) -> list[Path]:
        """Walk every collection's roots; delete points of files no longer memory; return the paths to check. Once
        ready, a scan is a reconcile, for ``reason`` (``periodic``, ``queue_overflow``...), unless ``reconcile`` is
        false (after a config reload): ``drift`` counts what it found the watcher had missed (files not indexed,
        indexed files gone, files changed since indexed; a path still pending behind the debounce is not missed).
        Files indexed whole whose ``lstat`` is what they were indexed at are not returned."""
        started = time.monotonic()
        if self._attest() and self.watcher is not None:  # the old watches follow the old directory
            self.watcher.refresh()
        found, skips, stats = walk_paths(self.collections)
        self._report_skips(skips)
        self.problems = report.problems(self, skips)
        on_disk = {path for _, path in found}
        if reconcile and self.ready.is_set():  # a reconcile: what it finds is what the watcher missed
            pending = {str(p) for p in [*self.settler.paths(), *self.hand]}
            self.drift = {"not_indexed": len(on_disk - self.indexed.keys() - self.ledger.marks.keys() - pending),
                          "gone": len(self.indexed.keys() - on_disk - pending),
                          "changed": sum(report.changed(self, p) for p in (on_disk & self.indexed.keys()) - pending)}
            self.last_reconcile, self.last_reconcile_reason = time.time(), reason
            self.recovered_total += sum(self.drift.values())
            if any(self.drift.values()):
                log.warning("reconcile_drift", **self.drift, reason=reason,
                            hint="the watcher missed these; indexing them now")
        for abs_path in [p for p in self.indexed if p not in on_disk]:
            self._remove(abs_path, reason="gone")
        self.ledger.keep_only(on_disk | {str(s.path) for s in skips})  # gone, or no longer a candidate
        to_check = [Path(path) for collection, path in found
                    if not self._unchanged(collection.name, path, stats[path])]
        self.last_scan_s = time.monotonic() - started
        return to_check

    def _unchanged(self, collection: str, path: str, st: os.stat_result) -> bool:
        """Whether ``path``, found by the walk for ``collection`` with ``lstat`` result ``st``, is indexed there
        whole at that stat: then nothing is queued for it (the walk never enters a symlink, so the path is as safe
        as when indexed)."""
        entry = self.indexed.get(path)
        return entry is not None and entry.collection == collection and unchanged_by_stat(entry.state, st)

    def _report_skips(self, skips: list[Skip]) -> None:
        for skip in skips:
            self._skip(skip.path, skip.reason, failed=skip.reason in FAILURES)

    def _skip(self, path: Path, reason: str, detail: str = "", failed: bool = False) -> None:
        """Log a skip or failure once per file state; a file that stops being indexable loses its points."""
        if self.ledger.skip(path, reason, detail, failed):
            self._remove(str(path), reason=reason)

    def _remove(self, abs_path: str, reason: str) -> None:
        entry = self.indexed.get(abs_path)
        if entry is None:
            return
        self.store.delete_file(entry.collection, abs_path)
        del self.indexed[abs_path]
        log.info("file_removed", path=abs_path, collection=entry.collection, reason=reason)

    # -- processing ---------------------------------------------------------------------------------------------
    def on_path(self, path: Path, quiet_s: float | None = None) -> None:
        """Watcher callback: queue ``path`` behind the debounce (``quiet_s``: its quiet period, ``None`` for
        ``settle_s``). Cheap: called on watchdog's thread."""
        self.settler.add(path, quiet_s=quiet_s)

    def process(self, paths: list[Path]) -> list[Path]:
        """Bring the store in line with the disk for ``paths`` (files or directories, present or gone). Returns
        the files whose write found the store unavailable (the caller retries them later); raises
        ``StoreUnavailable`` when a delete or read found it so."""
        self.in_hand, self.hand = len(paths), list(paths)
        prepared: list[Prepared] = []
        try:
            for path in paths:
                self.beat()
                self._prepare_one(path, prepared)
            return self.write(prepared) if prepared else []
        finally:
            self.in_hand, self.hand = 0, []

    def _prepare_one(self, path: Path, prepared: list[Prepared]) -> None:
        key = str(path)
        try:
            st = os.lstat(path)
        except OSError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode):
            self._remove(key, reason="not_a_file")  # a file that became a directory leaves no ghost
            collection, _ = route(self.collections, path)
            # a directory made or moved in under a memory root: its files arrive without events of their own. The
            # workspace root itself is never walked (it may hold anything); its memory files have their own events.
            if collection is not None or path in {c.root for c in self.collections if c.role != "root"}:
                skips: list[Skip] = []
                self.settler.add_many(walk_dir(path, skips))
                self._report_skips(skips)
            return
        if st is None:  # gone: a deleted or moved-away file, or a whole directory
            self._remove(key, reason="deleted")
            prefix = key.rstrip("/") + "/"
            for abs_path in [p for p in self.indexed if p.startswith(prefix)]:
                self._remove(abs_path, reason="deleted")
            self.ledger.forget_under(key)
            return
        other = self._indexed_name(key, st)
        if other is not None:
            path, key = Path(other), other
        collection, reason = route(self.collections, path)
        if collection is None:
            if reason:
                self._skip(path, reason)
            elif key in self.indexed:
                self._remove(key, reason="not_memory")
            return
        known = self.indexed.get(key)
        try:
            # a file that changed owner (a workspace now nested in another's memory/) is rewritten in its new
            # collection, whatever its hash; the embedding cache makes that cheap
            result = self.pipeline.prepare(collection, path,
                                           known.state if known and known.collection == collection.name else None)
        except FileNotFoundError:
            self._remove(key, reason="deleted")
            return
        except FileSkipped as exc:
            self._skip(path, exc.reason, exc.detail, failed=exc.reason in FAILURES)
            return
        except ExtractError as exc:
            self._skip(path, "extract_failed", str(exc), failed=True)
            return
        if isinstance(result, Unchanged):
            log.debug("file_unchanged", path=key)
            if result.identity is not None and known is not None and known.collection == collection.name:
                size, mtime, ctime, inode, device = result.identity  # same text under a new stat (touch, chmod):
                known.state = replace(known.state, size_bytes=size, mtime_ns=mtime, ctime_ns=ctime, inode=inode,
                                      device=device)  # skip the hash next time; a reconcile won't count it changed
            return
        self.ledger.clear(key)
        prepared.append(result)

    def _indexed_name(self, key: str, st: os.stat_result) -> str | None:
        """One file, two names (a hard link; ``memory.md`` linked to ``MEMORY.md``): the file is indexed once,
        under the name the walk met first. An event names only the name written through, so for a name that is
        not indexed this returns the indexed name of the same (device, inode), if any, still that file on disk."""
        if st.st_nlink < 2 or not stat.S_ISREG(st.st_mode) or key in self.indexed:
            return None
        for abs_path, entry in list(self.indexed.items()):
            if (entry.state.inode, entry.state.device) == (st.st_ino, st.st_dev) and abs_path != key:
                try:
                    if os.path.samestat(os.lstat(abs_path), st):
                        return abs_path
                except OSError:
                    continue
        return None

    def write(self, prepared: list[Prepared], into: Mapping[str, str] | None = None) -> list[Path]:
        """Embed and store ``prepared`` files, smallest first in groups of about ``GROUP_CHUNKS`` chunks, so a huge
        file in the batch does not hold back the small ones. Returns the files to retry. ``into`` (a rebuild):
        collection name -> the physical collection to write instead; the live index state is left alone."""
        retry: list[Path] = []
        group: list[Prepared] = []
        size = 0
        for file in sorted(prepared, key=lambda f: len(f.chunks)):
            if group and size + len(file.chunks) > GROUP_CHUNKS:
                retry += self._write_group(group, into)
                group, size = [], 0
            group.append(file)
            size += len(file.chunks)
        if group:
            retry += self._write_group(group, into)
        return retry

    def _should_stop(self) -> bool:
        """Asked between embedded slices: progress (a beat), and whether to give up for a stop."""
        self.beat()
        return self.stopping.is_set()

    def _write_group(self, prepared: list[Prepared], into: Mapping[str, str] | None = None) -> list[Path]:
        try:
            self.store.ensure_room(0)  # a full state dir: retry later, without embedding in vain meanwhile
        except StateDirFull:
            return [file.path for file in prepared]
        try:
            vectors = self.pipeline.embed(prepared, should_stop=self._should_stop)
        except Interrupted:
            log.info("index_interrupted", files=[str(f.path) for f in prepared],
                     hint="embedded slices are cached; the next start finishes them")
            return []
        except (EmbedError, ExtractError) as exc:
            if len(prepared) == 1:
                self._skip(prepared[0].path, "embed_failed", str(exc), failed=True)
                return []
            return [path for file in prepared for path in self._write_group([file], into)]  # isolate the refused file
        retry: list[Path] = []
        for file, file_vectors in zip(prepared, vectors):
            points = self.pipeline.points(file, file_vectors)
            started = time.monotonic()
            abs_path = str(file.path)
            old = self.indexed.get(abs_path)
            try:
                if into is not None:
                    self.store.replace_file(into[file.collection.name], abs_path, file.file_hash, points)
                    continue
                if old and old.collection != file.collection.name:
                    self.store.delete_file(old.collection, abs_path)
                self.store.replace_file(file.collection.name, abs_path, file.file_hash, points)
            except StoreUnavailable as exc:
                self.metrics.error("state_dir_full" if isinstance(exc, StateDirFull) else "store_unavailable")
                if not isinstance(exc, StateDirFull):  # that one the store logs once per outage
                    log.error("store_unavailable", path=abs_path, error=str(exc), retry_after_s=RETRY_AFTER_S)
                retry.append(file.path)
                continue
            self.metrics.store_write_seconds.observe(time.monotonic() - started)
            self.indexed[abs_path] = Indexed(file.collection.name, FileState(
                file.file_hash, file.size_bytes, file.mtime_ns, len(points), True, file.ctime_ns, file.inode,
                file.device))
            log.info("file_indexed", path=abs_path, collection=file.collection.name, kind=file.kind,
                     chunks=len(points), embedded=file.embedded, cache_hits=file.cache_hits,
                     write_ms=round((time.monotonic() - started) * 1000, 1))
        return retry

    # -- reporting (indexer.report) -----------------------------------------------------------------------------
    def health(self) -> str:
        """``report.health``: ``"degraded"`` while the watcher is dead, drift was found or store writes fail."""
        return report.health(self)

    def pending(self, agent: str | None = None) -> list[str]:
        """``report.pending``: workspace-relative paths changed on disk and not yet indexed."""
        return report.pending(self, agent)

    def status(self) -> dict[str, Any]:
        """``report.status``: counters for ``qmd-indexer status``."""
        return report.status(self)
