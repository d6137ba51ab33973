"""The indexing service's state and per-file orchestration: keeps every collection equal to the memory files on disk.

Data flows one way: watcher event or scan -> ``Settler`` -> worker -> ``Pipeline`` -> ``Store``. The worker (one
thread, ``indexer.worker``) is the only writer; the HTTP API only reads. ``Indexer.open(settings)`` builds one ready
to use (plugins loaded, store and cache open, collections connected); then either

- ``worker.run(indexer, stop)`` (``qmd-indexer run``, through ``indexer.service.serve``): watch, scan, index until
  ``stop`` is set, rescanning every ``rescan_interval_s`` (the watcher is a fast path, never the only path); or
- ``worker.index_once(indexer)`` (``qmd-indexer index --once``): scan and process everything, then return.

Recovery is not a step: the store's payloads say which content hash each file was indexed at and whether all its
points were written (``chunk_count``), so after a crash or ``SIGKILL`` the next scan redoes exactly the files whose
points are missing, mixed or stale; deterministic point ids make redoing idempotent.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import structlog

from indexer.api import GROUPS
from indexer.bm25 import Bm25Terms
from indexer.cache import EmbeddingCache
from indexer.config import Settings
from indexer.errors import EmbedError, ExtractError, FileSkipped, StoreUnavailable
from indexer.ledger import FAILURES, Ledger
from indexer.pipeline import Interrupted, Pipeline, Prepared, Unchanged
from indexer.plugins import Registry, load_registry
from indexer.points import FileState
from indexer.search import Searcher
from indexer.store import ServerOptions, Store, open_store
from indexer.watcher import Settler, Watcher
from indexer.workspace import Collection, Skip, attest, plan_collections, route, walk, walk_dir

MAX_WAIT_S = 10.0  # the longest a search waits for pending changes (``search --wait``)
log = structlog.get_logger("qmd_indexer.daemon")

GROUP_CHUNKS = 256  # chunks embedded and written together; smaller files of a batch go first
RETRY_AFTER_S = 5.0  # a store found unreachable is tried again after this long (connecting, or a file's write)


@dataclass(slots=True)
class Indexed:
    """What the daemon knows is in the store for one file."""

    collection: str
    state: FileState


def plugin_configs(settings: Settings) -> dict[str, dict[str, Any]]:
    """Each installed or configured plugin's config table, plus ``state_dir`` (str: a folder the plugin may keep its
    own files in, such as the audio plugin's verdict cache) unless its table sets one; the text embedder also gets
    ``model``/``device``/``batch_size`` from the top level."""
    names = {ep.name for group in GROUPS for ep in entry_points(group=group)} | set(settings.plugin)
    configs = {name: {"state_dir": str(settings.state_dir), **settings.plugin.get(name, {})} for name in names}
    base = {"model": settings.model, "device": settings.device, "batch_size": settings.batch_size}
    configs["sentence-transformers"] = {**base, **configs.get("sentence-transformers", {})}
    return configs


class Indexer:
    """The collections, store, pipeline and index state of one daemon (or one ``index --once``).

    Build it with ``Indexer.open``; ``__init__`` takes the parts already made. ``clock`` drives the debounce
    (seconds, monotonic); ``polling`` makes the watcher poll instead of using inotify. ``reindex`` drops the
    collections at the first ``connect()``.
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
        self.settler = Settler(settings.settle_s, clock)  # the debounce queue in front of the worker
        self.polling = polling
        self.indexed: dict[str, Indexed] = {}
        self.ledger = Ledger()
        self.ready = threading.Event()
        self.connected = threading.Event()
        self.stopping = threading.Event()  # set by the worker's stop event: embedding gives up between slices
        self.watcher: Watcher | None = None  # set by the worker while it runs
        self.started_at = time.time()
        self.last_scan_s: float | None = None
        self.in_hand = 0  # paths taken from the queue and not yet processed
        self.hand: list[Path] = []  # those paths
        self.last_reconcile: float | None = None  # wall-clock time of the last scan once ready (a reconcile)
        self.drift = {"not_indexed": 0, "gone": 0}  # what the last reconcile found the watcher had missed
        self._cache = cache
        self._reindex = reindex

    @classmethod
    def open(cls, settings: Settings, registry: Registry | None = None, store: Store | None = None,
             reindex: bool = False, connect: bool = True, terms: Bm25Terms | None = None,
             polling: bool = False) -> Indexer:
        """An ``Indexer`` ready to use: plugins loaded (unless ``registry`` is given: tests share one model), the
        store (unless given) and the embedding cache opened under ``settings.state_dir``; with ``connect``, also
        ``connect()``-ed to its collections (``reindex`` drops them first). ``terms``: the BM25 term builder
        (``None``: the product's).

        Raises ``ConfigError`` for conflicting plugins, ``PluginError`` without a text embedder, ``OSError`` when
        the state directory cannot be used, and what ``connect`` raises.
        """
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        if registry is None:
            registry = load_registry(settings.plugins, plugin_configs(settings), settings.prefer)
        registry.check_multimodal({w.agent: w.multimodal.modalities for w in settings.workspace
                                   if w.multimodal.enabled})
        if store is None:
            store = open_store(settings.state_dir, settings.qdrant_url, settings.qdrant_api_key,
                               ServerOptions.from_settings(settings))
        cache = EmbeddingCache(settings.state_dir / "embeddings.sqlite3")
        indexer = cls(settings, registry, store, cache, terms if terms is not None else Bm25Terms(settings.bm25),
                      polling=polling, reindex=reindex)
        for collection in indexer.collections:
            if collection.role == "extra" and not os.path.lexists(collection.root):
                log.warning("extra_path_missing", agent=collection.agent, path=str(collection.root),
                            hint="watched from its parent once it exists; picked up by the next rescan")
        if connect:
            indexer.connect()
        return indexer

    def connect(self) -> None:
        """Create or check every collection and read what is indexed (once; ``reindex`` drops them first).

        Raises ``CollectionMismatch`` when a collection was built for another model, ``StoreUnavailable`` when
        Qdrant cannot be reached (or the embedded store is held by another process).
        """
        dims = self.pipeline.dense_dims()
        indexed: dict[str, Indexed] = {}
        for collection in self.collections:
            if self._reindex:
                self.store.drop(collection.name)
            self.store.ensure_collection(collection.name, dims)
            for abs_path, state in self.store.file_states(collection.name).items():
                indexed[abs_path] = Indexed(collection.name, state)
        self._reindex = False
        self.indexed = indexed
        self.connected.set()
        self._attest()
        log.info("store_opened", backend=self.store.kind, collections=[c.name for c in self.collections],
                 files=len(self.indexed))

    def connect_until(self, stop: threading.Event) -> bool:
        """``connect()``, retrying every ``RETRY_AFTER_S`` while the store is unavailable; one log line per outage.
        False if ``stop`` was set first."""
        reported = False
        while not stop.is_set():
            try:
                self.connect()
                if reported:
                    log.info("store_reconnected", backend=self.store.kind)
                return True
            except StoreUnavailable as exc:
                if not reported:
                    log.error("store_unavailable", error=str(exc), retry_after_s=RETRY_AFTER_S)
                    reported = True
            stop.wait(RETRY_AFTER_S)
        return False

    def close(self) -> None:
        """Stop the watcher, flush and close the store, close the cache."""
        if self.watcher:
            self.watcher.stop()
        self.store.flush()
        self.store.close()
        self._cache.close()

    def searcher(self, **overrides: Any) -> Searcher:
        """A ``Searcher`` over these collections with the configured defaults (``Searcher.from_settings``)."""
        return Searcher.from_settings(self.settings, self.collections, self.store, self.registry.embedders,
                                      self.terms, **{"hit_fields": self.registry.hit_fields, **overrides})

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
    def scan(self) -> list[Path]:
        """Walk every collection's roots; delete points of files no longer memory; return the paths to check."""
        started = time.monotonic()
        if self._attest() and self.watcher is not None:  # the old watches follow the old directory
            self.watcher.refresh()
        found, skips = walk(self.collections)
        self._report_skips(skips)
        on_disk = {str(path) for _, path in found}
        if self.ready.is_set():  # a reconcile: what it finds is what the watcher missed
            self.drift = {"not_indexed": len(on_disk - self.indexed.keys() - self.ledger.marks.keys()),
                          "gone": len(self.indexed.keys() - on_disk)}
            self.last_reconcile = time.time()
            if any(self.drift.values()):
                log.warning("reconcile_drift", **self.drift, hint="the watcher missed these; indexing them now")
        for abs_path in [p for p in self.indexed if p not in on_disk]:
            self._remove(abs_path, reason="gone")
        self.ledger.keep_only(on_disk | {str(s.path) for s in skips})  # gone, or no longer a candidate
        self.last_scan_s = time.monotonic() - started
        return [path for _, path in found]

    def _report_skips(self, skips: list[Skip]) -> None:
        for skip in skips:
            self._skip(skip.path, skip.reason)

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
    def on_path(self, path: Path) -> None:
        """Watcher callback: queue ``path`` behind the debounce. Cheap: called on watchdog's thread."""
        self.settler.add(path)

    def process(self, paths: list[Path]) -> list[Path]:
        """Bring the store in line with the disk for ``paths`` (files or directories, present or gone). Returns
        the files whose write found the store unavailable (the caller retries them later); raises
        ``StoreUnavailable`` when a delete or read found it so."""
        self.in_hand, self.hand = len(paths), list(paths)
        prepared: list[Prepared] = []
        try:
            for path in paths:
                self._prepare_one(path, prepared)
            return self._write(prepared) if prepared else []
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
            result = self.pipeline.prepare(collection, path, known.state if known else None)
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

    def _write(self, prepared: list[Prepared]) -> list[Path]:
        """Embed and store ``prepared`` files, smallest first in groups of about ``GROUP_CHUNKS`` chunks, so a huge
        file in the batch does not hold back the small ones. Returns the files to retry."""
        retry: list[Path] = []
        group: list[Prepared] = []
        size = 0
        for file in sorted(prepared, key=lambda f: len(f.chunks)):
            if group and size + len(file.chunks) > GROUP_CHUNKS:
                retry += self._write_group(group)
                group, size = [], 0
            group.append(file)
            size += len(file.chunks)
        if group:
            retry += self._write_group(group)
        return retry

    def _write_group(self, prepared: list[Prepared]) -> list[Path]:
        try:
            vectors = self.pipeline.embed(prepared, should_stop=self.stopping.is_set)
        except Interrupted:
            log.info("index_interrupted", files=[str(f.path) for f in prepared],
                     hint="embedded slices are cached; the next start finishes them")
            return []
        except (EmbedError, ExtractError) as exc:
            if len(prepared) == 1:
                self._skip(prepared[0].path, "embed_failed", str(exc), failed=True)
                return []
            return [path for file in prepared for path in self._write_group([file])]  # isolate the refused file
        retry: list[Path] = []
        for file, file_vectors in zip(prepared, vectors):
            started = time.monotonic()
            points = self.pipeline.points(file, file_vectors)
            abs_path = str(file.path)
            old = self.indexed.get(abs_path)
            try:
                if old and old.collection != file.collection.name:
                    self.store.delete_file(old.collection, abs_path)
                self.store.replace_file(file.collection.name, abs_path, file.file_hash, points)
            except StoreUnavailable as exc:
                log.error("store_unavailable", path=abs_path, error=str(exc), retry_after_s=RETRY_AFTER_S)
                retry.append(file.path)
                continue
            self.indexed[abs_path] = Indexed(file.collection.name, FileState(
                file.file_hash, file.size_bytes, file.mtime_ns, len(points), True, file.ctime_ns, file.inode,
                file.device))
            log.info("file_indexed", path=abs_path, collection=file.collection.name, kind=file.kind,
                     chunks=len(points), embedded=file.embedded, cache_hits=file.cache_hits,
                     write_ms=round((time.monotonic() - started) * 1000, 1))
        return retry

    # -- reporting ----------------------------------------------------------------------------------------------
    def health(self) -> str:
        """``"degraded"`` while the watcher is dead or the last reconcile found drift, else ``"ok"``."""
        dead = self.watcher is not None and (self.watcher.dead or not self.watcher.alive())
        return "degraded" if dead or any(self.drift.values()) else "ok"

    def pending(self, agent: str | None = None) -> list[str]:
        """Workspace-relative paths (sorted, ``/`` separators) of ``agent``'s collections (every agent's when
        ``None``) changed on disk and not yet indexed: queued behind the debounce or in hand. A path that is not
        memory (outside every root) is left out; a deleted file still counts (its points are still served)."""
        out: set[str] = set()
        for path in [*self.settler.paths(), *self.hand]:
            for collection in self.collections:
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
        """Wait up to ``timeout_s`` seconds (capped at ``MAX_WAIT_S``) until ``pending(agent)`` is empty; returns
        what is still pending."""
        deadline = time.monotonic() + min(max(timeout_s, 0.0), MAX_WAIT_S)
        pending = self.pending(agent)
        while pending and time.monotonic() < deadline:
            time.sleep(0.05)
            pending = self.pending(agent)
        return pending

    def status(self) -> dict[str, Any]:
        """Counters for ``qmd-indexer status``: per-collection files and chunks, queue, embeddings since start."""
        per: dict[str, dict[str, Any]] = {
            c.name: {"agent": c.agent, "role": c.role, "root": str(c.root), "files": 0, "chunks": 0}
            for c in self.collections
        }
        for entry in list(self.indexed.values()):
            if entry.collection in per:
                per[entry.collection]["files"] += 1
                per[entry.collection]["chunks"] += entry.state.points
        stats = self.pipeline.stats
        return {
            "ready": self.ready.is_set(),
            "store_connected": self.connected.is_set(),
            "store_degraded": self.store.degraded,  # writes failing (being retried)
            "backend": self.store.kind,
            "state_dir": str(self.settings.state_dir),
            "uptime_s": round(time.time() - self.started_at, 1),
            "queue_depth": len(self.settler) + self.in_hand,
            "chunks_embedded": stats.chunks_embedded,
            "cache_hits": stats.cache_hits,
            "files_failed": self.ledger.files_failed,
            "last_scan_s": self.last_scan_s,
            "watch": self.watcher.modes() if self.watcher is not None else {},
            "watch_polled": dict(self.watcher.poll_reasons) if self.watcher is not None else {},
            "last_reconcile": self.last_reconcile,
            "drift": dict(self.drift),
            "collections": per,
        }
