"""A growing session transcript indexed incrementally: an appended line costs work for the new turns, not the file.

After a transcript is chunked (whole, or its tail), its ``FileState`` keeps a ``Tail``: the byte offset read up to
(``end``, a torn last line excluded), a check of the bytes just before it, and where the open window (the last,
which turns appended later may extend) starts: its first turn's byte offset and JSONL line, and its first chunk's
index. At the next change, ``read_tail`` trusts the indexed prefix when the file is the same one (inode and device),
is no shorter than ``end``, and its last ``CHECK_BYTES`` before ``end`` hash as they did; it then seeks to the open
window's first line and reads and windows only from there (``indexer.sources.transcripts.windowed``: the windows
before the open one are those a whole read gives, see its docstring). The caller embeds the tail's chunks (the open
window's new version and the new windows), upserts them over the superseded open-window points (same ids: same
chunk indexes) and deletes the indexes past the new end (``indexer.sync``).

The trade-off of the check: while the daemon runs it reads ``CHECK_BYTES`` instead of the whole prefix, so a
writer that rewrote the prefix in place, kept the inode, the length and those last bytes would go unnoticed until
the file is re-chunked whole (a rebuild, a shrink). Transcript writers append, and a rewrite (compaction) writes a
new file (a new inode) or changes the end; both fail the check and re-chunk whole.

The ``Tail`` is kept across restarts in the payload of the transcript's chunk 0 (``Tail.record``, the payload's
``tail``; chunk 0 is rewritten with the file's state at each append, so the two never disagree), and read back when
the daemon connects (``Tail.restore``). Nothing watched the file while the daemon was down, so the first tail read
of a restored ``Tail`` first hashes the whole indexed prefix (``digest``: the sha256 of bytes ``[0, end)``, kept up
to date with each read; hashing, not parsing or embedding) and re-chunks whole when it differs. A transcript not
changed while down is not read at all (its stat is what chunk 0 records).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import IO, TYPE_CHECKING, Any

from indexer.api import Chunk, ExtractContext, TranscriptFormat
from indexer.points import point_id
from indexer.sources.transcripts import Reading, Turn, read_turns, windowed

if TYPE_CHECKING:
    from indexer.points import FileState, Payload
    from indexer.state import Indexed
    from indexer.store import Store

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
    turns: int = 0  # turns indexed in all (``status``: a session's turns)
    open_turns: int = 0  # turns before the open window's first
    digest: str = ""  # sha256 hex of bytes [0, end): checked once after a restart (see the module)
    # the sha256 object at ``end`` (in memory only; ``None`` for a Tail restored after a restart: not yet verified)
    hasher: Any = field(default=None, compare=False, repr=False)

    def record(self) -> dict[str, Any]:
        """The ``Tail`` as JSON (chunk 0's payload ``tail``): each field by its name (``settings`` a list, its roles
        a list), ``first`` and ``hasher`` left out: chunk 0 is ``first``, and the hash is verified again after a
        restart."""
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in _STORED}
        out["settings"] = [list(x) if isinstance(x, tuple) else x for x in self.settings]
        return out

    @classmethod
    def restore(cls, record: Mapping[str, Any], first: Chunk) -> Tail | None:
        """The ``Tail`` of a ``record`` read back from chunk 0 (``first``: that chunk), each field by its name;
        ``None`` when the record is not one this version writes (a field missing or of another type: the
        transcript is then re-chunked whole once)."""
        try:
            roles, tool_chars, redaction = record["settings"]
            values = {f.name: _CAST[str(f.type)](record[f.name]) for f in _STORED if f.name != "settings"}
            return cls(**values, first=first, settings=(tuple(roles), int(tool_chars), str(redaction)))
        except (KeyError, TypeError, ValueError):
            return None


#: the fields ``Tail.record`` stores, in order, and how each is read back (by its annotation)
_STORED = tuple(f for f in fields(Tail) if f.name not in ("first", "hasher"))
_CAST: dict[str, Any] = {"int": int, "str": str}


@dataclass(frozen=True, slots=True)
class TailRead:
    """What reading a transcript adds to its ``indexer.sources.base.Prepared``: the ``Tail`` after the read
    (``state``; ``None`` for a transcript without turns), the bytes and JSONL lines parsed (``read_bytes``,
    ``read_lines``: the tail alone, or the whole file) and, for a tail read, the chunk index of each prepared chunk
    (``indexes``: chunk 0 first when it is rewritten, then the open window's index on; ``None`` for a whole read,
    0, 1, 2...) and the file's chunks in all (``total``)."""

    state: Tail | None
    read_bytes: int
    read_lines: int
    indexes: list[int] | None = None
    total: int = -1


def _check(handle: IO[bytes], end: int) -> str:
    start = max(0, end - CHECK_BYTES)
    handle.seek(start)
    return hashlib.sha256(handle.read(end - start)).hexdigest()


def _hashed(handle: IO[bytes], hasher: Any, start: int, end: int) -> Any:
    """``hasher`` updated with bytes ``[start, end)`` of ``handle``, read in 1 MiB blocks."""
    handle.seek(start)
    left = end - start
    while left > 0:
        block = handle.read(min(left, 1 << 20))
        if not block:
            break
        hasher.update(block)
        left -= len(block)
    return hasher


def _tail(handle: IO[bytes], st: os.stat_result, reading: Reading, turns: list[Turn], chunks: list[Chunk],
          open_turn: int, open_chunk: int, base: int, first: Chunk, settings: tuple[object, ...],
          skipped: int = 0, before: int = 0, hasher: Any = None, hashed: int = 0) -> Tail:
    """The ``Tail`` after windowing ``turns`` into ``chunks`` (numbered from ``base``); ``skipped``: turns of
    ``turns[0]``'s line left out before it; ``before``: turns indexed before ``turns[0]``; ``hasher``: the sha256
    of bytes ``[0, hashed)`` (``None``: none yet)."""
    opening = turns[open_turn]
    skip = sum(1 for t in turns[:open_turn] if t.line == opening.line)
    skip += skipped if opening.line == turns[0].line else 0
    hasher = _hashed(handle, hasher if hasher is not None else hashlib.sha256(), hashed, reading.end)
    return Tail(inode=st.st_ino, device=st.st_dev, end=reading.end, check=_check(handle, reading.end),
                open_offset=opening.offset, open_line=opening.line, open_skip=skip, open_index=base + open_chunk,
                chunk_count=base + len(chunks), session_id=reading.session_id, first=first, settings=settings,
                turns=before + len(turns), open_turns=before + open_turn, digest=hasher.hexdigest(), hasher=hasher)


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
    hasher = tail.hasher.copy() if tail.hasher is not None else None
    if hasher is None:  # restored after a restart: nothing watched the file meanwhile, so the whole prefix is checked
        hasher = _hashed(handle, hashlib.sha256(), 0, tail.end)
        if hasher.hexdigest() != tail.digest:
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
                         tail.open_skip, tail.open_turns, hasher, tail.end)


def restore_tails(store: Store, name: str, states: Mapping[str, FileState],
                  held: Mapping[str, Indexed]) -> dict[str, FileState]:
    """``states`` (abs path -> what collection ``name`` holds of each transcript) with the ``Tail`` each chunk 0
    records (where it was indexed up to, read back so that a restart reads only what was appended since), read in
    requests of 1,024 points. ``held``: what the daemon holds indexed now; on a reconnect (a reload) a transcript
    keeps its verified ``Tail``, running hash included. A transcript whose chunk 0 has none it can use (points of an
    earlier version, or not the file's chunk count) loses its stat shortcut: the first scan re-chunks it whole once
    (its vectors from the embedding cache) and so records one. Raises ``StoreUnavailable``."""
    ids = {point_id(name, abs_path, 0): abs_path for abs_path, st in states.items() if st.points}
    out = dict(states)
    payloads: dict[str, Payload] = {}
    wanted = list(ids)
    for start in range(0, len(wanted), 1024):
        payloads.update(store.payloads(name, wanted[start : start + 1024]))
    for pid, abs_path in ids.items():
        payload, state = payloads.get(pid), states[abs_path]
        tail = None
        if payload is not None and payload.tail is not None:
            first = Chunk(payload.text, payload.start_line, payload.end_line, kind=payload.kind,
                          modality=payload.modality, meta=dict(payload.extra), context=payload.context)
            tail = Tail.restore(payload.tail, first)
        known = held.get(abs_path)
        if known is not None and known.collection == name and known.state.tail == tail:
            tail = known.state.tail
        if tail is not None and tail.chunk_count == state.points:
            out[abs_path] = replace(state, tail=tail)
        elif state.complete:
            out[abs_path] = replace(state, size_bytes=-1, mtime_ns=-1)
    return out
