"""Daemons on a real 3-node Qdrant cluster: a node SIGKILLed in the middle of a first index, and two daemons (two
machines, two agents) writing to one cluster at once. The end state is compared point by point with a clean index."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import httpx
import pytest
from conftest import assert_same_points, make_settings, wait_for, write
from qdrant.fixtures import CLUSTER_COLLECTIONS, Cluster

import indexer.sync as sync_module
from indexer.daemon import Indexer
from indexer.search import SearchParams
from indexer.store import ServerOptions, ServerStore
from indexer.worker import index_once, run

TOPICS = ["deploys", "incidents", "travel", "coffee", "hiring", "budget"]


def generated_workspace(root: Path, notes: int) -> Path:
    """A workspace of ``notes`` distinct notes of about two chunks each, under six topic directories."""
    write(root / "MEMORY.md", "# Memory\n\nThe team index lives in memory/; each topic has its own folder.\n")
    for i in range(notes):
        topic = TOPICS[i % len(TOPICS)]
        lines = [f"# {topic.title()} note {i}", ""]
        lines += [f"Entry {i}.{j}: on day {(i * 7 + j) % 28 + 1} the {topic} log recorded item {i * 31 + j} "
                  f"with owner person-{(i + j) % 13} and cost {(i * 17 + j * 3) % 997} units." for j in range(18)]
        write(root / "memory" / topic / f"note-{i:03d}.md", "\n".join(lines) + "\n")
    return root


def _cluster_store(cluster: Cluster) -> ServerStore:
    node = cluster.nodes[0]
    return ServerStore(node.url, options=ServerOptions(prefer_grpc=True, grpc_port=node.grpc_port,
                                                       **CLUSTER_COLLECTIONS))


def clean_index(tmp_path: Path, workspace: Path, cache_from: Path, registry, agent: str = "main") -> Indexer:
    """An index of ``workspace`` on Qdrant Edge in a fresh state dir, embedded from a copy of ``cache_from``'s
    embedding cache (so its vectors are the ones the daemon wrote, and nothing is embedded again)."""
    settings = make_settings(tmp_path / "clean", [{"agent": agent, "path": workspace}])
    settings.state_dir.mkdir(parents=True)
    with sqlite3.connect(cache_from / "embeddings.sqlite3") as src, \
            sqlite3.connect(settings.state_dir / "embeddings.sqlite3") as dst:
        src.backup(dst)
    reference = Indexer.open(settings, registry=registry)
    status = index_once(reference)
    assert status["chunks_embedded"] == 0, "the clean index reuses the daemon's vectors"
    return reference


def _run(indexer: Indexer) -> tuple[threading.Event, threading.Thread]:
    stop = threading.Event()
    thread = threading.Thread(target=run, args=(indexer, stop), daemon=True)
    thread.start()
    return stop, thread


def _stop(indexer: Indexer, stop: threading.Event, thread: threading.Thread) -> None:
    stop.set()
    indexer.settler.wake()
    thread.join(60)
    assert not thread.is_alive()
    if indexer.state.watcher is not None:
        indexer.state.watcher.stop()


def test_node_killed_mid_first_index_then_restarted_leaves_the_index_equal_to_the_files(
        tmp_path: Path, fault_cluster: Cluster, registry, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sync_module, "RETRY_AFTER_S", 1.0)
    workspace = generated_workspace(tmp_path / "ws", notes=100)
    files = 101
    store = _cluster_store(fault_cluster)
    settings = make_settings(tmp_path, [{"agent": "main", "path": workspace}])
    indexer = Indexer.open(settings, registry=registry, store=store)
    victim = fault_cluster.nodes[1]
    stop, thread = _run(indexer)
    try:
        wait_for(lambda: len(indexer.state.indexed) >= 10, timeout_s=120)
        victim.kill()
        killed_at = (time.monotonic(), len(indexer.state.indexed))
        # writes fail (HTTP 500 from the surviving nodes): the daemon says it is degraded and queues the files again
        wait_for(lambda: indexer.view.status()["store_degraded"], timeout_s=30)
        time.sleep(3.0)
        indexed_while_down = len(indexer.state.indexed) - killed_at[1]
        victim.start()
        wait_for(lambda: len(indexer.state.indexed) == files and indexer.view.status()["queue_depth"] == 0,
                 timeout_s=180)
        recovered_s = time.monotonic() - killed_at[0]
        assert not indexer.view.status()["store_degraded"]
    finally:
        _stop(indexer, stop, thread)
    names = [c.name for c in indexer.collections]
    for name in names:
        fault_cluster.wait_replicas_active(name)
    reference = clean_index(tmp_path, workspace, indexer.settings.state_dir, registry)
    compared = assert_same_points(store, reference.store, names)
    assert compared == sum(reference.store.count(n) for n in names) > files
    for node in fault_cluster.nodes:  # each node answers with the same counts (no replica left behind)
        for name in names:
            count = httpx.post(f"{node.url}/collections/{name}/points/count", json={"exact": True}).json()
            assert count["result"]["count"] == reference.store.count(name), (node.url, name)
    print(f"\nfault: killed node 1 after {killed_at[1]} of {files} files; {indexed_while_down} indexed while it was "
          f"down; all {files} files / {compared} points equal to a clean index {recovered_s:.1f} s after the kill")
    reference.close()
    for name in names:
        store.drop(name)
    store.close()


def test_two_daemons_on_one_cluster_keep_to_their_own_agents(tmp_path: Path, qdrant_cluster: Cluster,
                                                             registry, request: pytest.FixtureRequest) -> None:
    from qdrant.fixtures import drop_all_collections

    request.addfinalizer(lambda: drop_all_collections(qdrant_cluster.url))
    alpha_ws = generated_workspace(tmp_path / "alpha-ws", notes=12)
    beta_ws = tmp_path / "beta-ws"
    write(beta_ws / "MEMORY.md", "# Beta\n\nThe beta agent keeps bees and sells lavender honey in June.\n")
    write(beta_ws / "memory" / "hives.md", "# Hives\n\nHive 3 swarmed on Tuesday; the queen was replaced.\n")
    daemons = []
    for agent, ws in (("alpha", alpha_ws), ("beta", beta_ws)):  # two machines: own state dirs, own clients
        settings = make_settings(tmp_path / agent, [{"agent": agent, "path": ws}])
        daemons.append(Indexer.open(settings, registry=registry, store=_cluster_store(qdrant_cluster)))
    running = [(d, *_run(d)) for d in daemons]  # both index at once
    try:
        for d in daemons:
            assert d.state.ready.wait(120)
    finally:
        for d, stop, thread in running:
            _stop(d, stop, thread)
    alpha, beta = daemons
    listed = httpx.get(f"{qdrant_cluster.url}/collections").json()["result"]["collections"]
    on_server = sorted(c["name"] for c in listed)
    assert on_server == ["memory-dir-alpha", "memory-dir-beta", "memory-root-alpha", "memory-root-beta", "qmd-claims"]
    for d in daemons:  # nothing collided: each collection holds exactly what its daemon indexed
        for name, counts in d.view.status()["collections"].items():
            assert d.store.count(name) == counts["chunks"] > 0
        assert not any(name.endswith("-beta" if d is alpha else "-alpha") for name in d.view.status()["collections"])
    assert len(alpha.state.indexed) == 13 and len(beta.state.indexed) == 2
    honey = SearchParams("who sells lavender honey?", k=5)
    assert {h["agent"] for h in beta.view.searcher().search(honey)} == {"beta"}
    assert {h["agent"] for h in alpha.view.searcher().search(honey)} == {"alpha"}  # never beta's notes
    with pytest.raises(KeyError, match="unknown agent"):  # another machine's agent is not searched from here
        alpha.view.searcher().search(SearchParams("honey", k=5, agent="beta"))
    for d in daemons:
        d.store.close()
