"""The indexing service's state and per-file orchestration: keeps every collection equal to the memory files on disk.

Data flows one way: watcher event or scan -> ``Settler`` -> worker -> ``Pipeline`` -> ``Store``. The worker (one
thread, ``indexer.worker``) is the only writer; the HTTP API only reads. ``Indexer.open(settings)`` builds one ready
to use (plugins loaded, store and cache open, collections connected); then either

- ``worker.run(indexer, stop)`` (``qmd-indexer run``, through ``indexer.service.serve``): watch, scan, index until
  ``stop`` is set, rescanning every ``rescan_interval_s`` (the watcher is a fast path, never the only path); or
- ``worker.index_once(indexer)`` (``qmd-indexer index --once``): scan and process everything, then return.

Rebuilds (``--reindex``, ``POST /reindex``): ``rebuild()`` fills a new collection beside each live one from the
files on disk (vectors from the embedding cache, so only what is not cached is embedded), then ``Store.swap``s them
in; searches answer from the old collections meanwhile. A crash mid-rebuild leaves the old ones serving, and
``connect()`` sweeps the leftovers at the next start.

Recovery is not a step: the store's payloads say which content hash each file was indexed at and whether all its
points were written (``chunk_count``), so after a crash or ``SIGKILL`` the next scan redoes exactly the files whose
points are missing, mixed or stale; deterministic point ids make redoing idempotent.
"""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import structlog

from indexer.api import GROUPS
from indexer.bm25 import Bm25Terms
from indexer.cache import EmbeddingCache
from indexer.config import Settings
from indexer.errors import (
    CollectionMismatch,
    EmbedError,
    ExtractError,
    FileSkipped,
    StateReadOnly,
    StoreLocked,
    StoreUnavailable,
)
from indexer.ledger import FAILURES, Ledger
from indexer.pipeline import Interrupted, Pipeline, Prepared, Unchanged
from indexer.plugins import Registry, load_registry
from indexer.points import FileState
from indexer.search import Searcher
from indexer.store import ServerOptions, Store, open_store
from indexer.watcher import Settler, Watcher
from indexer.workspace import Collection, Skip, attest, overlaps, plan_collections, route, walk, walk_dir

MAX_WAIT_S = 10.0  # the longest a search waits for pending changes (``search --wait``)
log = structlog.get_logger("qmd_indexer.daemon")

GROUP_CHUNKS = 256  # chunks embedded and written together; smaller files of a batch go first
RETRY_AFTER_S = 5.0  # a store found unreachable is tried again after this long (connecting, or a file's write)


_STATE_LOCKS: dict[Path, int] = {}  # state dir -> fd of its daemon.lock, held until this process exits


def hold_state_lock(state_dir: Path) -> None:
    """Take ``<state_dir>/daemon.lock`` (``fcntl.flock``, exclusive) for the rest of this process's life, before
    anything else under ``state_dir`` is created or opened: two daemons started at once on an empty state dir
    would otherwise both create the store and the loser delete the winner's new files. Taking it again in the
    same process is a no-op (tests open several indexers on one state dir).

    Raises ``StoreLocked`` when another process holds it, ``StateReadOnly`` when the lock file cannot be created
    because the state dir is read-only (or not writable by this user)."""
    import errno
    import fcntl

    state_dir = state_dir.resolve()
    if state_dir in _STATE_LOCKS:
        return
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(state_dir / "daemon.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise StateReadOnly(f"the state directory {state_dir} is read-only ({exc.strerror}); make it "
                                f"writable or choose another with --state-dir") from None
        raise
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreLocked(f"the state directory {state_dir} is in use by another process (a running daemon?); "
                          f"query it with `qmd-indexer search`, or stop it first") from None
    _STATE_LOCKS[state_dir] = fd


@dataclass(slots=True)
class Indexed:
    """What the daemon knows is in the store for one file."""

    collection: str
    state: FileState


def plugin_configs(settings: Settings) -> dict[str, dict[str, Any]]:
    """Each installed or configured plugin's config table, plus ``state_dir`` (str: a folder the plugin may keep its
    own files in, such as the audio plugin's verdict cache) unless its table sets one; the text embedder also gets
    ``model``/``device``/``batch_size``/``precision`` from the top level and keeps exported models under
    ``<state_dir>/models``."""
    names = {ep.name for group in GROUPS for ep in entry_points(group=group)} | set(settings.plugin)
    configs = {name: {"state_dir": str(settings.state_dir), **settings.plugin.get(name, {})} for name in names}
    base = {"model": settings.model, "device": settings.device, "batch_size": settings.batch_size,
            "precision": settings.precision, "cache_dir": str(settings.state_dir / "models")}
    configs["sentence-transformers"] = {**base, **configs.get("sentence-transformers", {})}
    return configs


class Indexer:
    """The collections, store, pipeline and index state of one daemon (or one ``index --once``).

    Build it with ``Indexer.open``; ``__init__`` takes the parts already made. ``clock`` drives the debounce
    (seconds, monotonic); ``polling`` makes the watcher poll instead of using inotify. ``reindex`` asks for a
    ``rebuild()`` (the worker runs it once connected).
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
        self.drift = {"not_indexed": 0, "gone": 0}  # what the last reconcile found the watcher had missed
        self._cache = cache
        self.rebuild_requested = threading.Event()  # the worker rebuilds every collection when it is set
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
        ``connect()``-ed to its collections (``reindex`` asks the worker for a ``rebuild()``). ``terms``: the BM25
        term builder (``None``: the product's).

        Raises ``StoreLocked`` when another process holds the state dir (``hold_state_lock``), ``StateReadOnly``
        when it is read-only, ``ConfigError`` for conflicting plugins, ``PluginError`` without a text embedder,
        ``OSError`` when the state directory cannot be used, and what ``connect`` raises.
        """
        hold_state_lock(settings.state_dir)  # first: nothing is created before the lock is ours
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
        self._check_identity()
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

    def _write(self, prepared: list[Prepared], into: Mapping[str, str] | None = None) -> list[Path]:
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
            started = time.monotonic()
            points = self.pipeline.points(file, file_vectors)
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

    # -- model identity -----------------------------------------------------------------------------------------
    def identity(self) -> str:
        """What made the vectors and chunks: each embedder's ``identity`` (model, precision, fingerprint of its
        files; ``model_id`` for one without) and the chunking version."""
        from indexer import chunking

        models = ", ".join(f"{modality}={getattr(e, 'identity', e.model_id)}"
                           for modality, e in sorted(self.registry.embedders.items()))
        return f"{models}; chunking={getattr(chunking, 'CHUNKING_VERSION', 1)}"

    def _identities_path(self) -> Path:
        return self.settings.state_dir / "collection-identity.json"

    def _record_identity(self, names: list[str]) -> None:
        path = self._identities_path()
        try:
            record = json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            record = {}
        record.update({name: self.identity() for name in names})
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
        tmp.replace(path)

    def _check_identity(self) -> None:
        """Compare each collection's recorded identity with the configured one: on a change, rebuild (or raise
        ``CollectionMismatch`` with ``on_model_change = "refuse"``), naming both. Unrecorded ones are recorded."""
        try:
            record = json.loads(self._identities_path().read_text())
        except (FileNotFoundError, ValueError):
            record = {}
        current = self.identity()
        names = [c.name for c in self.collections]
        changed = {name: record[name] for name in names if name in record and record[name] != current}
        if changed and not self.rebuild_requested.is_set():
            indexed_with = sorted(set(changed.values()))
            if self.settings.on_model_change == "refuse":
                raise CollectionMismatch(
                    f"collections {sorted(changed)} were built with {'; '.join(indexed_with)}, but the configuration "
                    f"says {current}; rebuild them with `qmd-indexer index --once --reindex` (or `run --reindex`), "
                    f"or set on_model_change = \"rebuild\"")
            log.warning("model_changed", collections=sorted(changed), indexed_with=indexed_with, configured=current,
                        action="rebuild")
            self.rebuild_requested.set()
        self._record_identity([name for name in names if name not in record])

    # -- rebuilding ---------------------------------------------------------------------------------------------
    def request_rebuild(self) -> None:
        """Ask the worker for a ``rebuild()`` (``POST /reindex``); returns at once."""
        self.rebuild_requested.set()
        self.settler.wake()

    def rebuild(self) -> bool:
        """Rebuild every collection beside the live one and swap the new ones in when all are complete (the worker
        calls it; searches meanwhile answer from the old collections). Vectors come from the embedding cache where
        it has them. Returns False, leaving the old collections serving and the new ones for ``connect()`` to sweep,
        when a stop was requested or the store failed; raises ``StoreUnavailable`` from the store's own calls."""
        self.rebuild_requested.clear()
        self.rebuilding = True
        started, before = time.monotonic(), self.pipeline.stats.chunks_embedded
        try:
            dims = self.pipeline.dense_dims()
            into = {c.name: self.store.rebuild_target(c.name) for c in self.collections}
            log.info("rebuild_started", collections=into)
            for target in into.values():
                self.store.ensure_collection(target, dims)
            found, _ = walk(self.collections)  # skips are logged by the scan that follows
            batch: list[Prepared] = []
            for n, (collection, path) in enumerate(found, 1):
                try:
                    result = self.pipeline.prepare(collection, path, None)
                    if isinstance(result, Prepared):
                        batch.append(result)
                except (OSError, FileSkipped, ExtractError):
                    pass  # gone, skipped or failing: the scan after the swap logs it as usual
                if len(batch) >= GROUP_CHUNKS // 8 or n == len(found):
                    if self._write(batch, into) or self.stopping.is_set():
                        log.warning("rebuild_abandoned", reason="stop requested or store unavailable",
                                    hint="the old collections keep serving; the next start sweeps the new ones")
                        return False
                    batch = []
            for collection in self.collections:
                self.store.swap(collection.name, into[collection.name])
            self._record_identity(list(into))
            self.connect()
            log.info("rebuild_finished", files=len(self.indexed), seconds=round(time.monotonic() - started, 2),
                     chunks_embedded=self.pipeline.stats.chunks_embedded - before)
            return True
        finally:
            self.rebuilding = False

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
        text = self.registry.embedders.get("text")
        return {
            "ready": self.ready.is_set(),
            "store_connected": self.connected.is_set(),
            "store_degraded": self.store.degraded,  # writes failing (being retried)
            "backend": self.store.kind,
            "state_dir": str(self.settings.state_dir),
            "uptime_s": round(time.time() - self.started_at, 1),
            "queue_depth": len(self.settler) + self.in_hand,
            "rebuilding": self.rebuilding or self.rebuild_requested.is_set(),
            "hnsw": {name: dict(build) for name, build in list(self.hnsw.items())},
            "models": {modality: {"model_id": e.model_id, "identity": getattr(e, "identity", e.model_id),
                                  "precision": getattr(e, "precision", None)}
                       for modality, e in self.registry.embedders.items()},
            "chunks_embedded": stats.chunks_embedded,
            "cache_hits": stats.cache_hits,
            "files_failed": self.ledger.files_failed,
            "last_scan_s": self.last_scan_s,
            # the precision the text embedder runs at (``precision = "auto"`` resolves per CPU), and its model_id
            "embedding": {"model_id": text.model_id, "precision": getattr(text, "precision", None)} if text else None,
            "watch": self.watcher.modes() if self.watcher is not None else {},
            "watch_polled": dict(self.watcher.poll_reasons) if self.watcher is not None else {},
            "last_reconcile": self.last_reconcile,
            "drift": dict(self.drift),
            "collections": per,
        }
