"""File events to settled paths: the watchdog observer on every root, and the debounce in front of the worker.

- The watchdog handler only enqueues (watchdog calls handlers under its observer lock, so slow work there would
  stall every event). Every path an event names (``src`` and, for moves, ``dest``) goes to the ``Settler``; the
  worker later looks at the disk, so "what is there now" wins over the order of events. An atomic save (temp file
  renamed over the target) and a backup-unlink-create save both end as one settled path: the target.
- ``Settler`` releases a path once no event touched it for its quiet period, or ``max_wait_s`` (``settle_max_s``,
  5 s) after its first unreleased event, so a file saved every half second is still indexed while the saves go on.
  ``settle_for`` maps each event to its quiet period: a file closed after writing (inotify's ``IN_CLOSE_WRITE``) and
  the target of a rename (the step that ends an atomic save) are complete, so they settle after ``QUICK_SETTLE_S``;
  plain creates, modifies, deletes and a rename's source wait ``settle_s`` (default 1.0 s; the reference agent
  debounces 1.5 s), so a burst of writes still collapses into one index. The clock is injectable for tests.
- Watches: each workspace root non-recursively (for the root memory file and a ``memory/`` created later),
  ``memory/`` and extra directories recursively (watchdog adds watches for directories created inside), the parent
  of an extra file. A symlinked root is never watched.
- Lost events. inotify's watch limit (``max_user_watches``) may refuse the root's watch (``schedule`` raises) or
  only some directories below it (watchdog skips those silently): after scheduling a recursive root, and after each
  directory made under one, ``watches_exhausted`` tries one watch of its own; refused, the watcher logs
  ``watch_limit_reached`` once and polls that root instead. A kernel event queue overflow (``IN_Q_OVERFLOW``, more
  than ``fs.inotify.max_queued_events`` unread) drops events: the watcher logs ``watch_queue_overflow``. Either way
  the root goes to ``take_lost()``, and the worker reconciles it at once instead of at the next periodic rescan.
"""

from __future__ import annotations

import errno
import heapq
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import structlog
from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers.polling import PollingObserver

from indexer.watchmode import native_observer, poll_reason, watch_roots, watches_exhausted
from indexer.workspace import MEMORY_DIR, Collection

log = structlog.get_logger("qmd_indexer.watcher")

_IGNORED_EVENTS = frozenset({"opened", "closed_no_write"})
QUICK_SETTLE_S = 0.05  # quiet period after a close-after-write or the rename that ends a save (seconds)


def settle_for(event_type: str, dest: bool = False) -> float | None:
    """The quiet period (seconds) for a path named by a watchdog event of ``event_type`` (``dest``: it is the
    move's destination): ``QUICK_SETTLE_S`` when the event says the file is complete (``closed``, or the target of
    ``moved``), ``None`` (the configured ``settle_s``) for anything that may be part of a burst."""
    if event_type == "closed" or (event_type == "moved" and dest):
        return QUICK_SETTLE_S
    return None
class Settler:
    """Per-path debounce: ``add(path)`` (re)starts that path's quiet period; ``take_ready`` returns paths whose
    quiet period of ``settle_s`` seconds has passed, earliest deadline first. A heap keeps ``take_ready`` at
    O(k log n) for a queue of n paths (a first scan queues every file). Thread-safe."""

    def __init__(self, settle_s: float, clock: Callable[[], float] = time.monotonic, max_wait_s: float = 5.0) -> None:
        self.settle_s = settle_s
        self.max_wait_s = max_wait_s  # a path kept busy by events is still released this long after its first one
        self.clock = clock
        self._deadlines: dict[Path, float] = {}
        self._first: dict[Path, float] = {}  # when the first still-unreleased event for a path arrived
        self._released: dict[Path, float] = {}  # that time, for paths taken and not yet claimed by ``changed_at``
        self._heap: list[tuple[float, int, Path]] = []  # may hold stale entries; _deadlines is the truth
        self._seq = 0
        self._cond = threading.Condition()

    def add(self, path: Path, settle: bool = True, delay: float = 0.0, quiet_s: float | None = None) -> None:
        """Queue ``path``; an event (``settle=True``) (re)starts its quiet period of ``quiet_s`` seconds (``None``:
        ``settle_s``); ``settle=False`` makes it ready after ``delay`` seconds (at once for scans; a retry waits)
        unless an event already holds it."""
        with self._cond:
            current = self._deadlines.get(path)
            if not settle and current is not None:
                return
            now = self.clock()
            if settle:
                first = self._first.setdefault(path, now)
                quiet = self.settle_s if quiet_s is None else quiet_s
                deadline = min(now + quiet, max(now, first + self.max_wait_s))
            else:
                deadline = now + delay
            self._deadlines[path] = deadline
            self._seq += 1
            heapq.heappush(self._heap, (deadline, self._seq, path))
            self._cond.notify_all()

    def add_many(self, paths: Iterable[Path]) -> None:
        for path in paths:
            self.add(path, settle=False)

    def take_ready(self, limit: int) -> list[Path]:
        """Up to ``limit`` settled paths, removed from the queue."""
        with self._cond:
            now = self.clock()
            ready: list[Path] = []
            while self._heap and len(ready) < limit and self._heap[0][0] <= now:
                deadline, _, path = heapq.heappop(self._heap)
                if self._deadlines.get(path) == deadline:
                    del self._deadlines[path]
                    first = self._first.pop(path, None)
                    if first is not None:
                        self._released[path] = first
                    ready.append(path)
            return ready

    def changed_at(self, paths: Iterable[Path]) -> dict[Path, float]:
        """For the taken ``paths`` that an event queued: path -> when its first event arrived (this queue's
        clock, seconds), forgotten once asked (the index lag, ``indexer.metrics``). Scanned paths have none."""
        with self._cond:
            return {path: first for path in paths if (first := self._released.pop(path, None)) is not None}

    def wait(self, timeout_s: float) -> None:
        """Block until a path may be ready or ``timeout_s`` seconds pass (or ``wake`` is called)."""
        with self._cond:
            while self._heap and self._deadlines.get(self._heap[0][2]) != self._heap[0][0]:
                heapq.heappop(self._heap)  # drop stale entries so the head is a live deadline
            if self._heap:
                timeout_s = max(0.0, min(timeout_s, self._heap[0][0] - self.clock()))
            if timeout_s > 0:
                self._cond.wait(timeout_s)

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def paths(self) -> list[Path]:
        """A snapshot of the queued paths (settling or ready)."""
        with self._cond:
            return list(self._deadlines)

    def __len__(self) -> int:
        with self._cond:
            return len(self._deadlines)


class _Handler(FileSystemEventHandler):
    def __init__(self, watcher: Watcher) -> None:
        self.watcher = watcher

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type in _IGNORED_EVENTS or (event.is_directory and event.event_type == "modified"):
            return  # a directory's "modified" only echoes changes that arrive as events of their own
        paths = [(event.src_path, settle_for(event.event_type))]
        if getattr(event, "dest_path", ""):
            paths.append((event.dest_path, settle_for(event.event_type, dest=True)))
        if event.is_directory and event.event_type in ("deleted", "moved"):
            # a watched root that goes away takes its watch with it, even if a new directory later gets its inode
            self.watcher.forget(Path(event.src_path if isinstance(event.src_path, str) else event.src_path.decode()))
        for n, (raw, quiet_s) in enumerate(paths):
            path = Path(raw if isinstance(raw, str) else raw.decode())
            self.watcher.on_path(path, quiet_s)
            if event.is_directory and path.name == MEMORY_DIR and path.parent in self.watcher.workspace_roots:
                self.watcher.watch_memory_dir(path)
            elif event.is_directory and (event.event_type == "created" or (event.event_type == "moved" and n)):
                self.watcher.check_new_dir(path)  # watchdog has tried to watch it (and what it holds) by now


class Watcher:
    """Runs watchdog observers over the collections' roots and calls ``on_path(path, quiet_s)`` for every event
    path (``quiet_s``: ``settle_for`` of its event).

    A watch follows a directory object, not its name: when a root is deleted and made again, or replaced by a
    restored copy, its old watch sees nothing. ``refresh()`` (called every few seconds by the daemon, and on
    every directory event for a root) re-watches any root whose (device, inode) changed or that appeared late.
    """

    def __init__(self, collections: Sequence[Collection], on_path: Callable[[Path, float | None], None],
                 polling: bool = False, poll_interval_s: float = 2.0, wake: Callable[[], None] = lambda: None) -> None:
        self.collections = collections
        self.on_path = on_path
        self.wake = wake  # called when a root lost events (``take_lost``), to rouse the worker
        self.workspace_roots = {c.workspace.path for c in collections}
        self.polling = polling
        self.poll_interval_s = poll_interval_s
        self.poll_reasons: dict[str, str] = {}  # polled root -> why (setting, file system type, watch limit)
        self._observer = PollingObserver(timeout=poll_interval_s) if polling else native_observer(self._overflowed)
        self.restarts = 0  # observer restarts after it died (at most one)
        self.dead = False  # died again after its one restart: only the periodic reconcile finds changes now
        self._fallback: PollingObserver | None = None
        self._handler = _Handler(self)
        self._watched: dict[Path, tuple[Any, Any, tuple[int, int]]] = {}  # path -> (observer, watch, dev/ino)
        self._recursive: set[Path] = set()  # recursive roots watched natively: checked as directories appear
        self._lost: dict[str, str] = {}  # root -> why its events were lost (``take_lost``)
        self._lost_lock = threading.Lock()  # apart: watchdog's reader thread reports an overflow at any time
        self._lock = threading.Lock()

    def _roots(self) -> list[tuple[Path, bool]]:
        return watch_roots(self.collections)

    def start(self) -> None:
        self._observer.start()  # started first, so each schedule() sets its watches now and can fail here
        self.refresh()

    def refresh(self) -> list[Path]:
        """(Re)watch roots that are new or now name another directory; returns them (their files need a scan)."""
        changed = []
        for root, recursive in self._roots():
            if self._schedule(root, recursive):
                changed.append(root)
        return changed

    def watch_memory_dir(self, path: Path) -> None:
        """Watch ``path`` recursively if it is a real directory (never through a symlink)."""
        self._schedule(path, recursive=True)

    def _schedule(self, path: Path, recursive: bool) -> bool:
        """Watch ``path`` unless it is already watched as the same directory object; True if a watch was set."""
        try:
            st = os.lstat(path)
        except OSError:
            return False
        if not stat.S_ISDIR(st.st_mode):  # absent, a file, or a symlink: never watched through
            return False
        identity = (st.st_dev, st.st_ino)
        with self._lock:
            old = self._watched.get(path)
            if old is not None:
                if old[2] == identity:
                    return False
                try:
                    old[0].unschedule(old[1])
                except (KeyError, OSError):
                    pass
            observer = self._observer
            reason = self._poll_reason(path)
            if reason and not self.polling:
                if str(path) not in self.poll_reasons:
                    log.info("watch_polled", path=str(path), reason=reason, interval_s=self.poll_interval_s)
                self.poll_reasons[str(path)] = reason
                observer = self._poller()
            try:
                watch = observer.schedule(self._handler, str(path), recursive=recursive)
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EMFILE):
                    log.error("watch_failed", path=str(path), error=str(exc))
                    return False
                self._limit_reached(path)
                observer = self._poller()
                watch = observer.schedule(self._handler, str(path), recursive=recursive)
            self._watched[path] = (observer, watch, identity)
            self._recursive.discard(path)
            if recursive and observer is self._observer and not self.polling:
                self._recursive.add(path)
                if watches_exhausted(path):  # some directories below may have been refused silently
                    self._to_poller(path)
            return True

    def _limit_reached(self, path: Path) -> None:
        """Log ``watch_limit_reached`` (once per watcher) and record that ``path`` is polled for it."""
        if "watch_limit_reached" not in self.poll_reasons.values():
            log.warning("watch_limit_reached", path=str(path),
                        hint="raise fs.inotify.max_user_watches; polling this root meanwhile")
        self.poll_reasons[str(path)] = "watch_limit_reached"

    def _to_poller(self, root: Path) -> None:
        """Move natively watched ``root`` to the poller because the watch limit is reached (caller holds the lock)."""
        observer, watch, identity = self._watched[root]
        self._limit_reached(root)
        try:
            observer.unschedule(watch)  # frees its watches for the roots still to come
        except (KeyError, OSError, RuntimeError):
            pass
        self._recursive.discard(root)
        self._watched[root] = (self._poller(), self._poller().schedule(self._handler, str(root), recursive=True),
                               identity)

    def check_new_dir(self, path: Path) -> None:
        """A directory appeared under a watched root: if it is under a natively watched recursive root and the watch
        limit is used up now, watchdog may have failed to watch it (silently): poll that root, and have it
        reconciled (files made in the new directory before the first poll would be missed)."""
        with self._lock:
            roots = [r for r in self._recursive if r == path or r in path.parents]
        if not roots or not watches_exhausted(path):
            return
        with self._lock:
            for root in roots:
                if root in self._recursive:
                    self._to_poller(root)
        for root in roots:
            self._lose(root, "watch_limit_reached")

    def _overflowed(self, root: Path) -> None:
        """The kernel's event queue overflowed (watchdog's inotify reader thread calls this per watched root)."""
        self._lose(root, "queue_overflow")

    def _lose(self, root: Path, reason: str) -> None:
        with self._lost_lock:
            first = str(root) not in self._lost
            self._lost.setdefault(str(root), reason)
        if first and reason == "queue_overflow":
            log.warning("watch_queue_overflow", root=str(root),
                        hint="events were dropped (raise fs.inotify.max_queued_events); reconciling this root now")
        self.wake()

    def take_lost(self) -> dict[str, str]:
        """Roots whose events were lost since the last call, and why (``queue_overflow``, ``watch_limit_reached``);
        the worker reconciles them at once."""
        with self._lost_lock:
            lost, self._lost = self._lost, {}
        return lost

    def _poller(self) -> Any:
        """The shared ``PollingObserver`` for roots that are polled, started on first use."""
        if self._fallback is None:
            self._fallback = PollingObserver(timeout=self.poll_interval_s)
            self._fallback.start()
        return self._fallback

    def _poll_reason(self, path: Path) -> str:
        return poll_reason(self.collections, path)

    def alive(self) -> bool:
        """The observer thread and every emitter thread (one per watch) are running. An emitter whose directory
        is gone stops by design (its root is forgotten, then watched anew by ``refresh``): not a death."""
        observers = [o for o in (self._observer, self._fallback) if o is not None]
        return all(o.is_alive() and all(e.is_alive() or not os.path.isdir(e.watch.path) for e in list(o.emitters))
                   for o in observers)

    def check(self) -> bool:
        """Called on the daemon's refresh tick: when the observer (or an emitter) died, log ``watcher_died`` and
        restart it once, re-watching every root; if it dies again, log ``watcher_dead`` and leave it to the
        periodic reconcile (``status`` says ``dead``). True when the observer was restarted (its roots need a
        scan: events were lost meanwhile)."""
        if self.dead or self.alive():
            return False
        if self.restarts >= 1:
            self.dead = True
            log.error("watcher_dead", hint="changes are found by the periodic reconcile only; restart the daemon")
            return False
        log.error("watcher_died", roots=[str(p) for p in self._watched], restarting=True)
        self.stop()
        with self._lock:
            self._watched.clear()
            self._recursive.clear()
        self._observer = (PollingObserver(timeout=self.poll_interval_s) if self.polling
                          else native_observer(self._overflowed))
        self._fallback = None
        self.start()
        self.restarts += 1
        log.info("watcher_restarted", roots=[str(p) for p in self._watched])
        return True

    def modes(self) -> dict[str, str]:
        """Watched root -> ``"native"`` (inotify and the like), ``"poll"`` (``PollingObserver``) or ``"dead"``."""
        with self._lock:
            watched = dict(self._watched)
        return {str(path): "dead" if self.dead else "poll" if isinstance(observer, PollingObserver) else "native"
                for path, (observer, _, _) in sorted(watched.items())}

    def forget(self, path: Path) -> None:
        """Drop the watch of root ``path`` (deleted or moved away), so the next directory there is watched anew."""
        with self._lock:
            old = self._watched.pop(path, None)
            self._recursive.discard(path)
            if old is not None:
                try:
                    old[0].unschedule(old[1])
                except (KeyError, OSError, RuntimeError):
                    pass

    def stop(self) -> None:
        for observer in (self._observer, self._fallback):
            if observer is not None and observer.is_alive():
                observer.stop()
                observer.join(timeout=5)
            elif observer is not None:
                try:
                    observer.unschedule_all()  # stops emitters left running by a dead observer thread
                except Exception:  # noqa: BLE001 - best effort on a broken observer
                    pass
