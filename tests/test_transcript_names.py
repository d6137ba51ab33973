"""Session transcripts are named like notes: ``sessions/<file>.jsonl`` in hits, citations, pages and listings, on
every face, whatever folder they lie in; ``get`` takes that name back; the folder comes from ``--sessions`` or from
the config file, a relative one read against the file that names it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import write
from test_sessions import EVIDENCE, SESSION, _talk, openclaw

from indexer.config_load import load_settings
from indexer.memory import LocalMemory
from indexer.schema import GetRequest, RecallRequest, SearchRequest
from indexer.worker import index_once
from indexer.workspace import sessions_root


def _agent(tmp_path: Path) -> dict[str, object]:
    ws = tmp_path / "workspace"
    write(ws / "MEMORY.md", "# Memory\n\n- The user likes kayaks.\n")
    sessions = tmp_path / "home" / ".openclaw" / "agents" / "main" / "sessions"
    write(sessions / f"{SESSION}.jsonl", openclaw(SESSION, "2023-06-02", _talk(EVIDENCE)))
    return {"agent": "main", "path": ws, "sessions": sessions}


def test_a_transcript_is_named_sessions_slash_its_file_and_get_takes_the_name_back(tmp_path: Path,
                                                                                    make_indexer) -> None:
    indexer = make_indexer([_agent(tmp_path)])
    index_once(indexer)
    memory = LocalMemory(indexer.view)
    top = memory.search(SearchRequest(query="booked the ferry for the kayak race", k=3, corpus="sessions"))["hits"][0]
    assert top["path"] == f"sessions/{SESSION}.jsonl"
    assert top["citation"] == f"sessions/{SESSION}.jsonl#L{top['start_line']}-L{top['end_line']}"
    page = memory.get(GetRequest(path=top["citation"]))
    assert page["path"] == top["path"] and (page["from"], page["to"]) == (top["start_line"], top["end_line"])
    assert EVIDENCE in page["text"]
    listed = memory.recall(RecallRequest(query="*", k=10))["hits"]
    assert {h["path"] for h in listed} == {"MEMORY.md", f"sessions/{SESSION}.jsonl"}


def test_a_relative_sessions_folder_in_a_config_file_is_read_against_that_file(tmp_path: Path) -> None:
    config = write(tmp_path / "etc" / "config.toml",
                   f'[[workspace]]\nagent = "main"\npath = "{tmp_path / "ws"}"\nsessions = "agents/main/sessions"\n')
    (tmp_path / "ws").mkdir()
    settings = load_settings(config)
    assert sessions_root(settings.workspace[0]) == tmp_path / "etc" / "agents" / "main" / "sessions"


def test_index_takes_the_sessions_folder_on_the_command_line(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    done = subprocess.run([sys.executable, "-m", "indexer.cli", "index", "--once", "--json", "--workspace",
                           str(agent["path"]), "--sessions", str(agent["sessions"]), "--state-dir",
                           str(tmp_path / "state")], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["collections"]["sessions-main"]["files"] == 1
    refused = subprocess.run([sys.executable, "-m", "indexer.cli", "index", "--once", "--sessions", "x"],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "--sessions" in refused.stderr


def test_a_sessions_folder_inside_memory_indexes_its_transcripts(tmp_path: Path, make_indexer) -> None:
    """``sessions = "memory/sessions"``: its transcripts were claimed by ``memory/`` (not notes) and by the sessions
    collection after it, so none was indexed and nothing said why."""
    ws = tmp_path / "workspace"
    write(ws / "MEMORY.md", "# Memory\n\n- The user likes kayaks.\n")
    write(ws / "memory" / "sessions" / f"{SESSION}.jsonl", openclaw(SESSION, "2023-06-02", _talk(EVIDENCE)))
    indexer = make_indexer([{"agent": "main", "path": ws, "sessions": "memory/sessions"}])
    index_once(indexer)
    memory = LocalMemory(indexer.view)
    top = memory.search(SearchRequest(query="booked the ferry for the kayak race", k=3, corpus="sessions"))["hits"]
    assert top and top[0]["path"] == f"sessions/{SESSION}.jsonl"
    assert indexer.view.status()["collections"]["memory-dir-main"]["files"] == 0
    assert not indexer.state.ledger.failures


def test_a_missing_transcript_is_not_found_not_refused(tmp_path: Path, make_indexer) -> None:
    import pytest

    indexer = make_indexer([_agent(tmp_path)])
    memory = LocalMemory(indexer.view)
    with pytest.raises(FileNotFoundError):
        memory.get(GetRequest(path="sessions/00000000-0000-0000-0000-000000000000.jsonl"))
