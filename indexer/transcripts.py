"""Session transcripts: a JSON Lines file of one session read as turns, cut into windows, rendered for ``get``.

A workspace's ``sessions`` folder is a source of its own (``indexer.workspace.SOURCES``); its ``*.jsonl`` files are
read by the first transcript format plugin (group ``qmd_indexer.transcripts``, ``indexer.api.TranscriptFormat``)
whose ``sniff`` claims them. Reading is streamed, one record a line (``read_turns``): a record that is not JSON is
passed over (``bad_lines`` counts them), and a last line without its newline that does not parse is a writer
mid-append, left for the next event.

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
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

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
    session's start (``started``), the lines read (``lines``, a torn last one excluded) and those that were not
    JSON (``bad_lines``)."""

    session_id: str = ""
    started: datetime.datetime | None = None
    lines: int = 0
    end: int = 0  # bytes: where the last line read whole ends (a torn last one excluded)
    bad_lines: int = 0
    roles: tuple[str, ...] = ROLES
    tool_chars: int = 400
    redact: Callable[[str], str] = field(default=lambda text: text)  # ``indexer.redact.Redactor.redact``


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


def _turn(line: int, message: Message, fallback: str, reading: Reading, offset: int) -> Turn | None:
    # secrets out per message, before a turn is windowed, embedded, stored or shown: a turn's text never depends on
    # its neighbours, so a tail read alone (``indexer.tailing``) gives the windows a whole read gives
    text = reading.redact(message.text)
    text = " ".join(text.split()) if message.role == "tool" else LINE_END.sub("\n", text).strip()
    if message.role not in reading.roles or not text:
        return None
    if message.role == "tool":
        cut = text[: reading.tool_chars]
        return Turn(line, "tool", "tool result", cut + ("…" if len(cut) < len(text) else ""),
                    parse_time(message.timestamp or fallback), offset)
    first, newline, rest = text.partition("\n")
    turn = split_turn(first)
    name = None
    if turn is not None:
        name, said = turn
        text = said + newline + rest
    return Turn(line, message.role, name or message.role, text, parse_time(message.timestamp or fallback), offset)


def read_turns(handle: IO[bytes], fmt: TranscriptFormat, reading: Reading, start_line: int = 1,
               start_offset: int = 0) -> Iterator[Turn]:
    """The turns of the transcript open in ``handle`` (binary, at the start of line ``start_line``, byte
    ``start_offset``), read one line at a time (never the whole file); ``reading`` is filled as it goes. A plugin's
    exception in ``read`` is an ``ExtractError`` naming the line."""
    number, offset = start_line - 1, start_offset
    reading.end = start_offset
    for raw in handle:
        number += 1
        at, offset = offset, offset + len(raw)
        try:
            record = json.loads(raw)
        except ValueError:
            if not raw.endswith(b"\n"):
                number, offset = number - 1, at  # a writer mid-append: this line is read whole at the next event
                break
            reading.bad_lines += 1
            continue
        finally:
            reading.lines, reading.end = number, offset
        if not isinstance(record, dict):
            continue
        try:
            read = fmt.read(record)
        except Exception as exc:  # a plugin's own bug: reported for this file
            raise ExtractError(f"{type(exc).__name__} reading line {number}: {exc}") from exc
        if read.session_id and not reading.session_id:
            reading.session_id = read.session_id
        if reading.started is None and read.timestamp:
            reading.started = parse_time(read.timestamp)
        for message in read.messages:
            turn = _turn(number, message, read.timestamp, reading, at)
            if turn is not None:
                yield turn


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
                      tool_chars=workspace.sessions_tool_result_chars)
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
        for number, _ in enumerate(handle, 1):
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
