"""Which files of the planned collections are memory on disk: the walk of every collection (``walk``,
``walk_paths``), the collection that owns one path (``route``, for file events and ``get``), and what the log,
``status`` and ``doctor`` say about the configured paths (``overlaps``, ``path_problems``).

The rules are ``indexer.workspace``'s (see its module docstring): root memory files named, directories walked
(never through a symlink or a hidden name), candidates by their source's ``suffix``, one file in one collection
(the first of a workspace's, the innermost workspace's across agents).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from indexer.config import Workspace
from indexer.workspace import REPAIR_DIR, ROOT_NAMES, Collection, Skip


def _names(directory: Path) -> set[str]:
    try:
        return set(os.listdir(directory))
    except OSError:
        return set()


def root_files(ws: Workspace) -> tuple[list[Path], list[Skip]]:
    """The root memory files of ``ws`` that are indexed, and the skips (symlinks, split root memory)."""
    names = _names(ws.path)
    files: list[Path] = []
    skips: list[Skip] = []
    for spellings in ROOT_NAMES:
        chosen: Path | None = None
        for name in spellings:
            if name not in names:
                continue
            path = ws.path / name
            if path.is_symlink():
                skips.append(Skip(path, "symlink"))
                continue
            if chosen is None:
                chosen = path
            elif not _same_file(chosen, path):
                skips.append(Skip(path, "split_root_memory"))
        if chosen is not None:
            files.append(chosen)
    return files, skips


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samestat(os.lstat(a), os.lstat(b))
    except OSError:
        return False


def _skipped_name(name: str) -> bool:
    return name.startswith(".") or name == REPAIR_DIR


def walk_dir(root: Path, skips: list[Skip]) -> Iterator[Path]:
    """Regular files under directory ``root``, depth first, never entering a symlink or a hidden directory. A
    directory that cannot be listed (permissions, I/O error) is a ``Skip`` with reason ``unreadable_directory``."""
    return map(Path, _walk_dir(str(root), skips))


def _walk_dir(root: str, skips: list[Skip]) -> Iterator[str]:
    """``walk_dir`` on strings: a ``Path`` and its first hash cost ~10 us a file, a tenth of a scan's time."""
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return  # gone meanwhile
    except OSError:
        skips.append(Skip(Path(root), "unreadable_directory"))
        return
    for entry in entries:
        if _skipped_name(entry.name):
            continue
        if entry.is_symlink():
            skips.append(Skip(Path(entry.path), "symlink"))
        elif entry.is_dir(follow_symlinks=False):
            yield from _walk_dir(entry.path, skips)
        else:
            yield entry.path


def walk(collections: Sequence[Collection]) -> tuple[list[tuple[Collection, Path]], list[Skip]]:
    """Every candidate file of ``collections`` on disk, each once, and the skips. A file reached through several
    collections of one workspace belongs to the first; through several workspaces, to the innermost that contains
    it (a workspace nested in another's ``memory/`` owns its files; see ``overlaps``). ``walk_paths`` also gives
    each candidate's ``lstat`` result (the walk takes it anyway, to meet each file once).

    A candidate is not yet known to be memory: the classifiers decide its kind, and the pipeline the rest.
    """
    found, skips, _ = walk_paths(collections)
    return [(collection, Path(path)) for collection, path in found], skips


def walk_paths(collections: Sequence[Collection]
               ) -> tuple[list[tuple[Collection, str]], list[Skip], dict[str, os.stat_result]]:
    """``walk`` with absolute path strings, and each candidate's ``lstat`` result by path: what a scan needs,
    without a ``Path`` for each of its files (they cost most of the walk: docs/performance.md, "Scans")."""
    found: list[tuple[Collection, str]] = []
    skips: list[Skip] = []
    stats: dict[str, os.stat_result] = {}
    seen_paths: dict[str, int] = {}  # path -> its index in found
    seen_inodes: set[tuple[int, int]] = set()

    def take(collection: Collection, path: str) -> None:
        try:
            st = os.lstat(path)
        except OSError:
            return
        key = (st.st_dev, st.st_ino)
        if path in seen_paths:  # reached again through another workspace: the innermost one owns it
            index = seen_paths[path]
            if _outranks(collection, found[index][0], Path(path)):
                found[index] = (collection, path)
            return
        if key in seen_inodes:
            return
        stats[path] = st
        seen_paths[path] = len(found)
        seen_inodes.add(key)
        found.append((collection, path))

    for collection in collections:
        if collection.role == "root":
            files, root_skips = root_files(collection.workspace)
            skips.extend(root_skips)
            for file in files:
                take(collection, str(file))
            continue
        root = collection.root
        if _symlink_on_way(collection, root):
            skips.append(Skip(root, "symlink"))
            continue
        suffix = collection.source.suffix
        if root.is_dir():
            for path in _walk_dir(str(root), skips):
                if path.endswith(suffix):
                    take(collection, path)
        elif root.is_file():
            take(collection, str(root))
    return found, skips, stats


def _symlink_on_way(collection: Collection, path: Path) -> bool:
    """Whether ``path`` or any directory between the workspace (or the extra root) and it is a symlink (one
    ``lstat`` per level; string operations, not ``pathlib``: this runs for every file of every scan)."""
    base = collection.root if collection.source.own_root else collection.workspace.path
    if collection.source.own_root and os.path.islink(base):
        return True
    rest = _below(base, path)
    if rest is None:
        return str(path) != str(base)
    current = str(base).rstrip("/")
    for part in rest:
        current = f"{current}/{part}"
        if os.path.islink(current):
            return True
    return False


def _below(root: Path, path: Path) -> list[str] | None:
    """The names from ``root`` down to ``path`` (both absolute), or ``None`` when ``path`` is not under ``root``
    (``path == root`` included)."""
    prefix = str(root).rstrip("/") + "/"
    path_s = str(path)
    return path_s[len(prefix):].split("/") if path_s.startswith(prefix) and len(path_s) > len(prefix) else None


def route(collections: Sequence[Collection], path: Path) -> tuple[Collection | None, str | None]:
    """The collection that owns ``path`` (absolute), or ``(None, reason)`` when it is not memory.

    ``reason`` is ``None`` for paths that are simply outside every root (no log needed), or a skip reason such as
    ``"symlink"`` or ``"hidden"`` worth reporting. Does not require the file to exist, so deletes route too. When
    collections of several workspaces claim the path, the innermost workspace containing it decides (``_rank``).
    """
    best: Collection | None = None
    for collection in collections:
        verdict, reason = _claim(collection, path)
        if verdict == "pass":
            continue
        if best is None or _outranks(collection, best, path):
            if verdict == "refuse":
                return None, reason
            best = collection
    return best, None


def _outranks(collection: Collection, other: Collection, path: Path) -> bool:
    """Whether ``collection`` owns ``path`` rather than ``other``, which claimed it first: the innermost workspace
    (``_rank``); within one workspace, a source that ``claims_nested`` for a candidate of its own (a sessions folder
    inside ``memory/`` holds transcripts, not notes: ``memory/sessions/x.jsonl`` was claimed by ``memory/`` and
    indexed by neither)."""
    if collection.source.claims_nested and other.role != collection.role and collection.workspace == other.workspace:
        return str(path).endswith(collection.source.suffix)
    return _rank(collection, path) > _rank(other, path)


def _rank(collection: Collection, path: Path) -> int:
    """How strongly ``collection`` owns ``path``: the depth of its workspace when the path lies inside that workspace
    (the innermost workspace wins), ``-1`` for an extra path outside its own workspace."""
    ws = collection.workspace.path
    return len(ws.parts) if path.is_relative_to(ws) else -1


def _claim(collection: Collection, path: Path) -> tuple[str, str | None]:
    """``("own", None)``, ``("refuse", reason)`` (the collection's rules say it is not memory) or ``("pass", None)``
    (not under this collection's root)."""
    ws = collection.workspace
    if collection.role == "root":
        if os.path.dirname(str(path)) != str(ws.path):
            return "pass", None
        for canonical, *legacy in ROOT_NAMES:
            if path.name == canonical:
                return ("refuse", "symlink") if path.is_symlink() else ("own", None)
            if path.name in legacy:
                names = _names(ws.path)
                if canonical in names and not _same_file(ws.path / canonical, path) and path.exists():
                    return "refuse", "split_root_memory"
                if canonical in names and _same_file(ws.path / canonical, path):
                    return "refuse", None  # the same file under its other name: indexed once, as MEMORY.md
                return ("refuse", "symlink") if path.is_symlink() else ("own", None)
        return "pass", None
    root = collection.root
    if collection.role == "extra" and path == root:
        return ("refuse", "symlink") if path.is_symlink() else ("own", None)
    parts = _below(root, path)
    if parts is None:
        return "pass", None
    if any(_skipped_name(part) for part in parts):
        return "refuse", "hidden"
    if not path.name.endswith(collection.source.suffix):
        return "refuse", None  # not a candidate of this source (a transcript folder's index, its lock files)
    if _symlink_on_way(collection, path):
        return "refuse", "symlink"
    return "own", None


def overlaps(collections: Sequence[Collection]) -> list[str]:
    """One warning per pair of agents whose memory roots overlap (a workspace nested in another's ``memory/`` or
    extra path, an extra path inside another agent's workspace), naming who owns the files there."""
    found: dict[tuple[str, str], str] = {}
    for outer in collections:
        if outer.role == "root":
            continue
        for inner in collections:
            start = inner.workspace.path if inner.role == "root" else inner.root
            if inner.agent == outer.agent or (inner.agent, outer.agent) in found:
                continue
            if start == outer.root or start.is_relative_to(outer.root):
                owner = inner if _rank(inner, start) >= _rank(outer, start) else outer
                found[(inner.agent, outer.agent)] = (
                    f"{start} (agent {inner.agent!r}) lies inside {outer.root} ({outer.name}, agent {outer.agent!r}); "
                    f"files there belong to the innermost workspace that indexes them (here agent {owner.agent!r})")
    return list(found.values())


@dataclass(frozen=True, slots=True)
class Problem:
    """A configured path the daemon cannot use as meant: ``kind`` is ``workspace_missing`` (the workspace folder is
    not there: its indexed files are kept, ``missing_workspaces``), ``extra_path_missing`` or
    ``sessions_path_missing`` (nothing there: an empty collection until it appears) or ``extra_path_overlaps``
    (inside, or around, ``memory/`` or an earlier extra path of the same agent: its files are indexed once, in the
    collection ``detail`` names)."""

    kind: str
    agent: str
    path: Path
    detail: str


WORKSPACE_MISSING = ("the workspace folder is not there (an unmounted disk, a folder moved away): its indexed files "
                     "are kept, and checked again once it is back")


def missing_workspaces(collections: Sequence[Collection]) -> list[str]:
    """The workspace folders of ``collections`` that are not there now, each as ``"<path>/"``: the files indexed
    under one keep their points (a disk not mounted yet must not cost a re-embedding of everything on it)."""
    return [str(c.root).rstrip("/") + "/" for c in collections if _workspace_away(c)]


def _workspace_away(collection: Collection) -> bool:
    """Whether ``collection`` is a workspace's root collection whose folder is not there now."""
    return collection.role == "root" and not os.path.isdir(collection.root)


def path_problems(collections: Sequence[Collection]) -> list[Problem]:
    """The ``Problem``s of the workspaces, extra paths and sessions folders among ``collections``, in order."""
    out: list[Problem] = [Problem("workspace_missing", c.agent, c.root, WORKSPACE_MISSING)
                          for c in collections if _workspace_away(c)]
    for n, extra in enumerate(collections):
        missing = extra.source.missing
        if missing and not os.path.lexists(extra.root):
            out.append(Problem(missing[0], extra.agent, extra.root, missing[1]))
        if extra.role != "extra":
            continue
        for other in collections[:n]:
            if other.agent != extra.agent or other.role == "root":
                continue
            if extra.root == other.root or extra.root.is_relative_to(other.root) or other.root.is_relative_to(
                    extra.root):
                what = "memory/" if other.role == "dir" else str(other.root)
                out.append(Problem("extra_path_overlaps", extra.agent, extra.root,
                                   f"overlaps {what}: files under both are indexed once, in {other.name}"))
                break
    return out
