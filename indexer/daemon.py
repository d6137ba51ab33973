"""The indexing service: keeps every collection equal to the memory files on disk.

Data flows one way: watcher event or scan -> ``Settler`` -> worker -> ``Pipeline`` -> ``Store``. The worker (one
thread) is the only writer; the HTTP API only reads. ``Indexer`` is used two ways:

- ``qmd-indexer run``: ``Indexer.run(stop)`` starts the watcher, queues a full scan, then processes settled paths
  until ``stop`` is set, rescanning every ``rescan_interval_s`` (the watcher is a fast path, never the only path).
- ``qmd-indexer index --once``: ``Indexer.index_once()`` scans and processes everything, then returns.

Recovery is not a step: the store's payloads say which content hash each file was indexed at and whether all its
points were written (``chunk_count``), so after a crash or ``SIGKILL`` the next scan redoes exactly the files whose
points are missing, mixed or stale; deterministic point ids make redoing idempotent.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import structlog

from indexer.cache import EmbeddingCache
from indexer.config import Settings
from indexer.errors import EmbedError, ExtractError, FileSkipped, StoreUnavailable
from indexer.pipeline import Interrupted, Pipeline, Prepared, Unchanged
from indexer.plugins import Registry, load_registry
from indexer.store import FileState, Store, open_store
from indexer.watcher import Settler, Watcher
from indexer.workspace import Collection, Skip, overlaps, plan_collections, route, walk, walk_dir

log = structlog.get_logger("qmd_indexer.daemon")

BATCH_FILES = 32  # files prepared per worker step: fills the model's batches during a full index
GROUP_CHUNKS = 256  # chunks embedded and written together; smaller files of a batch go first
RETRY_AFTER_S = 5.0  # a write that failed because the store was unreachable is retried after this long
REFRESH_S = 5.0  # how often the roots are checked for a directory deleted and made again (its watch is dead)


@dataclass(slots=True)
class Indexed:
    """What the daemon knows is in the store for one file."""

    collection: str
    state: FileState


def plugin_configs(settings: Settings) -> dict[str, dict[str, Any]]:
    """Each plugin's config table; the text embedder gets ``model``/``device``/``batch_size`` from the top level."""
    configs = {name: dict(table) for name, table in settings.plugin.items()}
    base = {"model": settings.model, "device": settings.device, "batch_size": settings.batch_size}
    configs["sentence-transformers"] = {**base, **configs.get("sentence-transformers", {})}
    return configs


class Indexer:
    """Owns the collections, the store, the pipeline and the worker state of one daemon (or one ``index --once``).

    ``registry`` and ``store`` may be passed in (tests share one loaded model across daemons); otherwise they are
    built from ``settings``. ``clock`` drives the debounce (seconds, monotonic).
    """

    def __init__(self, settings: Settings, registry: Registry | None = None, store: Store | None = None,
                 clock: Callable[[], float] = time.monotonic, polling: bool = False) -> None:
        self.settings = settings
        self.collections: list[Collection] = plan_collections(settings.workspace)
        self.by_name = {c.name: c for c in self.collections}
        self.registry = registry
        self.store = store
        self.settler = Settler(settings.settle_s, clock)
        self.polling = polling
        self.indexed: dict[str, Indexed] = {}
        # abs_path -> (size, mtime_ns, ctime_ns, reason, failed): files skipped or failing in their current state
        self.bad: dict[str, tuple[int, int, int, str, bool]] = {}
        self.ready = threading.Event()
        self.connected = threading.Event()
        self.stopping = threading.Event()  # set by run()'s stop event: embedding gives up between slices
        self._reindex = False
        self.started_at = time.time()
        self.last_scan_s: float | None = None
        self._in_hand = 0
        self._cache: EmbeddingCache | None = None
        self.pipeline: Pipeline | None = None
        self.watcher: Watcher | None = None

    # -- lifecycle ----------------------------------------------------------------------------------------------
    def open(self, reindex: bool = False, connect: bool = True) -> None:
        """Load plugins, open the store and cache; with ``connect``, also ``connect()`` to the collections.

        Raises ``ConfigError`` for conflicting plugins, ``PluginError`` without a text embedder, and what
        ``connect`` raises.
        """
        s = self.settings
        s.state_dir.mkdir(parents=True, exist_ok=True)
        if self.registry is None:
            self.registry = load_registry(s.plugins, plugin_configs(s), s.prefer)
        if self.store is None:
            self.store = open_store(s.state_dir, s.qdrant_url, s.qdrant_api_key, s.qdrant_timeout_s)
        self._cache = EmbeddingCache(s.state_dir / "embeddings.sqlite3")
        self.pipeline = Pipeline(self.registry, self._cache, s.max_file_bytes)
        self._reindex = reindex
        for collection in self.collections:
            if collection.role == "extra" and not os.path.lexists(collection.root):
                log.warning("extra_path_missing", agent=collection.agent, path=str(collection.root),
                            hint="watched from its parent once it exists; picked up by the next rescan")
        for overlap in overlaps(self.collections):
            log.warning("workspaces_overlap", detail=overlap)
        if connect:
            self.connect()

    def connect(self) -> None:
        """Create or check every collection and read what is indexed (once; ``--reindex`` drops them first).

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

    def _connect_until(self, stop: threading.Event) -> bool:
        """``connect()``, retrying every ``RETRY_AFTER_S`` while the store is unavailable; one log line per outage."""
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
        if self.watcher:
            self.watcher.stop()
        if self.store:
            self.store.flush()
            self.store.close()
        if self._cache:
            self._cache.close()

    # -- attestation --------------------------------------------------------------------------------------------
    def _attest(self) -> list[str]:
        """Record which filesystem object (device, inode) each workspace path is; return the agents whose path now
        names another one (a restored backup, a re-created directory). Their files lose the stat shortcut, so
        every file is re-hashed once instead of trusting sizes and mtimes that may match by accident; unchanged
        text still costs no embedding. The record is ``<state_dir>/attestations.json``."""
        record = self.settings.state_dir / "attestations.json"
        try:
            previous = json.loads(record.read_text())
        except (OSError, ValueError):
            previous = {}
        current, changed = {}, []
        for ws in self.settings.workspace:
            try:
                st = os.stat(ws.path)
            except OSError:
                log.warning("workspace_missing", agent=ws.agent, path=str(ws.path))
                continue
            current[ws.agent] = {"path": str(ws.path), "dev": st.st_dev, "ino": st.st_ino}
            old = previous.get(ws.agent)
            if old and old["path"] == str(ws.path) and (old["dev"], old["ino"]) != (st.st_dev, st.st_ino):
                changed.append(ws.agent)
                log.warning("workspace_reattested", agent=ws.agent, path=str(ws.path),
                            old_inode=old["ino"], new_inode=st.st_ino)
                prefix = str(ws.path).rstrip("/") + "/"
                for abs_path, entry in self.indexed.items():
                    if abs_path.startswith(prefix):
                        entry.state = replace(entry.state, size_bytes=-1, mtime_ns=-1)
        if current != previous:
            tmp = record.with_suffix(".tmp")
            tmp.write_text(json.dumps(current, indent=1))
            tmp.replace(record)
        return changed

    # -- scanning -----------------------------------------------------------------------------------------------
    def scan(self) -> list[Path]:
        """Walk every collection's roots; delete points of files no longer memory; return the paths to check."""
        started = time.monotonic()
        if self._attest() and self.watcher is not None:  # the old watches follow the old directory
            self.watcher.refresh()
        found, skips = walk(self.collections)
        self._report_skips(skips)
        on_disk = {str(path) for _, path in found}
        for abs_path in [p for p in self.indexed if p not in on_disk]:
            self._remove(abs_path, reason="gone")
        skipped = {str(s.path) for s in skips}
        for abs_path in [p for p in self.bad if p not in on_disk and p not in skipped]:
            del self.bad[abs_path]  # gone, or no longer a candidate: no longer failing
        self.last_scan_s = time.monotonic() - started
        return [path for _, path in found]

    def _report_skips(self, skips: list[Skip]) -> None:
        for skip in skips:
            self._skip(skip.path, skip.reason, "" if skip.reason != "split_root_memory" else
                       "MEMORY.md and memory.md are distinct files; MEMORY.md is indexed. Run `qmd-indexer doctor`.")

    def _fingerprint(self, path: Path) -> tuple[int, int, int]:
        try:
            st = os.lstat(path)
            return st.st_size, st.st_mtime_ns, st.st_ctime_ns
        except OSError:
            return -1, -1, -1

    def _skip(self, path: Path, reason: str, detail: str = "", failed: bool = False) -> None:
        """Log a skip or failure once per file state (a rescan of an unchanged bad file stays quiet)."""
        key = str(path)
        mark = (*self._fingerprint(path), reason, failed)
        if self.bad.get(key) == mark:
            return
        self.bad[key] = mark
        detail = detail or _DETAILS.get(reason, "")
        if failed:
            log.error("file_failed", path=key, reason=reason, detail=detail)
        elif reason in _LOUD:
            log.warning("file_skipped", path=key, reason=reason, detail=detail)
        else:
            log.info("file_skipped", path=key, reason=reason, detail=detail)
        if key in self.indexed:
            self._remove(key, reason=reason)

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

    def process(self, paths: list[Path]) -> None:
        """Bring the store in line with the disk for ``paths`` (files or directories, present or gone)."""
        assert self.pipeline is not None and self.store is not None
        self._in_hand = len(paths)
        prepared: list[Prepared] = []
        try:
            for path in paths:
                self._prepare_one(path, prepared)
            if prepared:
                self._write(prepared)
        finally:
            self._in_hand = 0

    def _prepare_one(self, path: Path, prepared: list[Prepared]) -> None:
        key = str(path)
        try:
            st = os.lstat(path)
        except OSError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode):
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
            for abs_path in [p for p in self.bad if p == key or p.startswith(prefix)]:
                del self.bad[abs_path]
            return
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
            self._skip(path, exc.reason, exc.detail, failed=exc.reason in _FAILURES)
            return
        except ExtractError as exc:
            self._skip(path, "extract_failed", str(exc), failed=True)
            return
        if isinstance(result, Unchanged):
            log.debug("file_unchanged", path=key)
            return
        self.bad.pop(key, None)
        prepared.append(result)

    def _write(self, prepared: list[Prepared]) -> None:
        """Embed and store ``prepared`` files, smallest first in groups of about ``GROUP_CHUNKS`` chunks, so a huge
        file in the batch does not hold back the small ones."""
        group: list[Prepared] = []
        size = 0
        for file in sorted(prepared, key=lambda f: len(f.chunks)):
            if group and size + len(file.chunks) > GROUP_CHUNKS:
                self._write_group(group)
                group, size = [], 0
            group.append(file)
            size += len(file.chunks)
        if group:
            self._write_group(group)

    def _write_group(self, prepared: list[Prepared]) -> None:
        try:
            vectors = self.pipeline.embed(prepared, should_stop=self.stopping.is_set)
        except Interrupted:
            log.info("index_interrupted", files=[str(f.path) for f in prepared],
                     hint="embedded slices are cached; the next start finishes them")
            return
        except (EmbedError, ExtractError) as exc:
            if len(prepared) == 1:
                self._skip(prepared[0].path, "embed_failed", str(exc), failed=True)
                return
            for file in prepared:  # isolate the file the embedder refused
                self._write_group([file])
            return
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
                self._retry_later(file.path)
                continue
            self.indexed[abs_path] = Indexed(file.collection.name, FileState(
                file.file_hash, file.size_bytes, file.mtime_ns, len(points), True))
            log.info("file_indexed", path=abs_path, collection=file.collection.name, kind=file.kind,
                     chunks=len(points), embedded=file.embedded, cache_hits=file.cache_hits,
                     write_ms=round((time.monotonic() - started) * 1000, 1))

    def _retry_later(self, path: Path) -> None:
        timer = threading.Timer(RETRY_AFTER_S, self.settler.add, args=(path, False))
        timer.daemon = True
        timer.start()

    # -- run modes ----------------------------------------------------------------------------------------------
    def index_once(self) -> dict[str, Any]:
        """Scan and index everything now (no watcher); returns ``status()``."""
        self.stopping = threading.Event()
        self.settler.add_many(self.scan())
        self._drain(progress=True)
        self.ready.set()
        return self.status()

    def _drain(self, progress: bool, stop: threading.Event | None = None) -> None:
        """Process everything queued now; on a terminal, with a progress bar that log lines print above."""
        total = len(self.settler)
        bar = None
        redirect: Any = contextlib.nullcontext()
        if progress and total and sys.stderr.isatty():
            from tqdm import tqdm
            from tqdm.contrib.logging import logging_redirect_tqdm

            bar = tqdm(total=total, unit="file", desc="indexing", file=sys.stderr, leave=False)
            redirect = logging_redirect_tqdm()
        started, chunks_before = time.monotonic(), self.pipeline.stats.chunks_embedded
        with redirect:
            while not (stop and stop.is_set()):
                batch = self.settler.take_ready(BATCH_FILES)
                if not batch:
                    break
                self.process(batch)
                if bar:
                    bar.update(len(batch))
        if bar:
            bar.close()
        log.info("index_pass_finished", files=len(self.indexed), seconds=round(time.monotonic() - started, 2),
                 chunks_embedded=self.pipeline.stats.chunks_embedded - chunks_before)

    def run(self, stop: threading.Event) -> None:
        """Watch and index until ``stop`` is set; finishes the batch in hand, then returns. An unavailable store
        at start is waited for (the API meanwhile answers ``ready: false`` and searches 503)."""
        self.stopping = stop
        if not self.connected.is_set() and not self._connect_until(stop):
            return
        self.watcher = Watcher(self.collections, self.on_path, polling=self.polling)
        self.watcher.start()
        for embedder in self.registry.embedders.values():  # load models now, not on the first search
            try:
                embedder.embed_query("warm-up")
            except Exception as exc:
                log.error("embedder_failed", model_id=embedder.model_id, error=f"{type(exc).__name__}: {exc}")
        self.settler.add_many(self.scan())
        self._drain(progress=True, stop=stop)
        if stop.is_set():
            return
        self.ready.set()
        log.info("daemon_ready", files=len(self.indexed), queue_depth=len(self.settler))
        next_scan = time.monotonic() + self.settings.rescan_interval_s
        next_refresh = time.monotonic() + REFRESH_S
        while not stop.is_set():
            if time.monotonic() >= next_refresh:
                next_refresh = time.monotonic() + REFRESH_S
                renewed = self.watcher.refresh()
                if renewed:
                    log.info("watch_renewed", roots=[str(p) for p in renewed])
                    self.settler.add_many(self.scan())
            batch = self.settler.take_ready(BATCH_FILES)
            if batch:
                try:
                    self.process(batch)
                except StoreUnavailable as exc:
                    log.error("store_unavailable", error=str(exc), retry_after_s=RETRY_AFTER_S)
                    for path in batch:
                        self._retry_later(path)
                except Exception:  # a bug must not kill the worker: log it, retry the batch later
                    log.exception("worker_error", paths=[str(p) for p in batch], retry_after_s=RETRY_AFTER_S)
                    for path in batch:
                        self._retry_later(path)
                continue
            if time.monotonic() >= next_scan:
                try:
                    self.settler.add_many(self.scan())
                except StoreUnavailable as exc:
                    log.error("store_unavailable", error=str(exc))
                next_scan = time.monotonic() + self.settings.rescan_interval_s
                continue
            self.settler.wait(min(1.0, max(0.0, next_scan - time.monotonic()), max(0.0, next_refresh - time.monotonic())))

    # -- reporting ----------------------------------------------------------------------------------------------
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
        stats = self.pipeline.stats if self.pipeline else None
        return {
            "ready": self.ready.is_set(),
            "store_connected": self.connected.is_set(),
            "backend": self.store.kind if self.store else None,
            "state_dir": str(self.settings.state_dir),
            "uptime_s": round(time.time() - self.started_at, 1),
            "queue_depth": len(self.settler) + self._in_hand,
            "chunks_embedded": stats.chunks_embedded if stats else 0,
            "cache_hits": stats.cache_hits if stats else 0,
            "files_failed": sum(1 for mark in list(self.bad.values()) if mark[4]),
            "last_scan_s": self.last_scan_s,
            "collections": per,
        }


# reasons worth a warning (the user may want to act); the rest are routine and logged at debug level
_LOUD = frozenset({"symlink", "too_large", "split_root_memory", "not_regular_file", "permission_denied",
                   "unreadable", "no_extractor", "no_embedder", "silent", "no_speech"})
_DETAILS = {
    "split_root_memory": "MEMORY.md and memory.md are distinct files; MEMORY.md is indexed. Run `qmd-indexer doctor`.",
    "symlink": "symlinks are never followed",
    "hidden": "hidden names are not memory",
}
# reasons that are failures (the file is memory but could not be indexed), counted in files_failed
_FAILURES = frozenset({"permission_denied", "unreadable"})
