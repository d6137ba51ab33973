"""What a hit shows: the lines of a chunk a search answer cites (``snippet``, ``shown``) and the API's hit
(``to_hit``, ``indexer.schema.Hit``).

A snippet is at most ``SNIPPET_CHARS`` characters of whole lines, starting at the lines that best match the query;
a conversation window (a few whole turns, ``indexer.conversation``) is shown whole up to ``WINDOW_CHARS``: which
line of a window answers a question is what the window's embedding knows, not the words the question shares. A
window overlapping a better hit's lines shows only its turns that hit does not (``narrowed``).
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import replace
from itertools import groupby
from typing import cast

from indexer import schema
from indexer.chunking import LINE_END, split_lines
from indexer.conversation import turns
from indexer.points import Hit, Payload
from indexer.ranking import terms
from indexer.sources.transcripts import KIND as TRANSCRIPT

SNIPPET_CHARS = 700  # the reference agent's snippet cap
WINDOW_CHARS = 1200  # a conversation window (a few whole turns) is shown whole up to this many characters
_HEADING = re.compile(r" {0,3}#{1,6}(?:[ \t]|$)")  # an ATX heading line
LEAD_LINES = 2  # lines above the best-matching one a snippet may start at


def snippet(text: str, query: str, first_line: int, limit: int = SNIPPET_CHARS) -> tuple[str, int, int]:
    """``(snippet, start_line, end_line)``: whole lines of ``text`` (which starts at ``first_line``), at most
    ``limit`` characters, starting at the line sharing most words with ``query`` (the first of equals; the first
    line when no line shares a word): led in by up to ``LEAD_LINES`` lines of its paragraph above it, or, when it
    opens its paragraph, by the heading right over it, then as many lines below it as fit. A single line longer
    than ``limit`` is cut. Lines are ``split_lines``' (``\\n``, ``\\r\\n`` or a lone ``\\r`` ends one) and joined with
    ``\\n``."""
    lines = split_lines(text)
    words = terms(query)
    best = max(range(len(lines)), key=lambda i: (len(words & terms(lines[i])), -i)) if words else 0
    lo, size = best, len(lines[best])
    lead = limit // 2  # the lines above take at most half the snippet

    def fits(j: int) -> bool:
        return size + 1 + len(lines[j]) <= lead

    while lo > 0 and best - lo < LEAD_LINES and lines[lo - 1].strip() and fits(lo - 1):
        lo -= 1
        size += 1 + len(lines[lo])
    if lo == best:  # the line opens its paragraph: the heading over it (across blank lines) names its section
        above = next((j for j in range(lo - 1, max(lo - 1 - LEAD_LINES, -1), -1) if lines[j].strip()), None)
        if above is not None and _HEADING.match(lines[above]) and fits(above):
            size += sum(1 + len(line) for line in lines[above:lo])
            lo = above
    hi = best
    while hi + 1 < len(lines) and size + 1 + len(lines[hi + 1]) <= limit:
        hi += 1
        size += 1 + len(lines[hi])
    while hi > best and not lines[hi].strip():
        hi -= 1
    body = "\n".join(lines[lo : hi + 1])
    if len(body) > limit:
        body = body[: limit - 1] + "…"
    return body, first_line + lo, first_line + hi


def shown(payload: Payload, query: str) -> tuple[str, int, int]:
    """``(snippet, start_line, end_line)`` a hit on ``payload`` shows for ``query``: a conversation window (its
    payload names ``speakers``) whole when it fits ``WINDOW_CHARS``, any other text chunk its ``snippet``, a media
    chunk its text cut to ``SNIPPET_CHARS``."""
    if payload.get("speakers") and len(payload.text) <= WINDOW_CHARS:
        return payload.text, payload.start_line, payload.end_line
    if payload.kind == TRANSCRIPT and payload.get("turn_lines"):  # its text's lines are not the file's
        return _turns_shown(payload, query)
    if payload.modality == "text":
        return snippet(payload.text, query, payload.start_line,
                       WINDOW_CHARS if payload.get("speakers") else SNIPPET_CHARS)
    return payload.text[:SNIPPET_CHARS], payload.start_line, payload.end_line


def turn_spans(payload: Payload) -> list[tuple[int, int, int]]:
    """The turns of a conversation window as ``(first line, last line, offset)``, in order: their lines in the file
    (a transcript's JSONL line of each, from its payload's ``turn_lines``; a conversation log's own lines, its turns
    read as ``indexer.conversation.turns`` reads them) and where each starts in ``payload.text``, in characters.
    Empty for any other chunk, and for a transcript window indexed before its payload named its turns."""
    lines, offsets = payload.get("turn_lines"), payload.get("turn_offsets")
    if lines and offsets and len(lines) == len(offsets):
        return [(int(line), int(line), int(at)) for line, at in zip(lines, offsets)]
    if not payload.get("speakers") or payload.modality != "text" or payload.kind == TRANSCRIPT:
        return []
    text_lines = split_lines(payload.text)
    if len(text_lines) != payload.end_line - payload.start_line + 1:
        return []  # text that is not the file's lines start_line..end_line: no turn can be placed
    starts = _line_starts(payload.text)
    return [(payload.start_line + t.first, payload.start_line + t.last, starts[t.first]) for t in turns(text_lines)]


def _line_starts(text: str) -> list[int]:
    """Where each line of ``text`` starts, in characters (lines as ``split_lines`` cuts them)."""
    return [0, *(match.end() for match in LINE_END.finditer(text))]


def _turns_shown(payload: Payload, query: str) -> tuple[str, int, int]:
    """``shown`` of a transcript window over ``WINDOW_CHARS``: whole turns from the one holding the line that best
    matches ``query`` (``snippet``'s choice) on, as many as fit (the first alone cut to fit, ending in ``…``), with
    the JSONL lines of the first and last turn shown."""
    spans = turn_spans(payload)
    starts = [offset for _, _, offset in spans]
    _, best, _ = snippet(payload.text, query, 0, WINDOW_CHARS)
    at = _line_starts(payload.text)[best]
    first = last = max(0, bisect_right(starts, at) - 1)
    ends = [*starts[1:], len(payload.text) + 1]  # where each turn ends, its line break included
    while last + 1 < len(spans) and ends[last + 1] - starts[first] - 1 <= WINDOW_CHARS:
        last += 1
    body = payload.text[starts[first] : ends[last] - 1].rstrip("\n")
    if len(body) > WINDOW_CHARS:
        body = snippet(body, "", 0, WINDOW_CHARS)[0]
    return body, spans[first][0], spans[last][0]


def narrowed(payload: Payload, taken: Sequence[tuple[int, int]]) -> tuple[Payload, float] | None:
    """``payload`` of a conversation window cut to its longest run of whole turns (the first of equals) on none of
    whose lines a range of ``taken`` lies (``(first line, last line)``, inclusive: what better hits of its file
    show), and the share of the window's turns that run keeps (0 < share < 1). ``None`` when every turn is taken,
    when none is, or for a chunk whose turns are unknown (``turn_spans``): such a hit either shows nothing new or
    needs no cut. The cut payload's text, lines, ``turn_lines`` and ``turn_offsets`` are the run's."""
    spans = turn_spans(payload)
    free = [not any(a <= last and first <= b for a, b in taken) for first, last, _ in spans]
    runs, at = [], 0  # (length, first turn index) of each run of free turns
    for ok, run in groupby(free):
        length = len(list(run))
        if ok:
            runs.append((length, -at))
        at += length
    if not runs or all(free):
        return None
    length, first = max(runs)  # the longest, the first of equals
    i, j = -first, -first + length - 1
    begin = spans[i][2]
    end = spans[j + 1][2] if j + 1 < len(spans) else len(payload.text)
    extra = dict(payload.extra)
    if "turn_lines" in extra:
        extra["turn_lines"] = list(extra["turn_lines"][i : j + 1])
        extra["turn_offsets"] = [at - begin for _, _, at in spans[i : j + 1]]
        extra["turns"] = j - i + 1
    cut = replace(payload, text=payload.text[begin:end].rstrip("\n"), start_line=spans[i][0],
                  end_line=spans[j][1], extra=extra)
    return cut, (j - i + 1) / len(spans)


def _round(value: float | None) -> float | None:
    return None if value is None else round(float(value), 6)


def to_hit(hit: Hit, query: str, hit_fields: Sequence[str] = ()) -> schema.Hit:
    """The API's hit for a scored point; the payload fields named in ``hit_fields`` are copied when present."""
    p = hit.payload
    body, start, end = shown(p, query)
    out = schema.Hit(collection=p.collection, agent=p.agent, path=p.path, start_line=start, end_line=end,
                     score=round(hit.score, 6), snippet=body, kind=p.kind, citation=f"{p.path}#L{start}-L{end}",
                     dense_score=_round(hit.dense_score), keyword_score=_round(hit.keyword_score))
    media = {key: p.get(key) for key in hit_fields if p.get(key) is not None}
    # the schema allows a plugin's own keys (extra="allow"), which a TypedDict cannot declare
    return cast(schema.Hit, {**out, **media}) if media else out
