"""The worker: the one thread that writes. It takes settled paths from the debounce queue (``Settler``) and hands
them to ``Sync.process`` (``indexer.sync``); it alone changes the ``IndexState`` and writes points.

- ``index_once(indexer)``: rebuild if asked (``--reindex``), scan, process everything queued, return ``status()``
  (``qmd-indexer index --once``).
- ``run(indexer, stop)``: wait for the store, start the watcher, scan and drain (``ready`` is set then; the daemon
  loads its models meanwhile, ``indexer.service.warm_models``, and a file to embed waits for them), and keep
  processing settled paths until ``stop`` is set, rescanning every ``rescan_interval_s`` and re-watching roots made
  again every ``REFRESH_S``, and reconciling at once a root whose events were lost (a kernel queue overflow, a
  watch refused below it: ``Watcher.take_lost``). A requested rebuild
  (``--reindex`` or ``POST /reindex``) runs here too, between batches, followed by a scan.
- Retries: a path whose write found the store unavailable, or a batch that raised, goes back into the same queue
  with a delay of ``sync.RETRY_AFTER_S`` seconds (an event for it meanwhile takes precedence). No timer threads.
  A batch the embedder could not answer (``EmbedUnavailable``: its server down, 429, 5xx) goes back with backoff
  (``ledger.Outage``: 1 s doubling to 30 s, or the server's ``Retry-After``), never failed, its points kept.
- Reload (``SIGHUP``, ``indexer.reload``): applied between batches; new collections are watched and scanned, then
  ``READY=1`` goes out again.
- Metrics: the index lag of each path an event queued is observed when its batch is done (``indexer.metrics``).
- HNSW: once ready, and after each rescan, a thread (``build_indexes``) gives each Qdrant Edge collection of at
  least ``edge_hnsw_min_points`` points without an index one (``EdgeStore.build_index``: built by a child process
  on a copy, swapped in); ``run`` stops and joins it before it returns.
- Progress: ``drain`` reports to an optional ``progress(total)`` context manager that yields an ``advance(n)``
  callable (the CLI draws a bar on a terminal); the worker itself never draws.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from indexer import sync
from indexer.daemon import Indexer
from indexer.errors import EmbedUnavailable, StateDirFull, StoreUnavailable
from indexer.status import Status
from indexer.store import EdgeStore
from indexer.systemd import Supervisor
from indexer.watcher import Watcher

if TYPE_CHECKING:
    from indexer.reload import Reloader

log = structlog.get_logger("qmd_indexer.daemon")

BATCH_FILES = 32  # files prepared per worker step: fills the model's batches during a full index
REFRESH_S = 5.0  # how often the roots are checked for a directory deleted and made again (its watch is dead)

Progress = Callable[[int], AbstractContextManager[Callable[[int], None]]]


@contextlib.contextmanager
def _no_progress(total: int) -> Iterator[Callable[[int], None]]:
    yield lambda n: None


def retry_later(indexer: Indexer, paths: Iterable[Path], delay_s: float = sync.RETRY_AFTER_S) -> None:
    """Queue ``paths`` again, ready in ``delay_s`` seconds (default ``sync.RETRY_AFTER_S``)."""
    for path in paths:
        indexer.settler.add(path, settle=False, delay=delay_s)


def process_observed(indexer: Indexer, batch: list[Path], pace: sync.Pace | None = None) -> None:
    """``Sync.process(batch, pace)``, its retries queued again (and the files it found under new directories
    queued), and the index lag of the paths an event queued observed (those not retried). Raises what ``process``
    raises."""
    changed = indexer.settler.changed_at(batch)
    outcome = indexer.sync.process(batch, pace)
    indexer.settler.add_many(outcome.found)
    retry_later(indexer, outcome.retry, outcome.retry_after_s)
    done = indexer.settler.clock()
    for path in changed.keys() - set(outcome.retry):
        indexer.metrics.index_lag.observe(max(0.0, done - changed[path]))


def process_guarded(indexer: Indexer, batch: list[Path], pace: sync.Pace | None = None) -> None:
    """``process_observed`` where no error kills the worker: an unavailable store or a bug is logged and the
    batch queued again in ``sync.RETRY_AFTER_S`` seconds."""
    try:
        process_observed(indexer, batch, pace)
    except StoreUnavailable as exc:
        indexer.metrics.error("state_dir_full" if isinstance(exc, StateDirFull) else "store_unavailable")
        if not isinstance(exc, StateDirFull):  # the store logs that once per outage
            log.error("store_unavailable", error=str(exc), retry_after_s=sync.RETRY_AFTER_S)
        retry_later(indexer, batch)
    except Exception:  # a bug must not kill the worker: log it, retry the batch later
        indexer.metrics.error("worker_error")
        log.exception("worker_error", paths=[str(p) for p in batch], retry_after_s=sync.RETRY_AFTER_S)
        retry_later(indexer, batch)


def drain(indexer: Indexer, pace: sync.Pace | None = None, progress: Progress | None = None,
          guarded: bool = False) -> None:
    """Process everything ready in the queue now (until ``pace.stop`` is set); logs ``index_pass_finished``. With
    ``guarded`` (the daemon) errors are logged and retried (``process_guarded``); else they propagate."""
    pace = pace or sync.Pace()
    settler, stats = indexer.settler, indexer.pipeline.stats
    started, chunks_before = time.monotonic(), stats.chunks_embedded
    with (progress or _no_progress)(len(settler)) as advance:
        while not pace.stop.is_set():
            pace.beat()
            batch = settler.take_ready(BATCH_FILES)
            if not batch:
                break
            if guarded:
                process_guarded(indexer, batch, pace)
            else:
                process_observed(indexer, batch, pace)
            advance(len(batch))
    log.info("index_pass_finished", files=len(indexer.state.indexed), seconds=round(time.monotonic() - started, 2),
             chunks_embedded=stats.chunks_embedded - chunks_before)


def index_once(indexer: Indexer, progress: Progress | None = None, wait_s: float = 0.0) -> Status:
    """Scan and index everything now (no watcher); returns ``StatusView.status()``. Files held back because the
    embedder cannot answer (``EmbedUnavailable``: they stay queued, not failed) are tried again with the outage's
    backoff for up to ``wait_s`` seconds; whatever is still queued then is the status's ``queue_depth``. Raises
    ``StoreUnavailable`` when the store cannot be reached for a delete or a read."""
    if indexer.state.rebuild_requested.is_set():
        indexer.rebuild()
    indexer.settler.add_many(indexer.scan())
    deadline = time.monotonic() + wait_s
    drain(indexer, progress=progress)
    while len(indexer.settler) and time.monotonic() < deadline:
        indexer.settler.wait(deadline - time.monotonic())
        drain(indexer, progress=progress)
    indexer.state.ready.set()
    return indexer.view.status()


def build_indexes(indexer: Indexer, stop: threading.Event) -> None:
    """Give each Edge collection of at least ``edge_hnsw_min_points`` points with fewer than half of them indexed an
    HNSW index (``EdgeStore.build_index``), one collection at a time, recording each in ``IndexState.hnsw``. A failed
    build is logged and not tried again by this process; one given up (``stop``, or a rebuild meanwhile) is tried
    at the next call."""
    store, minimum, state = indexer.store, indexer.settings.edge_hnsw_min_points, indexer.state
    if not minimum or not isinstance(store, EdgeStore):
        return
    for collection in indexer.collections:
        name = collection.name
        if stop.is_set() or state.hnsw.get(name, {}).get("state") == "failed":
            continue
        try:
            points, indexed = store.index_state(name)
        except Exception:  # not created yet
            continue
        if points < minimum or indexed >= points // 2:
            continue
        state.record_hnsw(name, state="building", points=points)
        log.info("hnsw_build_started", collection=name, points=points, indexed=indexed)
        try:
            seconds = store.build_index(name, stop)
        except Exception as exc:
            state.record_hnsw(name, state="failed", points=points, error=str(exc)[:500])
            log.error("hnsw_build_failed", collection=name, error=str(exc)[:500])
            continue
        if seconds is None:
            state.record_hnsw(name, state="given_up", points=points)
            log.info("hnsw_build_given_up", collection=name)
        else:
            points, indexed = store.index_state(name)
            state.record_hnsw(name, state="built", points=points, indexed=indexed, seconds=round(seconds, 1))
            log.info("hnsw_build_finished", collection=name, points=points, indexed=indexed, seconds=round(seconds, 1))


def _index_builder(indexer: Indexer, stop: threading.Event, running: threading.Thread | None) -> threading.Thread:
    """``running`` while it is alive, else a new ``build_indexes`` thread, started."""
    if running is not None and running.is_alive():
        return running
    thread = threading.Thread(target=build_indexes, args=(indexer, stop), name="hnsw-builder", daemon=True)
    thread.start()
    return thread


def _rebuild(indexer: Indexer, pace: sync.Pace) -> None:
    """``indexer.rebuild(pace)``; a failure is logged and leaves the old collections serving."""
    try:
        indexer.rebuild(pace)
    except StoreUnavailable as exc:
        indexer.metrics.error("rebuild_failed")
        log.error("rebuild_failed", error=str(exc), hint="the old collections keep serving; ask again later")
    except Exception:
        indexer.metrics.error("rebuild_failed")
        log.exception("rebuild_failed", hint="the old collections keep serving")


def _watch(indexer: Indexer) -> Watcher:
    """Stop the watcher of the previous collections, if any, and start one over the plan's collections."""
    if indexer.state.watcher is not None:
        indexer.state.watcher.stop()
    settler = indexer.settler

    def on_path(path: Path, quiet_s: float | None) -> None:  # on watchdog's thread: queue behind the debounce
        settler.add(path, quiet_s=quiet_s)

    watcher = Watcher(indexer.collections, on_path, polling=indexer.polling,
                      poll_interval_s=indexer.settings.poll_interval_s, wake=settler.wake)
    indexer.state.watch(watcher)
    watcher.start()
    return watcher


def state_writable(indexer: Indexer) -> bool:
    """Whether the state dir can be written now (``os.access``: a read-only mount refuses root too). A change is
    logged once: ``state_dir_read_only`` (error; indexing waits, searches answer from what is indexed) and
    ``state_dir_writable`` when it is back."""
    state_dir = indexer.settings.state_dir
    writable = os.access(state_dir, os.W_OK)
    if indexer.state.record_writable(writable):
        if writable:
            log.info("state_dir_writable", state_dir=str(state_dir), queue_depth=len(indexer.settler))
        else:
            indexer.metrics.error("state_dir_read_only")
            log.error("state_dir_read_only", state_dir=str(state_dir),
                      hint="indexing waits until it is writable again; searches answer from what is indexed")
    return writable


def connect_until(indexer: Indexer, stop: threading.Event) -> bool:
    """``indexer.connect()``, retrying every ``sync.RETRY_AFTER_S`` while the store is unavailable; one log line per
    outage (a full state dir is logged by the store itself). False if ``stop`` was set first."""
    reported = False
    while not stop.is_set():
        try:
            indexer.connect()
            if reported:
                log.info("store_reconnected", backend=indexer.store.kind)
            return True
        except StoreUnavailable as exc:
            if not reported:
                indexer.metrics.error("state_dir_full" if isinstance(exc, StateDirFull) else "store_unavailable")
                if not isinstance(exc, StateDirFull):
                    log.error("store_unavailable", error=str(exc), retry_after_s=sync.RETRY_AFTER_S)
            reported = True
        except EmbedUnavailable as exc:  # a remote embedder's vector size is not known yet: its server is down
            if not reported:
                indexer.metrics.error("embedder_unavailable")
                log.error("embedder_unavailable", error=str(exc), retry_after_s=sync.RETRY_AFTER_S,
                          hint="the collections open once the embedding server answers")
            reported = True
        stop.wait(sync.RETRY_AFTER_S)
    return False


def run(indexer: Indexer, stop: threading.Event, progress: Progress | None = None,
        supervisor: Supervisor | None = None, reloader: Reloader | None = None) -> None:
    """Watch and index until ``stop`` is set; finishes the batch in hand, then returns. An unavailable store at
    start is waited for (the API meanwhile answers ``ready: false`` and searches 503). ``progress`` is shown for
    the first pass only. ``supervisor`` (``qmd-indexer run`` under systemd) gets ``READY=1`` after the first
    pass, ``STATUS=`` changes and watchdog beats while the worker makes progress, and ``READY=1`` again after each
    reload ``reloader`` asked for (``SIGHUP``) is applied. The worker's ``Pace`` (``stop`` and the supervisor's
    heartbeat) is made here, once, and handed to every write."""
    state = indexer.state
    pace = sync.Pace(stop, supervisor.beat) if supervisor is not None else sync.Pace(stop)
    if not state.connected.is_set() and not connect_until(indexer, stop):
        return
    if supervisor is not None and supervisor.listening is not None:
        supervisor.listening.wait()  # the API first: a scan on this thread would slow its start (one GIL)
    _watch(indexer)
    settler = indexer.settler
    if state.rebuild_requested.is_set():
        _rebuild(indexer, pace)
    settler.add_many(indexer.scan())
    drain(indexer, pace, progress, guarded=True)
    if stop.is_set():
        return
    state.ready.set()
    log.info("daemon_ready", files=len(state.indexed), queue_depth=len(settler))
    state.startup.mark("ready")
    if supervisor is not None:
        supervisor.ready(len(settler), len(state.indexed))
    next_scan = time.monotonic() + indexer.settings.rescan_interval_s
    next_refresh = time.monotonic() + REFRESH_S
    _loop(indexer, pace, supervisor, reloader, next_scan, next_refresh)


def verify_claims(indexer: Indexer) -> set[str]:
    """Check the daemon's claims on a shared server (``ClaimingStore.verify``); an agent lost to another owner
    leaves the plan, and what is known indexed of it is forgotten (its points, another owner's now, are neither
    read nor deleted). Returns the agents lost; a store that cannot be reached is logged and checked next time."""
    state = indexer.state
    try:
        indexer.store.verify()
    except StoreUnavailable as exc:
        log.error("store_unavailable", error=str(exc))
    lost = set(indexer.store.refused_agents()) & set(state.plan.agents())  # found by this check or by a read
    if lost:
        gone = {c.name for c in state.plan.collections if c.agent in lost}
        state.swap_plan(dataclasses.replace(state.plan, collections=tuple(
            c for c in state.plan.collections if c.name not in gone)))
        state.reset({p: i for p, i in state.indexed.items() if i.collection not in gone})
    return lost


def _loop(indexer: Indexer, pace: sync.Pace, supervisor: Supervisor | None, reloader: Reloader | None,
          next_scan: float, next_refresh: float) -> None:
    """``run``'s loop once ready, until ``pace.stop`` is set; joins the HNSW builder thread before it returns."""
    settler, watcher, state, stop = indexer.settler, indexer.state.watcher, indexer.state, pace.stop
    assert watcher is not None
    builder = _index_builder(indexer, stop, None)
    try:
        while not stop.is_set():
            pace.beat()
            if supervisor is not None:
                supervisor.status(len(settler), len(state.indexed))
            if not state_writable(indexer):  # nothing is written meanwhile: changes wait in the queue
                stop.wait(1.0)
                continue
            if state.rebuild_requested.is_set():
                _rebuild(indexer, pace)
                settler.add_many(indexer.scan("rebuild"))
                continue
            if reloader is not None and reloader.requested.is_set():
                if reloader.apply():
                    watcher = _watch(indexer)
                    settler.add_many(indexer.scan("reload", reconcile=False))  # a new workspace's files are not drift
                if supervisor is not None:
                    supervisor.ready(len(settler), len(state.indexed))
                continue
            if time.monotonic() >= next_refresh:
                next_refresh = time.monotonic() + REFRESH_S
                verify_claims(indexer)
                if watcher.check():
                    settler.add_many(indexer.scan("watcher_restarted"))
                renewed = watcher.refresh()
                if renewed:
                    log.info("watch_renewed", roots=[str(p) for p in renewed])
                    settler.add_many(indexer.scan("watch_renewed"))
            lost = watcher.take_lost()
            if lost:
                reason = ",".join(sorted(set(lost.values())))
                log.info("reconcile_started", reason=reason, roots=sorted(lost))
                try:
                    settler.add_many(indexer.scan(reason))
                except StoreUnavailable as exc:
                    log.error("store_unavailable", error=str(exc))
                continue
            batch = settler.take_ready(BATCH_FILES)
            if batch:
                process_guarded(indexer, batch, pace)
                continue
            if time.monotonic() >= next_scan:
                try:
                    settler.add_many(indexer.scan())
                except StoreUnavailable as exc:
                    indexer.metrics.error("store_unavailable")
                    log.error("store_unavailable", error=str(exc))
                next_scan = time.monotonic() + indexer.settings.rescan_interval_s
                builder = _index_builder(indexer, stop, builder)
                continue
            settler.wait(min(1.0, max(0.0, next_scan - time.monotonic()), max(0.0, next_refresh - time.monotonic())))
    finally:
        builder.join()  # ``stop`` is set: a build in progress kills its child and gives up
