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
  ``O_NOFOLLOW`` (``indexer.safeio.open_append``), so a symlinked ``memory/``, sub-folder or file is refused (403)
  even when swapped in during the call; it must be a regular file with one link (a hard link could reach a file
  outside).
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
- **Writable**: a file system the daemon may not write (systemd's ``ProtectHome=read-only`` without
  ``ReadWritePaths=``, a read-only mount) or missing permission is the server's state, not the request's fault:
  ``AppendUnavailable`` (503) saying why and what to change; ``append_state`` says the same ahead of any call
  (``/health``'s ``append``).
- **Logs** name the agent, path, bytes and lines, never the text.
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import structlog

from indexer.config import Settings, Workspace
from indexer.errors import AppendRefused, AppendUnavailable, EntryTooLarge
from indexer.safeio import UnsafePath, open_append
from indexer.schema import AppendRequest, AppendResponse
from indexer.walk import route
from indexer.workspace import MEMORY_DIR, REPAIR_DIR, Collection, select

log = structlog.get_logger("qmd_indexer.append")

NAME_MAX = 255  # bytes of one path component (Linux, most file systems)


#: what the refusal says for each ``UnsafePath`` reason of ``indexer.safeio.open_append``
_UNSAFE = {"symlink": "symlink", "not_directory": "not a directory", "not_regular_file": "not a regular file",
           "hard_link": "hard link", "outside": "outside", "changing": "a folder on the way keeps changing"}


#: errno values that mean the daemon may not write the workspace at all (not this request's fault)
_NOT_WRITABLE = {errno.EROFS: "read-only file system", errno.EACCES: "permission denied",
                 errno.EPERM: "operation not permitted"}
#: how to let the daemon write, said with each of those refusals
_HOW_TO_WRITE = ("appends need the memory/ folder writable by the daemon: under the shipped systemd unit "
                 "(ProtectHome=read-only) add ReadWritePaths=<workspace>/memory in a drop-in "
                 "(docs/operations.md, \"Appends under systemd\")")


def append_state(workspace: Workspace) -> str:
    """Whether ``workspace`` takes appends now: ``"off"`` (``append`` not set), ``"on"``, or ``"unavailable:
    <why>"`` when the daemon cannot write its ``memory/`` folder (the workspace itself while it has none): a
    read-only file system (``statvfs``'s ``ST_RDONLY``, as a read-only bind mount or systemd's ``ProtectHome`` gives)
    or no write permission for the daemon's user (``os.access``). Two system calls; reads nothing."""
    if not workspace.append:
        return "off"
    folder = workspace.path / MEMORY_DIR
    target = folder if folder.is_dir() else workspace.path
    try:
        if os.statvfs(target).f_flag & os.ST_RDONLY:
            return "unavailable: read-only file system"
        if not os.access(target, os.W_OK | os.X_OK):
            return "unavailable: permission denied"
    except OSError as exc:
        return f"unavailable: {exc.strerror or exc}"
    return "on"


def _unavailable(exc: OSError, rel: str) -> OSError | AppendUnavailable:
    """``exc`` as ``AppendUnavailable`` when it says the daemon may not write there (``_NOT_WRITABLE``), else
    ``exc``."""
    why = _NOT_WRITABLE.get(exc.errno or 0)
    return AppendUnavailable(f"cannot write {rel}: {why}; {_HOW_TO_WRITE}") if why else exc


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


def _breaks_before(fd: int, offset: int) -> int:
    """Line breaks (``\\n``, ``\\r\\n``, lone ``\\r``) in the first ``offset`` bytes of ``fd``."""
    data = bytearray()
    while len(data) < offset:
        piece = os.pread(fd, offset - len(data), len(data))
        if not piece:
            break
        data += piece
    return data.count(b"\n") + data.count(b"\r") - data.count(b"\r\n")


def append_entry(collections: Sequence[Collection], settings: Settings, request: AppendRequest,
                 now: datetime | None = None) -> AppendResponse:
    """Append ``request.text`` to ``request.path`` (default: today's daily note, ``now`` the moment) of
    ``request.agent``'s workspace (see the module rules).

    Returns ``{"agent", "path", "from", "to", "citation", "bytes"}``: the workspace-relative path, the entry's
    first and last line (1-based, inclusive), ``path#Lfrom-Lto``, and the bytes written (separator included).
    Raises ``KeyError`` (unknown agent, 404), ``AppendRefused`` (403), ``EntryTooLarge`` (413), ``ValueError``
    (empty text, NUL byte, malformed path: 400), ``AppendUnavailable`` (503: a read-only file system, no write
    permission) and other ``OSError`` from the file system.
    """
    text, path, agent = request.text, request.path, request.agent
    workspace = select(collections, agent)[0].workspace
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
        try:
            fd = open_append(workspace.path, rel)
        except UnsafePath as exc:
            raise AppendRefused(f"{rel}: refused ({_UNSAFE.get(exc.reason, exc.reason)})") from None
        except OSError as exc:
            raise _unavailable(exc, rel) from None
    except (AppendRefused, EntryTooLarge, ValueError, OSError, AppendUnavailable) as exc:
        log.warning("append_refused", agent=agent, path=asked, reason=type(exc).__name__, detail=str(exc))
        raise
    try:
        first, written = _write_entry(fd, body.encode("utf-8"), file_cap, rel, agent)
    except OSError as exc:
        raise _unavailable(exc, rel) from None
    finally:
        os.close(fd)
    last = first + body.count("\n") - 1
    log.info("memory_appended", agent=agent, path=rel, bytes=written, lines=last - first + 1, from_line=first,
             to_line=last)
    return {"agent": workspace.agent, "path": rel, "from": first, "to": last, "citation": f"{rel}#L{first}-L{last}",
            "bytes": written}


def _write_entry(fd: int, entry: bytes, file_cap: int, rel: str, agent: str | None) -> tuple[int, int]:
    """Write ``entry`` at the end of ``fd`` (a blank line before it when the file has text) in one ``os.write``,
    under an exclusive ``flock`` so the end read is still the end when it is written; returns the entry's first
    line and the bytes written. Raises ``EntryTooLarge`` when the file would pass ``file_cap``, ``OSError`` for a
    short write."""
    fcntl.flock(fd, fcntl.LOCK_EX)  # released when the caller closes fd
    end = os.fstat(fd).st_size
    tail = os.pread(fd, 1, end - 1) if end else b""
    separator = b"" if not end else b"\n" if tail == b"\n" else b"\n\n"  # a blank line between entries
    data = separator + entry
    if end + len(data) > file_cap:
        log.warning("append_refused", agent=agent, path=rel, reason="EntryTooLarge", file_bytes=end)
        raise EntryTooLarge(f"{rel} holds {end} bytes; with this entry ({len(data)}) it would pass the limit of "
                            f"{file_cap} (append_max_file_bytes): append to another file")
    written = os.write(fd, data)  # one write on O_APPEND: the kernel puts it whole at the end
    if written != len(data):  # a full disk, or a quota: the entry is cut, say so
        log.error("append_short_write", agent=agent, path=rel, bytes=len(data), written=written)
        raise OSError(errno.ENOSPC, f"only {written} of {len(data)} bytes were written", rel)
    landed = os.lseek(fd, 0, os.SEEK_CUR) - len(data)  # this descriptor's offset: after our own write
    return _breaks_before(fd, landed + len(separator)) + 1, written
