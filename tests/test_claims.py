"""Agents that look alike never share an index, on a real Qdrant server and the 3-node cluster, in both tenancy
layouts: collision-free names (``workspace.agent_slug``), one owner per agent (``indexer.store.claims``), and the
one-time move of a store named the old way (``indexer.rename``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import write
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from indexer.config import Workspace
from indexer.doctor import findings
from indexer.doctor_store import claim_findings
from indexer.search import SearchParams
from indexer.store.claims import NotOwner
from indexer.worker import index_once
from indexer.workspace import agent_slug, plan_collections, sanitise

LAYOUTS = ["collections", "shared", "cluster-collections", "cluster-shared"]


@given(st.text(min_size=1, max_size=12), st.text(min_size=1, max_size=12))
def test_two_different_ids_never_share_a_physical_name_or_tenant(a: str, b: str) -> None:
    if a == b:
        return
    assert agent_slug(a) != agent_slug(b)
    one = {c.name for c in plan_collections([Workspace(agent=a, path=Path("/w/a"))])}
    two = {c.name for c in plan_collections([Workspace(agent=b, path=Path("/w/b"))])}
    assert not one & two, "root and dir collections (the shared tenant keys) differ"


@given(st.from_regex(r"[a-z0-9]+(-[a-z0-9]+)*", fullmatch=True))
def test_an_id_already_safe_keeps_its_readable_name(agent: str) -> None:
    assert agent_slug(agent) == agent == sanitise(agent)


def test_ids_that_sanitise_alike_get_a_short_stable_hash() -> None:
    assert agent_slug("Bob").startswith("bob--") and agent_slug("bob") == "bob"
    assert agent_slug("alice.smith") != agent_slug("alice_smith")
    assert agent_slug("Bob") == agent_slug("Bob") and len(agent_slug("Bob")) == len("bob--") + 8


@pytest.fixture(name="server", params=LAYOUTS)
def server_fixture(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """Settings overrides for daemons on the single node or the 3-node cluster, in one tenancy layout; every
    collection is dropped after the test."""
    from qdrant.fixtures import CLUSTER_COLLECTIONS, drop_all_collections

    layout = request.param
    if layout.startswith("cluster"):
        url = request.getfixturevalue("qdrant_cluster").url
        extra = {f"qdrant_{k}": v for k, v in CLUSTER_COLLECTIONS.items()}
    else:
        url = request.getfixturevalue("qdrant_server").url
        extra = {}
    yield {"qdrant_url": url, "qdrant_tenancy": layout.rpartition("-")[2], **extra}
    drop_all_collections(url)


def _daemon(make_indexer: Any, tmp_path: Path, name: str, agent: str, fact: str, server: dict[str, Any]) -> Any:
    ws = tmp_path / f"ws-{name}"
    write(ws / "MEMORY.md", f"# Memory\n\nThe private note of {name}: {fact}.\n")
    write(ws / "memory" / "log.md", f"# Log\n\nToday {name} wrote about {fact} again.\n")
    return make_indexer([{"agent": agent, "path": ws}], state_dir=tmp_path / f"state-{name}", **server)


def _release(tmp_path: Path, server: dict[str, Any], agent: str) -> Any:
    """``qmd-indexer release --agent <agent>`` with a config of that agent on ``server``."""
    from click.testing import CliRunner

    from indexer.cli import main

    config = tmp_path / "release.toml"
    config.write_text(f'qdrant_url = "{server["qdrant_url"]}"\nstate_dir = "{tmp_path / "state-new"}"\n'
                      f'[[workspace]]\nagent = "{agent}"\npath = "{tmp_path}"\n')
    return CliRunner().invoke(main, ["release", "--config", str(config), "--agent", agent])


def _answers(daemon: Any, agent: str, query: str) -> list[str]:
    return [h["snippet"] for h in daemon.view.searcher().search(SearchParams(query, k=10, agent=agent))]


@pytest.mark.parametrize("pair", [("Bob", "bob"), ("alice.smith", "alice_smith")])
def test_ids_that_differ_in_case_or_punctuation_keep_apart(tmp_path: Path, make_indexer: Any, server: dict[str, Any],
                                                           pair: tuple[str, str]) -> None:
    first, second = pair
    one = _daemon(make_indexer, tmp_path, "one", first, "keeps bees", server)
    index_once(one)
    before = {c.name: one.store.count(c.name) for c in one.collections}
    two = _daemon(make_indexer, tmp_path, "two", second, "keeps goats", server)
    try:
        index_once(two)
        assert not {c.name for c in one.collections} & {c.name for c in two.collections}
        for daemon in (one, two):
            daemon.scan("periodic")  # a rescan of either deletes nothing of the other's
        assert {c.name: one.store.count(c.name) for c in one.collections} == before
        bees, goats = _answers(one, first, "what animals are kept"), _answers(two, second, "what animals are kept")
        assert bees and all("goats" not in s for s in bees)
        assert goats and all("bees" not in s for s in goats)
    finally:
        two.store.close()
        one.store.close()


def test_the_same_id_on_a_second_daemon_is_refused_until_released(tmp_path: Path, make_indexer: Any,
                                                                  server: dict[str, Any]) -> None:
    one = _daemon(make_indexer, tmp_path, "one", "carol", "keeps bees", server)
    index_once(one)
    before = {c.name: one.store.count(c.name) for c in one.collections}
    with capture_logs() as logs:
        two = _daemon(make_indexer, tmp_path, "two", "carol", "keeps goats", server)
    try:
        refusal = [e for e in logs if e["event"] == "agent_claimed_elsewhere"]
        assert len(refusal) == 1 and refusal[0]["agent"] == "carol"
        assert str(tmp_path / "state-one") in refusal[0]["owner"]
        assert refusal[0]["owner_workspace"] == str(tmp_path / "ws-one")
        assert "collection_prefix" in refusal[0]["hint"] and "qmd-indexer release --agent carol" in refusal[0]["hint"]
        assert two.collections == () and two.state.plan.agents() == []
        reasons = two.view.health_answer().get("reasons", [])  # said as ok before, with nothing listed
        assert any("'carol' not served" in r and "state-one" in r for r in reasons), reasons
        index_once(two)
        two.scan("periodic")
        assert {c.name: one.store.count(c.name) for c in one.collections} == before, "nothing of one's deleted"
        assert all("goats" not in s for s in _answers(one, "carol", "what animals are kept"))
        # doctor names the claims: the first daemon's own, the second's refusal
        def kinds(daemon: Any) -> set[tuple[str, bool]]:
            found = claim_findings(daemon.store, daemon.settings, plan_collections(daemon.settings.workspace))
            return {(f.kind, f.problem) for f in found}

        assert kinds(one) == {("claim", False)} and kinds(two) == {("claimed_elsewhere", True)}
        # released explicitly (the one way out once the other is gone): the second daemon takes the agent over
        released = _release(tmp_path, server, "carol")
        assert released.exit_code == 0 and released.output.count("released memory-") == 2, released.output
        assert str(tmp_path / "state-one") in released.output
        two.connect()
        assert two.state.plan.agents() == ["carol"]
        name = one.collections[1].name
        kept = two.store.count(name)
        with pytest.raises(NotOwner):  # and the first daemon, still running, deletes none of its points
            one.store.delete_file(name, str(tmp_path / "ws-one" / "memory" / "log.md"))
        assert two.store.count(name) == kept
    finally:
        two.store.close()
        one.store.close()


def test_a_store_under_the_former_name_moves_once_without_embedding(tmp_path: Path, make_indexer: Any,
                                                                    server: dict[str, Any]) -> None:
    from dataclasses import replace

    old = _daemon(make_indexer, tmp_path, "one", "Bob", "keeps bees", server)
    former = replace(old.state.plan, collections=tuple(replace(c, name=c.former, former="")
                                                        for c in old.collections))
    old.connect(former)  # as a release that named collections with sanitise() alone left it
    index_once(old)
    counts = {c.name: old.store.count(c.name) for c in former.collections}
    assert all(counts.values()) and all(n.endswith("-bob") for n in counts)
    # the former name also holds a note of agent "bob" (another daemon's, before names had hashes): it stays there
    legacy_dir = former.collections[1].name
    theirs = _elsewhere(next(iter(old.store.scroll_points(legacy_dir))), legacy_dir, "bob", "/elsewhere/memory/x.md")
    old.store.upsert(legacy_dir, [theirs])
    old.store.close()
    with capture_logs() as logs:
        new = _daemon(make_indexer, tmp_path, "one", "Bob", "keeps bees", server)
    try:
        moved = [e for e in logs if e["event"] == "collection_renamed"]
        assert sorted((e["former"], e["points_moved"], e["chunks_embedded"]) for e in moved) == sorted(
            (n, k, 0) for n, k in counts.items())
        assert [e["points_left"] for e in moved if e["former"] == legacy_dir] == [1]
        assert former.collections[0].name not in new.store.collections()
        assert [p.payload.agent for p in new.store.scroll_points(legacy_dir)] == ["bob"], "the other's note stays"
        embedded = new.pipeline.stats.chunks_embedded
        index_once(new)
        assert new.pipeline.stats.chunks_embedded == embedded, "nothing re-embedded after the move"
        assert sum(new.store.count(c.name) for c in new.collections) == sum(counts.values())
        assert any("bees" in s for s in _answers(new, "Bob", "what animals are kept"))
        # doctor: the hashed names, and a path of another owner in this agent's index
        assert [f.kind for f in findings(list(new.settings.workspace)) if f.kind == "hashed_name"] == ["hashed_name"]
        mine = new.collections[1].name
        new.store.upsert(mine, [_elsewhere(next(iter(new.store.scroll_points(mine))), mine, "Bob", "/else/m.md")])
        found = claim_findings(new.store, new.settings, new.collections)
        assert [(f.path, f.problem) for f in found if f.kind == "foreign_paths"] == [(mine, True)]
    finally:
        new.store.close()


def _elsewhere(point: Any, collection: str, agent: str, abs_path: str) -> Any:
    """``point`` as if another workspace's file of ``agent`` had made it in ``collection``."""
    from dataclasses import replace

    from indexer.points import Point, point_id

    payload = replace(point.payload, agent=agent, abs_path=abs_path, path=abs_path, collection=collection)
    return Point(point_id(collection, abs_path, 0), point.dense, point.sparse, payload)


def _store(server: dict[str, Any]) -> Any:
    from indexer.store.layout import ServerOptions
    from indexer.store.server import ServerStore

    options = ServerOptions(tenancy=server["qdrant_tenancy"], **{k.removeprefix("qdrant_"): v for k, v in server.items()
                                                                  if k not in ("qdrant_url", "qdrant_tenancy")})
    return ServerStore(server["qdrant_url"], options=options)


def _owner(tmp_path: Path, name: str) -> Any:
    from indexer.statedir import owner_id
    from indexer.store.claims import Owner

    (tmp_path / name).mkdir(exist_ok=True)
    return Owner.here(owner_id(tmp_path / name), tmp_path / name)


WANTED = {"memory-root-dana": ("dana", "/w/dana"), "memory-dir-dana": ("dana", "/w/dana")}


@pytest.mark.parametrize("server", ["collections", "cluster-collections"], indirect=True)
def test_two_daemons_claiming_one_agent_at_once_never_both_win(tmp_path: Path, server: dict[str, Any]) -> None:
    import threading

    from indexer.store.claims import claim_id

    stores, owners = [_store(server), _store(server)], [_owner(tmp_path, "a"), _owner(tmp_path, "b")]
    try:
        for _ in range(12):
            start, refused = threading.Barrier(2), [{}, {}]

            def run(i: int, start: Any = start, refused: list[Any] = refused) -> None:
                start.wait()
                refused[i] = stores[i].claim(owners[i], WANTED)

            threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            winners = [i for i in (0, 1) if not refused[i]]
            assert len(winners) == 1, f"both or neither won: {refused}"
            held = stores[0].read_claims(WANTED)
            assert {c.owner for c in held.values()} == {owners[winners[0]].id}, "every claim is the winner's"
            stores[0].client.delete("qmd-claims", points_selector=[claim_id(n) for n in WANTED])
    finally:
        for s in stores:
            s.close()


def test_a_claim_write_held_back_loses_to_the_claim_made_meanwhile(tmp_path: Path, server: dict[str, Any]) -> None:
    """The race stretched: one daemon has read "no claim" and its write is held while another claims the agent.
    Before claims were conditional the held write, once through, overwrote the other's and both served it."""
    import threading

    slow, fast = _store(server), _store(server)
    held, release = threading.Event(), threading.Event()
    write = slow._write_claim

    def held_write(claim: Any) -> None:
        held.set()
        release.wait(30)
        write(claim)

    slow._write_claim = held_write
    refused: dict[str, Any] = {}
    first = threading.Thread(target=lambda: refused.update(slow.claim(_owner(tmp_path, "slow"), WANTED)))
    try:
        first.start()
        assert held.wait(30)
        assert fast.claim(_owner(tmp_path, "fast"), WANTED) == {}
        release.set()
        first.join(60)
        assert set(refused) == {"dana"} and refused["dana"].owner == _owner(tmp_path, "fast").id
        assert {c.owner for c in fast.read_claims(WANTED).values()} == {_owner(tmp_path, "fast").id}
        assert slow.refused_agents().keys() == {"dana"}
        with pytest.raises(NotOwner):
            slow.guard("memory-dir-dana")
    finally:
        release.set()
        slow.close()
        fast.close()


def test_a_claim_released_while_its_owner_serves_is_taken_back_or_lost_never_shared(
        tmp_path: Path, make_indexer: Any, server: dict[str, Any]) -> None:
    """``release`` while the owner runs, then another daemon of the same agent starts: the owner finds its claim
    another's at its next check and stops serving the agent; it never answers with the other's notes."""
    from indexer.worker import verify_claims

    one = _daemon(make_indexer, tmp_path, "one", "erin", "keeps bees", server)
    index_once(one)
    assert _release(tmp_path, server, "erin").exit_code == 0
    assert one.store.verify() == {} and one.store.read_claims(), "released under a running owner: taken back"
    assert _release(tmp_path, server, "erin").exit_code == 0
    with capture_logs() as logs:
        two = _daemon(make_indexer, tmp_path, "two", "erin", "keeps goats", server)
    try:
        index_once(two)
        assert not [e for e in logs if e["event"] == "agent_claimed_elsewhere"], "the second took the free agent"
        with capture_logs() as logs:
            with pytest.raises(NotOwner):  # the first's next read checks its claims (older than CHECK_S: forced)
                one.store._checked = 0.0
                _answers(one, "erin", "what animals are kept")
        assert [e["agent"] for e in logs if e["event"] == "agent_claim_lost"] == ["erin"]
        assert verify_claims(one) == {"erin"} and one.state.plan.agents() == [] and not one.state.indexed
        assert "erin" in one.view.health_answer().get("reasons", [""])[-1]
        assert any("goats" in s for s in _answers(two, "erin", "what animals are kept"))
    finally:
        two.store.close()
        one.store.close()


def test_a_claim_whose_time_is_not_a_number_is_read_not_fatal(tmp_path: Path, server: dict[str, Any]) -> None:
    from indexer.store.claims import claim_id

    store = _store(server)
    try:
        assert store.claim(_owner(tmp_path, "a"), WANTED) == {}
        for bad in ("yesterday", 1e300, None):
            store.client.set_payload("qmd-claims", {"claimed_at": bad}, points=[claim_id("memory-dir-dana")])
            claim = store.read_claims(["memory-dir-dana"])["memory-dir-dana"]
            assert claim.since().endswith("Z") and claim.by()
        assert _owner(tmp_path, "b") and _store(server).claim(_owner(tmp_path, "b"), WANTED)["dana"].since()
    finally:
        store.close()


@pytest.mark.parametrize("server", ["collections", "shared"], indirect=True)
def test_a_former_name_another_daemon_claims_is_never_taken_for_a_store_to_move(
        tmp_path: Path, make_indexer: Any, server: dict[str, Any]) -> None:
    """``bob`` serves an empty ``memory/``; ``Bob``'s former names are ``bob``'s live ones. ``Bob`` must start,
    leave ``bob``'s collections as they are and leave no staging collection behind."""
    ws = tmp_path / "ws-bob"
    write(ws / "MEMORY.md", "# Memory\n\nbob keeps owls.\n")
    (ws / "memory").mkdir()
    bob = make_indexer([{"agent": "bob", "path": ws}], state_dir=tmp_path / "state-bob", **server)
    index_once(bob)
    before = {c.name: bob.store.count(c.name) for c in bob.collections}
    Bob = _daemon(make_indexer, tmp_path, "Bob", "Bob", "keeps bees", server)
    try:
        index_once(Bob)
        assert Bob.state.plan.agents() == ["Bob"] and Bob.state.indexed
        assert {c.name: bob.store.count(c.name) for c in bob.collections} == before
        assert {n for n, k in before.items() if k} <= set(bob.store.collections())
        assert not [n for n in bob.store.physical_names() if "--rebuild-" in n]
        assert any("owls" in s for s in _answers(bob, "bob", "which birds"))
    finally:
        Bob.store.close()
        bob.store.close()


@given(st.from_regex(r"[a-z0-9]+(-[a-z0-9]+)*", fullmatch=True), st.from_regex(r"[a-z0-9]+(-[a-z0-9]+)*",
       fullmatch=True), st.from_regex(r"[a-z0-9]+(-[a-z0-9]+)*", fullmatch=True),
       st.from_regex(r"[a-z0-9]+(-[a-z0-9]+)*", fullmatch=True))
def test_extra_path_names_of_two_agents_never_meet(a: str, x: str, b: str, y: str) -> None:
    if (a, x) == (b, y) or a == b:
        return
    one = {c.name for c in plan_collections([Workspace(agent=a, path=Path("/w/a"), extra_paths=(Path(f"/x/{x}"),))])}
    two = {c.name for c in plan_collections([Workspace(agent=b, path=Path("/w/b"), extra_paths=(Path(f"/y/{y}"),))])}
    assert not one & two


def test_the_extra_names_of_the_field_report_differ() -> None:
    one = plan_collections([Workspace(agent="a", path=Path("/w/a"), extra_paths=(Path("/x/b-c"),))])
    two = plan_collections([Workspace(agent="c-a", path=Path("/w/c"), extra_paths=(Path("/y/b"),))])
    assert (one[2].name, two[2].name) == ("memory-extra-b-c--a", "memory-extra-b--c-a")
    assert (one[2].former, two[2].former) == ("memory-extra-b-c-a", "memory-extra-b-c-a"), "moved once, per agent"


def test_a_guarded_write_that_cannot_read_the_claims_counts_as_failing(tmp_path: Path) -> None:
    """During an outage every write first fails to read its claim: ``store_degraded`` must say so (it stayed false,
    the failed read not being counted as the write's)."""
    from qdrant.fixtures import free_port

    from indexer.errors import StoreUnavailable
    from indexer.store.claims import Claim
    from indexer.store.server import ServerStore

    store = ServerStore(f"http://127.0.0.1:{free_port()}")  # nothing listens there
    try:
        owner = _owner(tmp_path, "a")
        store.owner = owner
        store._claimed = {"memory-dir-dana": Claim("memory-dir-dana", "dana", "/w", owner.id, owner.host,
                                                  owner.state_dir, 0.0)}
        assert not store.degraded
        with pytest.raises(StoreUnavailable):
            store.guard("memory-dir-dana")
        assert store.degraded
    finally:
        store.close()


def test_doctor_without_the_daemons_state_dir_does_not_call_its_claims_foreign(
        tmp_path: Path, make_indexer: Any, server: dict[str, Any]) -> None:
    one = _daemon(make_indexer, tmp_path, "one", "gus", "keeps bees", server)
    try:
        index_once(one)
        elsewhere = one.settings.model_copy(update={"state_dir": tmp_path / "none"})  # doctor's default state dir
        found = claim_findings(one.store, elsewhere, plan_collections(elsewhere.workspace))
        assert {(f.kind, f.problem) for f in found} == {("claim", False)}, found
        moved = elsewhere.workspace[0].model_copy(update={"path": tmp_path / "ws-two"})
        other_ws = elsewhere.model_copy(update={"workspace": [moved]})
        found = claim_findings(one.store, other_ws, plan_collections(other_ws.workspace))
        assert {(f.kind, f.problem) for f in found} == {("claimed_elsewhere", True)}, found
    finally:
        one.store.close()
