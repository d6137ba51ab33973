"""What a hit shows: the lines of a chunk a search answer cites (``snippet``, ``shown``) and the API's hit
(``to_hit``, ``indexer.schema.Hit``).

A snippet is at most ``SNIPPET_CHARS`` characters of whole lines, starting at the lines that best match the query;
a conversation window (a few whole turns, ``indexer.conversation``) is shown whole up to ``WINDOW_CHARS``: which
line of a window answers a question is what the window's embedding knows, not the words the question shares.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import cast

from indexer import schema
from indexer.chunking import split_lines
from indexer.points import Hit, Payload
from indexer.ranking import terms

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
    if payload.modality == "text":
        return snippet(payload.text, query, payload.start_line,
                       WINDOW_CHARS if payload.get("speakers") else SNIPPET_CHARS)
    return payload.text[:SNIPPET_CHARS], payload.start_line, payload.end_line


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
