"""Markdown text to line-ranged chunks sized by the embedder's own tokenizer.

The reference agent chunks by lines at ~400 tokens with ~80 tokens of overlap. all-MiniLM-L6-v2 keeps only 256
word pieces (254 without [CLS]/[SEP]) and silently drops the rest, so chunks here are sized to the model:
``max_tokens`` of the text embedder per chunk, with 20 % of that as overlap (the reference's 80/400 ratio).

Algorithm:
1. Tokenize the whole text once, with character offsets; each token belongs to the line its first character is on.
2. Each line is cut into sentences (after ``.``/``!``/``?`` and whitespace); a sentence longer than ``max_tokens``
   is cut further at token boundaries (never inside a character), preferring boundaries before a word. Each is a
   piece. Blank lines cost nothing.
3. Pieces are packed greedily. A chunk ends early before a markdown heading once it is half full, so sections stay
   whole when they can. The next chunk starts with the trailing pieces of the previous one that fit in the overlap.

Line numbers are 1-based and inclusive, in the one line model of the project (``split_lines``): ``\\n``, ``\\r\\n`` and
a lone ``\\r`` each end a line, as editors show them; citations, snippets and ``get`` count lines the same way.
"""

from __future__ import annotations

import datetime
import re
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator, Sequence, Set
from dataclasses import dataclass, replace
from functools import partial
from itertools import takewhile

from markdown_it import MarkdownIt

from indexer.conversation import conversation_windows, is_conversation, speakers_of
from indexer.dates import date_words, note_date
from indexer.frontmatter import front_matter, front_matter_lines

OVERLAP_RATIO = 0.2  # reference: 80 of 400 tokens
MAX_CONTEXT_RATIO = 0.25  # share of the window a chunk's document context may take
TOKENIZE_BLOCK_CHARS = 1 << 16  # characters of whole lines tokenized at once (``_token_starts``)
MERGE_TOKENS = 128  # adjacent small sections merge while together (with context) under this many tokens
#: version of what the built-in markdown chunking makes of a note (line ranges and context text); stored with every
#: point so that a store built by another version is re-indexed once (see ``indexer.pipeline``)
CHUNKING_VERSION = 7  # 7: a transcript's payload path is ``sessions/<file>`` (``workspace.display_path``), not
# the absolute path (nothing re-embedded: the path is not in the embedded text); 6: a transcript window's payload
# names its turns' lines and offsets (``turn_lines``, ``turn_offsets``), so that a hit can show only the turns no
# better hit shows (5: a heading with no body joins the
# section under it; conversation logs with the full-width colon (``小王：...``) cut into turn windows too; 4:
# conversation logs cut into turn windows; a dated note's date and a window's speakers in the context; 3: front matter
# out of the chunks, its title and tags in their context)
CONTEXT_PATH = False  # whether the context also names the note's workspace-relative path


@dataclass(frozen=True, slots=True)
class TextChunk:
    """A chunk of a text: ``text`` is ``source[start_char:end_char]``; lines are 1-based, inclusive. ``context`` is
    the document context embedded and keyword-indexed with it (``chunk_markdown``; empty for ``chunk_text``),
    ``n_tokens`` counts the text's tokens plus the context's, and ``speakers`` names those of a conversation window
    (``indexer.conversation``; empty for other chunks)."""

    text: str
    start_line: int
    end_line: int
    n_tokens: int
    context: str = ""
    speakers: tuple[str, ...] = ()  # a conversation window's speakers; empty for any other chunk
    date: str = ""  # the note's date (``indexer.dates.note_date``) as ``YYYY-MM-DD``; empty for an undated note


@dataclass(frozen=True, slots=True)
class _Piece:
    line: int  # 0-based
    start: int  # character offsets in the source
    end: int
    n_tokens: int


def heading_lines(text: str) -> set[int]:
    """0-based line numbers where a markdown heading starts (ATX or setext), per CommonMark via markdown-it-py."""
    lines: set[int] = set()
    for token in MarkdownIt("commonmark").parse(text):
        if token.type == "heading_open" and token.map:
            lines.add(token.map[0])
    return lines


LINE_END = re.compile(r"\r\n|\r|\n")


def line_spans(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` character offsets of each line of ``text``, its line break excluded: ``\\n``, ``\\r\\n`` and a
    lone ``\\r`` each end a line (what Python's universal newlines and editors do); a final break ends the last line
    and starts no other. ``""`` has one empty line."""
    spans: list[tuple[int, int]] = []
    begin = 0
    for match in LINE_END.finditer(text):
        spans.append((begin, match.start()))
        begin = match.end()
    if begin < len(text) or not spans:
        spans.append((begin, len(text)))
    return spans


def split_lines(text: str) -> list[str]:
    """The lines of ``text`` in the project's one line model (see ``line_spans``), breaks removed."""
    return [text[begin:end] for begin, end in line_spans(text)]


def _token_starts(text: str, spans: Sequence[tuple[int, int]],
                  token_offsets: Callable[[str], list[tuple[int, int]]]) -> Iterator[list[int]]:
    """Per line of ``spans``, the start offsets (in ``text``) of its non-empty model tokens. The text is tokenized in
    blocks of whole lines of about ``TOKENIZE_BLOCK_CHARS`` characters: a model token never spans a line break (the
    tokenizers pre-split on whitespace), so the tokens are those of the whole text, while a huge note (a 10 MB
    conversation log) never holds millions of offsets at once nor the tokenizer for seconds."""
    line = 0
    while line < len(spans):
        last, size = line, 0
        while last < len(spans) and (last == line or size + spans[last][1] - spans[last][0] < TOKENIZE_BLOCK_CHARS):
            size += spans[last][1] - spans[last][0] + 1
            last += 1
        base, stop = spans[line][0], spans[last - 1][1]
        starts: list[list[int]] = [[] for _ in range(last - line)]
        line_starts = [begin for begin, _ in spans[line:last]]
        for start, end in token_offsets(text[base:stop]):
            if end > start:
                starts[bisect_right(line_starts, base + start) - 1].append(base + start)
        yield from starts
        line = last


def _pieces(text: str, token_offsets: Callable[[str], list[tuple[int, int]]], max_tokens: int) -> list[_Piece]:
    spans = line_spans(text)
    tokens_by_line = _token_starts(text, spans, token_offsets)
    pieces: list[_Piece] = []
    for line, ((begin, end), line_tokens) in enumerate(zip(spans, tokens_by_line, strict=True)):
        for s_begin, s_end in _sentences(text, begin, end):
            starts = line_tokens[bisect_left(line_tokens, s_begin) : bisect_left(line_tokens, s_end)]
            if len(starts) <= max_tokens:
                pieces.append(_Piece(line, s_begin, s_end, len(starts)))
                continue
            k = 0
            while k < len(starts):
                cut = k + max_tokens
                if cut < len(starts):
                    # prefer a cut before a token that starts a word, so no word is split across chunks
                    for j in range(cut, k + max_tokens // 2, -1):
                        if text[starts[j] - 1].isspace():
                            cut = j
                            break
                piece_start = s_begin if k == 0 else starts[k]
                piece_end = starts[cut] if cut < len(starts) else s_end
                pieces.append(_Piece(line, piece_start, piece_end, min(cut, len(starts)) - k))
                k = cut
    return pieces


_SENTENCE_GAP = re.compile(r"(?<=[.!?])\s+")


def _sentences(text: str, begin: int, end: int) -> list[tuple[int, int]]:
    """``(start, end)`` character spans of the sentences of ``text[begin:end]`` (one line): cut after ``.``, ``!``
    or ``?`` followed by whitespace, the whitespace belonging to neither side. A paragraph written as one long line
    thus becomes sentence pieces, so packing can fill a chunk and the overlap can carry whole sentences: with one
    piece per line, a 300-token paragraph under a title gave a title-only chunk and no overlap (how often:
    docs/performance.md, "Chunking")."""
    spans, start = [], begin
    for gap in _SENTENCE_GAP.finditer(text, begin, end):
        if gap.start() > start and gap.end() < end:
            spans.append((start, gap.start()))
            start = gap.end()
    spans.append((start, end))
    return spans


def chunk_text(
    text: str,
    token_offsets: Callable[[str], list[tuple[int, int]]],
    max_tokens: int,
    overlap_tokens: int | None = None,
) -> list[TextChunk]:
    """Chunks of ``text``, each at most ``max_tokens`` model tokens, consecutive chunks overlapping by up to
    ``overlap_tokens`` (default ``OVERLAP_RATIO * max_tokens``). Whitespace-only chunks are dropped; an empty text
    gives ``[]``. ``token_offsets`` is the embedder's tokenizer (see ``ExtractContext``). Plain windows with no
    document context; markdown notes go through ``chunk_markdown``."""
    if max_tokens < 1:
        raise ValueError("max_tokens must be at least 1")
    if not text.strip():
        return []
    overlap = int(max_tokens * OVERLAP_RATIO) if overlap_tokens is None else overlap_tokens
    pieces = _pieces(text, token_offsets, max_tokens)
    headings = heading_lines(text)
    return [TextChunk(text[pieces[lo].start : pieces[hi].end], pieces[lo].line + 1, pieces[hi].line + 1, total)
            for lo, hi, total in _pack(text, pieces, max_tokens, overlap, headings)]


def _pack(text: str, pieces: Sequence[_Piece], max_tokens: int, overlap: int,
          headings: Set[int] = frozenset()) -> list[tuple[int, int, int]]:
    """Greedy windows over ``pieces``: ``(first, last, n_tokens)`` piece indexes (inclusive) of each window, blank
    pieces at its edges dropped, whitespace-only windows skipped. A window ends early before a heading line of
    ``headings`` once half full; the next starts with the trailing pieces that fit in ``overlap``."""
    windows: list[tuple[int, int, int]] = []
    first = 0
    while first < len(pieces):
        total, last = 0, first
        while last < len(pieces):
            piece = pieces[last]
            if last > first and total + piece.n_tokens > max_tokens:
                break
            if last > first and piece.line in headings and piece.start == _line_start(pieces, last) \
                    and total >= max_tokens // 2:
                break
            total += piece.n_tokens
            last += 1
        lo, hi = first, last - 1
        while lo < hi and not text[pieces[lo].start : pieces[lo].end].strip():
            lo += 1  # blank lines at either edge add no meaning and would widen the cited range
        while hi > lo and not text[pieces[hi].start : pieces[hi].end].strip():
            hi -= 1
        if text[pieces[lo].start : pieces[hi].end].strip():
            windows.append((lo, hi, total))
        if last >= len(pieces):
            break
        # step back over trailing pieces that fit in the overlap, but always move forward
        back, kept = last, 0
        while back - 1 > first and kept + pieces[back - 1].n_tokens <= overlap:
            back -= 1
            kept += pieces[back].n_tokens
        first = back
    return windows


def _line_start(pieces: Sequence[_Piece], index: int) -> int:
    """Start offset of the first piece on the same line as ``pieces[index]``."""
    while index > 0 and pieces[index - 1].line == pieces[index].line:
        index -= 1
    return pieces[index].start


# -- markdown notes: heading sections with their document's context ------------------------------------------------
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
    pieces = _pieces(text, token_offsets, max_tokens - cap)
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
            else [(a, b, ()) for a, b, _ in _pack(text, part, budget, overlap)]
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


def _groups(text: str, lines: Sequence[str], sections: Sequence[_Section], pieces: Sequence[_Piece],
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


def _plain(text: str, pieces: Sequence[_Piece], budget: int, overlap: int, first: int,
           last: int) -> list[tuple[int, int]]:
    """``pieces[first..last]`` (one turn over the window) cut into plain windows (``_pack``): piece index ranges."""
    return [(first + x, first + y) for x, y, _ in _pack(text, pieces[first : last + 1], budget, overlap)]
