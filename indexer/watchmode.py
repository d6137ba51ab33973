"""How each root is watched: natively (inotify on Linux, with its kernel limits) or by polling, and why.

- ``poll_reason``: a root is polled when its workspace says ``watch = "poll"``, or (``"auto"``) when its file system
  gives no events for changes made elsewhere (``needs_polling``: network, FUSE, VM-shared; ``filesystem_type`` reads
  ``/proc/self/mountinfo``). The third reason, the inotify watch limit, is found while watching: ``Watcher`` asks
  ``watches_exhausted`` after scheduling a recursive root and after each new directory under one, because watchdog
  skips the directories the kernel refuses without a word.
- ``native_observer``: watchdog's observer, on Linux one whose emitters also report a kernel event queue overflow
  (``IN_Q_OVERFLOW``), which watchdog otherwise only logs.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from watchdog.observers import Observer

from indexer.workspace import Collection

# file systems whose changes made elsewhere (another machine, the host, a FUSE backing folder) raise no inotify event
_POLLED_FS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "virtiofs", "fuse", "ceph", "glusterfs", "afs")


def filesystem_type(path: Path, mountinfo: str = "/proc/self/mountinfo") -> str:
    """The file system type (``ext4``, ``nfs4``, ``fuse.bindfs``...) of the mount holding ``path``: the longest
    mount point of ``/proc/self/mountinfo`` that contains it (see proc(5)). ``""`` when unknown (no procfs)."""
    try:
        lines = Path(mountinfo).read_text().splitlines()
    except OSError:
        return ""
    target = os.path.realpath(path)
    best, fstype = -1, ""
    for line in lines:
        fields, _, rest = line.partition(" - ")
        parts = fields.split()
        if len(parts) < 5 or not rest:
            continue
        point = parts[4].encode().decode("unicode_escape")  # octal escapes such as \040 for a space
        if (target == point or target.startswith(point.rstrip("/") + "/")) and len(point) > best:
            best, fstype = len(point), rest.split()[0]
    return fstype


_IN_DELETE_SELF = 0x400  # inotify(7) event mask bit: the cheapest watch to ask for
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def watches_exhausted(path: Path) -> bool:
    """True when the kernel refuses this user one more inotify watch (``ENOSPC``: ``max_user_watches``, or
    ``max_inotify_watches`` of a user namespace, is used up), tried on ``path`` (a directory) through an inotify
    instance of its own, closed at once: the observer's watches are left alone. False off Linux or when unsure."""
    if _libc is None:
        return False
    fd = _libc.inotify_init1(os.O_CLOEXEC | os.O_NONBLOCK)
    if fd < 0:
        return False  # no inotify instance left (max_user_instances): nothing to learn about watches
    try:
        wd = _libc.inotify_add_watch(fd, os.fsencode(path), _IN_DELETE_SELF)
        return wd < 0 and ctypes.get_errno() == errno.ENOSPC
    finally:
        os.close(fd)


if sys.platform.startswith("linux"):
    from dataclasses import dataclass, field

    from watchdog.observers.inotify import InotifyEmitter, InotifyObserver, InotifyWatchGroup

    @dataclass
    class _WatchGroup(InotifyWatchGroup):
        """watchdog's watch group, also calling ``overflowed()`` once it has rebuilt its watches after the kernel
        queue overflowed (``on_queue_overflow``, called by watchdog's ``InotifyFD`` reader)."""

        overflowed: Callable[[], None] = field(kw_only=True)

        def on_queue_overflow(self) -> None:
            super().on_queue_overflow()
            self.overflowed()

    class _Emitter(InotifyEmitter):
        """watchdog's inotify emitter, also telling ``overflowed(root)`` when the kernel queue overflowed: watchdog
        rebuilds its watches then but emits no event for what was dropped."""

        def __init__(self, *args: Any, overflowed: Callable[[Path], None], **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._overflowed = overflowed

        def on_thread_start(self) -> None:
            # watchdog 7's InotifyEmitter.on_thread_start, building the group that reports overflows
            root = Path(os.fsdecode(self.watch.path))
            self._inotify = _WatchGroup(self._inotify_fd, os.fsencode(self.watch.path),
                                        is_recursive=self.watch.is_recursive,
                                        event_mask=self.get_event_mask_from_filter(),
                                        follow_symlink=self.watch.follow_symlink,
                                        overflowed=lambda: self._overflowed(root))

    def native_observer(overflowed: Callable[[Path], None]) -> Any:
        """An ``InotifyObserver`` whose emitters call ``overflowed(root)`` (on watchdog's reader thread; keep it
        cheap) for each watched root when the kernel's event queue overflowed and events were dropped."""
        observer = InotifyObserver()
        observer._emitter_class = _Emitter  # watchdog 7: the class and extra arguments of each emitter made
        observer._emitter_kwargs = {**observer._emitter_kwargs, "overflowed": overflowed}
        return observer
else:  # pragma: no cover - FSEvents, kqueue, ReadDirectoryChangesW: no overflow hook
    def native_observer(overflowed: Callable[[Path], None]) -> Any:
        """watchdog's native observer for this platform (no overflow report)."""
        return Observer()


def needs_polling(fstype: str) -> bool:
    """True for network, FUSE and VM-shared file systems (``_POLLED_FS``, ``fuse.*``)."""
    return fstype.split(".")[0] in _POLLED_FS


def watch_roots(collections: Sequence[Collection]) -> list[tuple[Path, bool]]:
    """``(directory, recursive)`` for every root of ``collections`` to watch: each workspace (not recursive: its
    root memory files), ``memory/``, extra directories and the sessions folder (recursive), the directory of an
    extra file."""
    roots = [(root, False) for root in sorted({c.workspace.path for c in collections})]
    for collection in collections:
        if collection.role == "extra" and not collection.root.is_dir():  # an extra file: its directory
            roots.append((collection.root.parent, False))
        elif collection.source.walked:
            roots.append((collection.root, True))
    return roots


def poll_reason(collections: Sequence[Collection], path: Path) -> str:
    """Why root ``path`` is polled rather than watched natively (``""``: it is not): the workspace's ``watch``
    setting (``setting``), else its file system type (``fs:nfs4``, ``fs:fuse.bindfs``...). The watch limit, the
    third reason (``watch_limit_reached``), is found only by watching."""
    modes = {c.workspace.watch for c in collections if path == c.workspace.path or c.workspace.path in path.parents}
    if "poll" in modes:
        return "setting"
    if "native" in modes:
        return ""
    fstype = filesystem_type(path)
    return f"fs:{fstype}" if needs_polling(fstype) else ""
