"""Agent-side reads of memory: a paged read of one file, ``recall`` and the boot context.

- ``read_memory``: lines ``from_line`` (1-based) onwards, at most ``lines`` of them and ``max_chars`` characters,
  streamed line by line so a 200 MB file is never loaded whole; says where to continue. Only memory files of the
  workspace are readable: ``..`` escapes, absolute paths outside it, symlinks, hidden and non-memory files are
  refused with ``ReadRefused`` (the same rules as indexing, ``indexer.walk.route``). A name spelled under the
  other Unicode normalisation form (NFC ``café`` for an NFD file on disk, as macOS and some editors write them) is
  read when exactly one file matches, and the answer's ``note`` says so; otherwise ``FileNotFoundError`` names the
  closest memory path.
- ``recall``: the best memories for a query; ``*``, ``all`` or an empty query lists every memory file instead, a
  page of at most ``LIST_CAP`` files with the total and the next page's offset.
- ``boot_context``: memory packed into a character budget for the start of a session: the root memory file first,
  then the most recently changed notes (or, given a query, the best hits), whole lines only, with a list of what
  did not fit.
"""

from __future__ import annotations

import difflib
import os
import unicodedata
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from indexer.api import HEAD_BYTES
from indexer.chunking import split_lines
from indexer.config import Settings
from indexer.errors import ReadRefused
from indexer.hits import SNIPPET_CHARS
from indexer.schema import (
    DEFAULT_K,
    DEFAULT_MAX_CHARS,
    LIST_CAP,
    BootContext,
    BootRequest,
    Hit,
    Omitted,
    Page,
    RecallRequest,
    SearchRequest,
    SearchResponse,
)
from indexer.search import Searcher, join_degraded
from indexer.sources import Sniff, reader, redactor
from indexer.sources.base import open_memory
from indexer.store import Store
from indexer.walk import route, walk
from indexer.workspace import Collection, display_path, select

LIST_ALL = frozenset({"", "*", "all"})
SESSION_FIELDS = ("session_id", "session_time")  # what a listed transcript shows of its first chunk


def resolve_memory_path(collections: Sequence[Collection], path: str, agent: str | None = None,
                        classify: Callable[[Path, bytes], str | None] | None = None) -> tuple[Collection, Path]:
    """The collection and absolute path of memory file ``path`` (workspace-relative or absolute).

    Raises ``ReadRefused`` when it is not a text memory file of the (agent's) workspace (``classify``, the plugin
    registry's ``classify_text``, must name a kind, ``None`` for media: a ``.png`` or ``notes.txt`` without a plugin
    for it is not memory),
    ``FileNotFoundError`` when it does not exist, ``KeyError`` for an unknown agent. The path is normalised
    lexically (no symlink resolution), then checked by the indexing rules; the file itself is only ever opened
    with ``open_memory``, which refuses a symlink swapped in after these checks.
    """
    chosen = select(collections, agent)
    for workspace in dict.fromkeys(c.workspace for c in chosen):
        candidate = _transcript(chosen, workspace, path) or Path(
            os.path.normpath(path if os.path.isabs(path) else workspace.path / path))
        # routed among every workspace's collections, as the indexer routes it: a file of a workspace nested in
        # this one's memory/ belongs to the inner one, never to this agent
        collection, reason = route(collections, candidate)
        if collection is not None and collection.workspace == workspace:
            if classify is not None and reader(collection).classified:  # a transcript: its reader sniffs it
                with open_memory(collection, candidate) as handle:  # FileNotFoundError, ReadRefused propagate
                    kind = classify(candidate, handle.read(HEAD_BYTES))
                if kind is None or (collection.role == "root" and kind != "markdown"):
                    raise ReadRefused(f"{path}: not a text memory file (kind {kind or 'unknown'})")
            return collection, candidate
        if reason:
            raise ReadRefused(f"{path}: refused ({reason})")
    raise ReadRefused(f"{path}: not a memory file of this workspace")


def _transcript(collections: Sequence[Collection], workspace: Any, path: str) -> Path | None:
    """The absolute path a name ``<shown_as><file>`` (``workspace.display_path``: a transcript's
    ``sessions/<file>``) stands for under the root of ``workspace``'s collection whose source names its files so,
    when the file is there or nowhere (then not found, as a missing note is); ``None`` otherwise (the name is then
    read as workspace-relative)."""
    for c in collections:
        shown_as = c.source.shown_as
        if c.workspace == workspace and shown_as and path.startswith(shown_as):
            candidate = Path(os.path.normpath(c.root / path[len(shown_as):]))
            if candidate.is_relative_to(c.root) and (
                    os.path.lexists(candidate) or not os.path.lexists(workspace.path / path)):
                return candidate  # there, or nowhere: a transcript not found (not "not memory")
    return None


def read_memory(collections: Sequence[Collection], path: str, from_line: int = 1, lines: int | None = None,
                max_chars: int = DEFAULT_MAX_CHARS, agent: str | None = None,
                classify: Callable[[Path, bytes], str | None] | None = None,
                transcript_format: Sniff | None = None,
                settings: Settings | None = None) -> Page:
    """A page of memory file ``path``, read by its collection's reader (``indexer.sources.Reader.page``), its
    secrets redacted as its collection's chunks are (``indexer.sources.redactor`` of ``settings``; ``None``: the
    default settings, redaction on).

    Returns ``{"path", "collection", "from", "to", "text", "truncated", "next_from"}``: ``text`` holds whole lines
    ``from``..``to`` (1-based, inclusive; ``to < from`` when the file has no such lines). ``truncated`` is true when
    ``lines`` or ``max_chars`` (characters) stopped the read before the end, and ``next_from`` is then the line to
    ask for next (else ``None``). A single line longer than ``max_chars`` is returned cut, with
    ``"line_truncated": true`` (and ``next_from`` the line after it). Raises what ``resolve_memory_path`` raises
    (``classify`` is passed to it) and ``ValueError`` for bad arguments.

    A session transcript (``transcript_format``: the registry's sniffing) reads as its turns, each whole on one line
    (``L12 [2023-05-08 13:57] Caroline (user): ...``, ``indexer.sources.transcripts.render_page``); ``from``,
    ``to``, ``lines`` and ``next_from`` count its JSONL lines. Without a format that claims it, it is ``ReadRefused``.
    """
    if from_line < 1 or (lines is not None and lines < 1) or max_chars < 1:
        raise ValueError("from must be >= 1, lines >= 1 and max_chars >= 1")
    collection, abs_path, note = _found(collections, path, agent, classify)
    result = reader(collection).page(collection, abs_path, from_line, lines, max_chars,
                                     redactor(settings, collection), transcript_format)
    if note:
        result["note"] = note
    return result


def _found(collections: Sequence[Collection], path: str, agent: str | None,
           classify: Callable[[Path, bytes], str | None] | None) -> tuple[Collection, Path, str | None]:
    """``read_memory``'s file: ``resolve_memory_path``'s ``(collection, abs_path)`` and ``None``, or, when no file
    has that name but one has it in another Unicode normalisation form, that one and a note saying so. Raises
    ``FileNotFoundError`` naming the closest file, and what ``resolve_memory_path`` raises."""
    try:
        collection, abs_path = resolve_memory_path(collections, path, agent, classify)
        if not os.path.lexists(abs_path):
            raise FileNotFoundError(path)
    except FileNotFoundError:
        respelled = _respelled(collections, path, agent)
        if respelled is None:
            raise FileNotFoundError(_closest(collections, path, agent)) from None
        collection, abs_path = resolve_memory_path(collections, respelled, agent, classify)
        return collection, abs_path, (f"no file is named {path!r}: read {respelled!r}, the same name in another "
                                      "Unicode normalisation form")
    return collection, abs_path, None


def _respelled(collections: Sequence[Collection], path: str, agent: str | None) -> str | None:
    """The workspace-relative ``path`` as spelled on disk when its names differ only by Unicode normalisation (each
    component compared in NFC) and exactly one file matches; ``None`` otherwise (or for an absolute path)."""
    if os.path.isabs(path):
        return None
    parts = Path(os.path.normpath(path)).parts
    for workspace in dict.fromkeys(c.workspace for c in select(collections, agent)):
        here, found = workspace.path, []
        for part in parts:
            try:
                names = [n for n in os.listdir(here) if unicodedata.normalize("NFC", n) ==
                         unicodedata.normalize("NFC", part)]
            except OSError:
                break
            if len(names) != 1:
                break
            here = here / names[0]
            found.append(names[0])
        else:
            return "/".join(found) if here.is_file() else None
    return None


CLOSE_RATIO = 0.8  # how near a memory file's path must be to be named as the one meant (``_closest``)


def _closest(collections: Sequence[Collection], path: str, agent: str | None) -> str:
    """``FileNotFoundError``'s message for ``path``: the path, and the closest memory file's path when one is near:
    ``difflib``'s ratio of at least ``CLOSE_RATIO``, of the whole paths or of the file names (a note moved to another
    folder). Paths all share ``memory/`` and ``.md``, so a lower cutoff named unrelated notes (``memory/zh-notes.md``
    -> ``memory/projects/home.md``, 0.63)."""
    chosen = select(collections, agent)
    files = [display_path(c, p) for c, p in walk(chosen)[0]]
    asked = unicodedata.normalize("NFC", path)

    def nearness(file: str) -> float:
        whole = difflib.SequenceMatcher(None, asked, file).ratio()
        return max(whole, difflib.SequenceMatcher(None, asked.rsplit("/", 1)[-1], file.rsplit("/", 1)[-1]).ratio())

    near, best = max(((nearness(file), file) for file in files), default=(0.0, ""))
    return f"{path} (the closest memory file is {best})" if near >= CLOSE_RATIO else path


def list_memories(collections: Sequence[Collection], store: Store, request: RecallRequest) -> SearchResponse:
    """Every memory file of the (``request.agent``'s) collections, one entry each, sorted by agent then path: the
    page of at most ``min(request.k, LIST_CAP)`` entries (``k`` unset: ``LIST_CAP``) from ``request.offset``
    (0-based), as ``{"hits", "relevant": None, "total", "next_offset"}`` (``total`` files in all; ``next_offset`` the
    next page's ``offset``, ``None`` after the last). An entry is a ``Hit`` of the whole file: lines 1 to its last
    chunk's end, the first chunk's text as snippet, ``score`` null."""
    agent, k, offset = request.agent, request.k or LIST_CAP, request.offset
    entries: dict[str, Hit] = {}
    first: dict[str, int] = {}  # abs_path -> the lowest chunk index seen (its text is the snippet)
    for collection in collections:
        if agent and collection.agent != agent:
            continue
        for p in store.scroll(collection.name, ["abs_path", "path", "agent", "collection", "kind", "chunk_index",
                                                "start_line", "end_line", "text", *SESSION_FIELDS]):
            entry = entries.get(p.abs_path)
            if entry is None:
                entry = entries[p.abs_path] = Hit(collection=p.collection, agent=p.agent, path=p.path, start_line=1,
                                                  end_line=p.end_line, score=None, snippet="", kind=p.kind,
                                                  citation="")
            entry["end_line"] = max(entry["end_line"], p.end_line)
            if p.chunk_index < first.get(p.abs_path, 1 << 30):
                first[p.abs_path] = p.chunk_index
                entry["snippet"] = p.text[:SNIPPET_CHARS]
                for key in SESSION_FIELDS:  # a transcript: its session and when its first turn was
                    if p.get(key) is not None:
                        entry[key] = p.get(key)  # type: ignore[literal-required]
    ordered = sorted(entries.values(), key=lambda e: (e["agent"], e["path"]))
    end = offset + min(k, LIST_CAP)
    listed = ordered[offset:end]
    for entry in listed:
        entry["citation"] = f"{entry['path']}#L{entry['start_line']}-L{entry['end_line']}"
    return {"hits": listed, "relevant": None, "total": len(ordered),
            "next_offset": end if end < len(ordered) else None}


def recall(searcher: Searcher, request: RecallRequest, degraded: list[str] | None = None) -> SearchResponse:
    """The ``request.k`` (default ``DEFAULT_K``) best memories for its query (the configured search mode), as
    ``{"hits", "relevant", "relevance"}`` (``indexer.relevance.judge``); ``*``/``all``/empty lists every memory
    file instead (``list_memories``: ``k`` defaults to ``LIST_CAP``, ``offset`` pages). The search is the
    ``SearchRequest`` of the fields the two requests share. Raises ``KeyError`` for an unknown agent. ``degraded``: as
    ``Searcher.retrieve``'s."""
    shared = request.model_dump(include=set(SearchRequest.model_fields) - {"k"}, exclude_none=True)
    search = SearchRequest(**shared)
    if request.query.strip().lower() in LIST_ALL:
        return list_memories(searcher.targets(search), searcher.store, request)  # KeyError: an unknown agent
    # a recall may ask for more hits than a search's k allows (RecallK): set without the search's bound
    answer = searcher.answer(search.model_copy(update={"k": request.k or DEFAULT_K}))
    if degraded is not None:
        degraded.extend(answer.degraded)
    return {"hits": answer.hits, "relevant": answer.relevant, "relevance": answer.relevance}


def boot_context(searcher: Searcher, request: BootRequest,
                 classify: Callable[[Path, bytes], str | None] | None = None,
                 settings: Settings | None = None) -> BootContext:
    """Memory for the start of a session, packed into ``request.budget_chars`` characters.

    Order: with a query, its best hits; without, the root memory file, then notes by most recent change. Each
    piece is a header line ``## <path>#L<a>-L<b>`` and whole lines of text; a piece that does not fit is cut at the
    last whole line that does. Returns ``{"text", "used_chars", "budget_chars", "included": [citations],
    "omitted": [{"citation", "lines"}]}``, and ``"degraded"`` when the query's search was less than the configured
    one (``Searcher.retrieve``: e.g. keyword only while the model loads). Files read from disk are redacted as
    ``read_memory`` redacts them (``settings``).
    """
    budget_chars, agent, query = request.budget_chars, request.agent, request.query
    if budget_chars < 1:
        raise ValueError("budget_chars must be >= 1")
    parts: list[str] = []
    included: list[str] = []
    omitted: list[Omitted] = []
    used = 0
    degraded: list[str] = []
    for path, start, text, total in _boot_pieces(searcher, agent, query, budget_chars, classify, degraded, settings):
        last = start + total - 1
        if text is None:
            omitted.append({"citation": f"{path}#L{start}-L{last}", "lines": total})
            continue
        lines = split_lines(text)
        room = budget_chars - used - len(f"## {path}#L{start}-L{last}") - 1 - (1 if parts else 0)
        take = size = 0
        for line in lines:
            if size + len(line) + (1 if take else 0) > room:
                break
            size += len(line) + (1 if take else 0)
            take += 1
        if take == 0:
            omitted.append({"citation": f"{path}#L{start}-L{last}", "lines": total})
            continue
        end = start + take - 1
        block = f"## {path}#L{start}-L{end}\n" + "\n".join(lines[:take])
        used += len(block) + (1 if parts else 0)
        parts.append(block)
        included.append(f"{path}#L{start}-L{end}")
        if end < last:
            omitted.append({"citation": f"{path}#L{end + 1}-L{last}", "lines": last - end})
    text = "\n".join(parts)
    context: BootContext = {"text": text, "used_chars": len(text), "budget_chars": budget_chars,
                            "included": included, "omitted": omitted}
    note = join_degraded(degraded)
    if note:
        context["degraded"] = note
    return context


def _boot_pieces(searcher: Searcher, agent: str | None, query: str | None, budget_chars: int,
                 classify: Callable[[Path, bytes], str | None] | None = None,
                 degraded: list[str] | None = None, settings: Settings | None = None
                 ) -> list[tuple[str, int, str | None, int]]:
    """``(path, start_line, text, total_lines)`` candidates in priority order. Without a query, files are read
    from disk (at most ``budget_chars`` characters each, whole lines), so lines are never pieces of chunks.
    ``degraded`` collects why the query's search was less than the configured one."""
    if query and query.strip().lower() not in LIST_ALL:
        hits = searcher.search(SearchRequest(query=query, k=20, agent=agent, corpus="memory"), degraded)
        return [(h["path"], h["start_line"], h["snippet"], h["end_line"] - h["start_line"] + 1)
                for h in hits if h["kind"] != "image"]
    targets = searcher.targets(SearchRequest(query="", agent=agent, corpus="memory"))  # never transcripts
    files: dict[str, dict[str, Any]] = {}
    for collection in targets:
        for p in searcher.store.scroll(collection.name, ["abs_path", "path", "mtime_ns", "end_line", "modality"]):
            if p.modality != "text":
                continue
            entry = files.setdefault(p.abs_path, {"path": p.path, "mtime": p.mtime_ns,
                                                  "root": collection.role == "root", "lines": 0})
            entry["lines"] = max(entry["lines"], p.end_line)
    pieces = []
    for abs_path, f in sorted(files.items(), key=lambda kv: (not kv[1]["root"], -kv[1]["mtime"], kv[1]["path"])):
        try:
            page = read_memory(searcher.collections, abs_path, 1, None, budget_chars, agent, classify,
                               settings=settings)
        except (ReadRefused, OSError):
            continue
        # a first line longer than the budget cannot be shown whole: the piece is listed as omitted
        pieces.append((f["path"], 1, None if page.get("line_truncated") else page["text"], max(f["lines"], page["to"])))
    return pieces
