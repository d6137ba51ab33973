"""A growing transcript is indexed incrementally (``indexer.tailing``): appended turns cost the embedding of the new
windows only, and the points equal those of a whole re-index; a rewrite of the indexed prefix (compaction) or a
shrink re-chunks the file whole. Real daemon pipeline, real Edge store, real files, the real model."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from conftest import write
from test_sessions import FILLER, openclaw

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
