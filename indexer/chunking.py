"""Text to line-ranged token windows sized by the embedder's own tokenizer, and the project's one line model. Markdown
notes are cut into heading sections with their document's context by ``indexer.sections.chunk_markdown``, whose
longer sections are windowed here.

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

import re
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator, Sequence, Set
from dataclasses import dataclass

from markdown_it import MarkdownIt

OVERLAP_RATIO = 0.2  # reference: 80 of 400 tokens
TOKENIZE_BLOCK_CHARS = 1 << 16  # characters of whole lines tokenized at once (``_token_starts``)
#: version of what the built-in markdown chunking makes of a note (line ranges and context text); stored with every
#: point so that a store built by another version is re-indexed once (see ``indexer.pipeline``)
CHUNKING_VERSION = 7  # 7: a transcript's payload path is ``sessions/<file>`` (``workspace.display_path``), not
# the absolute path (nothing re-embedded: the path is not in the embedded text); 6: a transcript window's payload
# names its turns' lines and offsets (``turn_lines``, ``turn_offsets``), so that a hit can show only the turns no
# better hit shows (5: a heading with no body joins the
# section under it; conversation logs with the full-width colon (``小王：...``) cut into turn windows too; 4:
# conversation logs cut into turn windows; a dated note's date and a window's speakers in the context; 3: front matter
# out of the chunks, its title and tags in their context)


@dataclass(frozen=True, slots=True)
class TextChunk:
    """A chunk of a text: ``text`` is ``source[start_char:end_char]``; lines are 1-based, inclusive. ``context`` is
    the document context embedded and keyword-indexed with it (``indexer.sections.chunk_markdown``; empty for
    ``chunk_text``), ``n_tokens`` counts the text's tokens plus the context's, and ``speakers`` names those of a
    conversation window (``indexer.conversation``; empty for other chunks)."""

    text: str
    start_line: int
    end_line: int
    n_tokens: int
    context: str = ""
    speakers: tuple[str, ...] = ()  # a conversation window's speakers; empty for any other chunk
    date: str = ""  # the note's date (``indexer.dates.note_date``) as ``YYYY-MM-DD``; empty for an undated note


@dataclass(frozen=True, slots=True)
class Piece:
    """A sentence, or a cut of one longer than the window: windows are packed of these (``pack``)."""

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


def pieces_of(text: str, token_offsets: Callable[[str], list[tuple[int, int]]], max_tokens: int) -> list[Piece]:
    """The pieces of ``text`` in order: each line's sentences (``_sentences``), one longer than ``max_tokens`` cut at
    token boundaries, before a word where one is near (steps 1-2 of the module docstring)."""
    spans = line_spans(text)
    tokens_by_line = _token_starts(text, spans, token_offsets)
    pieces: list[Piece] = []
    for line, ((begin, end), line_tokens) in enumerate(zip(spans, tokens_by_line, strict=True)):
        for s_begin, s_end in _sentences(text, begin, end):
            starts = line_tokens[bisect_left(line_tokens, s_begin) : bisect_left(line_tokens, s_end)]
            if len(starts) <= max_tokens:
                pieces.append(Piece(line, s_begin, s_end, len(starts)))
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
                pieces.append(Piece(line, piece_start, piece_end, min(cut, len(starts)) - k))
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
    document context; markdown notes go through ``indexer.sections.chunk_markdown``."""
    if max_tokens < 1:
        raise ValueError("max_tokens must be at least 1")
    if not text.strip():
        return []
    overlap = int(max_tokens * OVERLAP_RATIO) if overlap_tokens is None else overlap_tokens
    pieces = pieces_of(text, token_offsets, max_tokens)
    headings = heading_lines(text)
    return [TextChunk(text[pieces[lo].start : pieces[hi].end], pieces[lo].line + 1, pieces[hi].line + 1, total)
            for lo, hi, total in pack(text, pieces, max_tokens, overlap, headings)]


def pack(text: str, pieces: Sequence[Piece], max_tokens: int, overlap: int,
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


def _line_start(pieces: Sequence[Piece], index: int) -> int:
    """Start offset of the first piece on the same line as ``pieces[index]``."""
    while index > 0 and pieces[index - 1].line == pieces[index].line:
        index -= 1
    return pieces[index].start
