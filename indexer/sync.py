"""Bring the store in line with the disk for a batch of paths: prepare -> embed -> points -> write.

``Sync`` is the only caller of the pipeline (``indexer.pipeline``) and the only writer of points to the store; the
worker thread (``indexer.worker``) is its only caller. A file event's walk::

    watcher -> Settler (debounce) -> worker (take_ready) -> Sync.process -> Pipeline.prepare/embed/points
                                                          -> Store.replace_file / delete_file -> IndexState.put/drop

What it finds is recorded in the ``IndexState`` (``put``/``drop``, the ledger for skips and failures). Paths it
cannot finish now are handed back (``Outcome.retry``: the store was unavailable or its state dir full, or the
embedder could not answer now, with backoff: never failed, their points kept), and the files of a directory made or
moved in (which arrive without events of their own) are handed back as ``Outcome.found``; the worker queues both.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import structlog

from indexer.errors import (
    BadVectors,
    EmbedError,
    EmbedUnavailable,
    ExtractError,
    FileSkipped,
    StateDirFull,
    StoreUnavailable,
)
from indexer.ledger import FAILURES
from indexer.metrics import Metrics
from indexer.pipeline import Interrupted, Pipeline, trim_heap
from indexer.points import FileState, Point
from indexer.same_file import indexed_name
from indexer.sources.base import Prepared, Unchanged
from indexer.state import IndexState
from indexer.store import Store
from indexer.walk import missing_workspaces, route, walk_dir
from indexer.workspace import Collection, Skip

log = structlog.get_logger("qmd_indexer.daemon")

GROUP_CHUNKS = 256  # chunks embedded and written together; smaller files of a batch go first
STREAM_CHUNKS = 2 * GROUP_CHUNKS  # a file of more chunks is embedded and written in slices (``Sync._write_slices``)
RETRY_AFTER_S = 5.0  # a store found unreachable is tried again after this long (connecting, or a file's write)


@dataclass(slots=True)
class Outcome:
    """What ``Sync.process`` hands back to the worker: files to try again later (``retry``, in ``retry_after_s``
    seconds) and files found under a directory that appeared (``found``), to queue."""

    retry: list[Path] = field(default_factory=list)
    found: list[Path] = field(default_factory=list)
    retry_after_s: float = RETRY_AFTER_S


def _no_beat() -> None:
    pass


@dataclass(frozen=True)
class Pace:
    """The worker's stop event and heartbeat, made once when it starts (``indexer.worker``) and handed to each
    write: ``beat`` is called where work progresses (the systemd watchdog), and ``stop``, once set, makes embedding
    give up between slices. The default (``index --once``, a test) never stops and beats nothing."""

    stop: threading.Event = field(default_factory=threading.Event)
    beat: Callable[[], None] = _no_beat

    def should_stop(self) -> bool:
        """Asked between embedded slices: progress (a beat), and whether to give up for a stop."""
        self.beat()
        return self.stop.is_set()


class Sync:
    """Writes what ``pipeline`` makes of files into ``store`` and records it in ``state`` (see the module). The
    worker's ``Pace`` comes with each batch (``process``, ``fill``): the sync holds no stop event or heartbeat."""

    def __init__(self, state: IndexState, pipeline: Pipeline, store: Store, metrics: Metrics) -> None:
        self.state, self.pipeline, self.store, self.metrics = state, pipeline, store, metrics
        self._embed_delay_s: float | None = None  # set by a batch the embedder could not answer (``process``)

    # -- one batch ----------------------------------------------------------------------------------------------
    def process(self, paths: Sequence[Path], pace: Pace | None = None) -> Outcome:
        """Bring the store in line with the disk for ``paths`` (files or directories, present or gone), at the
        worker's ``pace`` (default: ``Pace()``). Raises
        ``StoreUnavailable`` when a delete or read found the store unavailable (a write that does goes to
        ``Outcome.retry``)."""
        pace = pace or Pace()
        outcome = Outcome()
        prepared: list[Prepared] = []
        self._embed_delay_s = None
        with self.state.holding(paths):
            for path in paths:
                pace.beat()
                self._prepare_one(path, prepared, outcome)
            if prepared:
                outcome.retry += self.write(prepared, pace=pace)
        if self._embed_delay_s is not None:  # the embedder could not answer: back off (``ledger.Outage``)
            outcome.retry_after_s = self._embed_delay_s
        return outcome

    def _prepare_one(self, path: Path, prepared: list[Prepared], outcome: Outcome) -> None:
        state, collections = self.state, self.state.plan.collections
        key = str(path)
        try:
            st = os.lstat(path)
        except OSError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode):
            self.remove(key, reason="not_a_file")  # a file that became a directory leaves no ghost
            collection, _ = route(collections, path)
            # a directory made or moved in under a memory root: its files arrive without events of their own. The
            # workspace root itself is never walked (it may hold anything); its memory files have their own events.
            if collection is not None or path in {c.root for c in collections if c.role != "root"}:
                skips: list[Skip] = []
                outcome.found += walk_dir(path, skips)
                self.report_skips(skips)
            return
        if st is None and key.startswith(tuple(missing_workspaces(collections))):
            log.info("file_kept", path=key, reason="workspace_missing")  # its disk may not be mounted yet
            return
        if st is None:  # gone: a deleted or moved-away file, or a whole directory
            self.remove(key, reason="deleted")
            prefix = key.rstrip("/") + "/"
            for abs_path in [p for p in state.indexed if p.startswith(prefix)]:
                self.remove(abs_path, reason="deleted")
            state.ledger.forget_under(key)
            return
        other = indexed_name(self.state, key, st)
        if other is not None:
            path, key = Path(other), other
        collection, reason = route(collections, path)
        if collection is None:
            if reason:
                self.skip(path, reason)
            elif key in state.indexed:
                self.remove(key, reason="not_memory")
            return
        known = state.indexed.get(key)
        try:
            # a file that changed owner (a workspace now nested in another's memory/) is rewritten in its new
            # collection, whatever its hash; the embedding cache makes that cheap
            result = self.pipeline.prepare(collection, path,
                                           known.state if known and known.collection == collection.name else None)
        except FileNotFoundError:
            self.remove(key, reason="deleted")
            return
        except FileSkipped as exc:
            self.skip(path, exc.reason, exc.detail, failed=exc.reason in FAILURES)
            return
        except ExtractError as exc:
            self.skip(path, "extract_failed", str(exc), failed=True)
            return
        if isinstance(result, Unchanged):
            log.debug("file_unchanged", path=key)
            if result.identity is not None and known is not None and known.collection == collection.name:
                state.restat(key, result.identity)  # same text under a new stat (touch, chmod)
            return
        state.ledger.clear(key)
        prepared.append(result)

    # -- removing -----------------------------------------------------------------------------------------------
    def remove(self, abs_path: str, reason: str) -> None:
        """Delete the points of ``abs_path``, if it has any, and forget it. Raises ``StoreUnavailable``."""
        entry = self.state.indexed.get(abs_path)
        if entry is None:
            return
        self.store.delete_file(entry.collection, abs_path)
        self.state.drop(abs_path)
        log.info("file_removed", path=abs_path, collection=entry.collection, reason=reason)

    def skip(self, path: Path, reason: str, detail: str = "", failed: bool = False) -> None:
        """Log a skip or failure once per file state (the ledger); a file that stops being indexable loses its
        points."""
        if self.state.ledger.skip(path, reason, detail, failed):
            self.remove(str(path), reason=reason)

    def report_skips(self, skips: Sequence[Skip]) -> None:
        """``skip`` each of a walk's ``skips``; the reasons in ``ledger.FAILURES`` count as failed files."""
        for s in skips:
            self.skip(s.path, s.reason, failed=s.reason in FAILURES)

    # -- writing ------------------------------------------------------------------------------------------------
    def write(self, prepared: Sequence[Prepared], into: Mapping[str, str] | None = None,
              pace: Pace | None = None) -> list[Path]:
        """Embed and store ``prepared`` files, smallest first in groups of about ``GROUP_CHUNKS`` chunks, so a huge
        file in the batch does not hold back the small ones. Returns the files to retry. ``into`` (a rebuild):
        collection name -> the physical collection to write instead; the index state is left alone. ``pace``: as
        ``process``'s."""
        pace = pace or Pace()
        retry: list[Path] = []
        group: list[Prepared] = []
        size = 0
        for file in sorted(prepared, key=lambda f: len(f.chunks)):
            if group and size + len(file.chunks) > GROUP_CHUNKS:
                retry += self._write_group(group, into, pace)
                group, size = [], 0
            group.append(file)
            size += len(file.chunks)
        if group:
            retry += self._write_group(group, into, pace)
        return retry

    def fill(self, found: Sequence[tuple[Collection, Path]], into: Mapping[str, str], batch_files: int,
             pace: Pace | None = None) -> bool:
        """Write every file of ``found`` (a walk) into the rebuild targets ``into`` (collection name -> physical
        collection), ``batch_files`` at a time, whatever its indexed state. Files gone, skipped or failing are left
        for the scan after the swap to log. Returns False (abandoned) when ``pace``'s stop was set or a write must be
        retried."""
        pace = pace or Pace()
        batch: list[Prepared] = []
        for n, (collection, path) in enumerate(found, 1):
            try:
                result = self.pipeline.prepare(collection, path, None)
                if isinstance(result, Prepared):
                    batch.append(result)
            except (OSError, FileSkipped, ExtractError):
                pass
            if len(batch) >= batch_files or n == len(found):
                if self.write(batch, into, pace) or pace.stop.is_set():
                    return False
                batch = []
        return True

    def _write_group(self, prepared: list[Prepared], into: Mapping[str, str] | None, pace: Pace) -> list[Path]:
        try:
            self.store.ensure_room(0)  # a full state dir: retry later, without embedding in vain meanwhile
        except StateDirFull:
            return [file.path for file in prepared]
        if len(prepared) == 1 and len(prepared[0].chunks) > STREAM_CHUNKS:
            return self._write_slices(prepared[0], into, pace)
        try:
            vectors = self.pipeline.embed(prepared, should_stop=pace.should_stop)
        except Interrupted:
            log.info("index_interrupted", files=[str(f.path) for f in prepared],
                     hint="embedded slices are cached; the next start finishes them")
            return []
        except EmbedUnavailable as exc:  # transient: retried later; never failed, the points stay as they are
            self.metrics.error("embedder_unavailable")
            self._embed_delay_s = self.state.ledger.outage.hold(
                [str(f.path) for f in prepared], f"{type(exc).__name__}: {exc}", exc.retry_after_s)
            return [file.path for file in prepared]
        except (EmbedError, ExtractError) as exc:
            if len(prepared) == 1 and isinstance(exc, BadVectors):  # the answer was bad, not the file: points stay
                self.state.ledger.skip(prepared[0].path, "bad_vectors", str(exc), failed=True)
                return []
            if len(prepared) == 1:
                self.skip(prepared[0].path, "embed_failed", str(exc), failed=True)
                return []
            # isolate the refused file
            return [path for file in prepared for path in self._write_group([file], into, pace)]
        retry: list[Path] = []
        for file, file_vectors in zip(prepared, vectors):
            self.state.ledger.outage.release(str(file.path))
            points = self.pipeline.points(file, file_vectors)
            started = time.monotonic()
            abs_path = str(file.path)
            old = self.state.indexed.get(abs_path)
            try:
                if into is not None:
                    self.store.replace_file(into[file.collection.name], abs_path, file.file_hash, points)
                    continue
                if old and old.collection != file.collection.name:
                    self.store.delete_file(old.collection, abs_path)
                if file.indexes is not None and old is not None:  # a transcript's tail: its other points stay
                    self._write_tail(file.collection.name, abs_path, points, old.state.points, file.chunk_count)
                else:
                    self.store.replace_file(file.collection.name, abs_path, file.file_hash, points)
            except StoreUnavailable as exc:
                self.metrics.error("state_dir_full" if isinstance(exc, StateDirFull) else "store_unavailable")
                if not isinstance(exc, StateDirFull):  # that one the store logs once per outage
                    log.error("store_unavailable", path=abs_path, error=str(exc), retry_after_s=RETRY_AFTER_S)
                retry.append(file.path)
                continue
            self.metrics.store_write_seconds.observe(time.monotonic() - started)
            self.state.put(abs_path, file.collection.name, FileState(
                file.file_hash, file.size_bytes, file.mtime_ns, file.chunk_count, True, file.ctime_ns, file.inode,
                file.device, file.tail_state))
            log.info("file_indexed", path=abs_path, collection=file.collection.name, kind=file.kind,
                     chunks=file.chunk_count, written=len(points), embedded=file.embedded, cache_hits=file.cache_hits,
                     write_ms=round((time.monotonic() - started) * 1000, 1), **_read(file))
        return retry

    def _write_tail(self, name: str, abs_path: str, points: Sequence[Point], had: int, count: int) -> None:
        """Write a transcript's tail (``indexer.sources.tailing``): its new points over the open window's (same ids),
        chunk 0 (``points[0]``, the file's state) last, then the indexes past its new end deleted. A crash between
        leaves more points than chunk 0 counts or an old chunk 0: incomplete, re-indexed whole at the next start."""
        self.store.upsert(name, points[1:])
        self.store.upsert(name, points[:1])
        if count < had:
            self.store.trim_file(name, abs_path, count, had)

    def _write_slices(self, file: Prepared, into: Mapping[str, str] | None, pace: Pace) -> list[Path]:
        """Embed and store one huge file (a 10 MB conversation log: 20,000 chunks) ``GROUP_CHUNKS`` chunks at a
        time, so its vectors and points are never all held at once and the store's lock is taken per slice
        (searches interleave with the write). Its old chunk 0, the point that carries the file's state, goes first
        (``Store.begin_file``) and its new one last (``replace_file``, which then deletes the old version's other
        points): until then the file reads as incomplete, in the store (a crash midway is re-indexed at the next
        start, its vectors from the embedding cache) and here (``IndexState``: the next event re-indexes it).
        Returns the files to retry, as ``_write_group``."""
        abs_path, logical = str(file.path), file.collection.name
        name = into[logical] if into is not None else logical
        trim_heap()  # what chunking the file freed (a 10 MB log: ~190 MiB) goes back before embedding begins
        old = self.state.indexed.get(abs_path) if into is None else None
        started = time.monotonic()
        try:
            if old is not None and old.collection != logical:
                self.store.delete_file(old.collection, abs_path)
                old = None
            self.store.begin_file(name, abs_path)
            if into is None:  # half-written from here on: never taken for indexed
                self.state.put(abs_path, logical, FileState(file.file_hash, file.size_bytes, file.mtime_ns, 0, False,
                                                            file.ctime_ns, file.inode, file.device))
            self._slices(file, name, pace, old.state.points if old is not None else None)
        except Interrupted:
            log.info("index_interrupted", files=[abs_path],
                     hint="embedded slices are cached; the next start finishes them")
            return []
        except EmbedUnavailable as exc:
            self.metrics.error("embedder_unavailable")
            self._embed_delay_s = self.state.ledger.outage.hold([abs_path], f"{type(exc).__name__}: {exc}",
                                                                exc.retry_after_s)
            return [file.path]
        except (EmbedError, ExtractError) as exc:
            if isinstance(exc, BadVectors):
                self.state.ledger.skip(file.path, "bad_vectors", str(exc), failed=True)
            else:
                self.skip(file.path, "embed_failed", str(exc), failed=True)
            return []
        except StoreUnavailable as exc:
            self.metrics.error("state_dir_full" if isinstance(exc, StateDirFull) else "store_unavailable")
            if not isinstance(exc, StateDirFull):
                log.error("store_unavailable", path=abs_path, error=str(exc), retry_after_s=RETRY_AFTER_S)
            return [file.path]
        self.state.ledger.outage.release(abs_path)
        self.metrics.store_write_seconds.observe(time.monotonic() - started)
        if into is None:
            self.state.put(abs_path, logical, FileState(file.file_hash, file.size_bytes, file.mtime_ns,
                                                        file.chunk_count, True, file.ctime_ns, file.inode, file.device,
                                                        file.tail_state))
        log.info("file_indexed", path=abs_path, collection=logical, kind=file.kind, chunks=file.chunk_count,
                 embedded=file.embedded, cache_hits=file.cache_hits, slices=-(-len(file.chunks) // GROUP_CHUNKS),
                 write_ms=round((time.monotonic() - started) * 1000, 1), **_read(file))
        return []

    def _slices(self, file: Prepared, name: str, pace: Pace, had: int | None) -> None:
        """Embed and upsert ``file``'s chunks ``GROUP_CHUNKS`` at a time into collection ``name``, chunk 0 last
        (``replace_file``), then trim the points past its count where it had ``had`` before (``None``: unknown).
        Raises ``Interrupted`` between slices when ``pace`` says stop, and what embedding and the store raise."""
        first = None
        for start in range(0, len(file.chunks), GROUP_CHUNKS):
            if start and pace.should_stop():  # between slices, cached or not
                raise Interrupted("stop requested")
            part = replace(file, chunks=file.chunks[start : start + GROUP_CHUNKS], embedded=0, cache_hits=0)
            vectors = self.pipeline.embed([part], should_stop=pace.should_stop)[0]
            file.embedded, file.cache_hits = file.embedded + part.embedded, file.cache_hits + part.cache_hits
            points = self.pipeline.points(file, vectors, start)
            if start == 0:
                first, points = points[0], points[1:]
            self.store.upsert(name, points)
        assert first is not None
        self.store.replace_file(name, str(file.path), file.file_hash, [first])
        if file.indexes is not None and had is not None and file.chunk_count < had:
            self.store.trim_file(name, str(file.path), file.chunk_count, had)

def _read(file: Prepared) -> dict[str, int]:
    """A transcript's ``read_bytes``/``read_lines`` for its ``file_indexed`` line (the bytes and JSONL lines parsed:
    its tail alone, or the whole file); nothing for another file."""
    return {"read_bytes": file.tail.read_bytes, "read_lines": file.tail.read_lines} if file.tail is not None else {}
