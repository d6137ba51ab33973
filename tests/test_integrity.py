"""Index integrity (issue 11): one line model for chunks, citations, snippets and ``get``; the store lock taken
before anything is touched; model identity recorded per collection."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest
from conftest import BACKENDS, backend_store, wait_for, write

from indexer.chunking import split_lines
from indexer.points import Payload, Point, point_id
from indexer.recall import read_memory
from indexer.search import SearchParams
from indexer.store import EdgeStore
from indexer.worker import index_once


def test_split_lines_ends_a_line_at_lf_crlf_and_lone_cr() -> None:
    assert split_lines("a\rb\r\nc\nd") == ["a", "b", "c", "d"]
    assert split_lines("a\n") == ["a"] and split_lines("") == [""] and split_lines("a\n\n") == ["a", ""]


@pytest.mark.parametrize(("name", "text", "token", "line"), [
    ("cr", "a\rCRCODE77\n", "CRCODE77", "CRCODE77"),
    ("crlf", "# Notes\r\n\r\nfirst line\r\nCRLFCODE88 is here\r\n", "CRLFCODE88", "CRLFCODE88 is here"),
    ("mixed", "# Mixed\nunix line\r\nwindows line\rold mac line\nMIXCODE99 last\n", "MIXCODE99", "MIXCODE99 last"),
])
def test_search_citation_and_get_count_lines_alike(tmp_path: Path, make_indexer, name: str, text: str, token: str,
                                                   line: str) -> None:
    ws = tmp_path / "ws"
    write(ws / "MEMORY.md", "# Memory\n\nnothing here\n")
    path = write(ws / "memory" / f"{name}.md", text.encode())
    indexer = make_indexer([{"agent": "main", "path": ws}])
    index_once(indexer)
    hits = indexer.view.searcher().search(SearchParams(token, k=1, mode="keyword"))
    assert hits and hits[0]["path"] == f"memory/{name}.md"
    hit = hits[0]
    expected = split_lines(path.read_bytes().decode())
    assert "\r" not in hit["snippet"]
    assert hit["snippet"].split("\n") == expected[hit["start_line"] - 1 : hit["end_line"]]
    page = read_memory(indexer.collections, hit["path"], from_line=hit["start_line"],
                       lines=hit["end_line"] - hit["start_line"] + 1)
    assert page["text"] == hit["snippet"]
    assert line in page["text"].split("\n")
    assert hit["citation"] == f"memory/{name}.md#L{hit['start_line']}-L{hit['end_line']}"


def test_reindex_against_a_running_daemon_touches_nothing(workspace: Path, tmp_path: Path) -> None:
    """``index --once --reindex`` on a running daemon's state dir used to delete its live shards and exit 0."""
    from test_cli import Daemon, _cli

    state = tmp_path / "state"
    daemon = Daemon(workspace, state, tmp_path / "daemon.log")
    try:
        wait_for(daemon.ready, timeout_s=120)
        shards = sorted(p.name for p in (state / "qdrant").iterdir())
        before = {p: p.stat().st_ino for p in (state / "qdrant").rglob("*")}
        for args in (("--reindex",), ()):
            result = _cli("index", "--once", *args, "--workspace", str(workspace), "--state-dir", str(state))
            assert result.returncode == 1, result.stderr
            assert "in use by another process" in result.stderr
        assert sorted(p.name for p in (state / "qdrant").iterdir()) == shards
        assert all(p.exists() and p.stat().st_ino == ino for p, ino in before.items() if p.suffix != ".tmp")
        hits = httpx.post(f"http://127.0.0.1:{daemon.port}/search", json={"query": "ACME-4471", "k": 1}).json()
        assert hits["hits"] and hits["hits"][0]["path"] == "memory/incidents.md"
    finally:
        assert daemon.terminate() == 0


@pytest.fixture(name="store", params=BACKENDS)
def store_fixture(request: pytest.FixtureRequest, tmp_path: Path):
    store = backend_store(request, request.param) or EdgeStore(tmp_path / "qdrant")
    yield store
    store.close()


def _points(collection: str, path: str, n: int, file_hash: str) -> list[Point]:
    return [Point(point_id(collection, path, i), {"text": np.asarray([1, i, 0], np.float32)}, {"bm25": ([1], [1.0])},
                  Payload(abs_path=path, path=path, file_hash=file_hash, chunk_index=i, chunk_count=n, text=path))
            for i in range(n)]


def test_a_rebuild_is_filled_beside_the_live_collection_and_swapped_in(store) -> None:
    store.ensure_collection("c", {"text": 3})
    store.replace_file("c", "/w/old.md", "h", _points("c", "/w/old.md", 2, "h"))
    for _ in range(2):  # the first swap replaces a plain collection, the second an alias
        new = store.rebuild_target("c")
        assert new.startswith("c--rebuild-")
        store.ensure_collection(new, {"text": 3})
        store.replace_file(new, "/w/new.md", "h", _points("c", "/w/new.md", 3, "h"))
        assert store.count("c") in (2, 3) and set(store.collections()) == {"c"}  # the rebuild is not listed yet
        store.swap("c", new)
        assert store.count("c") == 3 and set(store.file_states("c")) == {"/w/new.md"}
        assert set(store.collections()) == {"c"}
        store.replace_file("c", "/w/old.md", "h", _points("c", "/w/old.md", 2, "h"))  # writes follow the name
        store.delete_file("c", "/w/old.md")
    left = store.rebuild_target("c")  # a rebuild cut short leaves this behind
    store.ensure_collection(left, {"text": 3})
    assert store.sweep("c") == [left]
    assert store.count("c") == 3 and store.sweep("c") == []


def test_searches_answer_throughout_a_rebuild(workspace: Path, make_indexer) -> None:
    """A query that had hits keeps its hits while ``POST /reindex``'s rebuild runs, and after the swap."""
    from conftest import Running
    from fastapi.testclient import TestClient

    from indexer.server import create_app

    for n in range(40):  # enough files that the rebuild takes many store writes
        write(workspace / "memory" / "bulk" / f"n{n}.md", f"# Note {n}\n\nFiller note number {n} about gardening.\n")
    indexer = make_indexer([{"agent": "main", "path": workspace}])
    with Running(indexer), TestClient(create_app(indexer.view), base_url="http://127.0.0.1:8743") as api:
        first = api.post("/search", json={"query": "ACME-4471", "k": 3}).json()["hits"]
        assert first and first[0]["path"] == "memory/incidents.md"
        assert api.post("/reindex").json() == {"rebuilding": True}
        answers = []
        while indexer.state.rebuild_requested.is_set() or indexer.state.rebuilding or not answers:
            hits = api.post("/search", json={"query": "ACME-4471", "k": 3}).json()["hits"]
            answers.append([h["path"] for h in hits])
            assert hits and hits[0]["path"] == "memory/incidents.md", answers
        assert len(answers) > 1  # searched while it ran
        assert api.get("/status").json()["rebuilding"] is False
        assert api.post("/search", json={"query": "ACME-4471", "k": 3}).json()["hits"][0]["path"] \
            == "memory/incidents.md"
        assert indexer.view.status()["collections"]["memory-dir-main"]["files"] == 43
    assert set(indexer.store.collections()) == {"memory-root-main", "memory-dir-main"}
    physical = sorted(p.name for p in (indexer.settings.state_dir / "qdrant").iterdir() if p.is_dir())
    assert physical == ["memory-dir-main--rebuild-1", "memory-root-main--rebuild-1"]


def test_a_daemon_killed_mid_rebuild_restarts_on_the_old_index(workspace: Path, tmp_path: Path) -> None:
    """SIGKILL in the middle of a rebuild: the old collections serve after a restart and the leftovers are swept."""
    import signal

    from test_cli import Daemon

    for n in range(300):
        write(workspace / "memory" / "bulk" / f"n{n}.md", f"# Note {n}\n\nFiller note number {n} about gardening.\n")
    state = tmp_path / "state"
    daemon = Daemon(workspace, state, tmp_path / "first.log")
    try:
        wait_for(daemon.ready, timeout_s=300)
        assert httpx.post(f"http://127.0.0.1:{daemon.port}/reindex").status_code == 200
        wait_for(lambda: (state / "qdrant" / "memory-dir-main--rebuild-1" / "qmd-collection.json").exists(),
                 interval_s=0.01)  # both new collections made; the files are being written into them
        daemon.proc.send_signal(signal.SIGKILL)
        daemon.proc.wait(30)
    finally:
        if daemon.proc.poll() is None:
            daemon.proc.kill()
    assert not any(e["event"] == "rebuild_finished" for e in daemon.events()), "killed too late: rebuild finished"
    assert any("--rebuild-" in p.name for p in (state / "qdrant").iterdir())  # a half-built collection is left
    again = Daemon(workspace, state, tmp_path / "second.log")
    try:
        wait_for(again.ready, timeout_s=300)
        swept = [e for e in again.events() if e["event"] == "rebuild_leftovers_swept"]
        assert swept and not any(e["event"] == "file_indexed" for e in again.events())  # old index, complete
        hits = httpx.post(f"http://127.0.0.1:{again.port}/search", json={"query": "ACME-4471", "k": 1}).json()
        assert hits["hits"][0]["path"] == "memory/incidents.md"
        assert not any("--rebuild-" in p.name for p in (state / "qdrant").iterdir())
        assert httpx.get(f"http://127.0.0.1:{again.port}/status").json()["collections"]["memory-dir-main"][
            "files"] == 303
    finally:
        assert again.terminate() == 0


def test_a_same_size_model_swap_is_noticed_and_rebuilt(workspace: Path, tmp_path: Path, make_indexer) -> None:
    """A 2-layer copy of MiniLM (384-d too) used to be silently kept with the old vectors."""
    from conftest import make_settings
    from structlog.testing import capture_logs

    from indexer.builtin.embedding import load_sentence_transformer, resolve_model
    from indexer.daemon import Indexer
    from indexer.errors import CollectionMismatch
    from indexer.plugins import load_registry

    first = make_indexer([{"agent": "main", "path": workspace}])
    index_once(first)
    first.close()
    model = load_sentence_transformer(resolve_model("all-MiniLM-L6-v2")[1], "cpu")
    model[0].auto_model.encoder.layer = model[0].auto_model.encoder.layer[:2]
    model[0].auto_model.config.num_hidden_layers = 2
    small = tmp_path / "minilm-2-layers"
    model.save(str(small))
    registry = load_registry(config={"sentence-transformers": {"model": str(small), "precision": "fp32"}})
    settings = make_settings(tmp_path, [{"agent": "main", "path": workspace}], model=str(small))
    with pytest.raises(CollectionMismatch, match="minilm-2-layers"):
        Indexer.open(settings.model_copy(update={"on_model_change": "refuse"}), registry=registry).close()
    with capture_logs() as logs:
        second = Indexer.open(settings, registry=registry)
        try:
            index_once(second)
            changed = [e for e in logs if e["event"] == "model_changed"]
            assert changed and "all-MiniLM-L6-v2" in changed[0]["indexed_with"][0]
            assert "minilm-2-layers" in changed[0]["configured"]
            assert any(e["event"] == "rebuild_finished" for e in logs)
            payloads = second.store.scroll("memory-dir-main", ["model_id"])
            assert payloads and all(p.model_id.endswith("minilm-2-layers") for p in payloads)
            assert second.view.status()["models"]["text"]["precision"] == "fp32"
        finally:
            second.close()


def test_weights_replaced_in_place_are_re_embedded_not_served_from_the_cache(workspace: Path, tmp_path: Path) -> None:
    """Same directory, 2 -> 3 layers: the change is noticed and a rebuild runs; the embedding cache must not hand
    back the 2-layer vectors (it was keyed by the model id alone, the directory's path), so the store ends up
    holding what the 3-layer model makes of each chunk."""
    from conftest import make_settings
    from structlog.testing import capture_logs

    from indexer.builtin.embedding import load_sentence_transformer, resolve_model
    from indexer.daemon import Indexer
    from indexer.plugins import load_registry

    full = resolve_model("all-MiniLM-L6-v2")[1]
    model_dir = tmp_path / "minilm-in-place"

    def save_layers(n: int) -> None:
        model = load_sentence_transformer(full, "cpu")
        model[0].auto_model.encoder.layer = model[0].auto_model.encoder.layer[:n]
        model[0].auto_model.config.num_hidden_layers = n
        model.save(str(model_dir))

    def open_indexer() -> Indexer:
        registry = load_registry(config={"sentence-transformers": {"model": str(model_dir), "precision": "fp32"}})
        return Indexer.open(make_settings(tmp_path, [{"agent": "main", "path": workspace}], model=str(model_dir)),
                            registry=registry)

    save_layers(2)
    first = open_indexer()
    index_once(first)
    before = next(first.store.scroll_points("memory-root-main")).dense["text"]
    first.close()
    save_layers(3)  # the same path, other weights
    with capture_logs() as logs:
        second = open_indexer()
        try:
            index_once(second)
            assert any(e["event"] == "model_changed" for e in logs)
            assert second.pipeline.stats.chunks_embedded > 0, "the rebuild embedded nothing: cached 2-layer vectors"
            after = next(second.store.scroll_points("memory-root-main")).dense["text"]
            assert not np.allclose(before, after, atol=1e-4), "the store still holds the 2-layer vector"
        finally:
            second.close()
