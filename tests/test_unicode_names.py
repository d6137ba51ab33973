"""A name spelled the other way: a note whose file name is NFD on disk (``cafe`` + U+0301, as macOS writes it) is
read by ``GET /get`` (and ``read_memory``, behind MCP ``memory_get`` and the CLI's ``get``) asked in NFC, and the
answer says so; a path no file matches answers 404 naming the closest memory file. Real files, the real HTTP app;
the embedder is ``FakeModelServer`` behind the ``openai`` plugin (nothing here depends on vectors)."""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import pytest
from case_insensitive_fs import mount_case_insensitive, unmount
from conftest import Running, make_settings, wait_for, write
from fake_model_server import FakeModelServer
from fastapi.testclient import TestClient
from test_remote_faults import fake_registry, open_indexer

from indexer.daemon import Indexer
from indexer.recall import read_memory
from indexer.server import create_app
from indexer.state import Plan
from indexer.worker import index_once

NFC = unicodedata.normalize("NFC", "memory/café-notes.md")
NFD = unicodedata.normalize("NFD", NFC)


@pytest.fixture(name="api")
def api_fixture(tmp_path: Path) -> Iterator[tuple[TestClient, Path]]:
    ws = tmp_path / "ws"
    write(ws / "MEMORY.md", "# Memory\n\nShort answers.\n")
    write(ws / NFD, "# Café\n\nThe user drinks a flat white at the café on Fridays.\n")
    with FakeModelServer() as fake:
        indexer = open_indexer(tmp_path, ws, fake_registry(fake.url))
        try:
            index_once(indexer)
            yield TestClient(create_app(indexer.view), base_url="http://127.0.0.1:8743",
                             raise_server_exceptions=False), ws
        finally:
            indexer.close()


def test_get_finds_a_name_under_the_other_normalisation_and_says_so(api: tuple[TestClient, Path]) -> None:
    client, ws = api
    assert NFC != NFD and [p.name for p in (ws / "memory").iterdir()] == [Path(NFD).name]
    answer = client.get("/get", params={"path": NFC})
    assert answer.status_code == 200, answer.text
    page = answer.json()
    assert page["path"] == NFD and "flat white" in page["text"]
    assert "another Unicode normalisation form" in page["note"]
    assert "note" not in client.get("/get", params={"path": NFD}).json()  # asked as it is spelled: no note


def test_get_of_a_missing_file_names_the_closest_path(api: tuple[TestClient, Path]) -> None:
    client, ws = api
    answer = client.get("/get", params={"path": "memory/cafe-note.md"})
    assert answer.status_code == 404
    assert answer.json()["detail"] == f"no such file: memory/cafe-note.md (the closest memory file is {NFD})"
    answer = client.get("/get", params={"path": "memory/zzzz.md"})
    assert answer.status_code == 404 and "closest" not in answer.json()["detail"]
    # every path shares memory/ and .md: an unrelated note is not named (it was, at difflib's 0.6), a moved one is
    write(ws / "memory" / "projects" / "home.md", "# Garden\n\nThe tomatoes need watering.\n")
    assert "closest" not in client.get("/get", params={"path": "memory/zh-plans.md"}).json()["detail"]  # 0.67
    moved = client.get("/get", params={"path": "memory/home.md"}).json()["detail"]
    assert moved == "no such file: memory/home.md (the closest memory file is memory/projects/home.md)"


def test_two_files_named_alike_in_both_forms_each_read_as_asked(tmp_path: Path) -> None:
    """Two files whose names differ only by normalisation: each spelling reads its own file, never the other's."""
    ws = tmp_path / "ws"
    write(ws / "MEMORY.md", "# Memory\n")
    write(ws / NFD, "nfd\n")
    write(ws / NFC, "nfc\n")
    collections = Plan.of(make_settings(tmp_path, [{"path": str(ws), "agent": "a"}])).collections
    for path, text in ((NFD, "nfd"), (NFC, "nfc")):
        page = read_memory(collections, path)
        assert (page["text"], page["path"], "note" in page) == (text, path, False)


def test_an_edit_through_another_case_of_the_root_file_is_indexed(tmp_path: Path) -> None:
    """On a case-insensitive mount watched natively, an edit written through ``memory.md`` (the root file is
    ``MEMORY.md``: one inode, one link) is routed to the indexed ``MEMORY.md`` and indexed within seconds, not left
    to the periodic reconcile."""
    backing, mount = tmp_path / "backing", tmp_path / "mnt"
    write(backing / "ws" / "MEMORY.md", "# Memory\n\nShort answers.\n")
    write(backing / "ws" / "memory" / "coffee.md", "# Coffee\n\nA flat white.\n")
    child = mount_case_insensitive(backing, mount)
    try:
        ws = mount / "ws"
        assert os.path.samestat(os.lstat(ws / "memory.md"), os.lstat(ws / "MEMORY.md"))
        with FakeModelServer() as fake:
            settings = make_settings(tmp_path, [{"path": str(ws), "agent": "a", "watch": "native"}],
                                     state_dir=tmp_path / "state", rescan_interval_s=3600)
            indexer = Indexer.open(settings, registry=fake_registry(fake.url))
            try:
                with Running(indexer):
                    root = str(ws / "MEMORY.md")
                    before = indexer.state.indexed[root].state.file_hash
                    with open(ws / "memory.md", "a", encoding="utf-8") as handle:
                        handle.write("\nThe deploy freeze starts on the 20th.\n")
                    wait_for(lambda: indexer.state.indexed[root].state.file_hash != before, timeout_s=20)
                    assert str(ws / "memory.md") not in indexer.state.indexed
                    assert indexer.state.ledger.files_failed == 0
            finally:
                indexer.close()
    finally:
        unmount(mount, child)
