"""Session transcripts: a JSON Lines file of one session read as turns, cut into windows, rendered for ``get``.

A workspace's ``sessions`` folder is a source of its own (``indexer.workspace.SOURCES``); its ``*.jsonl`` files are
read by the first transcript format plugin (group ``qmd_indexer.transcripts``, ``indexer.api.TranscriptFormat``)
whose ``sniff`` claims them. Reading is streamed, one record a line (``read_turns``): a record that is not JSON is
passed over (``bad_lines`` counts them), and a last line without its newline that does not parse is a writer
mid-append, left for the next event. One record never costs the file: a record nested deeper than the parser goes
(``RecursionError``, ~1,000 levels) or too large to parse (``MAX_RECORD_BYTES`` once its long strings are cut) is
passed over too, and logged (``transcript_record_skipped``, with the file and the JSONL line).

Limits (memory and time stay bounded whatever one message holds): a message's text is cut to its first
``MAX_MESSAGE_CHARS`` characters before it is redacted, windowed or embedded, and its turn says so (``[message cut
to its first 262,144 of 52,428,800 characters] ...…``, logged as ``transcript_message_cut``); a line over
``PARSE_BYTES`` has its long strings cut before it is parsed (scanned and decoded ``SLICE_BYTES`` at a time, so the
line is held once and never parsed whole); a role that is not indexed (tool results, by default) is passed over
before its text is touched.

What becomes a chunk (``transcript_chunks``): the user's and the assistant's text, one turn per message, in windows
of whole turns with overlap (``indexer.conversation.turn_windows``, the windows measured for conversation logs);
thinking and tool calls never, tool results only where the workspace sets ``sessions_tool_results`` (each cut to
``sessions_tool_result_chars``). Each window's ``context`` (embedded and keyword-indexed, not shown) names the date
and time of its first turn, from the records' timestamps (a transcript's file name carries no date), and its
speakers; its payload carries ``session_id``, ``session_time`` (ISO 8601, UTC), ``speakers`` and ``note_date``
(``YYYY-MM-DD``, what ``indexer.ranking.boost_period`` and ``as_of`` read), ``turn_lines`` (each turn's JSONL line)
and ``turn_offsets`` (where each turn starts in the text, in characters: what ``indexer.hits.narrowed`` cuts a window
at), and its lines are the JSONL line numbers of its first and last turn.
"""

from __future__ import annotations

import datetime
import itertools
import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

import structlog

from indexer.api import Chunk, ExtractContext, FileInfo, Message, TranscriptFormat
from indexer.chunking import LINE_END
from indexer.config import Workspace
from indexer.conversation import split_turn, turn_windows
from indexer.dates import date_words
from indexer.errors import ExtractError

KIND = "transcript"  # the payload's ``kind`` of a transcript's chunks
ROLES = ("user", "assistant")  # the roles whose text is indexed (``"tool"`` too where the workspace says so)
WINDOW_TURNS = 5  # turns per window and turns shared by consecutive ones (as for conversation logs; benchmarks/
OVERLAP_TURNS = 2  # sessmem_eval.py measures them on transcripts)
# A message's text indexed, in characters: a long answer or a pasted file is whole (a book chapter is ~100,000),
# while one pasted dump or log cannot take the daemon's memory and CPU (redaction, tokens, embedding) with it.
MAX_MESSAGE_CHARS = 256 * 1024
CUT_MARGIN = 16 * 1024  # characters past the cut that redaction reads: a secret across it goes whole (a PEM block
# of an RSA 8192 key is ~6,500) before the text is cut
PARSE_BYTES = 1 << 20  # a longer line has its long strings cut before it is parsed (json.loads copies each 2-3 times)
MAX_RECORD_BYTES = 16 << 20  # a line still longer once cut is not parsed: what is left is structure (objects,
# numbers), which parses to ~20x its size in objects
SLICE_BYTES = 1 << 20  # a long string of a long line is scanned and decoded in slices of this (bounded copies)

log = structlog.get_logger("qmd_indexer.daemon")
_BODY = re.compile(rb'(?:[^"\\]++|\\u[0-9a-fA-F]{4}|\\["\\/bfnrt])*+')  # a JSON string's body, escapes whole
_HIGHS = re.compile(rb"(?:\\u[dD][89abAB][0-9a-fA-F]{2})*+(?:\\u[0-9a-fA-F]{4})?")  # high surrogates, the escape after
# a cut string's kept beginning -> its line and its body's bytes [start, end) there
_Cuts = dict[str, tuple[bytes | bytearray, int, int]]


@dataclass(frozen=True, slots=True)
class Turn:
    """One indexed message: its 1-based JSONL ``line``, ``role`` (``user``, ``assistant``, ``tool``), ``speaker``
    (the name its text starts with, ``Caroline: ...``, as a relayed chat names its sender; else the role), ``text``
    (without that name), ``time`` (UTC, ``None`` when the record has no readable timestamp)."""

    line: int
    role: str
    speaker: str
    text: str
    time: datetime.datetime | None
    offset: int = 0  # bytes: where its JSONL line starts in the file

    def shown(self) -> str:
        """The turn as one line of a chunk: ``Caroline: text``."""
        return f"{self.speaker}: {self.text}"


@dataclass(slots=True)
class Reading:
    """What ``read_turns`` learnt besides the turns: the ``session_id`` (a header's, a record's, else empty), the
    session's start (``started``), the lines read (``lines``, a torn last one excluded), those it could not read
    (``bad_lines``: not JSON, nested deeper than the parser goes, too large), the characters handed to ``redact``
    (``redacted_chars`` in all, ``longest_redacted`` at once: each message is cut to ``MAX_MESSAGE_CHARS`` first)
    and the messages so cut (``cut_messages``). ``source``: the file its log lines name (none logged when empty)."""

    session_id: str = ""
    started: datetime.datetime | None = None
    lines: int = 0
    end: int = 0  # bytes: where the last line read whole ends (a torn last one excluded)
    bad_lines: int = 0
    roles: tuple[str, ...] = ROLES
    tool_chars: int = 400
    redact: Callable[[str], str] = field(default=lambda text: text)  # ``indexer.redact.Redactor.redact``
    source: str = ""
    redacted_chars: int = 0
    longest_redacted: int = 0
    cut_messages: int = 0


class _TooLarge(Exception):
    """A line over ``MAX_RECORD_BYTES`` even with its long strings cut: not parsed."""


def parse_time(value: str) -> datetime.datetime | None:
    """An ISO 8601 timestamp (``2023-05-08T13:57:00.000Z``) as an aware UTC datetime; ``None`` when unreadable."""
    if not value:
        return None
    try:
        parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=datetime.UTC)
    return parsed.astimezone(datetime.UTC)


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


def _precut(raw: bytes | bytearray) -> tuple[bytes | bytearray, _Cuts]:
    """JSONL line ``raw`` with each string over ``MAX_MESSAGE_CHARS + CUT_MARGIN`` characters cut to that many (its
    beginning, re-encoded), before it is parsed, and each cut string's kept text -> ``(raw, start, end)`` (its
    body's bytes: what ``_bounded`` counts the whole of). Raises ``ValueError`` for a string that does not end
    (a torn line) or whose kept beginning is not JSON."""
    keep = MAX_MESSAGE_CHARS + CUT_MARGIN
    parts: list[bytes | memoryview] = []
    cuts: _Cuts = {}
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


def _lines(handle: IO[bytes]) -> Iterator[bytes | bytearray]:
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


def _parse(raw: bytes | bytearray) -> tuple[Any, _Cuts]:
    """The record of JSONL line ``raw`` and the strings cut out of it before it was parsed (``_precut``, for a line
    over ``PARSE_BYTES``). Raises ``ValueError`` (not JSON), ``RecursionError`` (nested deeper than the parser
    goes: ~1,000 levels, less the caller's stack) and ``_TooLarge``."""
    if len(raw) <= PARSE_BYTES:
        return json.loads(raw), {}
    shrunk, cuts = _precut(raw)
    if len(shrunk) > MAX_RECORD_BYTES:
        raise _TooLarge(f"{len(shrunk)} bytes once its long strings are cut")
    return json.loads(shrunk), cuts


def _bounded(text: str, cuts: _Cuts) -> tuple[str, int]:
    """``(text to read, characters of the message)``: ``text`` (a message's, as its format read it) cut to
    ``MAX_MESSAGE_CHARS + CUT_MARGIN`` when the message is longer, counting what ``_precut`` cut of its strings."""
    total = len(text)
    for kept, (raw, start, end) in cuts.items():
        if kept in text:
            try:
                total += sum(len(piece) for piece in _pieces(raw, start, end)) - len(kept)
            except ValueError:  # not JSON past the kept beginning (json.loads would refuse the line): its bytes
                total += end - start - len(kept)
    return (text if total <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS + CUT_MARGIN]), total


def _turn(line: int, message: Message, fallback: str, reading: Reading, offset: int, cuts: _Cuts) -> Turn | None:
    if message.role not in reading.roles:  # before its text is touched: a tool result not indexed is not redacted
        return None
    text, total = _bounded(message.text, cuts)  # cut before redaction, windows and tokens: memory and time bounded
    reading.redacted_chars += len(text)
    reading.longest_redacted = max(reading.longest_redacted, len(text))
    # secrets out per message, before a turn is windowed, embedded, stored or shown: a turn's text never depends on
    # its neighbours, so a tail read alone (``indexer.tailing``) gives the windows a whole read gives
    text = reading.redact(text)
    time = parse_time(message.timestamp or fallback)
    if message.role == "tool":
        text = " ".join(text.split())
        cut = text[: min(reading.tool_chars, MAX_MESSAGE_CHARS)]
        more = len(cut) < len(text) or total > MAX_MESSAGE_CHARS
        return Turn(line, "tool", "tool result", cut + ("…" if more else ""), time, offset) if text else None
    text = LINE_END.sub("\n", text).strip()
    if not text:
        return None
    first, newline, rest = text.partition("\n")
    turn = split_turn(first)
    name = None
    if turn is not None:
        name, said = turn
        text = said + newline + rest
    if total > MAX_MESSAGE_CHARS:
        text = f"[message cut to its first {MAX_MESSAGE_CHARS:,} of {total:,} characters] {text[:MAX_MESSAGE_CHARS]}…"
        reading.cut_messages += 1
        if reading.source:
            log.info("transcript_message_cut", path=reading.source, line=line, chars=total, kept=MAX_MESSAGE_CHARS)
    return Turn(line, message.role, name or message.role, text, time, offset)


def _record_turns(number: int, record: dict[str, Any], cuts: _Cuts, fmt: TranscriptFormat, reading: Reading,
                  at: int) -> list[Turn]:
    """The turns of the record of JSONL line ``number`` (its first byte ``at``). Raises ``RecursionError`` (a
    format nesting into it) and ``ExtractError`` (any other exception of the format's ``read``)."""
    try:
        read = fmt.read(record)
    except RecursionError:
        raise
    except Exception as exc:  # a plugin's own bug: reported for this file
        raise ExtractError(f"{type(exc).__name__} reading line {number}: {exc}") from exc
    if read.session_id and not reading.session_id:
        reading.session_id = read.session_id
    if reading.started is None and read.timestamp:
        reading.started = parse_time(read.timestamp)
    turns = (_turn(number, message, read.timestamp, reading, at, cuts) for message in read.messages)
    return [turn for turn in turns if turn is not None]


def _line_turns(raw: bytes | bytearray, number: int, fmt: TranscriptFormat, reading: Reading,
                at: int) -> list[Turn] | None:
    """The turns of JSONL line ``raw`` (line ``number``, its first byte ``at``), none for a line passed over (see
    ``read_turns``); ``None`` for a last line without its newline that does not parse (a writer mid-append)."""
    try:
        record, cuts = _parse(raw)
    except (ValueError, RecursionError, _TooLarge) as exc:
        if not raw.endswith(b"\n"):
            return None
        if isinstance(exc, ValueError):
            reading.bad_lines += 1
        else:
            _skipped(reading, number, exc, len(raw))
        return []
    if not isinstance(record, dict):
        return []
    try:
        return _record_turns(number, record, cuts, fmt, reading, at)
    except RecursionError as exc:  # the last line of defence: one record, not the file
        _skipped(reading, number, exc, len(raw))
        return []


def _skipped(reading: Reading, number: int, exc: BaseException, size: int) -> None:
    """A whole line passed over: counted, and logged where ``reading`` names its file."""
    reading.bad_lines += 1
    if reading.source:
        reason = "too_deep" if isinstance(exc, RecursionError) else "too_large"
        log.warning("transcript_record_skipped", path=reading.source, line=number, reason=reason, bytes=size)


def read_turns(handle: IO[bytes], fmt: TranscriptFormat, reading: Reading, start_line: int = 1,
               start_offset: int = 0) -> Iterator[Turn]:
    """The turns of the transcript open in ``handle`` (binary, at the start of line ``start_line``, byte
    ``start_offset``), read one line at a time (never the whole file); ``reading`` is filled as it goes. A line is
    measured before it is parsed: one over ``PARSE_BYTES`` has its strings over ``MAX_MESSAGE_CHARS +
    CUT_MARGIN`` characters cut first (scanned in slices), and is not parsed when still over ``MAX_RECORD_BYTES``.
    A line that is not JSON, nests deeper than the parser goes (``RecursionError``, in the parser or the format) or
    is too large is passed over (``reading.bad_lines``; the last two logged as ``transcript_record_skipped``, with
    the file and the line), unless it is a last line without its newline: a writer mid-append, read at the next
    event. A plugin's other exception in ``read`` is an ``ExtractError`` naming the line."""
    number, offset = start_line - 1, start_offset
    reading.end = start_offset
    lines = _lines(handle)
    while (raw := next(lines, None)) is not None:
        number += 1
        at, offset = offset, offset + len(raw)
        turns = _line_turns(raw, number, fmt, reading, at)
        del raw  # let go before the next line is read: a long one is never held twice
        if turns is None:
            number, offset = number - 1, at  # a writer mid-append: this line is read whole at the next event
        reading.lines, reading.end = number, offset
        if turns is None:
            break
        yield from turns


def _when(time: datetime.datetime | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M") if time else "undated"


def window_context(turns: Iterable[Turn]) -> tuple[str, tuple[str, ...]]:
    """``(context, speakers)`` of a window: ``Monday, 8 May 2023, 13:57 (2023-05-08): Caroline, Melanie``, from its
    first dated turn."""
    turns = list(turns)
    speakers = tuple(dict.fromkeys(t.speaker for t in turns))
    time = next((t.time for t in turns if t.time is not None), None)
    when = f"{date_words(time.date())}, {time:%H:%M} ({time.date().isoformat()})" if time else ""
    return f"{when}: {', '.join(speakers)}" if when else ", ".join(speakers), speakers


def _cut(text: str, offsets: list[tuple[int, int]], budget: int) -> list[str]:
    """``text`` in pieces of at most ``budget`` tokens (``offsets``: its tokens), cut at token ends."""
    pieces, begin = [], 0
    for n in range(budget, len(offsets) + budget, budget):
        end = offsets[min(n, len(offsets)) - 1][1]
        if text[begin:end].strip():
            pieces.append(text[begin:end].strip())
        begin = end
    return pieces or [text]


def transcript_chunks(turns: Iterable[Turn], reading: Reading, context: ExtractContext,
                      size: int | None = None, overlap: int | None = None) -> list[Chunk]:
    """The chunks of a transcript's ``turns``: windows of whole turns (``turn_windows``), each a ``Chunk`` of kind
    ``KIND`` whose lines are the JSONL lines of its first and last turn; a turn alone over the token budget is cut
    into pieces of the same lines. The budget leaves room for the context (``window_context``)."""
    return windowed(list(turns), reading, context, size, overlap)[0]


def windowed(turns: list[Turn], reading: Reading, context: ExtractContext, size: int | None = None,
             overlap: int | None = None) -> tuple[list[Chunk], int, int]:
    """``transcript_chunks`` of ``turns`` and where its last window (the open one, which a turn appended later may
    still extend) starts: ``(chunks, index of its first turn in turns, index of its first chunk in chunks)``
    (``(0, 0)`` for no turns). ``turn_windows`` is a greedy pass forward in which only the last window reaches the
    end of the turns, so every window before it stays as it is when turns are appended: windowing again from the
    open window's first turn gives the windows a pass over all the turns gives (``indexer.tailing``)."""
    if not turns:
        return [], 0, 0
    size = WINDOW_TURNS if size is None else size
    overlap = OVERLAP_TURNS if overlap is None else overlap
    budget = max(16, context.max_tokens - 48)  # the context: a date in words, a time and a few names
    tokens = [len(context.token_offsets(t.shown())) for t in turns]
    out: list[Chunk] = []
    open_turn = open_chunk = 0
    for first, last in turn_windows(tokens, budget, size, overlap):
        open_turn, open_chunk = first, len(out)
        window = turns[first : last + 1]
        ctx, speakers = window_context(window)
        time = next((t.time for t in window if t.time is not None), None)
        shown = [t.shown() for t in window]
        starts = list(itertools.accumulate((len(text) + 1 for text in shown[:-1]), initial=0))
        meta: dict[str, Any] = {"session_id": reading.session_id, "speakers": list(speakers),
                                "turns": len(window), "turn_lines": [t.line for t in window], "turn_offsets": starts}
        if time is not None:
            meta["session_time"] = time.isoformat().replace("+00:00", "Z")
            meta["note_date"] = time.date().isoformat()
        texts = ["\n".join(shown)]
        if first == last and tokens[first] > budget:
            texts = _cut(shown[0], context.token_offsets(shown[0]), budget)
        out.extend(Chunk(text, window[0].line, window[-1].line, kind=KIND, meta=meta, context=ctx) for text in texts)
    return out, open_turn, open_chunk


def extract(info: FileInfo, fmt: TranscriptFormat, workspace: Workspace, context: ExtractContext,
            redact: Callable[[str], str] | None = None) -> list[Chunk]:
    """The chunks of transcript ``info`` (opened through its opener, read streamed) under ``workspace``'s settings
    (``sessions_tool_results``, ``sessions_tool_result_chars``), each message's text through ``redact``. The session
    id is the file name's stem when no record names one. Raises ``ExtractError`` when the file cannot be read."""
    reading = Reading(roles=ROLES + (("tool",) if workspace.sessions_tool_results else ()),
                      tool_chars=workspace.sessions_tool_result_chars, source=str(info.path))
    if redact is not None:
        reading.redact = redact
    try:
        with info.open() as handle:
            turns = list(read_turns(handle, fmt, reading))
    except OSError as exc:
        raise ExtractError(f"cannot read: {exc.strerror or exc}") from exc
    if not reading.session_id:
        reading.session_id = info.path.stem
    return transcript_chunks(turns, reading, context)


def render_page(handle: IO[bytes], fmt: TranscriptFormat, from_line: int, lines: int | None, max_chars: int,
                tool_results: bool = True, redact: Callable[[str], str] | None = None) -> tuple[list[str], int, bool]:
    """A page of a transcript for ``get``: its turns from JSONL line ``from_line`` on, each whole and readable
    (``L12 [2023-05-08 13:57] Caroline (user): text``), over at most ``lines`` JSONL lines and ``max_chars``
    characters. Returns ``(rendered lines, last JSONL line covered, truncated)``. Tool results are shown (cut to
    400 characters) unless ``tool_results`` is false; thinking and tool calls never. Each message's text goes
    through ``redact`` (``indexer.redact.Redactor.redact``) as when it is indexed."""
    reading = Reading(roles=ROLES + (("tool",) if tool_results else ()))
    if redact is not None:
        reading.redact = redact
    if from_line > 1:  # skipping lines is cheap: no JSON is parsed before from_line
        for number, _ in enumerate(_lines(handle), 1):
            if number >= from_line - 1:
                break
    out: list[str] = []
    used, last = 0, from_line - 1
    for turn in read_turns(handle, fmt, reading, start_line=from_line):
        if lines is not None and turn.line - from_line >= lines:
            return out, last, True
        shown = f"L{turn.line} [{_when(turn.time)}] {turn.speaker} ({turn.role}): {turn.text}"
        if out and used + len(shown) + 1 > max_chars:
            return out, last, True
        out.append(shown[:max_chars])
        used += len(shown) + 1
        last = turn.line
    end = reading.lines if lines is None else min(reading.lines, from_line + lines - 1)
    return out, max(last, end), False
