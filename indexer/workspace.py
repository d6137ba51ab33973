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
  transcripts (``indexer.sources.transcripts``).
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
(``memory`` or ``sessions``), its folder in a workspace, where the symlink checks of its files start, which names
are candidates, how its files are named and which reader reads them (``indexer.sources``: notes or transcripts).
Everything downstream (the walk, ``indexer.walk``; the pipeline, the daemon, ``get`` and ``status`` through the
reader; tenancy; search's ``corpus`` filter) asks the source, never the role by name.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import structlog

from indexer.config import Workspace
from indexer.errors import unknown_agent

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
    (only names ending so are candidates; empty: any name), ``dense_weight`` (the factor a point's dense part of
    its fused score gets in hybrid search, ``indexer.ranking.fuse_scores``), ``reader`` (the name of the reader of
    its files in ``indexer.sources.READERS``), ``kind`` (its collections' names start so, after the prefix),
    ``folder`` (its root in a workspace, ``None`` where the workspace has none; ``None``: several, the extra
    paths), ``shown_as`` (its files are named ``<shown_as><path under its root>`` in hits and by ``get``; empty:
    relative to the workspace), ``claims_nested`` (its candidates under another collection of its workspace are its
    own: a sessions folder inside ``memory/``) and ``missing`` (``(problem kind, detail)`` reported while its root
    does not exist; empty: never)."""

    role: Role
    corpus: Corpus
    own_root: bool
    walked: bool
    suffix: str = ""
    dense_weight: float = 1.0
    reader: str = "notes"
    kind: str = ""
    folder: Callable[[Workspace], Path | None] | None = None
    shown_as: str = ""
    claims_nested: bool = False
    missing: tuple[str, str] | tuple[()] = ()


#: The dense part of a transcript window's fused score, against 1 for notes. Chat windows (greetings, thanks, one
#: speaker's name on every line) look alike to a small sentence model, and its cosine ranks them poorly: on sessmem,
#: MiniLM alone finds hit@5 0.571 against BM25's 0.816, and fused at equal weight it adds nothing (0.819). Measured
#: on sessmem with daily-log notes about other people beside the transcripts (``benchmarks/sessmem_eval.py --notes
#: rotated --corpus sessions --corpus all``, chunking v7, hybrid hit@5 sessions / all): 0.4 0.873/0.850, 0.5
#: 0.884/0.856, 0.6 0.873/0.867, 0.7 0.864/0.859, 0.8 0.859/0.862, 1.0 0.856/0.845. At 0.6 asking notes and
#: transcripts together (``corpus all``) costs 0.006, at 0.4 0.023: weighed down further, a transcript loses to a
#: note that only looks like it (docs/benchmarks.md, "Session transcripts"). Notes keep 1.0: on devvault 0.5 cost
#: nDCG@10 0.886 -> 0.853.
TRANSCRIPT_DENSE_WEIGHT = 0.6
SESSIONS_PREFIX = "sessions/"  # how a session transcript is named, wherever its folder lies (``display_path``)


def _absolute(ws: Workspace, raw: Path) -> Path:
    path = raw.expanduser()
    return Path(os.path.abspath(path if path.is_absolute() else ws.path / path))


def sessions_root(ws: Workspace) -> Path | None:
    """The workspace's ``sessions`` folder, ``~`` expanded, made absolute against the workspace; ``None`` when it
    configures none."""
    return None if ws.sessions is None else _absolute(ws, ws.sessions)


def _memory_dir(ws: Workspace) -> Path:
    return ws.path / MEMORY_DIR


def _workspace_root(ws: Workspace) -> Path:
    return ws.path


#: every source, in the order a workspace's collections are planned (``plan_collections``)
SOURCES: dict[str, Source] = {
    "root": Source("root", "memory", own_root=False, walked=False, kind="memory-root-", folder=_workspace_root),
    "dir": Source("dir", "memory", own_root=False, walked=True, kind="memory-dir-", folder=_memory_dir),
    "extra": Source("extra", "memory", own_root=True, walked=True, kind="memory-extra-",
                    missing=("extra_path_missing", "nothing there yet: an empty collection; indexed once it exists")),
    "sessions": Source("sessions", "sessions", own_root=True, walked=True, suffix=".jsonl",
                       dense_weight=TRANSCRIPT_DENSE_WEIGHT, reader="transcripts", kind="sessions-",
                       folder=sessions_root, shown_as=SESSIONS_PREFIX, claims_nested=True,
                       missing=("sessions_path_missing",
                                "no sessions folder there yet: an empty collection; indexed once it exists")),
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


def select(collections: Sequence[Collection], agent: str | None = None, corpus: str | None = None,
           names: Sequence[str] = ()) -> list[Collection]:
    """The ``collections`` of ``agent`` (``None``: every agent's) in ``corpus`` (``"memory"``, ``"sessions"``;
    ``None`` or ``"all"``: both) and, when ``names`` are given, among them: the one selector of search, recall,
    append and status. Raises ``KeyError`` (404 on the API) for an agent no collection has, naming the known ones
    (``indexer.errors.unknown_agent``), and for a name no collection has."""
    if agent is not None and not any(c.agent == agent for c in collections):
        raise KeyError(unknown_agent(agent, {c.agent for c in collections}))
    unknown = set(names) - {c.name for c in collections}
    if unknown:
        raise KeyError(f"unknown collection {sorted(unknown)[0]!r}")
    return [c for c in collections if (agent is None or c.agent == agent) and corpus in (None, "all", c.corpus)
            and (not names or c.name in names)]


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
        for source in SOURCES.values():
            if source.folder is not None:
                root = source.folder(ws)
                if root is not None:
                    add(source.kind, ws, source.role, root)
                continue
            for extra in extra_roots(ws):
                part = f"{source.kind}{sanitise(extra.stem if extra.suffix else extra.name)}"
                name = unique(part, taken, f"--{agent_slug(ws.agent)}")
                before = unique(f"{part}-{sanitise(ws.agent)}", taken_before)
                out.append(Collection(name, ws.agent, source.role, extra, ws, before))
    return out


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


def display_path(collection: Collection, path: Path) -> str:
    """How ``path`` of ``collection`` is named in hits, citations and pages, and what ``get`` takes back: a file of
    a source with ``shown_as`` as that and its path under the collection's root (a session transcript as
    ``sessions/<path under the sessions folder>``: the folder is often outside the workspace, e.g.
    ``~/.openclaw/agents/<id>/sessions``, and a long absolute path in every citation helps nobody), any other file
    relative to the workspace (``rel_path``)."""
    shown_as = collection.source.shown_as
    if shown_as and path.is_relative_to(collection.root):
        return shown_as + path.relative_to(collection.root).as_posix()
    return rel_path(collection.workspace, path)


def anchor(collection: Collection, path: Path) -> tuple[Path, str, bool]:
    """``(base, rel, follow_base)`` to open ``path`` of ``collection`` with ``indexer.safeio.open_beneath``: the
    workspace for root and ``memory/`` files (so a symlinked ``memory/`` is refused too), the extra root (or, for a
    file extra, its directory) for extras, whose root itself must not be a symlink."""
    if not collection.source.own_root:
        return collection.workspace.path, path.relative_to(collection.workspace.path).as_posix(), True
    if path == collection.root:
        return path.parent, path.name, True
    return collection.root, path.relative_to(collection.root).as_posix(), False
