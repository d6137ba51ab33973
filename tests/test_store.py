"""One behaviour suite for every store backend: embedded Qdrant Edge, a real Qdrant server, a real 3-node cluster,
and qdrant-client's in-process mode as a fast extra (see ``conftest.backend_store``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import BACKENDS, backend_store

from indexer.errors import CollectionMismatch
from indexer.points import (
    INTEGER_FIELDS,
    KEYWORD_FIELDS,
    FileState,
    Filter,
    Payload,
    Point,
    Query,
    parse_state_keys,
    point_id,
    state_key,
)
from indexer.store import EdgeStore, Store


@pytest.fixture(name="store", params=[*BACKENDS, "shared"])
def store_fixture(request: pytest.FixtureRequest, tmp_path: Path):
    store = backend_store(request, request.param) or EdgeStore(tmp_path / "qdrant")
    yield store
    store.close()


def _point(collection: str, path: str, index: int, file_hash: str, vector: list[float], count: int,
           terms: tuple[list[int], list[float]] = ([1], [1.0]), mtime_ns: int = 5) -> Point:
    payload = Payload(abs_path=path, path=path.lstrip("/"), file_hash=file_hash, chunk_index=index, chunk_count=count,
                      size_bytes=10, mtime_ns=mtime_ns, text=f"{path}#{index}")
    return Point(point_id(collection, path, index), {"text": np.asarray(vector, np.float32)}, {"bm25": terms}, payload)


def test_replace_file_leaves_exactly_one_version(store) -> None:
    store.ensure_collection("c", {"text": 3})
    store.replace_file("c", "/w/a.md", "h1", [_point("c", "/w/a.md", i, "h1", [1, 0, 0], 3) for i in range(3)])
    store.replace_file("c", "/w/b.md", "h1", [_point("c", "/w/b.md", 0, "h1", [0, 1, 0], 1)])
    assert store.count("c") == 4
    # a shorter new version: its chunk 0 overwrites in place, chunks 1-2 of the old version must go
    store.replace_file("c", "/w/a.md", "h2", [_point("c", "/w/a.md", 0, "h2", [1, 0, 0], 1)])
    states = store.file_states("c")
    assert store.count("c") == 2
    assert states["/w/a.md"].file_hash == "h2" and states["/w/a.md"].complete
    store.delete_file("c", "/w/a.md")
    assert set(store.file_states("c")) == {"/w/b.md"}


def test_interrupted_write_is_seen_as_incomplete(store) -> None:
    store.ensure_collection("c", {"text": 3})
    # as after a SIGKILL mid-write: 2 of 3 points of a new file, or a mix of two versions
    store.replace_file("c", "/w/a.md", "h1", [_point("c", "/w/a.md", i, "h1", [1, 0, 0], 3) for i in range(2)])
    store.replace_file("c", "/w/b.md", "h1", [_point("c", "/w/b.md", i, "h1", [1, 0, 0], 2) for i in range(2)])
    store.upsert("c", [_point("c", "/w/b.md", 0, "h2", [1, 0, 0], 1)])
    states = store.file_states("c")
    assert not states["/w/a.md"].complete
    assert not states["/w/b.md"].complete


def test_search_returns_a_ranked_list_per_vector_with_filters(store) -> None:
    store.ensure_collection("c", {"text": 3})
    a, b = "/w/memory/x/a.md", "/w/memory/b.md"
    store.replace_file("c", a, "h", [_point("c", a, 0, "h", [1, 0, 0], 1, ([7], [1.0]))])
    store.replace_file("c", b, "h", [_point("c", b, 0, "h", [0.9, 0.1, 0], 1, ([8], [1.0]))])
    x_axis = {"text": np.asarray([1, 0, 0], np.float32)}
    query = Query(limit=5, dense=x_axis, sparse=([7], [1.0]))
    lists = store.search("c", query)
    assert [h.payload.path for h in lists["text"]] == ["w/memory/x/a.md", "w/memory/b.md"]
    assert lists["text"][0].score == pytest.approx(1.0, abs=1e-5)
    assert [h.payload.path for h in lists["bm25"]] == ["w/memory/x/a.md"]
    only_b = Query(limit=5, dense=x_axis, filter=Filter(path_prefix="w/memory/b.md"))
    assert [h.payload.path for h in store.search("c", only_b)["text"]] == ["w/memory/b.md"]
    under_x = Query(limit=5, dense=x_axis, filter=Filter(path_prefix="w/memory/x/"))
    assert [h.payload.path for h in store.search("c", under_x)["text"]] == ["w/memory/x/a.md"]
    assert store.search("c", Query(limit=5, dense={"text": np.asarray([1, 0, 0], np.float32)},
                                   filter=Filter(kinds=("image",))))["text"] == []
    # the candidates' form: the same lists as (the backend's point id, score) pairs, no payloads
    pairs = store.scores("c", query)
    assert {using: [(str(pid), score) for pid, score in answer] for using, answer in pairs.items()} == {
        using: [(h.id, h.score) for h in hits] for using, hits in lists.items()}
    assert store.scores("c", under_x)["text"][0][0] in {pid for pid, _ in pairs["text"]}


def test_vector_size_mismatch_says_how_to_reindex(store) -> None:
    if getattr(store, "shared", False):
        pytest.skip("a shared collection outlives one tenant's drop; another model gets shared collections of its own")
    store.ensure_collection("c", {"text": 3})
    store.ensure_collection("c", {"text": 3})  # same config: fine
    with pytest.raises(CollectionMismatch, match="--reindex"):
        store.ensure_collection("c", {"text": 384})
    store.drop("c")
    store.ensure_collection("c", {"text": 384})


def test_edge_store_survives_reopen(tmp_path: Path) -> None:
    store = EdgeStore(tmp_path / "q")
    store.ensure_collection("c", {"text": 3})
    store.replace_file("c", "/w/a.md", "h1", [_point("c", "/w/a.md", 0, "h1", [1, 0, 0], 1)])
    store.close()
    again = EdgeStore(tmp_path / "q")
    again.ensure_collection("c", {"text": 3})
    assert again.count("c") == 1
    with pytest.raises(CollectionMismatch):
        again.ensure_collection("c", {"text": 4})
    again.close()


def test_per_vector_score_floor(store) -> None:
    store.ensure_collection("c", {"text": 3})
    store.replace_file("c", "/w/a.md", "h", [_point("c", "/w/a.md", 0, "h", [1, 0, 0], 1)])
    store.replace_file("c", "/w/b.md", "h", [_point("c", "/w/b.md", 0, "h", [0.6, 0.8, 0], 1)])
    vector = {"text": np.asarray([1, 0, 0], np.float32)}
    assert len(store.search("c", Query(limit=5, dense=vector))["text"]) == 2
    floored = store.search("c", Query(limit=5, dense=vector, sparse=([1], [1.0]), thresholds={"text": 0.9}))
    assert [h.payload.path for h in floored["text"]] == ["w/a.md"]
    assert len(floored["bm25"]) == 2  # the floor applies to its own vector only


def test_since_keeps_files_modified_at_or_after(store) -> None:
    store.ensure_collection("c", {"text": 3})
    old, new = 1_700_000_000 * 10**9, 1_800_000_000 * 10**9
    store.replace_file("c", "/w/old.md", "h", [_point("c", "/w/old.md", 0, "h", [1, 0, 0], 1, mtime_ns=old)])
    store.replace_file("c", "/w/new.md", "h", [_point("c", "/w/new.md", 0, "h", [1, 0, 0], 1, mtime_ns=new)])
    vector = {"text": np.asarray([1, 0, 0], np.float32)}

    def paths(since_ns: int) -> list[str]:
        lists = store.search("c", Query(limit=5, dense=vector, sparse=([1], [1.0]), filter=Filter(since_ns=since_ns)))
        return sorted({h.payload.path for hits in lists.values() for h in hits})

    assert paths(old) == ["w/new.md", "w/old.md"]
    assert paths(old + 10**9) == ["w/new.md"]
    assert paths(new + 10**9) == []


def test_payload_round_trips_with_plugin_fields() -> None:
    payload = Payload(path="memory/a/b.md", abs_path="/w/memory/a/b.md", kind="image", modality="image",
                      start_s=1.5, extra={"width": 640, "path": "not ours to override"})
    stored = payload.to_payload()
    assert stored["dirs"] == ["memory", "memory/a"] and stored["width"] == 640 and stored["path"] == "memory/a/b.md"
    assert "end_s" not in stored
    back = Payload.from_payload(stored)
    assert back.get("width") == 640 and back.start_s == 1.5 and back.path == payload.path


def test_search_without_payloads_then_fetch_the_kept_ones_by_id(store) -> None:
    """The searcher ranks ids and scores only, then reads the payloads of the hits it keeps, in one request."""
    store.ensure_collection("c", {"text": 3})
    a, b = "/w/memory/a.md", "/w/memory/b.md"
    store.replace_file("c", a, "h", [_point("c", a, 0, "h", [1, 0, 0], 1)])
    store.replace_file("c", b, "h", [_point("c", b, 0, "h", [0.9, 0.1, 0], 1)])
    hits = store.search("c", Query(limit=5, dense={"text": np.asarray([1, 0, 0], np.float32)}),
                        with_payload=False)["text"]
    assert len(hits) == 2 and all(h.payload.path == "" for h in hits)
    gone = point_id("c", "/w/memory/never.md", 0)
    payloads = store.payloads("c", [hits[1].id, hits[0].id, gone])
    assert set(payloads) == {hits[0].id, hits[1].id}  # an absent id is left out
    assert payloads[hits[0].id].path == "w/memory/a.md" and payloads[hits[1].id].path == "w/memory/b.md"
    assert store.payloads("c", []) == {}


def test_edge_index_built_beside_keeps_the_writes_made_while_it_builds(tmp_path: Path, monkeypatch) -> None:
    import threading

    import indexer.store.edge_optimize as edge

    go = tmp_path / "go"
    # the real child process, held at its start until the writes below are made (they land while it builds)
    monkeypatch.setattr(edge, "_OPTIMIZE", f"import os, time\nwhile not os.path.exists({str(go)!r}): "
                                           f"time.sleep(0.02)\n" + edge._OPTIMIZE)
    store = EdgeStore(tmp_path / "qdrant")
    store.ensure_collection("c", {"text": 3})
    for f in range(20):
        path = f"/w/{f}.md"
        store.replace_file("c", path, "h1", [_point("c", path, i, "h1", [1, f, i], 5) for i in range(5)])
    before = store._target("c")
    result: list[float | None] = []
    builder = threading.Thread(target=lambda: result.append(store.build_index("c")))
    builder.start()
    try:
        # meanwhile: one file replaced by a shorter version, one deleted, one added; searches keep answering
        store.replace_file("c", "/w/3.md", "h2", [_point("c", "/w/3.md", 0, "h2", [0, 0, 1], 1)])
        store.delete_file("c", "/w/7.md")
        store.replace_file("c", "/w/new.md", "h1", [_point("c", "/w/new.md", i, "h1", [0, 1, 0], 2) for i in range(2)])
        assert store.search("c", Query(limit=3, dense={"text": np.asarray([0, 0, 1], np.float32)}))["text"]
    finally:
        go.touch()
        builder.join(120)
    assert result and result[0] is not None, "the build finished and was swapped in"
    assert store._target("c") != before and not (tmp_path / "qdrant" / before).exists()
    states = store.file_states("c")
    assert set(states) == {f"/w/{f}.md" for f in range(20) if f != 7} | {"/w/new.md"}
    assert states["/w/3.md"].file_hash == "h2" and states["/w/3.md"].points == 1
    assert all(s.complete for s in states.values()) and store.count("c") == 18 * 5 + 1 + 2
    store.close()
    reopened = EdgeStore(tmp_path / "qdrant")  # the swap is durable
    assert reopened.count("c") == 93 and set(reopened.file_states("c")) == set(states)
    reopened.close()


def test_edge_index_build_gives_up_on_stop_and_leaves_no_copy(tmp_path: Path, monkeypatch) -> None:
    import threading

    import indexer.store.edge_optimize as edge

    monkeypatch.setattr(edge, "_OPTIMIZE", "import time\ntime.sleep(60)\n")
    store = EdgeStore(tmp_path / "qdrant")
    store.ensure_collection("c", {"text": 3})
    store.replace_file("c", "/w/a.md", "h1", [_point("c", "/w/a.md", 0, "h1", [1, 0, 0], 1)])
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    assert store.build_index("c", stop) is None
    assert sorted(p.name for p in (tmp_path / "qdrant").iterdir() if p.is_dir()) == ["c"]
    assert store.count("c") == 1
    store.close()


def test_edge_on_disk_vectors_and_int8_copy_keep_search_exact(tmp_path: Path) -> None:
    """``qdrant_on_disk_vectors`` + ``qdrant_quantization = "int8"`` on Edge: the shard is created with its original
    vectors, its int8 copy, its HNSW graph and its payload indexes memory-mapped cold (nothing of them read into RAM
    when the shard is loaded: a restart at a million points); searches find the same nearest points before and
    after the HNSW build (which builds the int8 copy), rescored with the originals (cosine scores kept), also after
    a restart. 7,000 x 384: Qdrant optimizes a segment (and so quantizes it) from 10,000 KB of vectors (its default
    indexing threshold)."""
    rng = np.random.default_rng(1)
    vectors = rng.normal(size=(7000, 384)).astype(np.float32)
    store = EdgeStore(tmp_path / "q", on_disk_vectors=True, quantization="int8")
    store.ensure_collection("c", {"text": 384})
    store.upsert("c", [_point("c", f"/w/{i}.md", 0, "h", list(v), 1) for i, v in enumerate(vectors)])
    config = json.loads((tmp_path / "q" / "c" / "edge_config.json").read_text())
    assert config["vectors"]["text"]["memory"] == "cold"
    assert config["quantization_config"] == {"scalar": {"type": "int8", "memory": "cold"}}
    assert config["hnsw_config"]["memory"] == "cold"
    indexes = json.loads(next((tmp_path / "q" / "c" / "segments").glob("*/payload_index/config.json")).read_text())
    assert {k: v["memory"] for k, v in indexes["indexed_fields"].items()} == {
        k: "cold" for k in (*KEYWORD_FIELDS, "file_hash", "file_state", *INTEGER_FIELDS)}
    query = vectors[7] + 0.01
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    expected = [f"w/{i}.md" for i in np.argsort(-(unit @ (query / np.linalg.norm(query))))[:3]]

    def top() -> tuple[list[str], float]:
        hits = store.search("c", Query(limit=3, dense={"text": query}))["text"]
        return [h.payload.path for h in hits], hits[0].score

    before = top()
    assert before[0] == expected
    assert store.build_index("c") is not None
    assert any((tmp_path / "q").rglob("*quantized*"))
    built = [json.loads(f.read_text())["config"]["vector_data"]["text"] for f in (tmp_path / "q").rglob("segment.json")]
    assert {"hnsw": "cold", "int8": "cold"} in [{"hnsw": b["index"]["options"]["memory"],
                                                 "int8": b["quantization_config"]["scalar"]["memory"]}
                                                for b in built if b["index"]["type"] == "hnsw"]
    after = top()
    assert after[0] == expected and abs(after[1] - before[1]) < 1e-4  # rescored: the exact cosine
    store.close()
    store = EdgeStore(tmp_path / "q", on_disk_vectors=True, quantization="int8")
    assert top() == after
    store.close()


def _in_page_cache(path: Path) -> float:
    """The fraction of ``path``'s pages that are in the page cache (``mincore(2)`` on a private mapping of it)."""
    import ctypes
    import mmap

    size = path.stat().st_size
    pages = -(-size // mmap.PAGESIZE)
    with open(path, "rb") as handle:
        mapped = mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_COPY)
    start = ctypes.c_char.from_buffer(mapped)
    try:
        flags = (ctypes.c_ubyte * pages)()
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.mincore(ctypes.c_void_p(ctypes.addressof(start)), ctypes.c_size_t(size), flags) != 0:
            raise OSError(ctypes.get_errno(), "mincore failed")
        return sum(f & 1 for f in flags) / pages
    finally:
        del start
        mapped.close()


def test_edge_warms_a_cold_shards_search_files_after_it_loads(tmp_path: Path) -> None:
    """Qdrant drops a cold shard's files from the page cache when it closes it, so after a restart every new query
    read its int8 copy and HNSW graph pages from disk (1M points: dense prefetch p50 27 ms, 3.3 ms warm). Loading a
    cold shard starts a thread that reads those files through; the original vectors stay on disk."""
    rng = np.random.default_rng(2)
    vectors = rng.normal(size=(7000, 384)).astype(np.float32)
    store = EdgeStore(tmp_path / "q", on_disk_vectors=True, quantization="int8")
    store.ensure_collection("c", {"text": 384})
    store.upsert("c", [_point("c", f"/w/{i}.md", 0, "h", list(v), 1) for i, v in enumerate(vectors)])
    assert store.build_index("c") is not None
    shard = tmp_path / "q" / store._target("c")
    store.close()
    quantized, graph = next(shard.rglob("quantized.data")), next(shard.rglob("vector_index-text/links*"))
    originals = next(shard.rglob("vector_storage-text/matrix.dat"))
    for path in (quantized, graph, originals):  # out of the page cache, as after a reboot
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
        assert _in_page_cache(path) == 0.0, path
    store = EdgeStore(tmp_path / "q", on_disk_vectors=True, quantization="int8")
    assert store.count("c") == 7000  # loads the shard; reads no vector
    assert store.warmer.wait(30)
    assert _in_page_cache(quantized) == 1.0 and _in_page_cache(graph) == 1.0
    assert _in_page_cache(originals) < 0.05
    store.close()
    assert not store.warmer._threads  # stopped and joined


def test_edge_file_states_from_payload_indexes_match_the_scroll(tmp_path: Path) -> None:
    """Edge reads file states from facet counts and each file's chunk 0 (a restart at 1M points); it must say what
    the scroll over every payload says: complete files, too few points, two versions mixed at the right count, no
    chunk 0; also on a collection made before the ``file_hash`` index (added when it is opened)."""
    store = EdgeStore(tmp_path / "q")
    store.ensure_collection("c", {"text": 3})
    v = [1.0, 0.0, 0.0]
    store.upsert("c", [_point("c", "/w/a.md", i, "h1", v, 3) for i in range(3)])
    store.upsert("c", [_point("c", "/w/twin.md", i, "h1", v, 3) for i in range(3)])  # same content as a.md
    store.upsert("c", [_point("c", "/w/b.md", i, "h2", v, 4) for i in range(3)])  # one point short
    store.upsert("c", [_point("c", "/w/mixed.md", 0, "h4", v, 2), _point("c", "/w/mixed.md", 1, "h3", v, 2)])
    store.upsert("c", [_point("c", "/w/nofirst.md", 1, "h5", v, 2)])
    store.upsert("c", [_point("c", "/w/ok.md", i, "h6", v, 2) for i in range(2)])
    expected = Store.file_states(store, "c")  # the scroll
    assert {p for p, s in expected.items() if s.complete} == {"/w/a.md", "/w/twin.md", "/w/ok.md"}

    def summary(states: dict) -> dict:  # a mixed file's hash is whichever point came first: not compared
        return {p: (s.points, s.complete) + ((s.file_hash, s.mtime_ns) if s.complete else ())
                for p, s in states.items()}

    assert summary(store.file_states("c")) == summary(expected)
    store.close()
    meta = tmp_path / "q" / "c" / "qmd-collection.json"
    record = json.loads(meta.read_text())
    del record["keyword_indexes"]
    meta.write_text(json.dumps(record))
    again = EdgeStore(tmp_path / "q")
    again.ensure_collection("c", {"text": 3})
    assert summary(again.file_states("c")) == summary(expected)
    assert "file_hash" in json.loads(meta.read_text())["keyword_indexes"]
    again.close()


def test_state_keys_parse_in_one_document_and_refuse_what_they_cannot_vouch_for() -> None:
    """``parse_state_keys`` gives each key's file state (whole, ``points`` = ``chunk_count``), and refuses values
    that would make the one JSON document mean something else: two arrays in one value, a value that is no array,
    wrong types, and two states of one file."""
    payloads = [Payload(abs_path=f"/w/ö {i}.md", file_hash=f"h{i}", size_bytes=10 + i, mtime_ns=5 + i, ctime_ns=6,
                        inode=100 + i, device=7, chunk_count=i + 1) for i in range(3)]
    keys = [state_key(p) for p in payloads]
    assert parse_state_keys(keys) == {p.abs_path: FileState(p.file_hash, p.size_bytes, p.mtime_ns, p.chunk_count, True,
                                                            p.ctime_ns, p.inode, p.device) for p in payloads}
    assert parse_state_keys([]) == {}
    for bad in ([keys[0] + "," + keys[1]], [keys[0], "7"], [keys[0], ""], ['[1,"h",1,1,1,1,1,1]'],
                [keys[0], keys[0].replace('"h0"', '"h9"')], ['["/w/a.md","h",1,1,1,1,1]']):
        with pytest.raises(ValueError):
            parse_state_keys(bad)


def test_edge_file_states_take_the_fast_way_only_when_the_counts_add_up(tmp_path: Path) -> None:
    """On a clean shard the file states come from the ``file_state`` keys of chunk 0s and approximate counts
    (``way="keys"``), or, where a chunk 0 has no key (written before keys existed), from chunk 0s read by id
    (``way="fast"``), and say what the scroll says; after what a crash between a file's upsert and its delete
    leaves (an old version's tail) the counts no longer add up and the exact way marks that file incomplete."""
    import uuid

    from structlog.testing import capture_logs

    store = EdgeStore(tmp_path / "q")
    store.ensure_collection("c", {"text": 3})
    v = [1.0, 0.0, 0.0]
    for name, n in (("a", 3), ("b", 1), ("twin", 3)):
        store.replace_file("c", f"/w/{name}.md", "h1" if n == 3 else "h2",
                           [_point("c", f"/w/{name}.md", i, "h1" if n == 3 else "h2", v, n) for i in range(n)])
    store.replace_file("c", "/w/a.md", "h3", [_point("c", "/w/a.md", 0, "h3", v, 2), _point("c", "/w/a.md", 1, "h3",
                                                                                              v, 2)])
    with capture_logs() as logs:
        states = store.file_states("c")
    assert [e["way"] for e in logs if e["event"] == "file_states_read"] == ["keys"]
    assert states == Store.file_states(store, "c")
    assert all(s.complete for s in states.values()) and states["/w/a.md"].points == 2
    store._shard("c").update(  # a chunk 0 without its key, as written before keys existed
                             store._qe.UpdateOperation.delete_payload([uuid.UUID(point_id("c", "/w/b.md", 0))],
                                                                      ["file_state"]))
    with capture_logs() as logs:
        assert store.file_states("c") == states
    assert [e["way"] for e in logs if e["event"] == "file_states_read"] == ["fast"]
    store.upsert("c", [_point("c", "/w/b.md", i, "h4", v, 1) for i in range(1)])  # b.md's new version: same size
    store.upsert("c", [_point("c", "/w/twin.md", 0, "h5", v, 1)])  # twin.md shrank: chunks 1-2 of h1 not yet deleted
    with capture_logs() as logs:
        states = store.file_states("c")
    assert [e["way"] for e in logs if e["event"] == "file_states_read"] == ["exact"]
    assert not states["/w/twin.md"].complete and states["/w/b.md"].complete and states["/w/b.md"].file_hash == "h4"
    store.close()


def test_opening_a_shard_on_tmpfs_checks_the_room_its_load_takes(monkeypatch) -> None:
    """On tmpfs, loading a shard reads its payload indexes' preallocated, sparse Gridstore files through (4 MiB page
    and 1 MiB tracker per keyword index), and each read fault allocates a page: a 16-note store grew 33 -> 168 MB at
    a restart and, with no room left, the daemon died of SIGBUS. Opening checks that room first: ``StateDirFull``
    (one line), never a crash; and it asks for what the load takes, not for every hole in the store (the WAL, the
    payload and sparse-vector pages stay sparse: counting them refused restarts that fit)."""
    import tempfile

    from indexer.errors import StateDirFull
    from indexer.store import edge as edge_module
    from indexer.store.edge_warm import load_room_bytes, unallocated_bytes

    if not Path("/dev/shm").is_dir() or edge_module.filesystem_type(Path("/dev/shm")) != "tmpfs":
        pytest.skip("no tmpfs at /dev/shm")
    with tempfile.TemporaryDirectory(dir="/dev/shm") as tmp:
        root = Path(tmp) / "qdrant"
        store = EdgeStore(root)
        store.ensure_collection("c", {"text": 3})
        store.upsert("c", [_point("c", "/w/a.md", 0, "h", [1.0, 0.0, 0.0], 1)])
        store.close()
        need = load_room_bytes(root / "c", vectors_cold=True)
        assert need > 8 * 1024 * 1024, need  # the index files, not yet backed by memory
        holes = unallocated_bytes(p for p in (root / "c").rglob("*"))
        assert holes > 3 * need, (holes, need)  # the rest stays sparse
        # a file system with less room than that: the open is refused before anything is mapped
        monkeypatch.setattr(EdgeStore, "free_bytes", lambda self: need // 2)
        again = EdgeStore(root)
        with pytest.raises(StateDirFull, match="tmpfs"):
            again.count("c")
        # room for the load alone (far less than the store's holes): it opens, and takes no more than said
        monkeypatch.setattr(EdgeStore, "free_bytes", lambda self: need + 1024 * 1024)
        allocated = sum(p.lstat().st_blocks * 512 for p in (root / "c").rglob("*") if p.is_file())
        assert again.count("c") == 1
        grown = sum(p.lstat().st_blocks * 512 for p in (root / "c").rglob("*") if p.is_file()) - allocated
        assert 0.9 * need <= grown <= need + 256 * 1024, (grown, need)
        again.close()


def test_collections_on_tmpfs_are_cold_so_a_restart_backs_fewer_holes() -> None:
    """On tmpfs a file's pages are memory already: Edge's default tier loads the vectors into a second copy, and the
    read faults of loading back the preallocated holes of its files with tmpfs pages (the demo workspace's store grew
    31 -> 167 MB at its first restart). A collection created on tmpfs is in the cold tier whatever the setting, so a
    load maps its vectors and reads none of them, and has no integer lookup map (range filters do not use it): the
    restart backs only the payload indexes' Gridstore files, which Qdrant reads through in every tier (edge_warm):
    6 keyword indexes x (4 + 1) MiB and the integer range index's 2 + 1 MiB, 33 MiB (36 with the lookup map; 65
    with the vectors cached)."""
    import tempfile

    from indexer.store import edge as edge_module

    if not Path("/dev/shm").is_dir() or edge_module.filesystem_type(Path("/dev/shm")) != "tmpfs":
        pytest.skip("no tmpfs at /dev/shm")

    def allocated(folder: Path) -> int:
        return sum(p.lstat().st_blocks * 512 for p in folder.rglob("*") if p.is_file())

    def restart_growth(cold: bool) -> int:
        with tempfile.TemporaryDirectory(dir="/dev/shm") as tmp:
            root = Path(tmp) / "qdrant"
            store = EdgeStore(root)
            assert store.on_tmpfs and store.on_disk_vectors  # the setting (False) is overridden on tmpfs
            store.on_disk_vectors = cold  # False: as it was before, to compare in the same run
            store.ensure_collection("c", {"text": 384})
            store.upsert("c", [_point("c", f"/w/{i}.md", 0, "h", [1.0] + [0.0] * 383, 1) for i in range(20)])
            store.close()
            vectors = json.loads((root / "c" / "edge_config.json").read_text())["vectors"]
            assert all((v.get("memory") == "cold") == cold for v in vectors.values()), vectors
            created = allocated(root / "c")
            again = EdgeStore(root)
            assert again.count("c") == 20  # loaded
            x_axis = {"text": np.asarray([1.0] + [0.0] * 383, np.float32)}
            for since, hits in ((5, 20), (6, 0)):  # mtime_ns 5: a range filter without the lookup map
                assert len(again.search("c", Query(limit=50, dense=x_axis, filter=Filter(since_ns=since)))["text"]) \
                    == hits
            grown = allocated(root / "c") - created
            again.close()
            twice = EdgeStore(root)
            assert twice.count("c") == 20
            assert allocated(root / "c") - created == grown  # once: a second restart backs nothing more
            twice.close()
            return grown

    cold, cached = restart_growth(True), restart_growth(False)
    assert cold <= 33.5 * 1024 * 1024, cold / 2**20
    assert cold < 0.7 * cached, (cold, cached)


def test_the_physical_layout_doctor_reads(store) -> None:
    """``physical_names``, ``physical_count``, ``aliases`` and ``per_tenant``: what ``doctor`` reads of the layout,
    on every backend; a rebuild's staging collection is listed and counted beside the live one."""
    from indexer.store.layout import PerTenant, shared_collection

    store.ensure_collection("c", {"text": 3})
    store.replace_file("c", "/w/a.md", "h", [_point("c", "/w/a.md", i, "h", [1, 0, 0], 2) for i in range(2)])
    staging = store.rebuild_target("c")
    store.ensure_collection(staging, {"text": 3})
    store.upsert(staging, [_point(staging, "/w/b.md", 0, "h", [0, 1, 0], 1)])
    if store.tenancy == "shared":
        live, rebuild = shared_collection("c", store.options.space), shared_collection(staging, store.options.space)
        assert {live, rebuild} <= set(store.physical_names())
        assert (store.physical_count(live, tenant="c"), store.physical_count(rebuild, tenant="c")) == (2, 1)
        assert store.physical_count(live, tenant="other") == 0
        assert store.per_tenant(live) == PerTenant(True, 0, 16)
        return
    assert {"c", staging} <= set(store.physical_names()) and store.aliases() == {}
    assert (store.physical_count("c"), store.physical_count(staging)) == (2, 1)
    assert store.per_tenant("c") is None or not store.per_tenant("c").tenant_index
    store.swap("c", staging)
    assert store.aliases() == {"c": staging} and store.physical_count(staging) == 1
    assert "c" not in store.physical_names()
