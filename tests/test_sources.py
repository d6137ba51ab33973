"""A third source needs one reader and one table row: a plain-text mail inbox (``<workspace>/inbox/*.txt``, one
message a paragraph), registered here as a test source, is planned, walked, read, embedded, stored, found by search
and paged by ``get`` through the real pipeline, the real model and Qdrant Edge, with no other change. And a
transcript's ``Tail`` keeps the stored form chunk 0 has always had."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from conftest import write

from indexer import sources
from indexer.api import Chunk
from indexer.points import FileState
from indexer.schema import GetRequest, SearchRequest
from indexer.sources.base import (
    Prepared,
    ReadSetup,
    Unchanged,
    index_hash,
    open_file_beneath,
    read_fingerprint,
    unchanged_by_stat,
)
from indexer.sources.notes import NotesReader
from indexer.sources.tailing import Tail
from indexer.watchmode import watch_roots
from indexer.worker import index_once
from indexer.workspace import SOURCES, Collection, Source, rel_path


class InboxReader(NotesReader):
    """One chunk per message (a paragraph) of a plain-text inbox; paging, redaction and retention are the notes'."""

    classified = False  # no classifier names .txt: the reader reads what its source's walk hands it

    def prepare(self, setup: ReadSetup, collection: Collection, path: Path, known: FileState | None,
                st: os.stat_result) -> Prepared | Unchanged:
        if unchanged_by_stat(known, st, setup.redactor.version):
            return Unchanged(path)
        st, _, content_hash = read_fingerprint(path, setup.max_file_bytes, collection)
        with open_file_beneath(collection, path) as handle:
            lines = handle.read().decode("utf-8").splitlines()
        chunks, start = [], 0
        for n, line in enumerate([*lines, ""], 1):
            if line.strip() and not start:
                start = n
            elif not line.strip() and start:
                chunks.append(Chunk("\n".join(lines[start - 1 : n - 1]), start, n - 1, kind="mail"))
                start = 0
        return Prepared(collection, path, rel_path(collection.workspace, path), "mail",
                        index_hash(content_hash, setup.redactor.version), st.st_size, st.st_mtime_ns,
                        setup.redactor.chunks(chunks), st.st_ctime_ns, st.st_ino, st.st_dev)


@pytest.fixture(name="inbox")
def inbox_fixture(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Any]:
    """The inbox source registered (its reader, its row) and a workspace with a note and an inbox of two days."""
    monkeypatch.setitem(sources.READERS, "inbox", InboxReader())
    monkeypatch.setitem(SOURCES, "inbox", Source("inbox", "memory", own_root=True, walked=True,  # type: ignore[arg-type]
                                                 suffix=".txt", reader="inbox", kind="inbox-",
                                                 folder=lambda ws: ws.path / "inbox"))
    ws = tmp_path / "ws"
    write(ws / "MEMORY.md", "# Memory\n\nThe user prefers tea in the afternoon.\n")
    write(ws / "inbox" / "2024-03-01.txt",
          "From: Dana\nThe boiler service is booked for Tuesday at nine.\n\n"
          "From: Lee\nThe quarterly report deadline moved to Friday.\napi_key = sk-ant-api03-" + "x" * 40 + "\n")
    write(ws / "inbox" / "2024-03-02.txt", "From: Sam\nThe piano tuner cancelled; rebook next week.\n")
    write(ws / "inbox" / "attachment.bin", b"\x00\x01 not mail")
    return {"agent": "main", "path": ws}


def test_a_third_source_is_indexed_searched_and_paged_end_to_end(make_indexer, inbox) -> None:
    from indexer.memory import LocalMemory

    indexer = make_indexer([inbox])
    names = [c.name for c in indexer.state.plan.collections]
    assert names == ["memory-root-main", "memory-dir-main", "inbox-main"]
    inbox_collection = indexer.state.plan.collections[-1]
    assert (inbox_collection.root, True) in watch_roots(indexer.state.plan.collections)
    index_once(indexer)
    points = indexer.store.scroll("inbox-main")
    assert {Path(p.abs_path).name for p in points} == {"2024-03-01.txt", "2024-03-02.txt"}  # .bin: no candidate
    assert {(p.path, p.start_line, p.end_line) for p in points} == {
        ("inbox/2024-03-01.txt", 1, 2), ("inbox/2024-03-01.txt", 4, 6), ("inbox/2024-03-02.txt", 1, 2)}
    assert all(p.kind == "mail" for p in points)
    assert not any("sk-ant" in p.text for p in points)  # the notes' redaction policy, inherited
    memory = LocalMemory(indexer.view)
    top = memory.search(SearchRequest(query="when is the boiler serviced", k=3))["hits"][0]
    assert (top["collection"], top["path"], top["start_line"]) == ("inbox-main", "inbox/2024-03-01.txt", 1)
    assert "inbox-main" in {h["collection"] for h in memory.search(
        SearchRequest(query="quarterly report deadline", k=5, corpus="memory"))["hits"]}
    page = memory.get(GetRequest(path="inbox/2024-03-01.txt", from_line=4, lines=2))
    assert page["collection"] == "inbox-main" and page["text"] == (
        "From: Lee\nThe quarterly report deadline moved to Friday.")
    status = indexer.view.status()
    assert status["collections"]["inbox-main"]["files"] == 2 and "main" not in status["sessions"]
    embedded = indexer.pipeline.stats.chunks_embedded
    write(inbox["path"] / "inbox" / "2024-03-02.txt", "From: Sam\nThe piano tuner cancelled; rebook next week.\n\n"
          "From: Ana\nThe bakery order is ready on Saturday.\n")
    index_once(indexer)  # one file changed: its new message embedded, the other's vector from the cache
    assert indexer.pipeline.stats.chunks_embedded == embedded + 1
    assert len(indexer.store.scroll("inbox-main")) == 4


def _tail(**changed: Any) -> Tail:
    values: dict[str, Any] = {
        "inode": 11, "device": 22, "end": 4096, "check": "c" * 64, "open_offset": 2048, "open_line": 9,
        "open_skip": 1, "open_index": 3, "chunk_count": 5, "session_id": "s-1", "first": Chunk("first turn"),
        "settings": (("user", "assistant"), 400, "3"), "turns": 17, "open_turns": 12, "digest": "d" * 64}
    return Tail(**{**values, **changed})


def test_a_tail_is_stored_by_field_name_and_reads_back_as_chunk_0_has_always_stored_it() -> None:
    tail = _tail()
    # the stored form of every version so far (what chunk 0 of an indexed transcript holds)
    stored = {"inode": 11, "device": 22, "end": 4096, "check": "c" * 64, "open_offset": 2048, "open_line": 9,
              "open_skip": 1, "open_index": 3, "chunk_count": 5, "session_id": "s-1",
              "settings": [["user", "assistant"], 400, "3"], "turns": 17, "open_turns": 12, "digest": "d" * 64}
    assert tail.record() == stored
    assert list(tail.record()) == list(stored)  # same keys, same order
    assert Tail.restore(stored, Chunk("first turn")) == tail
    assert Tail.restore({**stored, "end": "4096"}, Chunk("first turn")) == tail  # read back by each field's type
    for key in ("digest", "settings", "open_line"):
        assert Tail.restore({k: v for k, v in stored.items() if k != key}, Chunk("first turn")) is None
    assert Tail.restore({**stored, "settings": [["user"], 400]}, Chunk("first turn")) is None
    assert Tail.restore({**stored, "turns": "many"}, Chunk("first turn")) is None
