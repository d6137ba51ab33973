"""The worker: the one thread that writes. It takes settled paths from the debounce queue (``Settler``) and hands
them to ``Indexer.process``; nothing else calls it while it runs.

- ``index_once(indexer)``: rebuild if asked (``--reindex``), scan, process everything queued, return ``status()``
  (``qmd-indexer index --once``).
- ``run(indexer, stop)``: wait for the store, start the watcher, warm the embedders, scan and drain (``ready`` is
  set then), and keep processing settled paths until ``stop`` is set, rescanning every ``rescan_interval_s`` and
  re-watching roots made again every ``REFRESH_S``. A requested rebuild (``--reindex`` or ``POST /reindex``) runs
  here too, between batches, followed by a scan.
- Retries: a path whose write found the store unavailable, or a batch that raised, goes back into the same queue
  with a delay of ``RETRY_AFTER_S`` seconds (an event for it meanwhile takes precedence). No timer threads.
- HNSW: once ready, and after each rescan, a thread (``build_indexes``) gives each Qdrant Edge collection of at
  least ``edge_hnsw_min_points`` points without an index one (``EdgeStore.build_index``: built by a child process
  on a copy, swapped in); ``run`` stops and joins it before it returns.
- Progress: ``drain`` reports to an optional ``progress(total)`` context manager that yields an ``advance(n)``
  callable (the CLI draws a bar on a terminal); the worker itself never draws.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import structlog

from indexer.daemon import RETRY_AFTER_S, Indexer
from indexer.errors import StoreUnavailable
from indexer.store import EdgeStore
from indexer.systemd import Supervisor
from indexer.watcher import Watcher

log = structlog.get_logger("qmd_indexer.daemon")

BATCH_FILES = 32  # files prepared per worker step: fills the model's batches during a full index
REFRESH_S = 5.0  # how often the roots are checked for a directory deleted and made again (its watch is dead)

Progress = Callable[[int], AbstractContextManager[Callable[[int], None]]]


@contextlib.contextmanager
def _no_progress(total: int) -> Iterator[Callable[[int], None]]:
    yield lambda n: None


def retry_later(indexer: Indexer, paths: Iterable[Path]) -> None:
    """Queue ``paths`` again, ready in ``RETRY_AFTER_S`` seconds."""
    for path in paths:
        indexer.settler.add(path, settle=False, delay=RETRY_AFTER_S)


def process_guarded(indexer: Indexer, batch: list[Path]) -> None:
    """``indexer.process(batch)`` where no error kills the worker: an unavailable store or a bug is logged and the
    batch queued again in ``RETRY_AFTER_S`` seconds."""
    try:
        retry_later(indexer, indexer.process(batch))
    except StoreUnavailable as exc:
        log.error("store_unavailable", error=str(exc), retry_after_s=RETRY_AFTER_S)
        retry_later(indexer, batch)
    except Exception:  # a bug must not kill the worker: log it, retry the batch later
        log.exception("worker_error", paths=[str(p) for p in batch], retry_after_s=RETRY_AFTER_S)
        retry_later(indexer, batch)


def drain(indexer: Indexer, stop: threading.Event | None = None, progress: Progress | None = None,
          guarded: bool = False) -> None:
    """Process everything ready in the queue now (until ``stop`` is set); logs ``index_pass_finished``. With
    ``guarded`` (the daemon) errors are logged and retried (``process_guarded``); else they propagate."""
    settler, stats = indexer.settler, indexer.pipeline.stats
    started, chunks_before = time.monotonic(), stats.chunks_embedded
    with (progress or _no_progress)(len(settler)) as advance:
        while not (stop and stop.is_set()):
            indexer.beat()
            batch = settler.take_ready(BATCH_FILES)
            if not batch:
                break
            if guarded:
                process_guarded(indexer, batch)
            else:
                retry_later(indexer, indexer.process(batch))
            advance(len(batch))
    log.info("index_pass_finished", files=len(indexer.indexed), seconds=round(time.monotonic() - started, 2),
             chunks_embedded=stats.chunks_embedded - chunks_before)


def index_once(indexer: Indexer, progress: Progress | None = None) -> dict[str, Any]:
    """Scan and index everything now (no watcher); returns ``indexer.status()``. Raises ``StoreUnavailable``
    when the store cannot be reached for a delete or a read."""
    indexer.stopping = threading.Event()
    if indexer.rebuild_requested.is_set():
        indexer.rebuild()
    indexer.settler.add_many(indexer.scan())
    drain(indexer, progress=progress)
    indexer.ready.set()
    return indexer.status()


def build_indexes(indexer: Indexer, stop: threading.Event) -> None:
    """Give each Edge collection of at least ``edge_hnsw_min_points`` points with fewer than half of them indexed an
    HNSW index (``EdgeStore.build_index``), one collection at a time, recording each in ``indexer.hnsw``. A failed
    build is logged and not tried again by this process; one given up (``stop``, or a rebuild meanwhile) is tried
    at the next call."""
    store, minimum = indexer.store, indexer.settings.edge_hnsw_min_points
    if not minimum or not isinstance(store, EdgeStore):
        return
    for collection in indexer.collections:
        name = collection.name
        if stop.is_set() or indexer.hnsw.get(name, {}).get("state") == "failed":
            continue
        try:
            points, indexed = store.index_state(name)
        except Exception:  # not created yet
            continue
        if points < minimum or indexed >= points // 2:
            continue
        indexer.hnsw[name] = {"state": "building", "points": points}
        log.info("hnsw_build_started", collection=name, points=points, indexed=indexed)
        try:
            seconds = store.build_index(name, stop)
        except Exception as exc:
            indexer.hnsw[name] = {"state": "failed", "points": points, "error": str(exc)[:500]}
            log.error("hnsw_build_failed", collection=name, error=str(exc)[:500])
            continue
        if seconds is None:
            indexer.hnsw[name] = {"state": "given_up", "points": points}
            log.info("hnsw_build_given_up", collection=name)
        else:
            points, indexed = store.index_state(name)
            indexer.hnsw[name] = {"state": "built", "points": points, "indexed": indexed, "seconds": round(seconds, 1)}
            log.info("hnsw_build_finished", collection=name, points=points, indexed=indexed, seconds=round(seconds, 1))


def _index_builder(indexer: Indexer, stop: threading.Event, running: threading.Thread | None) -> threading.Thread:
    """``running`` while it is alive, else a new ``build_indexes`` thread, started."""
    if running is not None and running.is_alive():
        return running
    thread = threading.Thread(target=build_indexes, args=(indexer, stop), name="hnsw-builder", daemon=True)
    thread.start()
    return thread


def _rebuild(indexer: Indexer) -> None:
    """``indexer.rebuild()``; a failure is logged and leaves the old collections serving."""
    try:
        indexer.rebuild()
    except StoreUnavailable as exc:
        log.error("rebuild_failed", error=str(exc), hint="the old collections keep serving; ask again later")
    except Exception:
        log.exception("rebuild_failed", hint="the old collections keep serving")


def run(indexer: Indexer, stop: threading.Event, progress: Progress | None = None,
        supervisor: Supervisor | None = None) -> None:
    """Watch and index until ``stop`` is set; finishes the batch in hand, then returns. An unavailable store at
    start is waited for (the API meanwhile answers ``ready: false`` and searches 503). ``progress`` is shown for
    the first pass only. ``supervisor`` (``qmd-indexer run`` under systemd) gets ``READY=1`` after the first
    pass, ``STATUS=`` changes and watchdog beats while the worker makes progress."""
    indexer.stopping = stop
    if supervisor is not None:
        indexer.beat = supervisor.beat
    if not indexer.connected.is_set() and not indexer.connect_until(stop):
        return
    watcher = indexer.watcher = Watcher(indexer.collections, indexer.on_path, polling=indexer.polling,
                                        poll_interval_s=indexer.settings.poll_interval_s)
    watcher.start()
    for embedder in indexer.registry.embedders.values():  # load models now, not on the first search
        try:
            embedder.embed_query("warm-up")
        except Exception as exc:
            log.error("embedder_failed", model_id=embedder.model_id, error=f"{type(exc).__name__}: {exc}")
    settler = indexer.settler
    if indexer.rebuild_requested.is_set():
        _rebuild(indexer)
    settler.add_many(indexer.scan())
    drain(indexer, stop, progress, guarded=True)
    if stop.is_set():
        return
    indexer.ready.set()
    log.info("daemon_ready", files=len(indexer.indexed), queue_depth=len(settler))
    if supervisor is not None:
        supervisor.ready(len(settler), len(indexer.indexed))
    next_scan = time.monotonic() + indexer.settings.rescan_interval_s
    next_refresh = time.monotonic() + REFRESH_S
    builder = _index_builder(indexer, stop, None)
    try:
        _loop(indexer, stop, supervisor, next_scan, next_refresh, builder)
    finally:
        builder.join()  # ``stop`` is set: a build in progress kills its child and gives up


def _loop(indexer: Indexer, stop: threading.Event, supervisor: Supervisor | None, next_scan: float,
          next_refresh: float, builder: threading.Thread) -> None:
    """``run``'s loop once ready, until ``stop`` is set."""
    settler, watcher = indexer.settler, indexer.watcher
    assert watcher is not None
    while not stop.is_set():
        indexer.beat()
        if supervisor is not None:
            supervisor.status(len(settler) + indexer.in_hand, len(indexer.indexed))
        if indexer.rebuild_requested.is_set():
            _rebuild(indexer)
            settler.add_many(indexer.scan())
            continue
        if time.monotonic() >= next_refresh:
            next_refresh = time.monotonic() + REFRESH_S
            if watcher.check():
                settler.add_many(indexer.scan())
            renewed = watcher.refresh()
            if renewed:
                log.info("watch_renewed", roots=[str(p) for p in renewed])
                settler.add_many(indexer.scan())
        batch = settler.take_ready(BATCH_FILES)
        if batch:
            process_guarded(indexer, batch)
            continue
        if time.monotonic() >= next_scan:
            try:
                settler.add_many(indexer.scan())
            except StoreUnavailable as exc:
                log.error("store_unavailable", error=str(exc))
            next_scan = time.monotonic() + indexer.settings.rescan_interval_s
            builder = _index_builder(indexer, stop, builder)
            continue
        settler.wait(min(1.0, max(0.0, next_scan - time.monotonic()), max(0.0, next_refresh - time.monotonic())))
