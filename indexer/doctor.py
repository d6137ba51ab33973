"""Split root memory: detection and repair (``qmd-indexer doctor [--fix]``).

A workspace has a split root memory when ``MEMORY.md`` and the legacy ``memory.md`` both exist as distinct files
(on a case-insensitive filesystem the two names are one file, which is fine). Only ``MEMORY.md`` is indexed.

``fix_split`` archives the legacy file to
``.openclaw-repair/root-memory/<UTC timestamp, ':' and '.' replaced by '-'>/memory.md`` (the reference agent's
layout): a rename first, and across devices (``EXDEV``) copy + fsync + unlink. Archives are timestamped, so repeated
runs never overwrite one. When the legacy text differs from ``MEMORY.md``, it is appended to ``MEMORY.md`` under a
heading that names its origin. Nothing is lost: the legacy text is archived before anything is appended.
"""

from __future__ import annotations

import errno
import os
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from indexer.config import Workspace
from indexer.workspace import REPAIR_DIR, root_files


@dataclass(frozen=True, slots=True)
class Repair:
    """What ``fix_split`` did: where the legacy file went, and whether its text was merged into ``MEMORY.md``."""

    archived_to: Path
    merged: bool


def find_split(ws: Workspace) -> Path | None:
    """The legacy ``memory.md`` of a split root memory in ``ws``, or ``None`` when there is no split."""
    _, skips = root_files(ws)
    for skip in skips:
        if skip.reason == "split_root_memory" and skip.path.name == "memory.md":
            return skip.path
    return None


def _timestamp(now: datetime) -> str:
    return now.astimezone(UTC).isoformat().replace("+00:00", "Z").replace(":", "-").replace(".", "-")


def _move(source: Path, target: Path) -> None:
    """Rename ``source`` to ``target``; across filesystems copy, fsync, then unlink the source."""
    try:
        os.rename(source, target)
        return
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
    shutil.copy2(source, target)
    with open(target, "rb") as handle:
        os.fsync(handle.fileno())
    source.unlink()


def fix_split(ws: Workspace, now: datetime | None = None) -> Repair | None:
    """Archive the legacy root memory file of ``ws`` and merge its text if it differs; ``None`` if no split.

    Raises ``OSError`` if the archive cannot be written (nothing has been changed then).
    """
    legacy = find_split(ws)
    if legacy is None:
        return None
    canonical = ws.path / "MEMORY.md"
    legacy_text = legacy.read_bytes()
    stamp = _timestamp(now or datetime.now(UTC))
    archive_dir = ws.path / REPAIR_DIR / "root-memory" / stamp
    n = 1
    while archive_dir.exists():  # two repairs within one clock tick still get their own folders
        n += 1
        archive_dir = ws.path / REPAIR_DIR / "root-memory" / f"{stamp}-{n}"
    archive_dir.mkdir(parents=True)
    target = archive_dir / "memory.md"
    _move(legacy, target)
    merged = legacy_text.strip() != canonical.read_bytes().strip()
    if merged:
        origin = target.relative_to(ws.path).as_posix()
        with open(canonical, "ab") as handle:
            handle.write(f"\n\n## Merged from memory.md (archived at {origin})\n\n".encode())
            handle.write(legacy_text.rstrip(b"\n") + b"\n")
            handle.flush()
            os.fsync(handle.fileno())
    return Repair(target, merged)
