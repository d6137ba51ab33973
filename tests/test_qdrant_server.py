"""What only a real Qdrant server shows: its request size limit, collection creation settings, and writes that fail
while a cluster node is down and succeed once it is back (see ``tests/qdrant/fixtures.py`` for the servers)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from conftest import wait_for
from qdrant.fixtures import CLUSTER_COLLECTIONS, Cluster, Node, make_node, running
from qdrant_client.http.exceptions import UnexpectedResponse
from structlog.testing import capture_logs

import indexer.store.server as server_module
from indexer.errors import StoreUnavailable
from indexer.points import Payload, Point, point_id
from indexer.store import ServerOptions, ServerStore
from indexer.worker import index_once

MIB = 1024 * 1024


@pytest.fixture(scope="module", name="small_server")
def small_server_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """A single node that refuses request bodies over 1 MiB."""
    with running(make_node(tmp_path_factory.mktemp("qdrant-1mb"), QDRANT__SERVICE__MAX_REQUEST_SIZE_MB="1")) as node:
        yield node


def _points(n: int, file_hash: str = "h", text_chars: int = 2000, path: str = "/w/huge.md") -> list[Point]:
    rng = np.random.default_rng(7)
    return [Point(point_id("c", path, i), {"text": rng.standard_normal(384).astype(np.float32)},
                  {"bm25": ([i, i + 1], [1.0, 0.5])},
                  Payload(abs_path=path, path=path.lstrip("/"), file_hash=file_hash, chunk_index=i, chunk_count=n,
                          text=f"chunk {i} " + "x" * text_chars))
            for i in range(n)]


def test_upserts_are_split_under_the_servers_request_size_limit(small_server: Node) -> None:
    points = _points(300)  # ~2.9 MB of JSON: three times the server's limit
    whole = ServerStore(small_server.url, options=ServerOptions(max_request_bytes=64 * MIB, batch_points=10_000))
    whole.ensure_collection("c", {"text": 384})
    with pytest.raises(UnexpectedResponse, match="larger than allowed"):  # the limit is real: one request fails
        whole.upsert("c", points)
    assert whole.count("c") == 0
    whole.close()

    store = ServerStore(small_server.url, options=ServerOptions(max_request_bytes=1 * MIB))
    batches = list(store.batches(points))
    assert all(len(json.dumps([store._struct(p, {}).model_dump(mode="json", exclude_none=True) for p in b])) < MIB
               for b in batches), "json_bytes is an upper bound"
    assert len(batches) >= 3 and sum(map(len, batches)) == 300
    store.replace_file("c", "/w/huge.md", "h", points)
    assert store.count("c") == 300
    assert store.file_states("c")["/w/huge.md"].complete
    store.drop("c")
    store.close()


def test_collection_settings_apply_when_created_and_a_difference_is_reported(qdrant_server: Node) -> None:
    url = qdrant_server.url
    made = ServerStore(url, options=ServerOptions(on_disk_vectors=True, quantization="int8"))
    made.ensure_collection("settings", {"text": 3})
    made.upsert("settings", [Point(point_id("settings", "/w/a.md", 0), {"text": np.ones(3, np.float32)}, {},
                                   Payload(abs_path="/w/a.md", path="a.md", file_hash="h", chunk_count=1))])
    config = httpx.get(f"{url}/collections/settings").json()["result"]["config"]
    assert config["params"]["vectors"]["text"]["on_disk"] is True
    assert config["quantization_config"]["scalar"]["type"] == "int8"

    plain = ServerStore(url)  # configured differently: reported once (not at every check), used as it is
    with capture_logs() as logs:
        plain.ensure_collection("settings", {"text": 3})
        plain.ensure_collection("settings", {"text": 3})
    [line] = [e for e in logs if e["event"] == "collection_settings_differ"]
    assert line["collection"] == "settings" and line["log_level"] == "warning"
    assert line["differ"] == {"on_disk_vectors": {"collection": True, "configured": False},
                              "quantization": {"collection": "int8", "configured": "none"}}
    assert plain.count("settings") == 1
    plain.drop("settings")
    for store in (made, plain):
        store.close()


@pytest.mark.parametrize("grpc", [False, True])
def test_a_retried_create_whose_first_try_landed_uses_the_collection(qdrant_server: Node, grpc: bool) -> None:
    """A create the server applied but whose answer was lost (a cluster under a node's restart) is retried; the
    retry's "already exists" (HTTP 409, gRPC ALREADY_EXISTS) means the collection is there to use, not an error."""
    store = ServerStore(qdrant_server.url, options=ServerOptions(prefer_grpc=grpc, grpc_port=qdrant_server.grpc_port))
    try:
        store._create("created-twice", {"text": 3})
        store._create("created-twice", {"text": 3})  # the retry
        store.ensure_collection("created-twice", {"text": 3})
        assert store.collections() == {"created-twice": {"text": 3}}
    finally:
        store.drop("created-twice")
        store.close()


def test_cluster_collections_get_shards_and_replicas(fault_cluster: Cluster) -> None:
    store = ServerStore(fault_cluster.url, options=ServerOptions(**CLUSTER_COLLECTIONS))
    store.ensure_collection("sharded", {"text": 3})
    params = httpx.get(f"{fault_cluster.url}/collections/sharded").json()["result"]["config"]["params"]
    assert {k: params[k] for k in CLUSTER_COLLECTIONS} == CLUSTER_COLLECTIONS
    with capture_logs() as logs:
        ServerStore(fault_cluster.url, options=ServerOptions(shard_number=1)).ensure_collection("sharded", {"text": 3})
    [line] = [e for e in logs if e["event"] == "collection_settings_differ"]
    assert line["differ"] == {"shard_number": {"collection": 3, "configured": 1}}
    store.drop("sharded")
    store.close()


def test_a_write_during_a_node_outage_is_retried_until_the_node_is_back(fault_cluster: Cluster,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    store = ServerStore(fault_cluster.url, options=ServerOptions(**CLUSTER_COLLECTIONS))
    store.ensure_collection("c", {"text": 384})
    store.upsert("c", _points(40, "h1", 100))
    victim = fault_cluster.nodes[1]
    victim.kill()
    # with a replica down, a write needing both replicas answers HTTP 500, yet lands on the surviving one
    monkeypatch.setattr(server_module, "ATTEMPTS", 1)
    with pytest.raises(StoreUnavailable, match="500"):
        store.replace_file("c", "/w/huge.md", "h2", _points(40, "h2", 100))
    assert store.degraded
    monkeypatch.setattr(server_module, "ATTEMPTS", 5)  # the default: backoff 0.5, 1, 2, 4 s
    store.close()
    store = ServerStore(fault_cluster.url, options=ServerOptions(**CLUSTER_COLLECTIONS))  # not yet failing: retries
    errors: list[BaseException] = []

    def write() -> None:  # fails, backs off, succeeds once the node is up
        try:
            store.replace_file("c", "/w/huge.md", "h3", _points(40, "h3", 100))
        except BaseException as exc:  # handed to the test thread
            errors.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    wait_for(lambda: store.degraded, timeout_s=10)  # the first attempt failed: the store says so
    victim.start()
    writer.join(30)
    assert not errors and not store.degraded
    fault_cluster.wait_replicas_active("c")
    states = store.file_states("c")
    assert states["/w/huge.md"].file_hash == "h3" and states["/w/huge.md"].complete
    for node in fault_cluster.nodes:  # every node answers the same
        counted = httpx.post(f"{node.url}/collections/c/points/count", json={"exact": True}).json()
        assert counted["result"]["count"] == 40
    store.drop("c")
    store.close()


def test_an_unreachable_server_fails_writes_fast_after_the_first_gives_up(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_module, "ATTEMPTS", 2)
    with running(make_node(tmp_path / "node")) as node:
        store = ServerStore(node.url)
        store.ensure_collection("c", {"text": 384})
        node.kill()
        calls: list[int] = []
        real = store.client.upsert
        monkeypatch.setattr(store.client, "upsert", lambda *a, **k: (calls.append(1), real(*a, **k)))
        with pytest.raises(StoreUnavailable):
            store.upsert("c", _points(3))
        assert len(calls) == 2 and store.degraded
        with pytest.raises(StoreUnavailable):
            store.upsert("c", _points(3))
        assert len(calls) == 3, "while failing, a write gets one try"
        node.start()
        store.upsert("c", _points(3))
        assert not store.degraded and store.count("c") == 3
        store.close()


def test_one_huge_note_is_indexed_under_a_1_mib_request_limit(tmp_path: Path, small_server: Node, make_indexer) -> None:
    from conftest import write

    # ~150 chunks of ~1 KB text plus a 384-float vector each: ~1.4 MB of points for one file
    body = "\n".join(f"Line {i}: the storage audit of rack {i % 41} found {i * 7 % 300} degraded disks and "
                     f"{i % 9} spare controllers awaiting replacement by the night shift." for i in range(1200))
    ws = tmp_path / "ws"
    note = write(ws / "memory" / "audit.md", f"# Audit\n\n{body}\n")
    indexer = make_indexer([{"agent": "main", "path": ws}], qdrant_url=small_server.url, qdrant_max_request_mb=1)
    status = index_once(indexer)
    state = indexer.state.indexed[str(note)].state
    assert state.complete and state.points > 100
    assert indexer.store.count("memory-dir-main") == state.points == status["collections"]["memory-dir-main"]["chunks"]
    store = indexer.store
    assert len(list(store.batches(list(store.scroll_points("memory-dir-main"))))) >= 2, \
        "the note's points exceed one request"
    assert status["store_degraded"] is False and status["files_failed"] == 0
    for c in indexer.collections:
        indexer.store.drop(c.name)
    indexer.store.close()


def test_every_method_that_sends_a_request_is_retried() -> None:
    """Each method of the server store (and the classes it derives from) that calls qdrant-client is marked
    ``retried``, so a method renamed or added keeps its retry; the instance's methods are the retrying wrappers."""
    import ast
    import inspect
    import textwrap

    from indexer.store.retry import retried_methods

    marked = retried_methods(ServerStore)
    unmarked = []
    for klass in ServerStore.__mro__[:-1]:
        for fn in ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body:  # type: ignore[attr-defined]
            calls = [n for n in ast.walk(fn) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute)
                     and n.value.attr == "client" and isinstance(n.value.value, ast.Name)
                     and n.value.value.id == "self"]  # self.client.<request>
            if isinstance(fn, ast.FunctionDef) and calls and fn.name not in marked and fn.name != "close":
                unmarked.append(f"{klass.__name__}.{fn.name}")
    assert not unmarked
    assert {name for name, write in marked.items() if write} == {
        "_upsert_request", "_delete", "_delete_ids", "_write_claim", "_delete_claims", "_read_for_write"}
    store = ServerStore(":memory:")
    try:
        assert all(hasattr(getattr(store, name), "__wrapped__") for name in marked)
    finally:
        store.close()
