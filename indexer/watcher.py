"""File events to settled paths: the watchdog observer on every root, and the debounce in front of the worker.

- The watchdog handler only enqueues (watchdog calls handlers under its observer lock, so slow work there would
  stall every event). Every path an event names (``src`` and, for moves, ``dest``) goes to the ``Settler``; the
  worker later looks at the disk, so "what is there now" wins over the order of events. An atomic save (temp file
  renamed over the target) and a backup-unlink-create save both end as one settled path: the target.
- ``Settler`` releases a path once no event touched it for ``settle_s`` seconds (the reference agent debounces 1.5 s;
  the default 1.0 s keeps save-to-searchable under 2 s). The clock is injectable for tests.
- Watches: each workspace root non-recursively (for the root memory file and a ``memory/`` created later),
  ``memory/`` and extra directories recursively (watchdog adds watches for directories created inside), the parent
  of an extra file. A symlinked root is never watched. When the kernel refuses a watch (inotify's
  ``max_user_watches``), the watcher logs ``watch_limit_reached`` once and polls that root instead.
"""

from __future__ import annotations

import errno
import heapq
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import structlog
from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.polling import PollingObserver

from indexer.workspace import MEMORY_DIR, Collection

log = structlog.get_logger("qmd_indexer.watcher")

_IGNORED_EVENTS = frozenset({"opened", "closed_no_write"})


class Settler:
    """Per-path debounce: ``add(path)`` (re)starts that path's quiet period; ``take_ready`` returns paths whose
    quiet period of ``settle_s`` seconds has passed, earliest deadline first. A heap keeps ``take_ready`` at
    O(k log n) for a queue of n paths (a first scan queues every file). Thread-safe."""

    def __init__(self, settle_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.settle_s = settle_s
        self.clock = clock
        self._deadlines: dict[Path, float] = {}
        self._heap: list[tuple[float, int, Path]] = []  # may hold stale entries; _deadlines is the truth
        self._seq = 0
        self._cond = threading.Condition()

    def add(self, path: Path, settle: bool = True) -> None:
        """Queue ``path``; ``settle=False`` makes it ready at once (scans) unless an event already holds it."""
        with self._cond:
            current = self._deadlines.get(path)
            if not settle and current is not None:
                return
            deadline = self.clock() + (self.settle_s if settle else 0.0)
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
                    ready.append(path)
            return ready

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

    def __len__(self) -> int:
        with self._cond:
            return len(self._deadlines)


class _Handler(FileSystemEventHandler):
    def __init__(self, watcher: Watcher) -> None:
        self.watcher = watcher

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type in _IGNORED_EVENTS:
            return
        paths = [event.src_path]
        if getattr(event, "dest_path", ""):
            paths.append(event.dest_path)
        for raw in paths:
            path = Path(raw if isinstance(raw, str) else raw.decode())
            self.watcher.on_path(path)
            if event.is_directory and path.name == MEMORY_DIR and path.parent in self.watcher.workspace_roots:
                self.watcher.watch_memory_dir(path)


class Watcher:
    """Runs watchdog observers over the collections' roots and calls ``on_path(path)`` for every event path."""

    def __init__(self, collections: list[Collection], on_path: Callable[[Path], None], polling: bool = False) -> None:
        self.collections = collections
        self.on_path = on_path
        self.workspace_roots = {c.workspace.path for c in collections}
        self._observer = PollingObserver() if polling else Observer()
        self._fallback: PollingObserver | None = None
        self._handler = _Handler(self)
        self._watched: set[Path] = set()
        self._lock = threading.Lock()

    def start(self) -> None:
        self._observer.start()  # started first, so each schedule() sets its watches now and can fail here
        for root in sorted(self.workspace_roots):
            self._schedule(root, recursive=False)
        for collection in self.collections:
            if collection.role == "dir":
                self.watch_memory_dir(collection.root)
            elif collection.role == "extra" and not collection.root.is_symlink():
                if collection.root.is_dir():
                    self._schedule(collection.root, recursive=True)
                elif collection.root.parent.is_dir():
                    self._schedule(collection.root.parent, recursive=False)

    def watch_memory_dir(self, path: Path) -> None:
        """Watch ``path`` recursively if it is a real directory (never through a symlink)."""
        if path.is_dir() and not path.is_symlink():
            self._schedule(path, recursive=True)

    def _schedule(self, path: Path, recursive: bool) -> None:
        with self._lock:
            if path in self._watched or not path.is_dir():
                return
            self._watched.add(path)
            try:
                self._observer.schedule(self._handler, str(path), recursive=recursive)
                return
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EMFILE):
                    log.error("watch_failed", path=str(path), error=str(exc))
                    return
            if self._fallback is None:
                log.warning("watch_limit_reached", path=str(path),
                            hint="raise fs.inotify.max_user_watches; polling this root meanwhile")
                self._fallback = PollingObserver()
                self._fallback.start()
            self._fallback.schedule(self._handler, str(path), recursive=recursive)

    def stop(self) -> None:
        for observer in (self._observer, self._fallback):
            if observer is not None and observer.is_alive():
                observer.stop()
                observer.join(timeout=5)
