"""One bad record does not cost a transcript (issue 57, items 13 and 14): a record nested too deep to parse is
skipped and logged while the rest of the file, its indexed points and later appends are indexed; a huge message is
cut to ``MAX_MESSAGE_CHARS`` before redaction and chunking (the hit says so), a huge line's long strings are cut
before it is parsed, and a tool result that is not indexed is never redacted. Real daemon pipeline, real Edge
store, real files, the real model and the real redactor."""

from __future__ import annotations

import json
import resource
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from conftest import write
from structlog.testing import capture_logs
from test_sessions import FILLER, openclaw
from test_sessions_incremental import DAY, _turn
from test_sessions_incremental import _said as said
from test_sessions_incremental import _setup as live_session

from indexer.builtin.transcripts import OpenClawTranscripts
from indexer.chunking import LINE_END
from indexer.redact import Redactor
from indexer.schema import SearchRequest
from indexer.sources import jsonl, transcripts
from indexer.sources.transcripts import CUT_MARGIN, MAX_MESSAGE_CHARS, Reading, read_turns
from indexer.worker import index_once

DEPTH = 1000
DEEP = {  # valid JSON, 1,000 levels: a record that is nothing but nesting, and nested lists in a message's content
    "object": '{"a":' * DEPTH + "1" + "}" * DEPTH,
    "content": ('{"type": "message", "id": "deep", "timestamp": "2023-06-02T15:00:00.000Z", "message": '
                '{"role": "user", "content": ' + "[" * DEPTH + "]" * DEPTH + "}}"),
}
HUGE = 50 * 1024 * 1024  # characters of the huge message (and of the huge tool result): 52,428,800
MIB = 1024 * 1024


def _said(n: int) -> list[tuple[str, str]]:
    return said(n, "plan ")


def _texts(indexer: Any, path: Path) -> dict[int, str]:
    """chunk index -> text of every point of ``path``."""
    return {p.payload.chunk_index: p.payload.text for p in indexer.store.scroll_points("sessions-main")
            if p.payload.abs_path == str(path)}


def _live(make_indexer: Any, tmp_path: Path, turns: int = 12) -> tuple[Any, Path]:
    return live_session(make_indexer, tmp_path, turns)


def _search(indexer: Any, query: str) -> list[Any]:
    return indexer.view.searcher().answer(SearchRequest(query=query, k=3, corpus="sessions")).hits


def _skipped(logs: list[dict[str, Any]]) -> list[tuple[str, int, str]]:
    return [(e["path"], e["line"], e["reason"]) for e in logs if e["event"] == "transcript_record_skipped"]


@pytest.mark.parametrize("shape", sorted(DEEP))
def test_a_record_nested_too_deep_is_skipped_and_the_session_goes_on(make_indexer, tmp_path, shape) -> None:
    indexer, path = _live(make_indexer, tmp_path)
    before = _texts(indexer, path)
    assert before and indexer.view.status()["files_failed"] == 0
    deep_line = len(path.read_text().splitlines()) + 1
    with path.open("a") as handle:
        handle.write(DEEP[shape] + "\n")
        handle.write(_turn(1, "The zeppelin tour is on Saturday."))
    with capture_logs() as logs:
        index_once(indexer)
    assert _skipped(logs) == [(str(path), deep_line, "too_deep")]  # one structured line: the file and the line
    assert indexer.view.status()["files_failed"] == 0
    after = _texts(indexer, path)
    assert all(after[i] == before[i] for i in range(len(before) - 1))  # the indexed points are kept
    assert "zeppelin tour" in _search(indexer, "zeppelin tour")[0]["snippet"]
    with path.open("a") as handle:  # and later appends are indexed
        handle.write(_turn(2, "The lighthouse picnic moved to Sunday."))
    index_once(indexer)
    assert "lighthouse picnic" in _search(indexer, "lighthouse picnic")[0]["snippet"]
    assert indexer.view.status()["files_failed"] == 0


def test_a_transcript_read_whole_passes_over_a_record_nested_too_deep(make_indexer, tmp_path) -> None:
    ws, sessions = tmp_path / "ws", tmp_path / "sessions"
    write(ws / "MEMORY.md", "# Memory\n")
    text = openclaw("whole", DAY, _said(6)) + DEEP["content"] + "\n" + _turn(3, "The kayak race ferry is booked.")
    path = write(sessions / "whole.jsonl", text)
    indexer = make_indexer([{"agent": "main", "path": ws, "sessions": sessions}])
    with capture_logs() as logs:
        index_once(indexer)
    deep_line = text.splitlines().index(DEEP["content"]) + 1
    assert _skipped(logs) == [(str(path), deep_line, "too_deep")]
    assert indexer.view.status()["files_failed"] == 0
    assert "kayak race ferry" in _search(indexer, "kayak race ferry booked")[0]["snippet"]


def _huge_record(handle: Any, role: str, opening: str, chars: int, n: int) -> None:
    """Writes one record whose message is ``opening`` then words, ``chars`` characters in all, without holding it."""
    head = json.dumps({"type": "message", "id": f"h{n}", "timestamp": f"{DAY}T14:{n:02d}:00.000Z",
                       "message": {"role": role, "content": [{"type": "text", "text": "@"}]}})
    before, after = head.split("@")
    handle.write(before + opening)
    block = " ".join(FILLER) + " "
    left = chars - len(opening)
    piece = block * (MIB // len(block))
    while left > 0:
        handle.write(piece[:left])
        left -= len(piece[:left])
    handle.write(after + "\n")


def _huge_transcript(sessions: Path) -> Path:
    """A transcript with a 50 MB user message, a 50 MB tool result and turns before and after them."""
    path = sessions / "huge.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        handle.write(openclaw("huge", DAY, _said(4)))
        _huge_record(handle, "user", "Caroline: The harbour code word is PELICAN and the ferry leaves at noon. ",
                     HUGE, 1)
        _huge_record(handle, "toolResult", "TOOLOUTPUTWORD ", HUGE, 2)
        handle.write(_turn(5, "The zeppelin tour is on Saturday."))
    return path


def _reset_peak_rss() -> int:
    """The process's peak RSS (``ru_maxrss``, KiB on Linux) after resetting it to the current RSS where Linux lets
    a process do so (``/proc/self/clear_refs``), so that the growth measured is this test's."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass  # the growth is then measured from the process's earlier peak: a weaker bound
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def test_a_50_mb_message_is_cut_and_indexed_in_bounded_memory(make_indexer, tmp_path) -> None:
    ws, sessions = tmp_path / "ws", tmp_path / "sessions"
    write(ws / "MEMORY.md", "# Memory\n")
    path = _huge_transcript(sessions)
    indexer = make_indexer([{"agent": "main", "path": ws, "sessions": sessions}])
    peak_before = _reset_peak_rss()
    tracemalloc.start()
    try:
        with capture_logs() as logs:
            index_once(indexer)
        _, traced_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    rss_growth = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before) * 1024
    assert traced_peak <= 300 * MIB, f"Python allocations peaked at {traced_peak / MIB:.0f} MiB"
    assert rss_growth <= 300 * MIB, f"peak RSS grew by {rss_growth / MIB:.0f} MiB"
    assert indexer.view.status()["files_failed"] == 0
    hit = _search(indexer, "harbour code word PELICAN")[0]
    assert "harbour code word is PELICAN" in hit["snippet"]
    assert f"[message cut to its first {MAX_MESSAGE_CHARS:,} of {HUGE:,} characters]" in hit["snippet"]
    assert "zeppelin tour" in _search(indexer, "zeppelin tour on Saturday")[0]["snippet"]  # the rest of the file
    cut = [(e["path"], e["line"], e["chars"]) for e in logs if e["event"] == "transcript_message_cut"]
    assert cut == [(str(path), len(openclaw("huge", DAY, _said(4)).splitlines()) + 1, HUGE)]
    points = indexer.store.scroll("sessions-main")
    assert not any("TOOLOUTPUTWORD" in p.text for p in points)
    assert sum(len(p.text) for p in points) < 2 * MAX_MESSAGE_CHARS


@pytest.mark.parametrize("tool_results", [False, True])
def test_redaction_reads_a_huge_message_cut_and_never_an_unindexed_tool_result(tmp_path, tool_results) -> None:
    path = _huge_transcript(tmp_path)
    # a key across the cut: redaction reads CUT_MARGIN past it, so no part of it is left in the kept text
    key = "sk-ant-api03-" + "Q7x" * 20
    line = _turn(7, "x" * (MAX_MESSAGE_CHARS - 20) + " " + key + " more words after the key" * 10)
    with path.open("a") as handle:
        handle.write(line)
    roles = transcripts.ROLES + (("tool",) if tool_results else ())
    reading = Reading(roles=roles, redact=Redactor.from_settings(None, always=True).redact)
    with path.open("rb") as handle:
        turns = list(read_turns(handle, OpenClawTranscripts(), reading))
    assert reading.longest_redacted <= MAX_MESSAGE_CHARS + CUT_MARGIN  # never the 50 MB: cut before redaction
    # the short turns (a tool result among them), the huge message and the key's cut once each: the huge tool result
    # adds its cut where tool results are indexed, nothing where they are not
    small = 10_000
    huge_tool = MAX_MESSAGE_CHARS + CUT_MARGIN if tool_results else 0
    assert MAX_MESSAGE_CHARS + CUT_MARGIN + MAX_MESSAGE_CHARS + huge_tool <= reading.redacted_chars
    assert reading.redacted_chars <= 2 * (MAX_MESSAGE_CHARS + CUT_MARGIN) + huge_tool + small
    tools = [t for t in turns if t.role == "tool"]
    assert len(tools) == 2 * tool_results and all(len(t.text) <= reading.tool_chars + 1 for t in tools)
    last = turns[-1].text
    assert "sk-ant" not in last and "Q7xQ7x" not in last
    assert last.startswith(f"[message cut to its first {MAX_MESSAGE_CHARS:,} of ")


def _literal(text: str, ascii_part: bool) -> str:
    return json.dumps(text, ensure_ascii=ascii_part)[1:-1]


@pytest.mark.parametrize("slice_bytes", [None, 4099])
def test_a_huge_lines_strings_are_cut_before_parsing_as_after(tmp_path, monkeypatch, slice_bytes) -> None:
    """A line over ``PARSE_BYTES`` has its long strings cut before it is parsed: its turn is the one the whole line
    parsed gives, cut, whatever the escapes, multi-byte characters and surrogate pairs the slices fall on."""
    if slice_bytes is not None:
        monkeypatch.setattr(jsonl, "SLICE_BYTES", slice_bytes)
    unit = 'é中😀\n"\\ab\tcd/ \u2028 plain words '
    body = "".join(_literal(unit * 37 + str(n), n % 2 == 0) for n in range(2500))  # ~3 MB of string body
    line = ('{"type": "message", "id": "u", "timestamp": "2023-06-02T15:00:00.000Z", "message": {"role": "user", '
            '"content": [{"type": "text", "text": "' + body + '"}, {"type": "thinking", "thinking": "' + body
            + '"}]}}\n')
    assert len(line.encode()) > jsonl.PARSE_BYTES
    path = tmp_path / "one.jsonl"
    path.write_text('{"type": "session", "id": "s", "timestamp": "2023-06-02T15:00:00.000Z"}\n' + line)
    original = json.loads(line)["message"]["content"][0]["text"]
    reading = Reading()
    with path.open("rb") as handle:
        turns = list(read_turns(handle, OpenClawTranscripts(), reading))
    kept = LINE_END.sub("\n", original[: MAX_MESSAGE_CHARS + CUT_MARGIN]).strip()[:MAX_MESSAGE_CHARS]
    assert [t.text for t in turns] == [
        f"[message cut to its first {MAX_MESSAGE_CHARS:,} of {len(original):,} characters] {kept}…"]
    assert reading.bad_lines == 0 and reading.lines == 2


def test_a_line_too_large_once_cut_is_skipped_unparsed_and_a_torn_one_waits(tmp_path) -> None:
    head = openclaw("s", DAY, _said(2))
    numbers = ('{"type": "message", "id": "n", "timestamp": "2023-06-02T15:00:00.000Z", "message": {"role": "user", '
               '"content": [{"type": "text", "text": "Caroline: NUMBERSWORD"}]}, "numbers": [' + "0," * (9 * MIB)
               + "0]}\n")
    assert len(numbers) > jsonl.MAX_RECORD_BYTES  # structure, no long string: cutting strings cannot help
    torn = _turn(4, "The lighthouse picnic moved to Sunday. " + "More words. " * (2 * MIB // 12))
    whole = head + numbers + _turn(3, "The zeppelin tour is on Saturday.")
    path = write(tmp_path / "big.jsonl", whole + torn[:-9])
    reading = Reading(source=str(path))
    with capture_logs() as logs, path.open("rb") as handle:
        turns = list(read_turns(handle, OpenClawTranscripts(), reading))
    numbers_line = len(head.splitlines()) + 1
    assert _skipped(logs) == [(str(path), numbers_line, "too_large")] and reading.bad_lines == 1
    assert not any("NUMBERSWORD" in t.text for t in turns) and "zeppelin tour" in turns[-1].text
    assert reading.lines == numbers_line + 1  # the torn last line (a writer mid-append) is left for the next event
    assert reading.end == len(whole.encode())
    with path.open("a") as handle:
        handle.write(torn[-9:])
    reading = Reading(source=str(path))
    with path.open("rb") as handle:
        handle.seek(len(whole.encode()))
        turns = list(read_turns(handle, OpenClawTranscripts(), reading, numbers_line + 2, len(whole.encode())))
    assert [t.line for t in turns] == [numbers_line + 2] and "lighthouse picnic" in turns[0].text
    assert turns[0].text.startswith(f"[message cut to its first {MAX_MESSAGE_CHARS:,} of ")


class _Walking(OpenClawTranscripts):
    """A format that walks every record recursively first (as a third-party plugin may): 2 frames a level."""

    def read(self, record: Any) -> Any:
        def walk(value: Any) -> int:
            return 1 + sum([walk(v) for v in value]) if isinstance(value, list) else 1

        walk(record.get("meta", []))
        return super().read(record)


def test_a_format_that_recurses_too_deep_costs_one_record(tmp_path) -> None:
    nested = '{"type": "custom", "meta": ' + "[" * 600 + "]" * 600 + "}\n"  # json.loads reads 600 levels
    head = openclaw("s", DAY, _said(2))
    path = write(tmp_path / "walk.jsonl", head + nested + _turn(3, "The zeppelin tour is on Saturday."))
    reading = Reading(source=str(path))
    with capture_logs() as logs, path.open("rb") as handle:
        turns = list(read_turns(handle, _Walking(), reading))
    assert _skipped(logs) == [(str(path), len(head.splitlines()) + 1, "too_deep")]
    assert "zeppelin tour" in turns[-1].text and reading.lines == len(head.splitlines()) + 2
