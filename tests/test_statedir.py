"""Every file the daemon leaves under its state dir is one ``indexer.statedir`` names (with its format, writer and
readers), so a new record cannot appear without an owner: a real index pass, a rebuild and a restart, with the
embedded store and with a server store (qdrant-client's in-process mode: the owner id of the claims)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import write

from indexer import statedir
from indexer.worker import index_once


def unnamed(state_dir: Path) -> list[str]:
    """The entries directly under ``state_dir`` that ``statedir`` does not name."""
    return sorted(p.name for p in state_dir.iterdir() if not statedir.named(p.name))


@pytest.mark.parametrize("qdrant_url", ["", ":memory:"], ids=["edge", "server"])
def test_everything_under_the_state_dir_is_named(workspace: Path, tmp_path: Path, make_indexer,
                                                 qdrant_url: str) -> None:
    write(tmp_path / "sessions" / "s1.jsonl",
          '{"type":"message","message":{"role":"user","content":"when do we deploy?"}}\n')
    workspaces = [{"agent": "main", "path": workspace, "sessions": tmp_path / "sessions"}]
    indexer = make_indexer(workspaces, qdrant_url=qdrant_url, qdrant_tenancy="auto")
    index_once(indexer)
    assert indexer.rebuild()
    state = indexer.settings.state_dir
    present = {p.name for p in state.iterdir()}
    assert present >= {"daemon.lock", "embeddings.sqlite3", "attestations.json", "collection-identity.json"}
    if qdrant_url:  # in-process mode is always "collections" (no tenancy record): the server tests write one
        assert "owner-id" in present
    else:
        assert statedir.edge_store(state).is_dir() and "owner-id" not in present  # the embedded store claims nothing
    assert not unnamed(state), "name each new state-dir file in indexer/statedir.py (what, format, writer, readers)"


def test_an_unnamed_file_is_found(tmp_path: Path) -> None:
    for name in ("daemon.lock", "qdrant", "embeddings.sqlite3-wal", "embeddings.sqlite3.corrupt-1700000000",
                 "collection-identity.tmp", "owner-id.tmp", "ocr-cache.sqlite3", "stray.json", "qdrant-tenancy.json"):
        write(tmp_path / name, "")
    assert unnamed(tmp_path) == ["stray.json"]


def test_the_records_round_trip(tmp_path: Path) -> None:
    from indexer.migrate import record_tenancy

    assert statedir.recorded_identity(tmp_path) == "" and statedir.recorded_tenancy(tmp_path, "http://q:6333") is None
    statedir.record_identity(tmp_path, ["memory-root-main", "memory-dir-main"], "text=m; chunking=4")
    statedir.record_identity(tmp_path, ["memory-dir-main"], None)
    assert statedir.recorded_collections(tmp_path) == ["memory-root-main"]
    record_tenancy(tmp_path, "http://q:6333/", "shared")
    assert statedir.recorded_tenancy(tmp_path, "http://q:6333") == "shared"
    assert statedir.owner_id(tmp_path, create=False) == ""
    made = statedir.owner_id(tmp_path)
    assert len(made) == 32 and statedir.owner_id(tmp_path) == made
    assert statedir.owner_file(tmp_path).stat().st_mode & 0o077 == 0
    assert not unnamed(tmp_path)


@pytest.mark.parametrize("damage", ["[]", '"text"', "{not json", "folder"])
def test_a_damaged_record_reads_as_empty_and_is_written_over(tmp_path: Path, damage: str) -> None:
    """The identity and tenancy records hold JSON objects: another value, text that is not JSON or a folder in a
    record's place reads as no record (what a missing one does, so the daemon starts and records afresh) instead of
    failing every start with a ``TypeError``/``AttributeError``/``IsADirectoryError``; once the damage is a file,
    the next record is written over it."""
    from indexer.migrate import record_tenancy

    for path in (statedir.identity_file(tmp_path), statedir.tenancy_file(tmp_path)):
        if damage == "folder":
            path.mkdir()
        else:
            write(path, damage)
    assert statedir.read_identities(tmp_path) == {} and statedir.recorded_collections(tmp_path) == []
    assert statedir.recorded_identity(tmp_path) == "" and statedir.recorded_tenancy(tmp_path, "http://q") is None
    if damage == "folder":
        return
    statedir.record_identity(tmp_path, ["memory-dir-main"], "text=m")
    record_tenancy(tmp_path, "http://q", "shared")
    assert statedir.recorded_collections(tmp_path) == ["memory-dir-main"]
    assert statedir.recorded_tenancy(tmp_path, "http://q") == "shared"


@pytest.mark.parametrize("damage", ["[]", "null", '"text"', '{"main": [1]}', '{"main": "x"}',
                                    '{"main": {"path": "%s"}}'])
def test_damaged_attestations_read_as_none_and_are_written_over(workspace: Path, tmp_path: Path, damage: str) -> None:
    """``attestations.json`` holding another JSON value, or an entry that is not ``{"path", "dev", "ino"}``, failed
    every start (``AttributeError``/``KeyError``/``TypeError``); now such an entry is recorded afresh (one naming
    the same path but no inode counts as another folder: its files are re-hashed once, never trusted)."""
    from indexer.config import Workspace
    from indexer.rebuild import attest

    record = statedir.attestations(tmp_path)
    write(record, damage.replace("%s", str(workspace)))
    changed = attest([Workspace(agent="main", path=workspace)], record)
    assert [ws.agent for ws in changed] == (["main"] if "path" in damage else [])
    assert statedir.read_record(record)["main"]["ino"] == workspace.stat().st_ino
    assert attest([Workspace(agent="main", path=workspace)], record) == []
