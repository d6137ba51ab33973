"""Session transcripts: a JSON Lines file of one session read as turns, cut into windows, rendered for ``get``.

A workspace's ``sessions`` folder is a source of its own (``indexer.workspace.SOURCES``, read by
``indexer.sources.sessions``); its ``*.jsonl`` files are read by the first transcript format plugin (group
``qmd_indexer.transcripts``, ``indexer.api.TranscriptFormat``) whose ``sniff`` claims them. Reading is streamed, one
record a line (``read_turns``): a record that is not JSON is passed over (``bad_lines`` counts them), and a last
line without its newline that does not parse is a writer mid-append, left for the next event. One record never costs
the file: a record nested deeper than the parser goes (``RecursionError``, ~1,000 levels) or too large to parse
(``indexer.sources.jsonl.MAX_RECORD_BYTES`` once its long strings are cut) is passed over too, and logged
(``transcript_record_skipped``, with the file and the JSONL line).

Limits (memory and time stay bounded whatever one message holds): a message's text is cut to its first
``MAX_MESSAGE_CHARS`` characters before it is redacted, windowed or embedded, and its turn says so (``[message cut
to its first 262,144 of 52,428,800 characters] ...…``, logged as ``transcript_message_cut``); a line over
``jsonl.PARSE_BYTES`` has its long strings cut before it is parsed (``indexer.sources.jsonl``: scanned and decoded
``SLICE_BYTES`` at a time, so the line is held once and never parsed whole); a role that is not indexed (tool
results, by default) is passed over before its text is touched.

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
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

import structlog

import indexer.sources.jsonl as jsonl
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

log = structlog.get_logger("qmd_indexer.daemon")


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


def _bounded(text: str, cuts: jsonl.Cuts) -> tuple[str, int]:
    """``(text to read, characters of the message)``: ``text`` (a message's, as its format read it) cut to
    ``MAX_MESSAGE_CHARS + CUT_MARGIN`` when the message is longer, counting what ``jsonl.parse`` cut of its strings."""
    total = jsonl.length(text, cuts)
    return (text if total <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS + CUT_MARGIN]), total


def _turn(line: int, message: Message, fallback: str, reading: Reading, offset: int, cuts: jsonl.Cuts) -> Turn | None:
    if message.role not in reading.roles:  # before its text is touched: a tool result not indexed is not redacted
        return None
    text, total = _bounded(message.text, cuts)  # cut before redaction, windows and tokens: memory and time bounded
    reading.redacted_chars += len(text)
    reading.longest_redacted = max(reading.longest_redacted, len(text))
    # secrets out per message, before a turn is windowed, embedded, stored or shown: a turn's text never depends on
    # its neighbours, so a tail read alone (``indexer.sources.tailing``) gives the windows a whole read gives
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


def _record_turns(number: int, record: dict[str, Any], cuts: jsonl.Cuts, fmt: TranscriptFormat, reading: Reading,
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
        record, cuts = jsonl.parse(raw, MAX_MESSAGE_CHARS + CUT_MARGIN)
    except (ValueError, RecursionError, jsonl.TooLarge) as exc:
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
    measured before it is parsed: one over ``jsonl.PARSE_BYTES`` has its strings over ``MAX_MESSAGE_CHARS +
    CUT_MARGIN`` characters cut first (scanned in slices), and is not parsed when still over
    ``jsonl.MAX_RECORD_BYTES``.
    A line that is not JSON, nests deeper than the parser goes (``RecursionError``, in the parser or the format) or
    is too large is passed over (``reading.bad_lines``; the last two logged as ``transcript_record_skipped``, with
    the file and the line), unless it is a last line without its newline: a writer mid-append, read at the next
    event. A plugin's other exception in ``read`` is an ``ExtractError`` naming the line."""
    number, offset = start_line - 1, start_offset
    reading.end = start_offset
    lines = jsonl.lines(handle)
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
    open window's first turn gives the windows a pass over all the turns gives (``indexer.sources.tailing``)."""
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
        for number, _ in enumerate(jsonl.lines(handle), 1):
            if number >= from_line - 1:
                break
    out: list[str] = []
    used, last = 0, from_line - 1
    for turn in read_turns(handle, fmt, reading, start_line=from_line):
        if lines is not None and turn.line - from_line >= lines:
            return out, last, True
        who = turn.speaker if turn.speaker == turn.role else f"{turn.speaker} ({turn.role})"  # not "user (user)"
        shown = f"L{turn.line} [{_when(turn.time)}] {who}: {turn.text}"
        if out and used + len(shown) + 1 > max_chars:
            return out, last, True
        out.append(shown[:max_chars])
        used += len(shown) + 1
        last = turn.line
    end = reading.lines if lines is None else min(reading.lines, from_line + lines - 1)
    return out, max(last, end), False
