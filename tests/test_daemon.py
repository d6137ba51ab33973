"""The indexing service end to end on real files, the real model and a real store (Edge, a Qdrant server, a 3-node
cluster, and qdrant-client's in-process mode)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from conftest import BACKENDS, backend_store, write
from structlog.testing import capture_logs

from indexer.search import SearchParams
from indexer.worker import index_once, run


def _paths(indexer) -> set[str]:
    return {os.path.relpath(p, indexer.settings.workspace[0].path) for p in indexer.state.indexed}


def _count_points(indexer) -> int:
    return sum(indexer.store.count(c.name) for c in indexer.collections)


@pytest.fixture(name="backend", params=BACKENDS)
def backend_fixture(request: pytest.FixtureRequest):
    store = backend_store(request, request.param)
    yield store
    if store is not None:
        store.close()


def test_index_once_then_search_then_restart_embeds_nothing(workspace: Path, make_indexer, backend) -> None:
    indexer = make_indexer([{"agent": "main", "path": workspace}], store=backend)
    status = index_once(indexer)
    assert _paths(indexer) == {"MEMORY.md", "memory/incidents.md", "memory/food/coffee.md", "memory/travel.md"}
    assert status["collections"]["memory-root-main"]["files"] == 1
    assert status["collections"]["memory-dir-main"]["files"] == 3
    assert status["chunks_embedded"] == 4
    chunks = _count_points(indexer)
    assert chunks == sum(c["chunks"] for c in status["collections"].values())

    hits = indexer.view.searcher().search(SearchParams("when can we deploy?", k=3))
    assert hits[0]["path"] == "MEMORY.md" and hits[0]["collection"] == "memory-root-main"
    assert set(hits[0]) >= {"collection", "path", "start_line", "end_line", "score", "snippet", "kind", "citation"}
    assert hits[0]["start_line"] == 1 and hits[0]["end_line"] == 4
    assert hits[0]["citation"] == "MEMORY.md#L1-L4"

    # restart on the same store: nothing embedded, nothing rewritten
    if backend is None:
        indexer.store.close()  # an embedded store is held by one process (one EdgeStore) at a time
    again = make_indexer([{"agent": "main", "path": workspace}], store=backend)
    with capture_logs() as logs:
        status = index_once(again)
    assert status["chunks_embedded"] == 0 and status["cache_hits"] == 0
    assert not [e for e in logs if e["event"] == "file_indexed"]
    assert _count_points(again) == chunks


def test_renamed_file_is_not_embedded_again(workspace: Path, make_indexer) -> None:
    indexer = make_indexer([{"agent": "main", "path": workspace}])
    index_once(indexer)
    embedded = indexer.pipeline.stats.chunks_embedded
    old = workspace / "memory" / "travel.md"
    new = workspace / "memory" / "trips" / "lisbon.md"
    new.parent.mkdir()
    old.rename(new)
    indexer.sync.process([old, new])
    assert indexer.pipeline.stats.chunks_embedded == embedded, "same text: served from the embedding cache"
    assert str(old) not in indexer.state.indexed and str(new) in indexer.state.indexed
    hits = indexer.view.searcher().search(SearchParams("flights to Lisbon", k=1))
    assert hits[0]["path"] == "memory/trips/lisbon.md"


def test_edit_replaces_the_files_points(workspace: Path, make_indexer, backend) -> None:
    indexer = make_indexer([{"agent": "main", "path": workspace}], store=backend)
    index_once(indexer)
    note = workspace / "memory" / "incidents.md"
    note.write_text("# Incidents\n\nNothing happened this week.\n" + "Quiet on-call shift, no pages.\n" * 300)
    indexer.sync.process([note])
    state = indexer.state.indexed[str(note)].state
    assert state.points > 1 and state.complete
    searcher = indexer.view.searcher()
    assert all("ACME-4471" not in h["snippet"] for h in searcher.search(SearchParams("ACME-4471 export disk", k=10)))
    note.write_text("# Incidents\n\nShort again.\n")
    indexer.sync.process([note])
    assert indexer.store.file_states("memory-dir-main")[str(note)].points == 1


def test_deleted_files_and_directories_lose_their_points(workspace: Path, make_indexer, backend) -> None:
    indexer = make_indexer([{"agent": "main", "path": workspace}], store=backend)
    index_once(indexer)
    shutil.rmtree(workspace / "memory" / "food")
    (workspace / "MEMORY.md").unlink()
    indexer.sync.process([workspace / "memory" / "food", workspace / "MEMORY.md"])
    assert _paths(indexer) == {"memory/incidents.md", "memory/travel.md"}
    assert _count_points(indexer) == 2


def test_reconciliation_catches_what_happened_while_down(workspace: Path, make_indexer) -> None:
    indexer = make_indexer([{"agent": "main", "path": workspace}])
    index_once(indexer)
    indexer.store.close()
    (workspace / "memory" / "travel.md").unlink()
    write(workspace / "memory" / "new.md", "# New\n\nWritten while the daemon was down.\n")
    again = make_indexer([{"agent": "main", "path": workspace}])
    index_once(again)
    assert _paths(again) == {"MEMORY.md", "memory/incidents.md", "memory/food/coffee.md", "memory/new.md"}
    assert _count_points(again) == 4


def test_split_root_memory_is_reported_and_canonical_indexed(workspace: Path, make_indexer) -> None:
    write(workspace / "memory.md", "# Legacy\n\nAn older memory file.\n")
    indexer = make_indexer([{"agent": "main", "path": workspace}])
    with capture_logs() as logs:
        index_once(indexer)
    assert "memory.md" not in _paths(indexer) and "MEMORY.md" in _paths(indexer)
    [event] = [e for e in logs if e.get("reason") == "split_root_memory"]
    assert event["path"].endswith("/memory.md") and "doctor" in event["detail"]


def test_two_agents_in_one_daemon_get_their_own_collections(tmp_path: Path, workspace: Path, make_indexer) -> None:
    other = tmp_path / "other"
    write(other / "MEMORY.md", "# Other agent\n\nThe other agent likes green tea.\n")
    indexer = make_indexer([{"agent": "main", "path": workspace}, {"agent": "ops", "path": other}])
    index_once(indexer)
    searcher = indexer.view.searcher()
    [hit] = searcher.search(SearchParams("green tea", k=1, agent="ops"))
    assert hit["collection"] == "memory-root-ops" and hit["agent"] == "ops"
    assert all(h["agent"] == "main" for h in searcher.search(SearchParams("green tea", k=5, agent="main")))


def test_a_second_process_on_the_embedded_store_gets_a_clear_error(workspace: Path, make_indexer, tmp_path) -> None:
    make_indexer([{"agent": "main", "path": workspace}])
    from indexer.errors import StoreUnavailable

    with pytest.raises(StoreUnavailable, match="in use by another process"):
        make_indexer([{"agent": "main", "path": workspace}])


def test_a_replaced_workspace_is_reattested_and_rehashed(workspace: Path, make_indexer, tmp_path: Path) -> None:
    indexer = make_indexer([{"agent": "main", "path": workspace}])
    index_once(indexer)
    # restore the workspace from a "backup" in which one note differs but has the same size and mtime
    backup = tmp_path / "backup"
    shutil.copytree(workspace, backup)
    note = backup / "memory" / "travel.md"
    st = note.stat()
    note.write_text(note.read_text().replace("March", "April"))
    os.utime(note, ns=(st.st_atime_ns, st.st_mtime_ns))
    shutil.rmtree(workspace)
    backup.rename(workspace)
    with capture_logs() as logs:
        index_once(indexer)
    assert [e["agent"] for e in logs if e["event"] == "workspace_reattested"] == ["main"]
    assert [e["path"] for e in logs if e["event"] == "file_indexed"] == [str(workspace / "memory" / "travel.md")]
    hits = indexer.view.searcher().search(SearchParams("flights in April", k=1))
    assert "April" in hits[0]["snippet"]


def test_daemon_waits_for_an_unavailable_store_and_converges(workspace: Path, tmp_path: Path, registry,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from conftest import make_settings, wait_for

    import indexer.sync as sync_module
    from indexer.daemon import Indexer
    from indexer.store import EdgeStore

    monkeypatch.setattr(sync_module, "RETRY_AFTER_S", 0.2)
    settings = make_settings(tmp_path, [{"agent": "main", "path": workspace}])
    holder = EdgeStore(settings.state_dir / "qdrant")  # another process holds the embedded store
    holder.ensure_collection("memory-root-main", {"text": 384})
    indexer = Indexer.open(settings, registry=registry, connect=False)
    stop = threading.Event()
    thread = threading.Thread(target=run, args=(indexer, stop), daemon=True)
    with capture_logs() as logs:
        thread.start()
        wait_for(lambda: any(e["event"] == "store_unavailable" for e in logs))
        assert not indexer.state.ready.is_set() and indexer.view.status()["store_connected"] is False
        holder.close()  # the cause goes away
        wait_for(indexer.state.ready.is_set, timeout_s=60)
    stop.set()
    indexer.settler.wake()
    thread.join(30)
    indexer.close()
    assert [e["event"] for e in logs].count("store_unavailable") == 1  # one line per outage, not per retry
    assert "store_reconnected" in [e["event"] for e in logs]
    assert len(indexer.state.indexed) == 4


def test_unreachable_qdrant_server_fails_index_once_with_one_line(workspace: Path, tmp_path: Path) -> None:
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    result = subprocess.run(
        [sys.executable, "-m", "indexer.cli", "index", "--once", "--workspace", str(workspace), "--state-dir",
         str(tmp_path / "state"), "--qdrant-url", f"http://127.0.0.1:{port}"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "QMD_INDEXER_LOG_FORMAT": "json"})
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("qmd-indexer: Qdrant unreachable")


def test_stop_during_a_huge_file_is_prompt_and_resumes_from_the_cache(tmp_path: Path, make_indexer,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from conftest import wait_for

    import indexer.pipeline as pipeline_module
    import indexer.sync as sync_module

    monkeypatch.setattr(pipeline_module, "EMBED_SLICE", 32)  # slices and groups of 32 chunks keep the test short
    monkeypatch.setattr(sync_module, "GROUP_CHUNKS", 32)

    ws = tmp_path / "big"
    body = "\n".join(f"Entry {i}: the quarterly capacity plan for cluster {i % 97} lists {i * 3} spare cores."
                     for i in range(4000))
    write(ws / "memory" / "huge.md", f"# Capacity\n\n{body}\n")
    write(ws / "memory" / "small.md", "# Small\n\nA short note that must not wait for the huge one.\n")
    indexer = make_indexer([{"agent": "main", "path": ws}])
    stop = threading.Event()
    thread = threading.Thread(target=run, args=(indexer, stop), daemon=True)
    thread.start()
    wait_for(lambda: indexer.pipeline.stats.chunks_embedded >= 64, timeout_s=120)
    assert str(ws / "memory" / "small.md") in indexer.state.indexed, "the small file was written first"
    assert indexer.view.status()["chunks_embedded"] >= 64  # progress is visible while the huge file embeds
    stop.set()
    indexer.settler.wake()
    thread.join(60)
    assert not thread.is_alive()
    assert str(ws / "memory" / "huge.md") not in indexer.state.indexed
    embedded_before = indexer.pipeline.stats.chunks_embedded
    status = index_once(indexer)
    assert str(ws / "memory" / "huge.md") in indexer.state.indexed
    assert status["cache_hits"] >= embedded_before - 1  # the finished slices came from the cache


def test_a_scan_queues_only_files_whose_stat_moved_or_whose_index_is_not_whole(workspace: Path, make_indexer) -> None:
    """A rescan reads nothing it need not: a file indexed whole at its current ``lstat`` is not queued (at 10,000
    files routing and re-stat'ing each made up most of a restart's scan); a touched file, a new one and one whose
    points are incomplete are."""
    from dataclasses import replace

    indexer = make_indexer([{"agent": "main", "path": workspace}])
    embedded = index_once(indexer)["chunks_embedded"]
    assert indexer.scan() == []
    touched, new = workspace / "memory" / "travel.md", workspace / "memory" / "new.md"
    os.utime(touched, ns=(1, 1))
    write(new, "# New\n\nA note made while the daemon was down.\n")
    entry = indexer.state.indexed[str(workspace / "MEMORY.md")]
    entry.state = replace(entry.state, complete=False)
    assert sorted(indexer.scan()) == sorted([touched, new, workspace / "MEMORY.md"])
    status = index_once(indexer)
    assert status["chunks_embedded"] == embedded + 1 and indexer.scan() == []  # new.md; the others from the cache
