"""Shared-collection tenancy on a real Qdrant server (``qdrant_tenancy = "shared"``): the logical collections of every
agent are tenants of shared physical collections, and no read of one tenant ever returns another's point."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import backend_store, write
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from indexer.points import Filter, Payload, Point, Query, point_id
from indexer.search import SearchParams
from indexer.store import ServerOptions, ServerStore
from indexer.store.claims import CLAIMS
from indexer.store.layout import SHARED, TENANT_KEY, shared_collection
from indexer.worker import index_once


def _physical(client: Any) -> set[str]:
    """The names of the Qdrant collections on ``client``'s server but the claims' (``qmd-claims``)."""
    return {c.name for c in client.get_collections().collections} - {CLAIMS}


@pytest.fixture(name="shared")
def shared_fixture(qdrant_server: Any):
    """A store with shared tenancy on the session's server; every collection is dropped after the test."""
    from qdrant.fixtures import drop_all_collections

    store = ServerStore(qdrant_server.url, options=ServerOptions(tenancy="shared", space="model-a#1"))
    yield store
    store.close()
    drop_all_collections(qdrant_server.url)


def _point(collection: str, agent: str, path: str, index: int, file_hash: str, vector: list[float], count: int,
           terms: tuple[list[int], list[float]] = ([1], [1.0]), kind: str = "markdown", mtime_ns: int = 5) -> Point:
    payload = Payload(agent=agent, collection=collection, abs_path=path, path=path.lstrip("/"), file_hash=file_hash,
                      chunk_index=index, chunk_count=count, size_bytes=10, mtime_ns=mtime_ns, kind=kind,
                      text=f"{collection}:{path}#{index}")
    return Point(point_id(collection, path, index), {"text": np.asarray(vector, np.float32)}, {"bm25": terms}, payload)


def test_shared_collections_are_one_per_kind_and_space_with_a_tenant_index(shared: ServerStore) -> None:
    for agent in ("a", "b", "c"):
        for kind in ("root", "dir"):
            shared.ensure_collection(f"memory-{kind}-{agent}", {"text": 3})
    physical = sorted(c.name for c in shared.client.get_collections().collections)
    assert physical == sorted({shared_collection("memory-root-a", "model-a#1"),
                               shared_collection("memory-dir-a", "model-a#1")})
    assert all(p.startswith(SHARED) for p in physical)
    info = shared.client.get_collection(physical[0])
    assert info.config.hnsw_config.m == 0 and info.config.hnsw_config.payload_m == 16
    tenant = info.payload_schema[TENANT_KEY]
    assert tenant.data_type.value == "keyword" and tenant.params.is_tenant
    # another model's vectors go to other shared collections, never beside these
    assert shared_collection("memory-root-a", "model-b#1") not in physical


def test_per_tenant_write_update_delete_and_drop(shared: ServerStore, qdrant_server: Any) -> None:
    names = {agent: f"memory-dir-{agent}" for agent in ("a", "b")}
    for agent, name in names.items():
        shared.ensure_collection(name, {"text": 3})
        for path in ("/w/x.md", "/w/y.md"):  # the same paths in both tenants
            shared.replace_file(name, path, "h1", [_point(name, agent, path, i, "h1", [1, 0, 0], 2) for i in range(2)])
    assert shared.count(names["a"]) == shared.count(names["b"]) == 4
    # an update of a's x.md (shorter) leaves b's x.md as it was
    shared.replace_file(names["a"], "/w/x.md", "h2", [_point(names["a"], "a", "/w/x.md", 0, "h2", [0, 1, 0], 1)])
    assert shared.file_states(names["a"])["/w/x.md"].file_hash == "h2"
    assert shared.file_states(names["b"])["/w/x.md"].file_hash == "h1" and shared.count(names["b"]) == 4
    # a delete in b leaves a's file of that path
    shared.delete_file(names["b"], "/w/y.md")
    assert set(shared.file_states(names["b"])) == {"/w/x.md"} and set(shared.file_states(names["a"])) == {
        "/w/x.md", "/w/y.md"}
    other_model = ServerStore(qdrant_server.url, options=ServerOptions(tenancy="shared", space="b#2"))
    other_model.ensure_collection("memory-dir-c", {"text": 5})
    other_model.upsert("memory-dir-c", [_point("memory-dir-c", "c", "/w/x.md", 0, "h", [1, 0, 0, 0, 0], 1)])
    other_model.close()
    assert shared.collections() == {names["a"]: {"text": 3}, names["b"]: {"text": 3}}, "this model's tenants only"
    # removing agent a deletes its points only; the shared collection stays for b
    shared.drop(names["a"])
    assert shared.count(names["a"]) == 0 and shared.count(names["b"]) == 2
    assert set(shared.collections()) == {names["b"]}


def test_a_point_lands_in_the_tenant_it_is_written_to(shared: ServerStore) -> None:
    shared.ensure_collection("memory-root-a", {"text": 3})
    forged = _point("memory-root-b", "b", "/w/MEMORY.md", 0, "h", [1, 0, 0], 1)
    shared.upsert("memory-root-a", [forged])
    assert shared.count("memory-root-b") == 0
    assert [p.collection for p in shared.scroll("memory-root-a")] == ["memory-root-a"]


def test_rebuild_fills_beside_and_swaps_one_tenant(shared: ServerStore) -> None:
    for agent in ("a", "b"):
        name = f"memory-root-{agent}"
        shared.ensure_collection(name, {"text": 3})
        shared.replace_file(name, "/w/old.md", "h", [_point(name, agent, "/w/old.md", 0, "h", [1, 0, 0], 1)])
    target = shared.rebuild_target("memory-root-a")
    shared.ensure_collection(target, {"text": 3})
    shared.upsert(target, [_point("memory-root-a", "a", "/w/new.md", 0, "h", [0, 1, 0], 1)])
    assert set(shared.file_states("memory-root-a")) == {"/w/old.md"}, "searches answer from the live set meanwhile"
    shared.swap("memory-root-a", target)
    assert set(shared.file_states("memory-root-a")) == {"/w/new.md"}
    assert set(shared.file_states("memory-root-b")) == {"/w/old.md"}
    assert shared.count(target) == 0
    # a rebuild cut short leaves staged points; sweep removes them and nothing else
    shared.upsert(shared.rebuild_target("memory-root-b"), [_point("memory-root-b", "b", "/w/z.md", 0, "h", [1, 0, 0],
                                                                  1)])
    assert shared.sweep("memory-root-b") == [shared.rebuild_target("memory-root-b")]
    assert shared.sweep("memory-root-b") == []
    assert set(shared.file_states("memory-root-b")) == {"/w/old.md"}


def test_daemon_indexes_two_agents_into_shared_collections(tmp_path: Path, make_indexer, qdrant_server: Any) -> None:
    from qdrant.fixtures import drop_all_collections

    one, two = tmp_path / "one", tmp_path / "two"
    write(one / "MEMORY.md", "# One\n\nThe deploy window of agent one is Tuesday.\n")
    write(one / "memory" / "notes.md", "# Notes\n\nAgent one keeps bees.\n")
    write(two / "MEMORY.md", "# Two\n\nThe deploy window of agent two is Friday.\n")
    write(two / "memory" / "notes.md", "# Notes\n\nAgent two keeps goats.\n")
    indexer = make_indexer([{"agent": "one", "path": one}, {"agent": "two", "path": two}],
                           qdrant_url=qdrant_server.url, qdrant_tenancy="shared")
    try:
        status = index_once(indexer)
        assert set(status["collections"]) == {"memory-root-one", "memory-dir-one", "memory-root-two",
                                              "memory-dir-two"}
        assert all(c["files"] == 1 for c in status["collections"].values())
        physical = _physical(indexer.store.client)
        assert len(physical) == 2 and all(p.startswith(SHARED) for p in physical)
        searcher = indexer.view.searcher()
        hits = searcher.search(SearchParams("deploy window", k=5, collection="memory-root-two"))
        assert hits and all(h["collection"] == "memory-root-two" for h in hits)
        assert "Friday" in hits[0]["snippet"]
        # an edit and a delete in one agent leave the other's points
        write(one / "memory" / "notes.md", "# Notes\n\nAgent one keeps bees and hens.\n")
        (two / "memory" / "notes.md").unlink()
        indexer.sync.process([one / "memory" / "notes.md", two / "memory" / "notes.md"])
        assert "hens" in indexer.store.scroll("memory-dir-one")[0].text
        assert indexer.store.count("memory-dir-two") == 0 and indexer.store.count("memory-root-two") == 1
    finally:
        indexer.store.close()
        drop_all_collections(qdrant_server.url)


# -- isolation, proved over random tenants, paths and filters ------------------------------------------------------
_AGENTS = st.lists(st.sampled_from(["a", "b", "c", "d", "e", "main", "ops", "x-1"]), min_size=2, max_size=5,
                   unique=True)
_PATHS = st.lists(st.sampled_from(["/w/MEMORY.md", "/w/memory/a.md", "/w/memory/p/b.md", "/w/memory/p/q/c.md",
                                   "/v/memory/d.md"]), min_size=1, max_size=4, unique=True)
_FILTERS = st.builds(Filter, path_prefix=st.sampled_from([None, "w/memory", "w/memory/p", "v", "w/MEMORY.md"]),
                     kinds=st.sampled_from([(), ("markdown",), ("image",), ("markdown", "image")]),
                     since_ns=st.sampled_from([None, 0, 3]), until_ns=st.sampled_from([None, 9, 100]))


@pytest.fixture(name="tenants", params=["shared", "cluster"])
def tenants_fixture(request: pytest.FixtureRequest):
    """A shared-tenancy store on the single node, or on the 3-node cluster (3 shards, 2 replicas, over gRPC)."""
    store = backend_store(request, request.param, **({"tenancy": "shared", "space": "test#1"}
                                                      if request.param == "cluster" else {}))
    yield store
    store.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(agents=_AGENTS, data=st.data())
def test_no_read_of_one_tenant_returns_another_tenants_point(tenants: ServerStore, agents: list[str],
                                                             data: st.DataObject) -> None:
    shared = tenants
    rng = np.random.default_rng(len(agents))
    names = [f"memory-{data.draw(st.sampled_from(['root', 'dir']))}-{agent}" for agent in agents]
    own: dict[str, set[str]] = {}
    shown: dict[str, Payload] = {}  # point id -> its payload
    for agent, name in zip(agents, names, strict=True):
        shared.ensure_collection(name, {"text": 3})
        shared.drop(name)  # the examples share the server: start each tenant empty
        own[name] = set()
        for path in data.draw(_PATHS):
            kind = data.draw(st.sampled_from(["markdown", "image"]))
            mtime = data.draw(st.sampled_from([1, 5, 50]))
            points = [_point(name, agent, path, i, "h", rng.normal(size=3).tolist(), 2, ([i + 1], [1.0]), kind,
                             mtime_ns=mtime) for i in range(2)]
            shared.replace_file(name, path, "h", points)
            own[name] |= {p.id for p in points}
            shown.update((p.id, p.payload) for p in points)
    everyone = set().union(*own.values())
    for name in names:
        flt = data.draw(_FILTERS)
        query = Query(limit=50, dense={"text": rng.normal(size=3).astype(np.float32)}, sparse=([1, 2], [1.0, 1.0]),
                      filter=flt)
        found = {h.id for hits in shared.search(name, query).values() for h in hits}
        found |= {str(pid) for pairs in shared.scores(name, query).values() for pid, _ in pairs}
        assert found <= own[name], f"{name} answered with another tenant's points"
        dense = {h.id for h in shared.search(name, query)["text"]}  # exact at this size: every point that passes
        assert dense == {pid for pid in own[name] if _passes(shown[pid], flt)}
        assert all(h.payload.collection == name for hits in shared.search(name, query).values() for h in hits)
        assert set(shared.payloads(name, sorted(everyone))) == own[name]  # get by id: only its own
        assert {p.collection for p in shared.scroll(name)} <= {name}  # recall and boot read through scroll
        assert {p.id for p in shared.scroll_points(name)} == own[name]
        assert shared.count(name) == len(own[name])
        assert set(shared.file_states(name)) == {p.abs_path for p in shared.scroll(name, ["abs_path"])}


def _passes(p: Payload, f: Filter) -> bool:
    """Whether a point of payload ``p`` passes ``f`` (its path prefix, kinds and time window), in Python."""
    prefix = (f.path_prefix or "").strip("/")
    return ((not prefix or p.path == prefix or p.path.startswith(prefix + "/"))
            and (not f.kinds or p.kind in f.kinds)
            and (f.since_ns is None or p.mtime_ns >= f.since_ns) and (f.until_ns is None or p.mtime_ns < f.until_ns))


def test_migrate_into_shared_collections_then_the_daemon_embeds_nothing(workspace: Path, make_indexer,
                                                                        qdrant_server: Any) -> None:
    from click.testing import CliRunner
    from qdrant.fixtures import drop_all_collections

    from indexer.cli import main

    edge = make_indexer([{"agent": "main", "path": workspace}])
    index_once(edge)
    before = {c.name: edge.store.count(c.name) for c in edge.collections}
    edge.store.close()  # the daemon stops
    try:
        moved = CliRunner().invoke(main, ["migrate", "--to", qdrant_server.url, "--state-dir",
                                          str(edge.settings.state_dir)], env={"QMD_INDEXER_QDRANT_TENANCY": "shared"})
        assert moved.exit_code == 0, moved.output
        on_server = make_indexer([{"agent": "main", "path": workspace}], qdrant_url=qdrant_server.url,
                                 qdrant_tenancy="shared")
        physical = _physical(on_server.store.client)
        assert len(physical) == 2 and all(p.startswith(SHARED) for p in physical), "the daemon's own model space"
        assert {name: on_server.store.count(name) for name in before} == before
        status = index_once(on_server)
        assert status["chunks_embedded"] == 0 and status["cache_hits"] == 0
        on_server.store.close()
    finally:
        drop_all_collections(qdrant_server.url)


def test_two_daemons_write_their_agents_into_the_same_shared_collections(tmp_path: Path, make_indexer,
                                                                         qdrant_server: Any) -> None:
    from qdrant.fixtures import drop_all_collections

    one, two = tmp_path / "one", tmp_path / "two"
    for ws, fact in ((one, "keeps bees"), (two, "keeps goats")):
        write(ws / "MEMORY.md", f"# Memory\n\nThis agent {fact}.\n")
        write(ws / "memory" / "log.md", f"# Log\n\nToday the agent {fact} again.\n")
    daemons = [make_indexer([{"agent": agent, "path": ws}], state_dir=tmp_path / f"state-{agent}",
                            qdrant_url=qdrant_server.url, qdrant_tenancy="shared")
               for agent, ws in (("one", one), ("two", two))]
    try:
        for daemon in daemons:
            index_once(daemon)
        physical = _physical(daemons[0].store.client)
        assert len(physical) == 2, "both daemons' agents in one shared collection per kind"
        for daemon, other in ((daemons[0], "goats"), (daemons[1], "bees")):
            hits = daemon.view.searcher().search(SearchParams(f"the agent {other}", k=10))
            assert hits and all(other not in h["snippet"] for h in hits)
            # a rescan of one daemon deletes nothing of the other's
            daemon.scan("periodic")
        assert all(d.store.count(c.name) == 1 for d in daemons for c in d.collections)
    finally:
        for daemon in daemons:
            daemon.store.close()
        drop_all_collections(qdrant_server.url)


def test_daemon_rebuild_swaps_every_tenant_in_place(workspace: Path, make_indexer, qdrant_server: Any) -> None:
    from qdrant.fixtures import drop_all_collections

    indexer = make_indexer([{"agent": "main", "path": workspace}], qdrant_url=qdrant_server.url,
                           qdrant_tenancy="shared")
    try:
        index_once(indexer)
        before = {c.name: indexer.store.file_states(c.name) for c in indexer.collections}
        assert indexer.rebuild()
        assert {c.name: indexer.store.file_states(c.name) for c in indexer.collections} == before
        staging = [c.name for c in indexer.store.client.get_collections().collections if c.name.endswith("--rebuild")]
        assert staging and all(indexer.store.client.count(name).count == 0 for name in staging)
        [hit] = indexer.view.searcher().search(SearchParams("when can we deploy?", k=1))
        assert hit["path"] == "MEMORY.md" and hit["collection"] == "memory-root-main"
    finally:
        indexer.store.close()
        drop_all_collections(qdrant_server.url)


def test_a_model_change_answers_from_the_former_model_until_the_rebuild_is_swapped_in(qdrant_server: Any) -> None:
    from qdrant.fixtures import drop_all_collections

    def opened(space: str, former: tuple[str, ...] = ()) -> ServerStore:
        return ServerStore(qdrant_server.url, options=ServerOptions(tenancy="shared", space=space,
                                                                    former_spaces=former))

    old = opened("old#1")
    try:
        for agent in ("a", "b"):
            name = f"memory-root-{agent}"
            old.ensure_collection(name, {"text": 3})
            old.replace_file(name, "/w/x.md", "h", [_point(name, agent, "/w/x.md", 0, "h", [1, 0, 0], 1)])
        new = opened("new#2", former=("old#1",))
        new.ensure_collection("memory-root-a", {"text": 3})
        assert set(new.file_states("memory-root-a")) == {"/w/x.md"}, "the former model's points serve meanwhile"
        target = new.rebuild_target("memory-root-a")
        new.ensure_collection(target, {"text": 3})
        new.upsert(target, [_point("memory-root-a", "a", "/w/y.md", 0, "h", [0, 1, 0], 1)])
        assert set(new.file_states("memory-root-a")) == {"/w/x.md"}
        new.swap("memory-root-a", target)
        assert set(new.file_states("memory-root-a")) == {"/w/y.md"}
        assert shared_collection("memory-root-a", "new#2") in _physical(new.client)
        # the former model's shared collection lost a's points only
        assert old.count("memory-root-a") == 0 and old.count("memory-root-b") == 1
        # a swap cut short after it reached the new model's collection: b answers from there, and its next swap
        # also deletes what the former model's collection still holds of it
        cut_short = opened("new#2")  # what the swap had written into the new model's collection
        cut_short.ensure_collection("memory-root-b", {"text": 3})
        cut_short.upsert("memory-root-b", [_point("memory-root-b", "b", "/w/x.md", 0, "h", [1, 0, 0], 1)])
        cut_short.close()
        again = opened("new#2", former=("old#1",))
        again.ensure_collection("memory-root-b", {"text": 3})
        assert old.count("memory-root-b") == 1 and again.count("memory-root-b") == 1
        staged = again.rebuild_target("memory-root-b")
        again.ensure_collection(staged, {"text": 3})
        again.upsert(staged, [_point("memory-root-b", "b", "/w/x.md", 0, "h", [1, 0, 0], 1)])
        again.swap("memory-root-b", staged)
        assert old.count("memory-root-b") == 0 and again.count("memory-root-b") == 1
        again.close()
        # a store whose state dir never recorded that model never reads its points
        stranger = opened("other#3")
        stranger.ensure_collection("memory-root-b", {"text": 3})
        assert stranger.count("memory-root-b") == 0
        for store in (new, stranger):
            store.close()
    finally:
        old.close()
        drop_all_collections(qdrant_server.url)


def test_daemon_model_change_rebuilds_its_tenants_into_the_new_models_collections(workspace: Path, tmp_path: Path,
                                                                                  make_indexer,
                                                                                  qdrant_server: Any) -> None:
    from conftest import make_settings
    from qdrant.fixtures import drop_all_collections
    from structlog.testing import capture_logs

    from indexer.builtin.embedding import load_sentence_transformer, resolve_model
    from indexer.daemon import Indexer
    from indexer.plugins import load_registry

    server = {"qdrant_url": qdrant_server.url, "qdrant_tenancy": "shared"}
    first = make_indexer([{"agent": "main", "path": workspace}], **server)
    index_once(first)
    former = _physical(first.store.client)
    first.close()
    model = load_sentence_transformer(resolve_model("all-MiniLM-L6-v2")[1], "cpu")  # a 2-layer copy, 384-d too
    model[0].auto_model.encoder.layer = model[0].auto_model.encoder.layer[:2]
    model[0].auto_model.config.num_hidden_layers = 2
    small = tmp_path / "minilm-2-layers"
    model.save(str(small))
    registry = load_registry(config={"sentence-transformers": {"model": str(small), "precision": "fp32"}})
    second = Indexer.open(make_settings(tmp_path, [{"agent": "main", "path": workspace}], model=str(small), **server),
                          registry=registry)
    try:
        assert second.store.count("memory-dir-main") == 3, "the former model's points answer until the swap"
        with capture_logs() as logs:
            index_once(second)
        assert any(e["event"] == "rebuild_finished" for e in logs)
        payloads = second.store.scroll("memory-dir-main", ["model_id"])
        assert len(payloads) == 3 and all(p.model_id.endswith("minilm-2-layers") for p in payloads)
        client = second.store.client
        assert _physical(client) - former, "the new model's own collections"
        assert all(client.count(name).count == 0 for name in former), "the former model's points are gone"
    finally:
        second.close()
        drop_all_collections(qdrant_server.url)


def _migrate_cli(tmp_path: Path, *args: str) -> Any:
    from click.testing import CliRunner

    from indexer.cli import main

    (tmp_path / "none.toml").write_text("")
    return CliRunner().invoke(main, ["migrate", *args], env={"QMD_INDEXER_CONFIG": str(tmp_path / "none.toml")})


def test_migrate_between_layouts_resumes_verifies_counts_and_the_daemon_embeds_nothing(
        workspace: Path, tmp_path: Path, make_indexer, qdrant_server: Any) -> None:
    from conftest import assert_same_points
    from qdrant.fixtures import drop_all_collections

    from indexer.migrate import migrate, open_stores
    from indexer.statedir import recorded_tenancy

    url = qdrant_server.url
    daemon = make_indexer([{"agent": "main", "path": workspace}], qdrant_url=url, qdrant_tenancy="collections")
    state = daemon.settings.state_dir
    other = ServerStore(url)  # another daemon's agent on the same server: never touched
    try:
        index_once(daemon)
        names = sorted(c.name for c in daemon.collections)
        before = {name: daemon.store.count(name) for name in names}
        other.ensure_collection("memory-dir-other", {"text": 2})
        other.upsert("memory-dir-other", [_point("memory-dir-other", "other", "/o/memory/a.md", 0, "h", [1, 0], 1)])
        daemon.store.close()  # the daemon stops

        class Stop(Exception):
            pass

        def stop(collection: str, done: int) -> None:
            raise Stop

        with pytest.raises(Stop):  # interrupted after its first page, as by Ctrl-C
            source, target, recorded = open_stores(daemon.settings, url, url, "shared")
            try:
                migrate(source, target, page=2, progress=stop, names=recorded)
            finally:
                source.close()
                target.close()
        moved = _migrate_cli(tmp_path, "--from", url, "--tenancy", "shared", "--state-dir", str(state))
        assert moved.exit_code == 0, moved.output
        assert "already there" in moved.output and "COUNTS DIFFER" not in moved.output
        assert 'qdrant_tenancy = "shared"' in moved.output
        source, target, _ = open_stores(daemon.settings, url, url, "shared", "collections")
        assert assert_same_points(target, source, names) == sum(before.values())
        source.close()
        target.close()
        dropped = _migrate_cli(tmp_path, "--from", url, "--tenancy", "shared", "--drop-source", "--state-dir",
                               str(state))
        assert dropped.exit_code == 0 and dropped.output.count("source dropped") == len(names), dropped.output
        physical = _physical(other.client)
        assert not physical & set(names) and "memory-dir-other" in physical
        assert any(p.startswith(SHARED) for p in physical)
        assert recorded_tenancy(state, url) == "shared", "the daemon's auto keeps the layout it was moved to"
        again = _migrate_cli(tmp_path, "--from", url, "--tenancy", "shared", "--state-dir", str(state))
        assert again.exit_code == 1 and "not in the source" in again.output and "nothing to copy" in again.output
        # the same server under another name, same layout: refused before anything is dropped
        alias = url.replace("127.0.0.1", "localhost") + "/"
        same = _migrate_cli(tmp_path, "--from", url, "--to", alias, "--from-tenancy", "shared", "--tenancy", "shared",
                            "--drop-source", "--state-dir", str(state))
        assert same.exit_code == 2 and "are the same server" in same.output, same.output

        on_shared = make_indexer([{"agent": "main", "path": workspace}], qdrant_url=url, qdrant_tenancy="shared")
        assert {name: on_shared.store.count(name) for name in names} == before
        status = index_once(on_shared)
        assert status["chunks_embedded"] == 0 and status["cache_hits"] == 0, "every file was already there"
        on_shared.store.close()

        back = _migrate_cli(tmp_path, "--from", url, "--tenancy", "collections", "--drop-source", "--state-dir",
                            str(state))
        assert back.exit_code == 0, back.output
        assert {name: other.count(name) for name in names} == before
        assert other.count("memory-dir-other") == 1
        assert recorded_tenancy(state, url) == "collections"
        for p in (c.name for c in other.client.get_collections().collections if c.name.startswith(SHARED)):
            assert other.client.count(p).count == 0, "the tenants were deleted from the shared collections"
    finally:
        other.close()
        drop_all_collections(url)


def test_migrate_between_layouts_is_refused_while_the_daemon_runs(tmp_path: Path, qdrant_server: Any) -> None:
    import os
    import subprocess
    import sys

    from indexer.statedir import record_identity

    state = tmp_path / "state"
    state.mkdir()
    record_identity(state, ["memory-root-main"], "text=model#1; chunking=4")
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from pathlib import Path; "
                               "from indexer.statedir import hold_state_lock; hold_state_lock(Path(sys.argv[1])); "
                               "print('held', flush=True); sys.stdin.read()", str(state)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        assert any(line.strip() == "held" for line in iter(holder.stdout.readline, "")), "its stand-in holds the lock"
        refused = subprocess.run([sys.executable, "-m", "indexer.cli", "migrate", "--from", qdrant_server.url,
                                  "--tenancy", "shared", "--state-dir", str(state)], capture_output=True, text=True,
                                 timeout=120, env={**os.environ, "QMD_INDEXER_CONFIG": "/dev/null"})
        assert refused.returncode == 1 and "Stop the daemon" in refused.stderr, refused.stderr
    finally:
        holder.communicate("")


def test_a_reload_that_removes_an_agent_deletes_its_points_only_and_re_adding_embeds_nothing(
        tmp_path: Path, make_indexer, qdrant_server: Any) -> None:
    from qdrant.fixtures import drop_all_collections

    from indexer.reload import Reloader

    one, two = tmp_path / "one", tmp_path / "two"
    for ws, fact in ((one, "keeps bees"), (two, "keeps goats")):
        write(ws / "MEMORY.md", f"# Memory\n\nThis agent {fact}.\n")
        write(ws / "memory" / "log.md", f"# Log\n\nToday the agent {fact} again.\n")
    both = [{"agent": "one", "path": one}, {"agent": "two", "path": two}]
    daemon = make_indexer(both, qdrant_url=qdrant_server.url, qdrant_tenancy="shared")
    try:
        first = index_once(daemon)
        settings = daemon.settings
        assert {c.name: daemon.store.count(c.name) for c in daemon.collections} == {
            "memory-root-one": 1, "memory-dir-one": 1, "memory-root-two": 1, "memory-dir-two": 1}
        only_one = settings.model_copy(update={"workspace": settings.workspace[:1]})
        assert Reloader(daemon, lambda: only_one).apply()
        assert daemon.store.count("memory-root-two") == daemon.store.count("memory-dir-two") == 0
        assert daemon.store.count("memory-root-one") == daemon.store.count("memory-dir-one") == 1
        assert set(daemon.store.collections()) == {"memory-root-one", "memory-dir-one"}
        assert Reloader(daemon, lambda: settings).apply()  # the typo fixed: two comes back from the cache
        status = index_once(daemon)  # counts since start: nothing embedded since the first index, two cache hits
        assert (status["chunks_embedded"], status["cache_hits"]) == (first["chunks_embedded"], first["cache_hits"] + 2)
        assert daemon.store.count("memory-root-two") == daemon.store.count("memory-dir-two") == 1
    finally:
        daemon.store.close()
        drop_all_collections(qdrant_server.url)


def test_auto_tenancy_is_shared_on_a_new_server_and_keeps_an_existing_servers_collections(
        workspace: Path, tmp_path: Path, make_indexer, qdrant_server: Any) -> None:
    """The default ``qdrant_tenancy = "auto"``: a daemon on a server that holds none of its collections writes
    shared ones; one whose agents already have Qdrant collections of their own (a deployment from before) keeps
    them, embeds nothing and says how to migrate."""
    from qdrant.fixtures import drop_all_collections
    from structlog.testing import capture_logs

    url = qdrant_server.url
    try:
        with capture_logs() as logs:
            new = make_indexer([{"agent": "new", "path": workspace}], state_dir=tmp_path / "s1", qdrant_url=url)
            index_once(new)
        assert new.store.tenancy == "shared" and new.view.status()["tenancy"] == "shared"
        [settled] = [e for e in logs if e["event"] == "qdrant_tenancy_settled"]
        assert settled["tenancy"] == "shared" and settled["hint"] is None
        physical = _physical(new.store.client)
        assert physical and all(p.startswith(SHARED) for p in physical)
        new.store.close()
        # an agent added later that holds a Qdrant collection of its own does not flip the layout settled before
        ServerStore(url).ensure_collection("memory-root-late", {"text": 384})
        late = make_indexer([{"agent": "new", "path": workspace}, {"agent": "late", "path": tmp_path / "late"}],
                            state_dir=tmp_path / "s1", qdrant_url=url)
        assert late.store.tenancy == "shared"
        late.store.close()

        old = make_indexer([{"agent": "old", "path": workspace}], state_dir=tmp_path / "s2", qdrant_url=url,
                           qdrant_tenancy="collections")
        first = index_once(old)
        old.store.close()
        with capture_logs() as logs:  # the upgraded daemon, on the default
            again = make_indexer([{"agent": "old", "path": workspace}], state_dir=tmp_path / "s2", qdrant_url=url)
            status = index_once(again)
        assert again.store.tenancy == "collections" and again.view.status()["tenancy"] == "collections"
        [settled] = [e for e in logs if e["event"] == "qdrant_tenancy_settled"]
        assert "memory-root-old" in settled["reason"] and "migrate" in settled["hint"]
        assert status["chunks_embedded"] == 0 and first["chunks_embedded"] == 4
        again.store.close()
    finally:
        drop_all_collections(url)
