"""Open a file beneath a directory without following a symlink at any component, race-free: every open of a memory
file beneath its root, for reading (``open_beneath``) and for an append (``open_append``); and a note's bytes read as
text (``decode_text``).

Path checks made before ``open()`` can be raced: a directory on the way swapped for a symlink between the check and
the open makes the kernel follow it out of the workspace. ``open_beneath`` therefore lets the kernel resolve the
path from a descriptor of the root, refusing symlinks and ``..`` at every step, and checks the opened descriptor:

- Linux 5.6+: ``openat2(root_fd, rel, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)``
  (``openat2(2)``), one system call;
- elsewhere (or when seccomp forbids ``openat2``): ``openat`` component by component from the root descriptor,
  each directory with ``O_NOFOLLOW | O_DIRECTORY`` and the file with ``O_NOFOLLOW``.

Either way the file is opened ``O_NONBLOCK`` (a FIFO never blocks) and must ``fstat`` as a regular file.

``open_append`` walks the same way (``openat`` from the root's descriptor, ``O_NOFOLLOW`` at each component), making
the folders on the way, and opens the file ``O_RDWR | O_APPEND | O_CREAT``: never a FIFO, socket or device (checked
before the open, so none is opened for writing even to look), never a file with a second hard link (it could reach
a file outside the root).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import stat
from pathlib import Path

from indexer.errors import ExtractError

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)

# openat2(2): the same number on every Linux architecture (the unified syscall table from 5.1 on)
_SYS_OPENAT2 = 437
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08


class UnsafePath(OSError):
    """The path cannot be opened safely beneath the root. ``reason``: ``symlink`` (a symlink on the way),
    ``outside`` (an absolute path or ``..``), ``not_regular_file`` (a directory, FIFO, socket or device), and for
    ``open_append`` also ``not_directory`` (a file where a folder should be), ``hard_link`` (a file with a second
    link) or ``changing`` (a folder on the way replaced while it was made)."""

    def __init__(self, reason: str, path: str) -> None:
        super().__init__(errno.EPERM, reason, path)
        self.reason = reason


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = None
_have_openat2 = platform.system() == "Linux"


def _openat2(dir_fd: int, rel: str, flags: int) -> int | None:
    """``openat2`` with beneath/no-symlink resolution; ``None`` when the kernel (or a sandbox) lacks it."""
    global _libc, _have_openat2
    if not _have_openat2:
        return None
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long
    how = _OpenHow(flags, 0, _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS)
    fd = _libc.syscall(ctypes.c_long(_SYS_OPENAT2), ctypes.c_int(dir_fd), ctypes.c_char_p(os.fsencode(rel)),
                       ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
    if fd >= 0:
        return fd
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.E2BIG, errno.EINVAL):  # no openat2, or not these flags: walk from now on
        _have_openat2 = False
        return None
    if code in (errno.EPERM, errno.EAGAIN):  # a sandbox refusing the call, or a lookup raced by a rename: walk
        return None
    raise OSError(code, os.strerror(code), rel)


def _walk_open(dir_fd: int, parts: list[str], flags: int) -> int:
    """``openat`` one component at a time from ``dir_fd``, never following a symlink."""
    current = dir_fd
    try:
        for part in parts[:-1]:
            fd = os.open(part, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=current)
            if current != dir_fd:
                os.close(current)
            current = fd
        return os.open(parts[-1], flags, dir_fd=current)
    finally:
        if current != dir_fd:
            os.close(current)


def open_beneath(root: Path | str, rel: str, follow_root: bool = True) -> int:
    """A read-only descriptor of regular file ``rel`` (relative, ``/``-separated) beneath directory ``root``.

    ``root`` itself is opened normally (symlinks in it are the configuration's business) unless ``follow_root`` is
    false. Raises ``UnsafePath`` (an ``OSError``) for a symlink anywhere under ``root``, for ``..`` or an absolute
    ``rel``, and for anything but a regular file; ``FileNotFoundError``, ``PermissionError`` and other ``OSError``
    as the kernel reports them. The caller owns (and closes) the descriptor.
    """
    parts = [part for part in rel.split("/") if part not in ("", ".")]
    if rel.startswith("/") or not parts or ".." in parts:
        raise UnsafePath("outside", rel)
    flags = os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC
    root_fd = os.open(root, os.O_RDONLY | _DIRECTORY | _CLOEXEC | (0 if follow_root else _NOFOLLOW))
    try:
        try:
            fd = _openat2(root_fd, "/".join(parts), flags)
            if fd is None:
                fd = _walk_open(root_fd, parts, flags)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EXDEV) or (exc.errno == errno.ENOTDIR and _has_link(root_fd, parts)):
                raise UnsafePath("symlink" if exc.errno != errno.EXDEV else "outside", rel) from None
            raise
    finally:
        os.close(root_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafePath("not_regular_file", rel)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_append(root: Path | str, rel: str) -> int:
    """An ``O_RDWR | O_APPEND`` descriptor of regular file ``rel`` (relative, ``/``-separated, no ``..``) beneath
    directory ``root``, created with its folders when missing (mode ``0o666``/``0o777``, the umask decides).

    Raises ``UnsafePath`` (reasons above) for a symlink at any component, a non-directory on the way, anything but a
    regular file, a file with more than one link; ``PermissionError`` and other ``OSError`` as the kernel reports
    them. The caller owns (and closes) the descriptor."""
    parts = [part for part in rel.split("/") if part not in ("", ".")]
    if rel.startswith("/") or not parts or ".." in parts:
        raise UnsafePath("outside", rel)
    root_fd = os.open(root, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    current = root_fd
    try:
        for name in parts[:-1]:
            fd = _make_dir(current, name, rel)
            if current != root_fd:
                os.close(current)
            current = fd
        fd = _create_regular(current, parts[-1], rel)
    finally:
        if current != root_fd:
            os.close(current)
        os.close(root_fd)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
        os.close(fd)
        raise UnsafePath("hard_link" if stat.S_ISREG(st.st_mode) else "not_regular_file", rel)
    return fd


def _make_dir(dir_fd: int, name: str, rel: str) -> int:
    """Directory ``name`` beneath ``dir_fd``, made when missing, never through a symlink."""
    for _ in range(2):
        try:
            return os.open(name, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=dir_fd)
        except FileNotFoundError:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o777, dir_fd=dir_fd)  # the umask decides, as for any new folder
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            link = stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
            raise UnsafePath("symlink" if link else "not_directory", rel) from None
    raise UnsafePath("changing", rel)


def _create_regular(dir_fd: int, name: str, rel: str) -> int:
    """``name`` beneath ``dir_fd`` opened ``O_RDWR | O_APPEND | O_CREAT`` without following a symlink; a FIFO,
    socket or device is refused before it is opened."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath("symlink" if stat.S_ISLNK(st.st_mode) else "not_regular_file", rel)
    except FileNotFoundError:
        pass
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | _NOFOLLOW | _NONBLOCK | _CLOEXEC
    try:
        return os.open(name, flags, 0o666, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath("symlink", rel) from None
        if exc.errno in (errno.EISDIR, errno.ENXIO):
            raise UnsafePath("not_regular_file", rel) from None
        raise


def _has_link(root_fd: int, parts: list[str]) -> bool:
    """Whether a directory component of ``parts`` is (now) a symlink: ``O_DIRECTORY | O_NOFOLLOW`` on a symlink
    answers ``ENOTDIR``, which is a refusal, not a missing file."""
    current = root_fd
    try:
        for part in parts[:-1]:
            try:
                st = os.stat(part, dir_fd=current, follow_symlinks=False)
            except OSError:
                return False
            if stat.S_ISLNK(st.st_mode):
                return True
            try:
                fd = os.open(part, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=current)
            except OSError:
                return True
            if current != root_fd:
                os.close(current)
            current = fd
        return False
    finally:
        if current != root_fd:
            os.close(current)


def lock_exclusive(path: Path, holder: str) -> int:
    """Open (create, mode 0644) ``path`` and take an exclusive, non-blocking ``flock`` on it; returns the open
    descriptor, which holds the lock until it is closed. Raises ``indexer.errors.StoreLocked`` naming ``holder``
    (e.g. "the state directory /x") when another process holds it, and ``OSError`` when ``path`` cannot be opened."""
    import fcntl

    from indexer.errors import StoreLocked

    fd = os.open(path, os.O_RDWR | os.O_CREAT | _CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreLocked(f"{holder} is in use by another process (a running daemon?); query it with "
                          f"`qmd-indexer search`, or stop it first") from None
    return fd


def decode_text(data: bytes) -> tuple[str, int]:
    """``(text, n_replaced)``: ``data`` decoded as UTF-8 (a BOM is dropped); invalid byte sequences become U+FFFD
    and are counted, so one bad byte never hides the rest of a note. Raises ``ExtractError`` for NUL bytes, which
    mark a binary file rather than text."""
    if b"\x00" in data:
        raise ExtractError(f"contains NUL bytes (first at byte {data.index(0)}): binary, not text")
    text = data.decode("utf-8", errors="replace")
    if text.startswith("\ufeff"):
        text = text[1:]
    replaced = text.count("\ufffd") - data.decode("utf-8", errors="ignore").count("\ufffd")
    return text, replaced
