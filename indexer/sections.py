"""Markdown notes to chunks that know their document: the note cut into heading sections (``outline``), each
chunk's context (title, heading path, date, speakers, tags: ``document_context``), small sections merged and long
ones cut into the token windows of ``indexer.chunking``, conversation logs into turn windows
(``indexer.conversation``). ``chunk_markdown`` is what the built-in markdown extractor calls."""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from itertools import takewhile

from markdown_it import MarkdownIt

from indexer.chunking import OVERLAP_RATIO, Piece, TextChunk, pack, pieces_of
from indexer.conversation import conversation_windows, is_conversation, speakers_of
from indexer.dates import date_words, note_date
from indexer.frontmatter import front_matter, front_matter_lines

MAX_CONTEXT_RATIO = 0.25  # share of the window a chunk's document context may take
MERGE_TOKENS = 128  # adjacent small sections merge while together (with context) under this many tokens
CONTEXT_PATH = False  # whether the context also names the note's workspace-relative path


@dataclass(frozen=True, slots=True)
class _Section:
    start: int  # 0-based first line
    end: int  # 0-based line after the last
    crumbs: tuple[str, ...]  # heading path below the title
    heading: bool = True  # whether line ``start`` is the heading named by the last crumb (the title when none)


_DATE_NAME = re.compile(r"(\d{4}-\d{2}-\d{2})")
_INLINE_MARKUP = re.compile(r"[`*_]+|\[([^\]]*)\]\([^)]*\)")


def _clean_heading(inline: str) -> str:
    return " ".join(_INLINE_MARKUP.sub(lambda m: m.group(1) or "", inline).split())


def outline(text: str, skip: int | None = None) -> tuple[str | None, list[_Section]]:
    """``(first H1's text or None, sections)``: the text cut before each top-level heading (not one inside a
    blockquote, list or HTML comment). A section's ``crumbs`` are the headings above and including its own, the
    title H1 left out; the lines before the first heading form a section with no crumbs. The ``skip`` lines of
    front matter (default: ``front_matter_lines``) are in no section, unless nothing but blank lines follows them
    (the block is then the note's only text)."""
    skip = front_matter_lines(text) if skip is None else skip
    body = text.split("\n", skip)[-1] if skip else text
    parsed = "\n" * skip + body
    first = skip if body.strip() else 0
    tokens = MarkdownIt("commonmark").parse(parsed)
    heads: list[tuple[int, int, str]] = []  # (line, level, text)
    for i, token in enumerate(tokens):
        if token.type == "heading_open" and token.map and token.level == 0:
            heads.append((token.map[0], int(token.tag[1]), _clean_heading(tokens[i + 1].content)))
    title = next((name for _, level, name in heads if level == 1 and name), None)
    n_lines = text.count("\n") + (0 if text.endswith("\n") else 1)
    sections: list[_Section] = []
    if not heads or heads[0][0] > first:
        sections.append(_Section(first, heads[0][0] if heads else n_lines, (), heading=False))
    stack: list[tuple[int, str]] = []
    title_seen = False
    for n, (line, level, name) in enumerate(heads):
        end = heads[n + 1][0] if n + 1 < len(heads) else n_lines
        if level == 1 and name == title and not title_seen:
            title_seen = True
            stack = []
            sections.append(_Section(line, end, ()))
            continue
        while stack and stack[-1][0] >= level:
            stack.pop()
        stack.append((level, name))
        sections.append(_Section(line, end, tuple(crumb for _, crumb in stack)))
    return title, sections


def document_title(first_h1: str | None, rel_path: str, front_matter_title: str | None = None) -> str:
    """A note's title: its first H1, else its front matter's ``title``, else its file name without the extension,
    ``-``/``_`` read as spaces."""
    if first_h1 or front_matter_title:
        return first_h1 or front_matter_title or ""
    stem = rel_path.rsplit("/", 1)[-1].rsplit(".", 1)[0]
    return " ".join(stem.replace("-", " ").replace("_", " ").split()) or stem


def document_context(title: str | None, crumbs: Sequence[str], rel_path: str, tags: Sequence[str] = (),
                     day: datetime.date | None = None, speakers: Sequence[str] = ()) -> str:
    """The context of a chunk: ``Title > Section > Subsection``; a daily note (file named ``YYYY-MM-DD``) whose
    title lacks its date gets it prefixed; a dated note's date (``indexer.conversation.note_date``) follows in
    words (``Monday, 8 May 2023``), then a conversation window's ``speakers`` (``Caroline, Melanie``), then the front
    matter's ``tags`` as hashtags (``#ops #deploy``), each on a line of its own. ``title=None``: the chunk shows its
    title line itself, so only a date (or nothing) stands for it."""
    date = _DATE_NAME.search(rel_path.rsplit("/", 1)[-1])
    shown = title or ""
    date_text = date.group(1) if date and date.group(1) not in shown and date.group(1).replace("-", " ") not in shown \
        else ""
    head = " ".join(part for part in (date_text, title or "") if part)
    line = " > ".join([part for part in (head, *crumbs) if part])
    lines = (line, date_words(day) if day else "", ", ".join(speakers), " ".join(f"#{tag}" for tag in tags))
    line = "\n".join(part for part in lines if part)
    return f"{rel_path}\n{line}" if CONTEXT_PATH else line


def _common(a: Sequence[str], b: Sequence[str]) -> tuple[str, ...]:
    """The heading path ``a`` and ``b`` start with."""
    return tuple(x for x, _ in takewhile(lambda pair: pair[0] == pair[1], zip(a, b)))


def chunk_markdown(
    text: str,
    token_offsets: Callable[[str], list[tuple[int, int]]],
    max_tokens: int,
    rel_path: str,
    overlap_tokens: int | None = None,
) -> list[TextChunk]:
    """Chunks of a markdown note, each knowing its document: ``context`` is ``document_context`` (title, heading
    path and the front matter's tags), and ``context + "\\n" + text`` is at most ``max_tokens`` model tokens. Front
    matter (``front_matter``) is in no chunk's text: the first chunk starts after it, at the file's own line.

    A heading section (``outline``) that fits the window with its context is one chunk; adjacent sections merge
    while the merged chunk is under ``MERGE_TOKENS`` and fits (their context is the heading path they share); a
    longer section is cut into overlapping windows (as ``chunk_text``) that each carry the section's context. The
    context takes at most ``MAX_CONTEXT_RATIO`` of the window (cut at a token boundary beyond that). ``text`` of
    every chunk is the file's own lines ``start_line..end_line``."""
    text = re.sub(r"\r\n?", "\n", text)  # the one line model (split_lines): \r\n and a lone \r end a line too
    if max_tokens < 1:
        raise ValueError("max_tokens must be at least 1")
    if not text.strip():
        return []
    meta = front_matter(text)
    first_h1, sections = outline(text, meta.lines)
    title = document_title(first_h1, rel_path, meta.title)
    day = note_date(rel_path, meta.date, first_h1)
    cap = max(1, int(max_tokens * MAX_CONTEXT_RATIO))
    pieces = pieces_of(text, token_offsets, max_tokens - cap)
    lines = text.split("\n")
    context_of = _Context(token_offsets, cap, title, rel_path, meta.tags, day).of
    groups = _groups(text, lines, sections, pieces, context_of, min(MERGE_TOKENS, max_tokens))
    chunks: list[TextChunk] = []
    for lo, hi, crumbs, _, heading, talk in groups:
        part = pieces[lo:hi]
        everyone = speakers_of(lines, part[0].line, part[-1].line) if talk else ()
        budget = max_tokens - context_of(crumbs, speakers=everyone)[1]
        overlap = int(budget * OVERLAP_RATIO) if overlap_tokens is None else overlap_tokens
        windows = conversation_windows(part, lines, budget, partial(_plain, text, part, budget, overlap)) if talk \
            else [(a, b, ()) for a, b, _ in pack(text, part, budget, overlap)]
        for a, b, speakers in windows:
            total = sum(p.n_tokens for p in part[a : b + 1])
            context, n_context = context_of(crumbs, shows_heading=part[a].line == heading, speakers=speakers)
            chunks.append(TextChunk(text[part[a].start : part[b].end], part[a].line + 1, part[b].line + 1,
                                    total + n_context, context, speakers, day.isoformat() if day else ""))
    return chunks


@dataclass(frozen=True)
class _Context:
    """The document context of a note's chunks (``document_context``), cut to at most ``cap`` model tokens."""

    token_offsets: Callable[[str], list[tuple[int, int]]]
    cap: int
    title: str
    rel_path: str
    tags: Sequence[str]
    day: datetime.date | None

    def of(self, crumbs: Sequence[str], shows_heading: bool = False,
           speakers: Sequence[str] = ()) -> tuple[str, int]:
        """``(context, its tokens)`` of a chunk under heading path ``crumbs``."""
        title: str | None = self.title
        if shows_heading:  # a chunk that starts with its own heading line does not repeat it in its context
            title, crumbs = (title, crumbs[:-1]) if crumbs else (None, ())
        context = document_context(title, crumbs, self.rel_path, self.tags, self.day, speakers)
        if not context:
            return "", 0
        offsets = self.token_offsets(context + "\n")
        if len(offsets) > self.cap:
            context, offsets = context[: offsets[self.cap - 1][1]], offsets[: self.cap]
        return context, len(offsets)


def _groups(text: str, lines: Sequence[str], sections: Sequence[_Section], pieces: Sequence[Piece],
            context_of: Callable[[Sequence[str]], tuple[str, int]],
            merge_tokens: int) -> list[tuple[int, int, tuple[str, ...], int, int, bool]]:
    """(first piece, last piece + 1, crumbs, n_tokens, heading line or -1, conversation) per non-blank section;
    adjacent sections merge while the merged tokens and their shared context stay within ``merge_tokens``. A group
    of merged sections keeps the heading line of its first section only while that heading names the group's
    crumbs; a conversation log is a group of its own. A heading with no body (nothing but its own line before the
    next heading, e.g. a daily note's ``# 2026-12-01`` above a conversation log or a long section) belongs to the
    section under it: alone it was a one-line chunk that took hit slots and boot budget."""
    by_line: dict[int, list[int]] = {}
    for index, piece in enumerate(pieces):
        by_line.setdefault(piece.line, []).append(index)
    groups: list[tuple[int, int, tuple[str, ...], int, int, bool]] = []

    def add(section: _Section, idx: list[int], talk: bool) -> None:
        n = sum(pieces[i].n_tokens for i in idx)
        if groups and not talk and not groups[-1][5]:
            lo, _, crumbs, total, heading, _ = groups[-1]
            shared = _common(crumbs, section.crumbs)
            if total + n + context_of(shared)[1] <= merge_tokens:
                groups[-1] = (lo, idx[-1] + 1, shared, total + n, heading if shared == crumbs else -1, False)
                return
        groups.append((idx[0], idx[-1] + 1, section.crumbs, n, section.start if section.heading else -1, talk))

    held: list[tuple[_Section, list[int]]] = []  # bodiless headings waiting for the section under them
    for n_section, section in enumerate(sections):
        idx = [i for line in range(section.start, section.end) for i in by_line.get(line, ())]
        if not idx or not text[pieces[idx[0]].start : pieces[idx[-1]].end].strip():
            continue
        body = [i for i in idx if pieces[i].line != section.start and text[pieces[i].start : pieces[i].end].strip()]
        if section.heading and not body and n_section + 1 < len(sections):
            held.append((section, idx))
            continue
        talk = is_conversation(lines[section.start : section.end])
        if held:
            above = [i for _, part in held for i in part]
            n = sum(pieces[i].n_tokens for i in above + idx)
            if not talk and n + context_of(_common(held[0][0].crumbs, section.crumbs))[1] <= merge_tokens:
                for waiting in held:  # small enough to merge as any small sections do
                    add(*waiting, False)
            else:  # a conversation log or a long section: the headings above open its first window
                idx, section = above + idx, replace(section, heading=False)
            held = []
        add(section, idx, talk)
    for waiting in held:  # only bodiless headings left: they are the text
        add(*waiting, False)
    return groups


def _plain(text: str, pieces: Sequence[Piece], budget: int, overlap: int, first: int,
           last: int) -> list[tuple[int, int]]:
    """``pieces[first..last]`` (one turn over the window) cut into plain windows (``pack``): piece index ranges."""
    return [(first + x, first + y) for x, y, _ in pack(text, pieces[first : last + 1], budget, overlap)]
