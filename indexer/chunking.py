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

import re
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass

from markdown_it import MarkdownIt

OVERLAP_RATIO = 0.2  # reference: 80 of 400 tokens


@dataclass(frozen=True, slots=True)
class TextChunk:
    """A chunk of a text: ``text`` is ``source[start_char:end_char]``; lines are 1-based, inclusive."""

    text: str
    start_line: int
    end_line: int
    n_tokens: int


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


def _pieces(text: str, offsets: list[tuple[int, int]], max_tokens: int) -> list[_Piece]:
    spans = line_spans(text)
    line_starts = [begin for begin, _ in spans]
    tokens_by_line: list[list[int]] = [[] for _ in line_starts]
    for start, end in offsets:
        if end > start:
            tokens_by_line[bisect_right(line_starts, start) - 1].append(start)
    pieces: list[_Piece] = []
    for line, (begin, end) in enumerate(spans):
        line_tokens = tokens_by_line[line]
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
    piece per line, a 300-token paragraph under a title gave a title-only chunk and no overlap (measured on BEIR
    SciFact: 71 % of documents; see ``python -m benchmarks.eval``)."""
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
    gives ``[]``. ``token_offsets`` is the embedder's tokenizer (see ``ExtractContext``)."""
    if max_tokens < 1:
        raise ValueError("max_tokens must be at least 1")
    if not text.strip():
        return []
    overlap = int(max_tokens * OVERLAP_RATIO) if overlap_tokens is None else overlap_tokens
    pieces = _pieces(text, token_offsets(text), max_tokens)
    headings = heading_lines(text)
    chunks: list[TextChunk] = []
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
        body = text[pieces[lo].start : pieces[hi].end]
        if body.strip():
            chunks.append(TextChunk(body, pieces[lo].line + 1, pieces[hi].line + 1, total))
        if last >= len(pieces):
            break
        # step back over trailing pieces that fit in the overlap, but always move forward
        back, kept = last, 0
        while back - 1 > first and kept + pieces[back - 1].n_tokens <= overlap:
            back -= 1
            kept += pieces[back].n_tokens
        first = back
    return chunks


def _line_start(pieces: list[_Piece], index: int) -> int:
    """Start offset of the first piece on the same line as ``pieces[index]``."""
    while index > 0 and pieces[index - 1].line == pieces[index].line:
        index -= 1
    return pieces[index].start
