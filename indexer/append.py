"""Append a text entry to an agent's memory: today's daily note ``memory/YYYY-MM-DD.md`` or a named markdown file
under ``memory/``, created (with its folders) when missing. The one write path of the daemon; the index learns of
the entry as of any edit, from the watcher (``IN_CLOSE_WRITE`` settles in 50 ms), never from here.

Rules, checked before anything is written (a refused call writes nothing, not even a folder):

- **Off by default**: only a workspace with ``append = true`` takes appends (``AppendRefused``, 403, otherwise).
- **Where**: ``path`` is workspace-relative, as hits and ``get`` name files (``memory/projects/acme.md``), or
  absolute inside the workspace; omitted, today's daily note, the date in the workspace's ``timezone`` (an IANA
  name; empty: the system's local zone). It must lie under ``memory/``, end in ``.md``, have no hidden component
  (``.git``, ``.openclaw-repair``...), no ``..``, and belong to this agent (not to a workspace nested in its
  ``memory/``): else ``AppendRefused`` (403). An empty name, a NUL byte, a trailing ``/`` or a name over 255 bytes
  is a ``ValueError`` (400).
- **No symlinks**: the file is opened from a descriptor of the workspace, one component at a time with
  ``O_NOFOLLOW`` (``openat``), so a symlinked ``memory/``, sub-folder or file is refused (403) even when swapped
  in during the call; it must be a regular file with one link (a hard link could reach a file outside).
- **Size**: the entry's text at most ``append_max_bytes`` bytes of UTF-8 (``EntryTooLarge``, 413), and the file
  after it at most ``append_max_file_bytes`` (and ``max_file_bytes``, so it stays indexable; 413). The file cap is
  checked before the write: appends racing each other may pass it together, each by at most one entry.
- **One write**: the whole entry (a blank line before it when the file has text, the text with ``\\r\\n``/``\\r``
  made ``\\n``, one final newline) goes out in one ``os.write`` on an ``O_APPEND`` descriptor, so concurrent
  appends, from this daemon or any other process, land whole and never interleave. The file's end is read (for
  the blank line) and written under an exclusive ``flock`` of the file, so two appends to an empty file never both
  leave the blank line out (seen once in 50 concurrent appends: two entries ran together as one paragraph).
- **Line range**: after the write the descriptor's offset (``lseek``; its own, whatever others appended since)
  says where the entry landed; the line breaks before it (``\\n``, ``\\r\\n``, lone ``\\r``: the line model of
  ``indexer.chunking.line_spans``, as hits and ``get`` count) give its first line.
- **Logs** name the agent, path, bytes and lines, never the text.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import structlog

from indexer.config import Settings, Workspace
from indexer.errors import QmdError, ReadRefused
from indexer.schema import AppendResponse
from indexer.workspace import MEMORY_DIR, REPAIR_DIR, Collection, route

log = structlog.get_logger("qmd_indexer.append")

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
NAME_MAX = 255  # bytes of one path component (Linux, most file systems)


class AppendRefused(ReadRefused):
    """The append is not allowed: the workspace has ``append`` off, or the path is not a markdown file under its
    ``memory/`` (outside, ``..``, a symlink, hidden, another agent's, not ``.md``, not a regular file). 403."""


class EntryTooLarge(QmdError):
    """The entry is over ``append_max_bytes``, or would take the file over its cap. 413."""


def daily_note(workspace: Workspace, now: datetime | None = None) -> str:
    """``memory/YYYY-MM-DD.md`` for the day ``now`` (default: now) is in the workspace's ``timezone`` (an IANA name;
    empty: the system's local zone)."""
    moment = (now or datetime.now(UTC)).astimezone(ZoneInfo(workspace.timezone) if workspace.timezone else None)
    return f"{MEMORY_DIR}/{moment.date().isoformat()}.md"


def entry_body(text: str) -> str:
    """``text`` as it is written: line breaks made ``\\n``, leading and trailing empty lines dropped, one final
    ``\\n``. Raises ``ValueError`` when nothing is left or it holds a NUL byte (a file with one is binary, and
    would no longer be indexed)."""
    body = text.replace("\r\n", "\n").replace("\r", "\n").strip("\n")
    if not body.strip():
        raise ValueError("text is empty")
    if "\x00" in body:
        raise ValueError("text holds a NUL byte: memory files are text")
    return body + "\n"


def _parts(workspace: Workspace, path: str) -> list[str]:
    """The components of ``path`` below the workspace; raises ``ValueError`` (malformed) or ``AppendRefused``."""
    if not path or "\x00" in path or path.endswith("/"):
        raise ValueError(f"path must name a file, such as {MEMORY_DIR}/notes.md (got {path!r})")
    raw = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in raw:
        raise AppendRefused(f"{path}: refused (outside: '..')")
    if path.startswith("/"):
        below = Path(path).parts[1:]
        root = workspace.path.parts[1:]
        if tuple(below[:len(root)]) != root:
            raise AppendRefused(f"{path}: refused (outside the workspace)")
        raw = list(below[len(root):])
    if any(len(os.fsencode(part)) > NAME_MAX for part in raw):
        raise ValueError(f"{path}: a name is longer than {NAME_MAX} bytes")
    if len(raw) < 2 or raw[0] != MEMORY_DIR:
        raise AppendRefused(f"{path}: refused (not under {MEMORY_DIR}/: give a workspace-relative path such as "
                            f"{MEMORY_DIR}/notes.md)")
    if any(part.startswith(".") or part == REPAIR_DIR for part in raw):
        raise AppendRefused(f"{path}: refused (hidden)")
    if not raw[-1].endswith(".md"):
        raise AppendRefused(f"{path}: refused (not markdown: appends go to .md files)")
    return raw


def _open_dir(dir_fd: int, name: str, rel: str) -> int:
    """Directory ``name`` beneath ``dir_fd`` (made when missing), never through a symlink."""
    for _ in range(2):
        try:
            return os.open(name, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=dir_fd)
        except FileNotFoundError:
            try:
                os.mkdir(name, 0o777, dir_fd=dir_fd)  # the umask decides, as for any new folder
            except FileExistsError:
                pass
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            link = stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
            raise AppendRefused(f"{rel}: refused ({'symlink' if link else 'not a directory'})") from None
    raise AppendRefused(f"{rel}: refused (the folder {name!r} keeps changing)")


def _open_file(root: Path, parts: list[str], rel: str, create: bool) -> int:
    """An ``O_RDWR | O_APPEND`` descriptor of ``parts`` beneath ``root``: no symlink followed at any component, a
    regular file with one link. Folders on the way are made only when ``create``."""
    root_fd = os.open(root, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    current = root_fd
    try:
        for name in parts[:-1]:
            fd = _open_dir(current, name, rel) if create else os.open(
                name, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=current)
            if current != root_fd:
                os.close(current)
            current = fd
        try:  # never open a FIFO, socket or device for writing, not even to look
            st = os.stat(parts[-1], dir_fd=current, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                raise AppendRefused(f"{rel}: refused (symlink)")
            if not stat.S_ISREG(st.st_mode):
                raise AppendRefused(f"{rel}: refused (not a regular file)")
        except FileNotFoundError:
            if not create:
                raise
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | _NOFOLLOW | _NONBLOCK | _CLOEXEC
        try:
            fd = os.open(parts[-1], flags, 0o666, dir_fd=current)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise AppendRefused(f"{rel}: refused (symlink)") from None
            if exc.errno in (errno.EISDIR, errno.ENXIO):
                raise AppendRefused(f"{rel}: refused (not a regular file)") from None
            raise
    finally:
        if current != root_fd:
            os.close(current)
        os.close(root_fd)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
        os.close(fd)
        raise AppendRefused(f"{rel}: refused ({'hard link' if stat.S_ISREG(st.st_mode) else 'not a regular file'})")
    return fd


def _breaks_before(fd: int, offset: int) -> int:
    """Line breaks (``\\n``, ``\\r\\n``, lone ``\\r``) in the first ``offset`` bytes of ``fd``."""
    data = bytearray()
    while len(data) < offset:
        piece = os.pread(fd, offset - len(data), len(data))
        if not piece:
            break
        data += piece
    return data.count(b"\n") + data.count(b"\r") - data.count(b"\r\n")


def append_entry(collections: Sequence[Collection], settings: Settings, text: str, path: str | None = None,
                 agent: str | None = None, now: datetime | None = None) -> AppendResponse:
    """Append ``text`` to ``path`` (default: today's daily note) of ``agent``'s workspace (see the module rules).

    Returns ``{"agent", "path", "from", "to", "citation", "bytes"}``: the workspace-relative path, the entry's
    first and last line (1-based, inclusive), ``path#Lfrom-Lto``, and the bytes written (separator included).
    Raises ``KeyError`` (unknown agent, 404), ``AppendRefused`` (403), ``EntryTooLarge`` (413), ``ValueError``
    (empty text, NUL byte, malformed path: 400), ``PermissionError`` and other ``OSError`` from the file system.
    """
    chosen = [c for c in collections if c.agent == agent]
    if not chosen:
        raise KeyError(f"unknown agent {agent!r}")
    workspace = chosen[0].workspace
    asked = path
    try:
        if not workspace.append:
            raise AppendRefused(f"append is off for agent {agent!r}: set append = true on its workspace to allow it")
        body = entry_body(text)
        rel_parts = _parts(workspace, path if path is not None else daily_note(workspace, now))
        rel = "/".join(rel_parts)
        owner, reason = route(collections, workspace.path / rel)  # a symlinked memory/, a nested workspace...
        if owner is None or owner.workspace != workspace or owner.role != "dir":
            raise AppendRefused(f"{rel}: refused ({reason or 'not a memory file of this workspace'})")
        size = len(body.encode("utf-8"))
        file_cap = min(settings.append_max_file_bytes, settings.max_file_bytes)
        if size > settings.append_max_bytes:
            raise EntryTooLarge(f"the entry is {size} bytes; the limit is {settings.append_max_bytes} "
                                f"(append_max_bytes)")
        if size + 2 > file_cap:
            raise EntryTooLarge(f"the entry is {size} bytes; a file may hold at most {file_cap} "
                                f"(append_max_file_bytes)")
        fd = _open_file(workspace.path, rel_parts, rel, create=True)
    except (AppendRefused, EntryTooLarge, ValueError, OSError) as exc:
        log.warning("append_refused", agent=agent, path=asked, reason=type(exc).__name__, detail=str(exc))
        raise
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # the end read below is still the end when the entry is written
        end = os.fstat(fd).st_size
        tail = os.pread(fd, 1, end - 1) if end else b""
        separator = b"" if not end else b"\n" if tail == b"\n" else b"\n\n"  # a blank line between entries
        data = separator + body.encode("utf-8")
        if end + len(data) > file_cap:
            log.warning("append_refused", agent=agent, path=rel, reason="EntryTooLarge", file_bytes=end)
            raise EntryTooLarge(f"{rel} holds {end} bytes; with this entry ({len(data)}) it would pass the limit of "
                                f"{file_cap} (append_max_file_bytes): append to another file")
        written = os.write(fd, data)  # one write on O_APPEND: the kernel puts it whole at the end
        if written != len(data):  # a full disk, or a quota: the entry is cut, say so
            log.error("append_short_write", agent=agent, path=rel, bytes=len(data), written=written)
            raise OSError(errno.ENOSPC, f"only {written} of {len(data)} bytes were written", rel)
        landed = os.lseek(fd, 0, os.SEEK_CUR) - len(data)  # this descriptor's offset: after our own write
        first = _breaks_before(fd, landed + len(separator)) + 1
    finally:
        os.close(fd)
    last = first + body.count("\n") - 1
    log.info("memory_appended", agent=agent, path=rel, bytes=len(data), lines=last - first + 1, from_line=first,
             to_line=last)
    return {"agent": workspace.agent, "path": rel, "from": first, "to": last, "citation": f"{rel}#L{first}-L{last}",
            "bytes": len(data)}
