"""A growing transcript is indexed incrementally (``indexer.sources.tailing``): appended turns cost the embedding of
the new windows only, and the points equal those of a whole re-index; a rewrite of the indexed prefix (compaction)
or a shrink re-chunks the file whole. Real daemon pipeline, real Edge store, real files, the real model."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from conftest import write
from structlog.testing import capture_logs
from test_sessions import FILLER, openclaw

from indexer.terminal import print_status
from indexer.worker import index_once

DAY = "2023-06-02"


def _said(n: int, word: str = "") -> list[tuple[str, str]]:
    return [("Caroline" if i % 2 == 0 else "Melanie", f"{FILLER[i % len(FILLER)]} {word}{i}") for i in range(n)]


def _turn(n: int, text: str) -> str:
    return json.dumps({"type": "message", "id": f"a{n}", "timestamp": f"{DAY}T15:{n % 60:02d}:00.000Z",
                       "message": {"role": "user" if n % 2 else "assistant",
                                   "content": [{"type": "text", "text": f"Caroline: {text}"}]}}) + "\n"


def _view(indexer: Any, path: Path) -> list[tuple[str, int, int, int, str, str, Any]]:
    """Every point of ``path``: id, chunk index and count, lines, text, context, session id (sorted by index)."""
    store = indexer.store
    points = [p for p in store.scroll_points("sessions-main") if p.payload.abs_path == str(path)]
    return sorted((p.payload.chunk_index, p.payload.chunk_count if p.payload.chunk_index == 0 else -1,
                   p.payload.start_line, p.payload.end_line, p.payload.text, p.payload.context,
                   p.payload.get("session_id"), p.id) for p in points)


def _counters(indexer: Any) -> tuple[int, int]:
    """``(chunks embedded, embedding cache hits)`` since start, as ``status`` reports them."""
    status = indexer.view.status()
    return int(status["chunks_embedded"]), int(status["cache_hits"])


def _setup(make_indexer: Any, tmp_path: Path, turns: int = 30) -> tuple[Any, Path]:
    ws, sessions = tmp_path / "ws", tmp_path / "sessions"
    write(ws / "MEMORY.md", "# Memory\n")
    path = write(sessions / "live.jsonl", openclaw("live", DAY, _said(turns)))
    indexer = make_indexer([{"agent": "main", "path": ws, "sessions": sessions}])
    index_once(indexer)
    return indexer, path


def _rebuilt(make_indexer: Any, tmp_path: Path, path: Path, name: str) -> list[Any]:
    """The points a fresh daemon (empty store) makes of ``path``'s content."""
    ws, sessions = tmp_path / name / "ws", tmp_path / name / "sessions"
    write(ws / "MEMORY.md", "# Memory\n")
    copy = write(sessions / "live.jsonl", path.read_text())
    indexer = make_indexer([{"agent": "main", "path": ws, "sessions": sessions}], state_dir=tmp_path / name / "state")
    index_once(indexer)
    return [row[:-1] for row in _view(indexer, copy)]  # point ids name the path: compared apart


def test_appended_turns_embed_only_the_new_windows_and_equal_a_whole_reindex(make_indexer, tmp_path) -> None:
    indexer, path = _setup(make_indexer, tmp_path)
    before = _view(indexer, path)
    tail = indexer.state.indexed[str(path)].state.tail
    assert tail is not None and tail.open_index == len(before) - 1
    for round_ in range(3):
        embedded, hits = _counters(indexer)
        with path.open("a") as handle:
            handle.write(_turn(2 * round_, f"We booked the zeppelin tour number {round_}."))
            handle.write(_turn(2 * round_ + 1, f"The harbour kayak race is race {round_}."))
        index_once(indexer)
        after = _view(indexer, path)
        # the open window's new version and the windows after it are embedded; of the prefix only chunk 0 (the
        # file's state, rewritten) and the open window (unchanged where it was full) are looked up: a whole
        # re-chunk would look up every window of the file (cache hits)
        assert 1 <= _counters(indexer)[0] - embedded <= 2
        assert _counters(indexer)[1] - hits <= 2 < len(before) - 2
        assert after[: len(before) - 1] == before[: len(before) - 1] or round_  # untouched prefix points
        before = after
    rebuilt = _rebuilt(make_indexer, tmp_path, path, "whole")
    assert [row[:-1] for row in _view(indexer, path)] == rebuilt
    ids = [row[-1] for row in _view(indexer, path)]
    assert len(ids) == len(set(ids)) == rebuilt[0][1]  # chunk 0 counts them all: the file reads complete
    assert indexer.store.file_states("sessions-main")[str(path)].complete


def test_a_torn_line_waits_and_a_record_of_two_messages_keeps_the_windows(make_indexer, tmp_path) -> None:
    indexer, path = _setup(make_indexer, tmp_path, turns=12)
    line = _turn(40, "The lighthouse picnic moved to Sunday.")
    with path.open("a") as handle:
        handle.write(line[:30])  # a writer mid-append
    index_once(indexer)
    assert not any("lighthouse" in row[4] for row in _view(indexer, path))
    with path.open("a") as handle:
        handle.write(line[30:])
        for n in range(41, 52):
            handle.write(_turn(n, f"Another plan, number {n}, for the weekend."))
    index_once(indexer)
    assert [row[:-1] for row in _view(indexer, path)] == _rebuilt(make_indexer, tmp_path, path, "whole")


def test_a_rewritten_prefix_or_a_shrink_rechunks_whole(make_indexer, tmp_path) -> None:
    indexer, path = _setup(make_indexer, tmp_path)
    # cut back to the content last read whole (an undone append): the appended windows go
    original = path.read_text()
    with path.open("a") as handle:
        handle.write(_turn(1, "An append that is undone."))
    index_once(indexer)
    path.write_text(original)
    index_once(indexer)
    assert [row[:-1] for row in _view(indexer, path)] == _rebuilt(make_indexer, tmp_path, path, "undone")
    # compaction: the same file rewritten in place (same inode), its old turns summarised, then turns appended
    inode = path.stat().st_ino
    compacted = openclaw("live", DAY, _said(8, "summary")) + _turn(3, "After compaction we planned the zoo.")
    with path.open("r+") as handle:
        handle.write(compacted)
        handle.truncate()
    assert path.stat().st_ino == inode
    index_once(indexer)
    assert [row[:-1] for row in _view(indexer, path)] == _rebuilt(make_indexer, tmp_path, path, "compacted")
    assert not any("summary" not in row[4] and "zoo" not in row[4] for row in _view(indexer, path))
    # a file rewritten longer, same inode, same length up to the old offset but other bytes there
    body = path.read_text()
    with path.open("r+") as handle:
        handle.write(body.replace("summary", "SUMMARY") + _turn(9, "And then the aquarium."))
    index_once(indexer)
    assert [row[:-1] for row in _view(indexer, path)] == _rebuilt(make_indexer, tmp_path, path, "rewritten")
    # a shrink
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[: len(lines) // 2]))
    index_once(indexer)
    assert [row[:-1] for row in _view(indexer, path)] == _rebuilt(make_indexer, tmp_path, path, "shrunk")
    assert indexer.store.file_states("sessions-main")[str(path)].complete
    os.unlink(path)
    index_once(indexer)
    assert _view(indexer, path) == []


def _indexed(logs: list[dict[str, Any]], path: Path) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == "file_indexed" and e["path"] == str(path)]


def test_a_restart_reads_only_the_turns_appended_while_down(make_indexer, tmp_path) -> None:
    indexer, path = _setup(make_indexer, tmp_path, turns=40)
    settings, size = indexer.settings, path.stat().st_size
    before = _view(indexer, path)
    indexer.close()
    again = make_indexer(settings.workspace)  # the same state dir: what the first daemon indexed
    assert path not in again.scan()  # unchanged while down: nothing to read
    again.close()
    with path.open("a") as handle:
        handle.write(_turn(1, "While the daemon was down we booked the zeppelin tour."))
        handle.write(_turn(2, "And the harbour kayak race is on Sunday."))
    third = make_indexer(settings.workspace)
    tail = third.state.indexed[str(path)].state.tail
    assert tail is not None and tail.turns == 40 and tail.open_index == len(before) - 1
    with capture_logs() as logs:
        index_once(third)
    (line,) = _indexed(logs, path)
    # the open window's first line on was parsed, not the file; one or two windows embedded
    assert line["read_bytes"] == path.stat().st_size - tail.open_offset < size // 4
    assert line["read_lines"] < 12 and 1 <= line["embedded"] <= 2 and line["cache_hits"] <= 2
    assert third.state.indexed[str(path)].state.tail.turns == 42
    assert [row[:-1] for row in _view(third, path)] == _rebuilt(make_indexer, tmp_path, path, "whole")


def test_a_prefix_rewritten_while_down_rechunks_whole(make_indexer, tmp_path) -> None:
    indexer, path = _setup(make_indexer, tmp_path, turns=40)
    settings, inode = indexer.settings, path.stat().st_ino
    indexer.close()
    body = path.read_bytes()
    at = body.index(b"I painted a small lake")  # far more than the 4 KiB check before the end
    assert len(body) - at > 4 * 4096
    with path.open("r+b") as handle:  # in place: same inode, same length, then a turn appended
        handle.seek(at)
        handle.write(b"I PAINTED A SMALL LAKE")
        handle.seek(0, os.SEEK_END)
        handle.write(_turn(3, "Then we planned the aquarium.").encode())
    assert path.stat().st_ino == inode
    again = make_indexer(settings.workspace)
    with capture_logs() as logs:
        index_once(again)
    (line,) = _indexed(logs, path)
    assert line["read_bytes"] == path.stat().st_size  # read whole: the prefix's hash differed
    assert [row[:-1] for row in _view(again, path)] == _rebuilt(make_indexer, tmp_path, path, "rewritten")
    assert any("I PAINTED A SMALL LAKE" in row[4] for row in _view(again, path))


def test_status_counts_sessions_and_their_turns_across_a_restart(make_indexer, tmp_path, capsys) -> None:
    ws, sessions = tmp_path / "ws", tmp_path / "sessions"
    write(ws / "MEMORY.md", "# Memory\n")
    write(sessions / "a.jsonl", openclaw("a", DAY, _said(12)))
    b = write(sessions / "b.jsonl", openclaw("b", DAY, _said(7)))  # tool calls and results are no turns
    other = tmp_path / "other"
    write(other / "MEMORY.md", "# Memory\n")
    workspaces = [{"agent": "main", "path": ws, "sessions": sessions}, {"agent": "notes", "path": other}]
    indexer = make_indexer(workspaces)
    assert index_once(indexer)["sessions"] == {"main": {"count": 2, "turns": 19}}  # no sessions: not listed
    with b.open("a") as handle:
        handle.write(_turn(1, "One more thing about the picnic."))
    status = index_once(indexer)
    assert status["sessions"] == {"main": {"count": 2, "turns": 20}}
    print_status(status)
    assert "sessions of main: 2 session(s), 20 turn(s)" in capsys.readouterr().out
    indexer.close()
    again = make_indexer(workspaces)  # read back from the store: no transcript is read to know it
    assert again.view.status()["sessions"] == {"main": {"count": 2, "turns": 20}}
    b.unlink()
    assert index_once(again)["sessions"] == {"main": {"count": 1, "turns": 12}}
