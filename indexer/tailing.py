"""A growing session transcript indexed incrementally: an appended line costs work for the new turns, not the file.

After a transcript is chunked (whole, or its tail), its ``FileState`` keeps a ``Tail``: the byte offset read up to
(``end``, a torn last line excluded), a check of the bytes just before it, and where the open window (the last,
which turns appended later may extend) starts: its first turn's byte offset and JSONL line, and its first chunk's
index. At the next change, ``read_tail`` trusts the indexed prefix when the file is the same one (inode and device),
is no shorter than ``end``, and its last ``CHECK_BYTES`` before ``end`` hash as they did; it then seeks to the open
window's first line and reads and windows only from there (``indexer.transcripts.windowed``: the windows before the
open one are those a whole read gives, see its docstring). The caller embeds the tail's chunks (the open window's
new version and the new windows), upserts them over the superseded open-window points (same ids: same chunk
indexes) and deletes the indexes past the new end (``indexer.sync``).

The trade-off of the check: it reads ``CHECK_BYTES`` instead of the whole prefix, so a writer that rewrote the
prefix in place, kept the inode, the length and those last bytes would go unnoticed until the file is re-chunked
whole (a restart, a rebuild, a shrink). Transcript writers append, and a rewrite (compaction) writes a new file
(a new inode) or changes the end; both fail the check and re-chunk whole. The ``Tail`` lives in the daemon's memory
only: after a restart the first change of a transcript re-chunks it whole once (its vectors from the embedding
cache).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import IO

from indexer.api import Chunk, ExtractContext, TranscriptFormat
from indexer.transcripts import Reading, Turn, read_turns, windowed

CHECK_BYTES = 4096  # bytes before the indexed offset hashed to tell an append from a rewrite


@dataclass(frozen=True, slots=True)
class Tail:
    """Where a transcript was indexed up to (see the module). Offsets in bytes, lines 1-based JSONL lines."""

    inode: int
    device: int
    end: int  # bytes indexed: the end of the last line read whole
    check: str  # sha256 hex of the CHECK_BYTES (or fewer) before ``end``
    open_offset: int  # the open window's first turn: its line's first byte,
    open_line: int  # its JSONL line,
    open_skip: int  # the turns of that line before it (a record may hold several messages),
    open_index: int  # and the index of the open window's first chunk
    chunk_count: int  # chunks indexed
    session_id: str  # the records' session id ("" when none named it: the file name's stem was used)
    first: Chunk  # chunk 0, rewritten with the file's new state at each append (its vector is a cache hit)
    settings: tuple[object, ...]  # what the windows were read under (roles, tool result cut, redaction)


def _check(handle: IO[bytes], end: int) -> str:
    start = max(0, end - CHECK_BYTES)
    handle.seek(start)
    return hashlib.sha256(handle.read(end - start)).hexdigest()


def _tail(handle: IO[bytes], st: os.stat_result, reading: Reading, turns: list[Turn], chunks: list[Chunk],
          open_turn: int, open_chunk: int, base: int, first: Chunk, settings: tuple[object, ...],
          skipped: int = 0) -> Tail:
    """The ``Tail`` after windowing ``turns`` into ``chunks`` (numbered from ``base``); ``skipped``: turns of
    ``turns[0]``'s line left out before it."""
    opening = turns[open_turn]
    skip = sum(1 for t in turns[:open_turn] if t.line == opening.line)
    skip += skipped if opening.line == turns[0].line else 0
    return Tail(st.st_ino, st.st_dev, reading.end, _check(handle, reading.end), opening.offset, opening.line, skip,
                base + open_chunk, base + len(chunks), reading.session_id, first, settings)


def read_whole(handle: IO[bytes], st: os.stat_result, fmt: TranscriptFormat, reading: Reading,
               context: ExtractContext, stem: str, settings: tuple[object, ...]) -> tuple[list[Chunk], Tail | None]:
    """The chunks of the transcript open in ``handle`` (binary, at its start; ``st`` its ``fstat``), read streamed,
    and its ``Tail`` (``None`` when it has no turns). ``stem``: the session id when no record names one."""
    turns = list(read_turns(handle, fmt, reading))
    named = reading.session_id
    if not reading.session_id:
        reading.session_id = stem
    chunks, open_turn, open_chunk = windowed(turns, reading, context)
    if not chunks:
        return chunks, None
    reading.session_id = named
    tail = _tail(handle, st, reading, turns, chunks, open_turn, open_chunk, 0, chunks[0], settings)
    return chunks, tail


def read_tail(handle: IO[bytes], st: os.stat_result, tail: Tail, fmt: TranscriptFormat, reading: Reading,
              context: ExtractContext, stem: str, settings: tuple[object, ...]) -> tuple[list[Chunk], Tail] | None:
    """The chunks from ``tail``'s open window on (their indexes from ``tail.open_index``) and the new ``Tail``, read
    from the open window's first line only; ``None`` when the indexed prefix cannot be trusted (another file, a
    shorter one, other bytes before the offset, other settings, or a session id first named now): then the caller
    reads the file whole. ``handle``: the transcript, binary; ``st``: its ``fstat``."""
    if (st.st_ino, st.st_dev, settings) != (tail.inode, tail.device, tail.settings) or st.st_size < tail.end:
        return None
    if _check(handle, tail.end) != tail.check:
        return None
    handle.seek(tail.open_offset)
    reading.session_id = tail.session_id
    turns = list(read_turns(handle, fmt, reading, tail.open_line, tail.open_offset))[tail.open_skip :]
    if reading.session_id != tail.session_id or not turns:  # a name a whole read would give every window
        return None
    named = reading.session_id
    reading.session_id = named or stem
    chunks, open_turn, open_chunk = windowed(turns, reading, context)
    reading.session_id = named
    first = chunks[0] if tail.open_index == 0 else tail.first
    return chunks, _tail(handle, st, reading, turns, chunks, open_turn, open_chunk, tail.open_index, first, settings,
                         tail.open_skip)
