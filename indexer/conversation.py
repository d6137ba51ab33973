"""Conversation logs and dated notes: what chunking needs to cut a log as a conversation and to say when and who.

An agent logs what was said as a note with one line per turn (``- Caroline: I went to ...``, ``Caroline: ...``,
``[10:42] Caroline: ...``, ``**user**: ...``). ``turn_speaker`` reads a line's speaker; ``is_conversation`` decides
whether a run of lines is such a log (detected, never configured: enough turns, and most of them by speakers who
speak more than once, so a list of ``- Note: ...`` items is not one; Chinese and Japanese logs, written with the
full-width colon and no space after it, ``- [10:02] 小王：明天开会``, are read the same way). ``turn_windows`` cuts
the turns into windows of whole turns with overlap: retrieval over conversation logs works best on windows of a few
turns (Pan et al., "On Memory Construction and Retrieval for Personalized Conversational Agents", 2025; the LoCoMo
baselines), and the window and overlap here were measured on the convmem dev set (docs/benchmarks.md, "Conversation
memory").
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

#: turns per window and turns shared by consecutive windows (measured on convmem: docs/benchmarks.md)
WINDOW_TURNS = 5
OVERLAP_TURNS = 2
MIN_TURNS = 4  # fewer turn lines than this are no conversation
REPEAT_SHARE = 0.8  # share of the turns whose speaker speaks at least twice
TURN_SHARE = 0.5  # share of the non-blank lines that are turns (the rest: preamble, continuation lines)

_TURN = re.compile(
    r"^(?:[-*+][ \t]+)?"  # a top-level list item's marker (a nested item is a detail of its parent, not a turn)
    r"(?:[\[(]?\d{1,2}:\d{2}(?::\d{2})?(?:[ \t]*[AaPp][Mm])?[\])]?[ \t]*[-\u2013\u2014]?[ \t]*)?"  # [10:42] / 10:42 -
    r"(?:\*\*|__)?(?P<name>[^\W\d_][\w.'\u2019-]*(?:[ \t][^\W\d_][\w.'\u2019-]*){0,2})(?:\*\*|__)?"  # 1-3 words
    # the colon, then what was said: ": " or the full-width "\uff1a" of Chinese and Japanese, no space needed after it
    r"[ \t]*(?:\*\*|__)?(?::(?:\*\*|__)?[ \t]+|\uff1a(?:\*\*|__)?[ \t]*)\S")


_FENCE = re.compile(r"^ {0,3}(?:```|~~~)")


def turn_speaker(line: str) -> str | None:
    """The speaker of ``line`` when it reads as a turn (``- Name: text``, ``Name: text``, ``[10:42] Name: text``,
    ``**Name**: text``, ``- 小王：text`` with the full-width colon; a name of one to three words; not indented), else
    ``None``."""
    match = _TURN.match(line)
    return match["name"] if match else None


def split_turn(line: str) -> tuple[str, str] | None:
    """``(speaker, what was said)`` when ``line`` reads as a turn (as ``turn_speaker`` reads it: the said text starts
    after the colon it matched, ASCII or full-width, and the spaces after it), else ``None``."""
    match = _TURN.match(line)
    return (match["name"], line[match.end() - 1 :]) if match else None


def _speakers_outside_code(lines: Sequence[str]) -> list[str]:
    """The turn speakers of ``lines``, skipping fenced code blocks (program output is no conversation)."""
    out, fenced = [], False
    for line in lines:
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced and (speaker := turn_speaker(line)) is not None:
            out.append(speaker)
    return out


def is_conversation(lines: Sequence[str]) -> bool:
    """Whether ``lines`` (one section of a note) are a conversation log: at least ``MIN_TURNS`` turn lines, making
    at least ``TURN_SHARE`` of the non-blank lines, at least two speakers, and at least ``REPEAT_SHARE`` of the
    turns by speakers with two turns or more (a list of ``- Decision: ...``, ``- Owner: ...`` items has many
    one-time "speakers"). Lines in fenced code blocks are never turns."""
    speakers = _speakers_outside_code(lines)
    if len(speakers) < MIN_TURNS:
        return False
    counts = Counter(speakers)
    if len(counts) < 2 or len(speakers) < TURN_SHARE * sum(1 for line in lines if line.strip()):
        return False
    return sum(n for n in counts.values() if n >= 2) >= REPEAT_SHARE * len(speakers)


@dataclass(frozen=True, slots=True)
class Turn:
    """Lines ``first..last`` (0-based, inclusive) of one turn and its continuation lines; ``speaker`` is ``None``
    for the lines before the first turn (a preamble), which form a unit of their own."""

    first: int
    last: int
    speaker: str | None


def turns(lines: Sequence[str], offset: int = 0) -> list[Turn]:
    """``lines`` (numbered from ``offset``) as turns: a turn line starts one, the non-turn lines after it continue
    it, blank lines belong to nothing; the lines before the first turn are one unit with no speaker."""
    out: list[Turn] = []
    for n, line in enumerate(lines, offset):
        if not line.strip():
            continue
        speaker = turn_speaker(line)
        if speaker is not None or not out:
            out.append(Turn(n, n, speaker))
        else:
            out[-1] = Turn(out[-1].first, n, out[-1].speaker)
    return out


def turn_windows(tokens: Sequence[int], budget: int, size: int | None = None,
                 overlap: int | None = None) -> list[tuple[int, int]]:
    """Windows over turns whose token counts are ``tokens``: ``(first, last)`` turn indexes (inclusive) of each, at
    most ``size`` turns and ``budget`` tokens (a turn alone over ``budget`` is a window of its own, for the caller
    to cut), consecutive windows sharing up to ``overlap`` turns, every turn in at least one window (defaults:
    ``WINDOW_TURNS``, ``OVERLAP_TURNS``). Raises ``ValueError`` unless ``0 <= overlap < size``."""
    size = WINDOW_TURNS if size is None else size
    overlap = OVERLAP_TURNS if overlap is None else overlap
    if not 0 <= overlap < size:
        raise ValueError(f"overlap must be at least 0 and below size, got {overlap} of {size}")
    windows: list[tuple[int, int]] = []
    first = 0
    while first < len(tokens):
        last, total = first, tokens[first]
        while last + 1 < len(tokens) and last + 1 - first < size and total + tokens[last + 1] <= budget:
            last += 1
            total += tokens[last]
        if not windows or last > windows[-1][1]:  # a window the budget cut short may lie inside the one before
            windows.append((first, last))
        if last + 1 >= len(tokens):
            break
        first = max(first + 1, last + 1 - overlap)
    return windows


class Piece(Protocol):
    """What windowing reads of a chunking piece (``indexer.chunking``): its 0-based ``line`` and ``n_tokens``."""

    @property
    def line(self) -> int: ...

    @property
    def n_tokens(self) -> int: ...


def speakers_of(lines: Sequence[str], first: int, last: int) -> tuple[str, ...]:
    """The speakers of the turns on ``lines[first..last]`` (0-based, inclusive), in order of their first turn."""
    units = turns(lines[first : last + 1], first)
    return tuple(dict.fromkeys(u.speaker for u in units if u.speaker is not None))


def conversation_windows(pieces: Sequence[Piece], lines: Sequence[str], budget: int,
                         cut: Callable[[int, int], list[tuple[int, int]]]) -> list[tuple[int, int, tuple[str, ...]]]:
    """``(first, last, speakers)``: piece indexes (inclusive) of the windows of whole turns (``turn_windows``) over
    ``pieces`` (one conversation section; ``lines`` are the note's), each with its speakers; a turn alone over
    ``budget`` tokens is cut by ``cut(first, last)``, which returns piece index ranges of plain windows."""
    units = turns(lines[pieces[0].line : pieces[-1].line + 1], pieces[0].line)
    first_piece: dict[int, int] = {}
    for index, piece in enumerate(pieces):
        first_piece.setdefault(piece.line, index)
    ranges = []  # per turn: its first and last piece index
    for u in units:
        after = next((first_piece[line] for line in range(u.last + 1, pieces[-1].line + 2) if line in first_piece),
                     len(pieces))
        ranges.append((first_piece[u.first], after - 1))
    tokens = [sum(p.n_tokens for p in pieces[a : b + 1]) for a, b in ranges]
    out: list[tuple[int, int, tuple[str, ...]]] = []
    for i, j in turn_windows(tokens, budget):
        speakers = tuple(dict.fromkeys(u.speaker for u in units[i : j + 1] if u.speaker is not None))
        a, b = ranges[i][0], ranges[j][1]
        if i == j and tokens[i] > budget:
            out.extend((x, y, speakers) for x, y in cut(a, b))
        else:
            out.append((a, b, speakers))
    return out
