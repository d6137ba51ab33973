"""Long JSON Lines read with bounded memory: a line gathered in slices, and a long line's long strings cut before it
is parsed (``indexer.sources.transcripts`` reads session transcripts through it).

A line over ``PARSE_BYTES`` has each string longer than the caller's ``keep`` characters cut to that many before it
is parsed (scanned and decoded ``SLICE_BYTES`` at a time, so the line is held once and never parsed whole); one
still over ``MAX_RECORD_BYTES`` once cut is not parsed at all (``TooLarge``): what is left is structure (objects,
numbers), which parses to ~20x its size in objects. ``length`` gives back a cut message's whole length.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import IO, Any

PARSE_BYTES = 1 << 20  # a longer line has its long strings cut before it is parsed (json.loads copies each 2-3 times)
MAX_RECORD_BYTES = 16 << 20  # a line still longer once cut is not parsed: what is left is structure (objects,
# numbers), which parses to ~20x its size in objects
SLICE_BYTES = 1 << 20  # a long string of a long line is scanned and decoded in slices of this (bounded copies)

_BODY = re.compile(rb'(?:[^"\\]++|\\u[0-9a-fA-F]{4}|\\["\\/bfnrt])*+')  # a JSON string's body, escapes whole
_HIGHS = re.compile(rb"(?:\\u[dD][89abAB][0-9a-fA-F]{2})*+(?:\\u[0-9a-fA-F]{4})?")  # high surrogates, the escape after
#: a cut string's kept beginning -> its line and its body's bytes [start, end) there
Cuts = dict[str, tuple[bytes | bytearray, int, int]]


class TooLarge(Exception):
    """A line over ``MAX_RECORD_BYTES`` even with its long strings cut: not parsed."""


def _pieces(raw: bytes | bytearray, start: int, end: int) -> Iterator[str]:
    """The body ``raw[start:end]`` of a JSON string decoded a slice of at most ``SLICE_BYTES`` at a time, each cut
    where it splits no escape, UTF-8 sequence or surrogate pair. Raises ``ValueError`` where it is no such body."""
    pos = start
    while pos < end:
        stop = min(end, pos + SLICE_BYTES)
        if raw.find(b"\\", pos, stop) >= 0:  # escapes: cut after a whole one
            stop = _BODY.match(raw, pos, stop).end()  # type: ignore[union-attr]  # never None
        while pos < stop < end and 0x80 <= raw[stop] < 0xC0:  # the next byte continues a UTF-8 sequence
            stop -= 1
        if stop == pos:
            raise ValueError("not a JSON string")
        piece = json.loads('"' + raw[pos:stop].decode("utf-8", "surrogatepass") + '"')
        if "\ud800" <= piece[-1] <= "\udbff" and stop < end and raw[stop : stop + 2] == b"\\u":
            # a surrogate pair's first half: decoded with the escapes after it, as json.loads pairs them
            stop = _HIGHS.match(raw, stop, end).end()  # type: ignore[union-attr]  # never None
            piece = json.loads('"' + raw[pos:stop].decode("utf-8", "surrogatepass") + '"')
        yield piece
        pos = stop


def _string_end(raw: bytes | bytearray, start: int) -> int:
    """Where the JSON string whose body starts at ``raw[start]`` ends (its closing quote), scanned a slice at a
    time; -1 when it does not (an escape JSON has not, a torn line)."""
    pos = start
    while True:
        limit = pos + SLICE_BYTES
        quote = raw.find(b'"', pos, limit)
        escape = raw.find(b"\\", pos, limit if quote < 0 else quote)
        if escape < 0:  # none before the quote or in the slice: bytes found, not matched
            if quote >= 0 or limit >= len(raw):
                return quote
            pos = limit
            continue
        stop = _BODY.match(raw, escape, escape + SLICE_BYTES).end()  # type: ignore[union-attr]  # never None
        if stop == escape:
            return -1
        pos = stop


def _precut(raw: bytes | bytearray, keep: int) -> tuple[bytes | bytearray, Cuts]:
    """JSONL line ``raw`` with each string over ``keep`` characters cut to that many (its beginning, re-encoded),
    before it is parsed, and each cut string's kept text -> ``(raw, start, end)`` (its body's bytes: what
    ``length`` counts the whole of). Raises ``ValueError`` for a string that does not end (a torn line) or whose
    kept beginning is not JSON."""
    parts: list[bytes | memoryview] = []
    cuts: Cuts = {}
    view, done, pos = memoryview(raw), 0, 0
    while (start := raw.find(b'"', pos) + 1) > 0:
        end = _string_end(raw, start)
        if end < 0:
            raise ValueError("a string without its end")  # torn or not JSON: never parsed whole
        if end - start > keep:  # in bytes: a body no longer holds no more characters
            text, size = [], 0
            for piece in _pieces(raw, start, end):
                text.append(piece)
                size += len(piece)
                if size > keep:
                    break
            if size > keep:
                kept = "".join(text)[:keep]
                parts += [view[done : start - 1], json.dumps(kept, ensure_ascii=False).encode("utf-8", "surrogatepass")]
                cuts[kept], done = (raw, start, end), end + 1
        pos = end + 1
    if not cuts:
        return raw, {}
    parts.append(view[done:])
    return b"".join(parts), cuts


def lines(handle: IO[bytes]) -> Iterator[bytes | bytearray]:
    """The lines of ``handle`` from where it is, each read in pieces of at most ``SLICE_BYTES``: a long line is
    gathered into one buffer (``readline`` would hold it 2-3 times over while joining its pieces)."""
    while line := handle.readline(SLICE_BYTES):
        if line.endswith(b"\n") or len(line) < SLICE_BYTES:
            yield line
            continue
        buffer = bytearray(line)
        while part := handle.readline(SLICE_BYTES):
            buffer += part
            if part.endswith(b"\n"):
                break
        yield buffer
        del buffer  # not held while the lines after it are read


def parse(raw: bytes | bytearray, keep: int) -> tuple[Any, Cuts]:
    """The record of JSONL line ``raw`` and the strings cut out of it before it was parsed: for a line over
    ``PARSE_BYTES``, each string over ``keep`` characters is cut to that many first (``_precut``). Raises
    ``ValueError`` (not JSON), ``RecursionError`` (nested deeper than the parser goes: ~1,000 levels, less the
    caller's stack) and ``TooLarge``."""
    if len(raw) <= PARSE_BYTES:
        return json.loads(raw), {}
    shrunk, cuts = _precut(raw, keep)
    if len(shrunk) > MAX_RECORD_BYTES:
        raise TooLarge(f"{len(shrunk)} bytes once its long strings are cut")
    return json.loads(shrunk), cuts


def length(text: str, cuts: Cuts) -> int:
    """The characters of a message whose text (as its format read it from a parsed record) is ``text``, counting
    the whole of each of ``cuts`` (``parse``'s) that it holds; a cut string not JSON past its kept beginning
    (``json.loads`` would have refused the line) counts its bytes."""
    total = len(text)
    for kept, (raw, start, end) in cuts.items():
        if kept in text:
            try:
                total += sum(len(piece) for piece in _pieces(raw, start, end)) - len(kept)
            except ValueError:
                total += end - start - len(kept)
    return total
