"""Which files of a workspace are memory, and which collection each belongs to.

Rules (following the reference agent's memory layout):

- **Root memory file**: ``MEMORY.md`` at the workspace root is canonical, ``memory.md`` the legacy name; names are
  matched exactly as ``os.listdir`` returns them, never case-folded, so on a case-insensitive filesystem the one
  file is indexed once. When both exist as distinct files, ``MEMORY.md`` is indexed and the split is reported
  (``qmd-indexer doctor`` repairs it). ``DREAMS.md`` (legacy ``dreams.md``) is auxiliary root memory, same rule;
  ``USER.md`` (OpenClaw's user model: preferences, profile facts; no legacy name) is root memory too, evergreen as
  ``MEMORY.md`` (``indexer.ranking.decay`` ages dated daily notes only).
- **Memory directory**: every file under ``memory/``, recursively; markdown always, other kinds when a classifier
  names them (images and audio only when the workspace enables that modality).
- **Extra paths**: files or directories, absolute or workspace-relative, ``~`` expanded, duplicates removed; a
  directory is walked like ``memory/``; each gets a collection of its own.
- **Sessions**: the workspace's ``sessions`` folder (absolute or workspace-relative, ``~`` expanded), walked like
  ``memory/``; its ``*.jsonl`` files are candidates, and a transcript format plugin's sniffing decides which are
  transcripts (``indexer.transcripts``).
- **Never**: a symlink anywhere on the way (a symlinked file, a symlinked ``memory/``, a symlinked extra root): a
  security boundary, so nothing outside the workspace is pulled in; each skip is reported by name. Hidden names
  (``.git``, ``.obsidian``, editor swap files) and ``.openclaw-repair/`` (the doctor's archive) are skipped.
- One file reached by two routes (an extra path overlapping ``memory/``) belongs to the first collection in the
  order root, dir, extras, and is indexed once (``path_problems`` names the overlap, and a missing extra path, for
  the log, ``status`` and ``doctor``); the walk also dedupes by (device, inode). Across agents, a file
  belongs to the innermost workspace that contains it (a workspace nested in another's ``memory/``, an extra path
  reaching into another agent's workspace); ``overlaps`` names each such overlap for the log and ``doctor``.
  Two agents on one workspace path are refused by the config.

Workspace identity: ``attest`` records which filesystem object (device, inode) each workspace path is, so a
restored backup or a re-created directory under the same path is noticed (its files' stat shortcut is then
distrusted).

Each of these is a *source* (``Source``, ``SOURCES``): what feeds one kind of collection, which corpus it belongs to
(``memory`` or ``sessions``), where the symlink checks of its files start and which names are candidates. Everything
downstream (the pipeline, tenancy, search's ``corpus`` filter) asks the source, never the role by name.

Collections are named ``memory-root-<slug>``, ``memory-dir-<slug>``, ``memory-extra-<name>--<slug>``,
``sessions-<slug>``, ``<slug>``
being ``agent_slug(agent)``: the agent id itself when it is already ``[a-z0-9-]`` as sanitising leaves it, else
the sanitised id, ``--`` and 8 hex of its sha256 (``Bob`` -> ``bob--<hash>``), so ids that differ only in case or
punctuation never share a name (sanitising never leaves ``--``, so the two forms cannot meet). ``<name>`` is
sanitised, so it holds no ``--``: the first ``--`` of an extra's name ends ``<name>``, and agent ``a`` with extra
path ``b-c`` (``memory-extra-b-c--a``) never meets agent ``c-a`` with extra path ``b`` (``memory-extra-b--c-a``).
``-2``, ``-3``, ... are appended to ``<name>`` on a collision within one daemon (two extra paths of one name: the
second is ``memory-extra-<name>-2--<slug>``); every name is preceded by the ``collection_prefix`` setting (daemons on
several machines sharing one Qdrant server). ``Collection.former`` is the name the same collection had before
(``sanitise(agent)`` for the slug, one ``-`` after an extra's name): a store under it is moved once
(``indexer.rename``).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import structlog

from indexer.config import Workspace

log = structlog.get_logger("qmd_indexer.workspace")

#: the root memory files: each a canonical name, then its legacy names (indexed when the canonical one is absent)
ROOT_NAMES: tuple[tuple[str, ...], ...] = (("MEMORY.md", "memory.md"), ("DREAMS.md", "dreams.md"), ("USER.md",))
MEMORY_DIR = "memory"
REPAIR_DIR = ".openclaw-repair"


def sanitise(name: str) -> str:
    """``name`` lowercased with every run of characters outside ``[a-z0-9]`` turned into one ``-``."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "x"


Role = Literal["root", "dir", "extra", "sessions"]
Corpus = Literal["memory", "sessions"]


@dataclass(frozen=True, slots=True)
class Source:
    """What feeds one kind of collection: ``corpus`` it belongs to (search's ``corpus`` filter), ``own_root``
    (symlink checks and opens start at the collection's root, not at the workspace: an extra path, the sessions
    folder), ``walked`` (a directory walked for candidates; the root memory files are named instead), ``suffix``
    (only names ending so are candidates; empty: any name) and ``dense_weight`` (the factor a point's dense part of
    its fused score gets in hybrid search, ``indexer.ranking.fuse_scores``)."""

    role: Role
    corpus: Corpus
    own_root: bool
    walked: bool
    suffix: str = ""
    dense_weight: float = 1.0


#: The dense part of a transcript window's fused score, against 1 for notes. Chat windows (greetings, thanks, one
#: speaker's name on every line) look alike to a small sentence model, and its cosine ranks them poorly: on sessmem,
#: MiniLM alone finds hit@5 0.571 against BM25's 0.816, and fused at equal weight it adds nothing (0.819). Weights
#: measured there (hybrid hit@5 / recall@5): 1.0 0.819/0.743, 0.6 0.828/0.755, 0.5 0.831/0.754, 0.4 0.845/0.769,
#: 0.3 0.839/0.764; the same weight on convmem's daily logs 0.819 -> 0.828 hit@5 (benchmarks/sessmem_eval.py,
#: docs/performance.md). Notes keep 1.0: on devvault 0.5 cost nDCG@10 0.886 -> 0.853.
TRANSCRIPT_DENSE_WEIGHT = 0.4


SOURCES: dict[str, Source] = {
    "root": Source("root", "memory", own_root=False, walked=False),
    "dir": Source("dir", "memory", own_root=False, walked=True),
    "extra": Source("extra", "memory", own_root=True, walked=True),
    "sessions": Source("sessions", "sessions", own_root=True, walked=True, suffix=".jsonl",
                       dense_weight=TRANSCRIPT_DENSE_WEIGHT),
}


SLUG_HASH_HEX = 8  # hex digits of sha256(agent id) in a slug whose id sanitising changed


def agent_slug(agent: str) -> str:
    """The agent's part of every collection name (and shared tenant key): ``agent`` itself when ``sanitise`` leaves
    it unchanged (``[a-z0-9-]``, no ``--``, no leading or trailing ``-``), else ``<sanitise(agent)>--<8 hex of
    sha256(agent, UTF-8)>``. Injective up to a 32-bit hash collision between ids with the same sanitised form (the
    server's claims, ``indexer.store.claims``, record the exact id and refuse even that)."""
    safe = sanitise(agent)
    if safe == agent:
        return agent
    return f"{safe}--{hashlib.sha256(agent.encode()).hexdigest()[:SLUG_HASH_HEX]}"


@dataclass(frozen=True, slots=True)
class Collection:
    """One Qdrant collection of one workspace: ``role`` names its ``Source``; ``root`` is the workspace (for
    ``"root"``), the memory directory (``"dir"``), the extra path (``"extra"``, a file or a directory) or the
    sessions folder (``"sessions"``)."""

    name: str
    agent: str
    role: Role
    root: Path
    workspace: Workspace
    former: str = ""  # its name before slugs, when that differs (``indexer.rename`` moves a store under it once)

    @property
    def source(self) -> Source:
        return SOURCES[self.role]

    @property
    def corpus(self) -> Corpus:
        return SOURCES[self.role].corpus


@dataclass(frozen=True, slots=True)
class Skip:
    """A path deliberately not indexed; ``reason`` is a snake_case word (``symlink``, ``split_root_memory``...)."""

    path: Path
    reason: str


def plan_collections(workspaces: Sequence[Workspace], prefix: str = "") -> list[Collection]:
    """The collections of all ``workspaces``, named uniquely (each preceded by ``prefix``; the agent's part is
    ``agent_slug``), in order (root, dir, extras, sessions) per workspace; ``former`` is set where the name before slugs
    differs."""
    taken: set[str] = set()
    taken_before: set[str] = set()
    out: list[Collection] = []

    def unique(base: str, taken: set[str], slug: str = "") -> str:
        """``prefix + base + slug``, ``-2``, ``-3``... appended to ``base`` (to the whole, without ``slug``) until
        it is not ``taken``."""
        name, n = prefix + base + slug, 1
        while name in taken:
            n += 1
            name = f"{prefix}{base}-{n}{slug}" if slug else f"{prefix}{base}{slug}-{n}"
        taken.add(name)
        return name

    def add(kind: str, ws: Workspace, role: Role, root: Path) -> None:
        name = unique(f"{kind}{agent_slug(ws.agent)}", taken)
        before = unique(f"{kind}{sanitise(ws.agent)}", taken_before)
        out.append(Collection(name, ws.agent, role, root, ws, before if before != name else ""))

    for ws in workspaces:
        add("memory-root-", ws, "root", ws.path)
        add("memory-dir-", ws, "dir", ws.path / MEMORY_DIR)
        for extra in extra_roots(ws):
            part = f"memory-extra-{sanitise(extra.stem if extra.suffix else extra.name)}"
            name = unique(part, taken, f"--{agent_slug(ws.agent)}")
            before = unique(f"{part}-{sanitise(ws.agent)}", taken_before)
            out.append(Collection(name, ws.agent, "extra", extra, ws, before))
        sessions = sessions_root(ws)
        if sessions is not None:
            add("sessions-", ws, "sessions", sessions)
    return out


def _absolute(ws: Workspace, raw: Path) -> Path:
    path = raw.expanduser()
    return Path(os.path.abspath(path if path.is_absolute() else ws.path / path))


def sessions_root(ws: Workspace) -> Path | None:
    """The workspace's ``sessions`` folder, ``~`` expanded, made absolute against the workspace; ``None`` when it
    configures none."""
    return None if ws.sessions is None else _absolute(ws, ws.sessions)


def extra_roots(ws: Workspace) -> list[Path]:
    """The workspace's extra paths: ``~`` expanded, made absolute against the workspace, duplicates removed."""
    seen: dict[Path, None] = {}
    for raw in ws.extra_paths:
        seen.setdefault(_absolute(ws, raw), None)
    return list(seen)


def rel_path(ws: Workspace, path: Path) -> str:
    """``path`` relative to the workspace with ``/`` separators, or the absolute path when outside it."""
    try:
        return path.relative_to(ws.path).as_posix()
    except ValueError:
        return path.as_posix()


SESSIONS_PREFIX = "sessions/"  # how a session transcript is named, wherever its folder lies (``display_path``)


def display_path(collection: Collection, path: Path) -> str:
    """How ``path`` of ``collection`` is named in hits, citations and pages, and what ``get`` takes back: a session
    transcript as ``sessions/<path under the sessions folder>`` (the folder is often outside the workspace, e.g.
    ``~/.openclaw/agents/<id>/sessions``, and a long absolute path in every citation helps nobody), any other file
    relative to the workspace (``rel_path``)."""
    if collection.role == "sessions" and path.is_relative_to(collection.root):
        return SESSIONS_PREFIX + path.relative_to(collection.root).as_posix()
    return rel_path(collection.workspace, path)


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
    (``_rank``); within one workspace, its sessions folder for a transcript in it (a folder inside ``memory/``
    holds transcripts, not notes: ``memory/sessions/x.jsonl`` was claimed by ``memory/`` and indexed by neither)."""
    if collection.role == "sessions" and other.role != "sessions" and collection.workspace == other.workspace:
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
    """A configured path the daemon cannot use as meant: ``kind`` is ``extra_path_missing`` or
    ``sessions_path_missing`` (nothing there: an empty collection until it appears) or ``extra_path_overlaps``
    (inside, or around, ``memory/`` or an earlier extra path of the same agent: its files are indexed once, in the
    collection ``detail`` names)."""

    kind: str
    agent: str
    path: Path
    detail: str


def path_problems(collections: Sequence[Collection]) -> list[Problem]:
    """The ``Problem``s of the extra paths and sessions folders among ``collections``, in order."""
    out: list[Problem] = []
    for n, extra in enumerate(collections):
        if extra.role == "sessions" and not os.path.lexists(extra.root):
            out.append(Problem("sessions_path_missing", extra.agent, extra.root,
                               "no sessions folder there yet: an empty collection; indexed once it exists"))
        if extra.role != "extra":
            continue
        if not os.path.lexists(extra.root):
            out.append(Problem("extra_path_missing", extra.agent, extra.root,
                               "nothing there yet: an empty collection; indexed once it exists"))
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


def anchor(collection: Collection, path: Path) -> tuple[Path, str, bool]:
    """``(base, rel, follow_base)`` to open ``path`` of ``collection`` with ``indexer.safeio.open_beneath``: the
    workspace for root and ``memory/`` files (so a symlinked ``memory/`` is refused too), the extra root (or, for a
    file extra, its directory) for extras, whose root itself must not be a symlink."""
    if not collection.source.own_root:
        return collection.workspace.path, path.relative_to(collection.workspace.path).as_posix(), True
    if path == collection.root:
        return path.parent, path.name, True
    return collection.root, path.relative_to(collection.root).as_posix(), False
