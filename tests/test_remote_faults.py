"""A remote model cannot poison memory: the ``openai`` embedder and the ``http`` reranker against
``FakeModelServer`` (``tests/fake_model_server.py``, a FAKE server on loopback: no real server can be told to
answer NaN, trickle or send 50 MB), on real Qdrant Edge and real files. The real servers' own tests are
``tests/test_openai_embedder.py`` and ``tests/test_http_rerank.py`` (infinity-emb).

Each case: vectors checked where they enter (NaN, inf, zeros, short, wrong size: the file is failed with
``bad_vectors``, keeps its old points, nothing is cached, ``status``/``/metrics``/``/health`` say so; the cache
heals what an older version stored); one deadline per request whatever the server's pace (trickle), and an
answer's size capped (huge); an answer that is not JSON; a server down, found by the search that failed and by an
idle probe; a configured reranker that failed to load.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import make_settings, wait_for, write
from fake_model_server import FakeModelServer
from prometheus_client.parser import text_string_to_metric_families

from indexer.api import Chunk
from indexer.builtin import openai_embed
from indexer.builtin.http_rerank import HttpReranker, RerankError
from indexer.builtin.openai_embed import OpenAIEmbedder
from indexer.daemon import Indexer
from indexer.errors import BadVectors, ConfigError, EmbedUnavailable
from indexer.plugins import GROUPS, Registry, load_registry
from indexer.schema import SearchRequest
from indexer.worker import index_once

OPENAI_EP = EntryPoint("openai", "indexer.builtin.openai_embed:OpenAIEmbedder", "qmd_indexer.embedders")
BAD = ("nan", "inf", "zeros", "short", "wrong_size")


@pytest.fixture(name="fake")
def fake_fixture() -> Iterator[FakeModelServer]:
    with FakeModelServer(dim=16) as server:
        yield server


def fake_registry(url: str, reranker: str = "", **config: Any) -> Registry:
    eps = [ep for group in GROUPS for ep in entry_points(group=group) if ep.name != "openai"] + [OPENAI_EP]
    table = {"openai": {"base_url": url, "model": "fake", "retries": 1, "timeout_s": 2, "query_timeout_s": 1,
                        **config}}
    if reranker:
        table["http"] = {"base_url": url}
    return load_registry(config=table, prefer={"text": "openai"}, eps=eps, reranker=reranker)


def notes(ws: Path) -> Path:
    write(ws / "MEMORY.md", "# Memory\n\nThe user prefers short answers.\n")
    write(ws / "memory" / "coffee.md", "# Coffee\n\nThe user drinks a flat white without sugar.\n")
    write(ws / "memory" / "travel.md", "# Travel\n\nFlights to Lisbon are booked for March.\n")
    write(ws / "memory" / "deploy.md", "# Deploy\n\nDeploys go out on Tuesday mornings.\n")
    return ws


def open_indexer(tmp_path: Path, ws: Path, registry: Registry, reranker: str = "", name: str = "state") -> Indexer:
    settings = make_settings(tmp_path, [{"path": str(ws), "agent": "a"}], state_dir=tmp_path / name,
                             reranker=reranker, rerank_budget_s=1.0)
    return Indexer.open(settings, registry=registry)


def points(indexer: Indexer) -> dict[str, np.ndarray]:
    """Every stored point's text vector, by point id."""
    out = {}
    for collection in indexer.collections:
        for point in indexer.store.scroll_points(collection.name):
            out[str(point.id)] = point.dense["text"]
    return out


def cached(indexer: Indexer) -> list[np.ndarray]:
    db = sqlite3.connect(indexer.state.plan.settings.state_dir / "embeddings.sqlite3")
    try:
        return [np.frombuffer(blob, dtype=np.float32) for (blob,) in db.execute("SELECT vector FROM embedding")]
    finally:
        db.close()


def errors_metric(indexer: Indexer) -> dict[str, float]:
    families = text_string_to_metric_families(indexer.metrics.exposition()[0].decode())
    return {s.labels["kind"]: s.value for f in families if f.name == "qmd_indexer_errors"
            for s in f.samples if s.name.endswith("_total")}


@pytest.mark.parametrize("mode", BAD)
def test_a_bad_embedding_answer_is_refused_where_it_enters(fake: FakeModelServer, mode: str) -> None:
    """NaN, inf, all zeros, fewer vectors than inputs, another size mid-run: ``BadVectors`` for indexing (never
    retried as if the server were down), a keyword-only ``EmbedUnavailable`` saying "bad answer" for a query."""
    embedder = OpenAIEmbedder({"base_url": fake.url, "model": "fake", "retries": 3})
    try:
        assert embedder.embed([Chunk("warm up")]).shape == (1, 16)  # the size is known: 16
        fake.mode = mode
        asked = fake.requests
        with pytest.raises(BadVectors):
            embedder.embed([Chunk("flat white"), Chunk("Lisbon in March")])
        assert fake.requests == asked + 1  # a bad answer is not retried
        with pytest.raises(EmbedUnavailable, match="bad answer"):
            embedder.embed_query("flat white")
    finally:
        embedder.close()


@pytest.mark.parametrize("mode", ["nan", "zeros"])
def test_a_bad_vector_fails_its_file_keeps_its_points_and_is_never_cached(fake: FakeModelServer, tmp_path: Path,
                                                                        mode: str) -> None:
    """One file of a batch answered a bad vector: that file is failed (``bad_vectors``, with the reason) and keeps
    the points it had; the others are indexed; nothing bad is stored or cached; ``status``, ``/metrics`` and
    ``/health`` say so. With the server well again the next index heals it."""
    ws = notes(tmp_path / "ws")
    fake.poison = "POISON"
    indexer = open_indexer(tmp_path, ws, fake_registry(fake.url))
    try:
        index_once(indexer)
        coffee = str(ws / "memory" / "coffee.md")
        before = indexer.state.indexed[coffee].state.points
        stored = points(indexer)
        fake.mode = mode
        write(ws / "memory" / "coffee.md", "# Coffee\n\nThe user drinks a POISON flat white without sugar.\n")
        write(ws / "memory" / "travel.md", "# Travel\n\nFlights to Lisbon are booked for April.\n")
        status = index_once(indexer)
        assert status["files_failed"] == 1
        assert [(f["path"], f["reason"]) for f in status["failed_files"]] == [(coffee, "bad_vectors")]
        assert status["failed_files"][0]["detail"].startswith(f"{fake.url}/embeddings answered")
        assert indexer.state.indexed[coffee].state.points == before  # kept its old points
        now = points(indexer)
        assert all(np.isfinite(v).all() and np.linalg.norm(v) > 0.5 for v in now.values())
        changed = {pid for pid in stored if not np.array_equal(stored[pid], now[pid])}
        assert now.keys() == stored.keys() and len(changed) == 1  # travel.md's point; coffee.md's as it was
        assert all(np.isfinite(v).all() and v.any() for v in cached(indexer))
        health = indexer.view.health_answer()
        assert health["status"] == "degraded"
        assert any(r.startswith("embedder answered bad vectors for 1 file(s)") for r in health["reasons"])
        assert errors_metric(indexer).get("bad_vectors") == 1
        fake.mode = "ok"
        status = index_once(indexer)
        assert status["files_failed"] == 0
        assert not [r for r in indexer.view.health_reasons() if "bad vectors" in r]
        assert indexer.view.searcher().search(SearchRequest(query="POISON flat white", k=1))[0]["path"] == \
            "memory/coffee.md"
    finally:
        indexer.close()


def test_the_cache_heals_vectors_an_older_version_stored(fake: FakeModelServer, tmp_path: Path) -> None:
    """A cache holding NaN and all-zero vectors (written before vectors were checked): they are not served, the
    chunks are embedded again and their entries replaced, and every stored point is finite."""
    ws = notes(tmp_path / "ws")
    first = open_indexer(tmp_path, ws, fake_registry(fake.url))
    try:
        index_once(first)
    finally:
        first.close()
    state = tmp_path / "state"
    db = sqlite3.connect(state / "embeddings.sqlite3")
    with db:
        keys = [key for (key,) in db.execute("SELECT key FROM embedding")]
        for n, key in enumerate(keys):
            bad = np.full(16, np.nan if n % 2 else 0.0, dtype=np.float32)
            db.execute("UPDATE embedding SET vector = ? WHERE key = ?", (bad.tobytes(), key))
    db.close()
    for path in state.iterdir():
        if path.name != "embeddings.sqlite3":  # keep only the damaged cache: a new index reads it
            (__import__("shutil").rmtree if path.is_dir() else Path.unlink)(path)
    asked = fake.requests
    second = open_indexer(tmp_path, ws, fake_registry(fake.url))
    try:
        status = index_once(second)
        assert status["files_failed"] == 0 and len(second.state.indexed) == 4
        assert fake.requests > asked and status["chunks_embedded"] >= len(keys)
        assert all(np.isfinite(v).all() and np.linalg.norm(v) > 0.5 for v in points(second).values())
        assert all(np.isfinite(v).all() and v.any() for v in cached(second))
    finally:
        second.close()


#: an upper bound on a deadline's overshoot that a loaded 2-core machine keeps: far under the minutes a trickled
#: answer takes in whole (the old per-read timeouts took 20-70 s), so the test still tells a deadline from a timeout
SLACK_S = 5.0


def test_a_trickling_embedder_is_cut_at_its_deadline(fake: FakeModelServer, tmp_path: Path) -> None:
    """A server sending its answer a byte at a time: an indexing request gives up at ``timeout_s`` (the files wait,
    unfailed), and a hybrid search answers keyword-only within ``query_timeout_s`` plus a little."""
    ws = notes(tmp_path / "ws")
    indexer = open_indexer(tmp_path, ws, fake_registry(fake.url, timeout_s=1.0, query_timeout_s=0.5))
    try:
        index_once(indexer)
        fake.mode, fake.trickle_s = "trickle", 0.05
        embedder = indexer.registry.embedders["text"]
        started = time.monotonic()
        with pytest.raises(EmbedUnavailable, match="no whole answer within 1 s"):
            embedder.embed([Chunk("a new note about the garden")])
        assert time.monotonic() - started < SLACK_S  # the whole answer would take minutes at this pace
        degraded: list[str] = []
        started = time.monotonic()
        hits = indexer.view.searcher().search(SearchRequest(query="flat white", k=2), degraded)
        assert time.monotonic() - started < SLACK_S
        assert hits and degraded and degraded[0].startswith("keyword only: ")
    finally:
        indexer.close()


def test_a_restart_against_a_hung_server_takes_the_remembered_size_at_once(fake: FakeModelServer,
                                                                          tmp_path: Path) -> None:
    """A daemon restarted while its embedding server hangs (it accepts and never answers in time) learns the
    vector size the state dir remembered after one try at ``query_timeout_s``, not after ``retries`` tries at
    ``timeout_s``: with the defaults (3 x 60 s) that held a daemon's start for 3 minutes before it listened."""
    config = {"base_url": fake.url, "model": "fake", "state_dir": str(tmp_path), "timeout_s": 30.0,
              "query_timeout_s": 0.5, "retries": 3}
    first = OpenAIEmbedder(config)
    assert first.dim == 16  # the first start: asked and remembered
    first.close()
    fake.mode, fake.trickle_s = "trickle", 0.05
    restarted = OpenAIEmbedder(config)
    try:
        started = time.monotonic()
        assert restarted.dim == 16
        assert time.monotonic() - started < SLACK_S  # up to 3 tries at 30 s each before
        assert restarted.stats["requests"] == 1
        fake.mode = "ok"
        assert restarted.embed([Chunk("back again")]).shape == (1, 16)
    finally:
        restarted.close()


@pytest.mark.parametrize("mode", ["huge", "bad_json"])
def test_an_embedding_answer_too_long_or_not_json_is_unavailable(fake: FakeModelServer, mode: str) -> None:
    """50 MB answered to a 1-input request: refused unread (the size cap names it); a 200 that is not JSON: the
    server is not answering embeddings (``EmbedUnavailable``, retried later)."""
    embedder = OpenAIEmbedder({"base_url": fake.url, "model": "fake", "retries": 1})
    try:
        embedder.embed([Chunk("warm up")])
        fake.mode = mode
        with pytest.raises(EmbedUnavailable, match="more than the" if mode == "huge" else "without embeddings"):
            embedder.embed([Chunk("flat white")])
    finally:
        embedder.close()


@pytest.mark.parametrize("mode", ["nan", "inf", "short", "wrong_size", "bad_json", "huge", "trickle", "down"])
def test_a_bad_rerank_answer_is_refused_within_the_budget(fake: FakeModelServer, mode: str) -> None:
    """Every misbehaviour of the rerank server is an error (``TimeoutError`` for the trickle, within the budget;
    ``RerankError`` for the rest, the huge answer refused unread), so the search keeps the fused order."""
    reranker = HttpReranker({"base_url": fake.url})
    try:
        assert len(reranker.score("flat white", ["a flat white", "Lisbon"], timeout_s=1.0)) == 2
        fake.mode = mode
        started = time.monotonic()
        # the trickle is cut at its budget; every other answer is refused for what it is, so its budget is wide: on
        # a loaded machine a 0.5 s one may run out before a huge answer's size is read (a TimeoutError, not this)
        with pytest.raises(TimeoutError if mode == "trickle" else RerankError):
            reranker.score("flat white", ["a flat white", "Lisbon", "deploys"],
                           timeout_s=0.5 if mode == "trickle" else 30.0)
        assert time.monotonic() - started < (SLACK_S if mode == "trickle" else 30.0 + SLACK_S)
    finally:
        reranker.close()


def test_an_unreachable_embedder_found_by_a_search_or_an_idle_probe_degrades_health(
        fake: FakeModelServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The embedding server down with nothing to index: the search that fell back to keyword search makes
    ``/health`` degraded with the reason; once a query is answered again it is ok. With no search at all, the
    health check's idle probe finds the server gone."""
    ws = notes(tmp_path / "ws")
    indexer = open_indexer(tmp_path, ws, fake_registry(fake.url))
    try:
        index_once(indexer)
        assert indexer.view.health() == "ok"
        fake.mode = "down"
        degraded: list[str] = []
        indexer.view.searcher().search(SearchRequest(query="flat white", k=2), degraded)
        assert degraded and degraded[0].startswith("keyword only: ")
        health = indexer.view.health_answer()
        assert health["status"] == "degraded"
        assert any(r.startswith("embedder unavailable: ") and "ConnectError" in r for r in health["reasons"])
        fake.mode = "nan"  # it answers again, if badly: reachable, so no longer "unavailable"
        with pytest.raises(BadVectors):
            indexer.registry.embedders["text"].embed([Chunk("flat white")])
        assert not [r for r in indexer.view.health_reasons() if r.startswith("embedder unavailable")]
        fake.mode = "ok"
        assert indexer.view.searcher().search(SearchRequest(query="Lisbon in March", k=2))
        assert indexer.view.health() == "ok"

        monkeypatch.setattr(openai_embed, "PROBE_EVERY_S", 0.0)  # idle: every health check may probe
        fake.mode = "down"
        wait_for(lambda: indexer.view.health() == "degraded", timeout_s=10)
        embedder = indexer.registry.embedders["text"]
        fake.mode = "ok"
        wait_for(lambda: indexer.view.health() == "ok", timeout_s=10)
        wait_for(lambda: not embedder._probing.is_set(), timeout_s=5)
    finally:
        indexer.close()


@pytest.mark.parametrize(("name", "table"), [
    ("openai", {"base_url": "http://127.0.0.1:9/v1", "model": "m", "api_kye": "OPENAI_KEY"}),
    ("http", {"base_url": "http://127.0.0.1:9/v1", "top_n": 5}),
    ("sentence-transformers", {"model": "all-MiniLM-L6-v2", "modle": "all-MiniLM-L12-v2"}),
    ("cross-encoder", {"model": "/opt/models/reranker", "max_length": 512}),
])
def test_a_plugin_table_with_a_key_the_plugin_does_not_take_is_a_config_error(name: str, table: dict[str, Any]) -> None:
    """``[plugin.openai] api_kye = ...`` (a typo: the key would be ignored) refuses to start, naming the key and the
    table, as an unknown key of the daemon's own table does."""
    eps = [ep for group in GROUPS for ep in entry_points(group=group) if ep.name != "openai"] + [OPENAI_EP]
    bad = next(iter(set(table) - {"base_url", "model"}))  # the one key the plugin does not take
    with pytest.raises(ConfigError, match=rf"^\[plugin.{name}\]: unknown key '{bad}'( \(did you mean '\w+'\?\))? "
                                          rf"\(known: "):
        load_registry(config={name: table}, prefer={"text": "openai"} if name == "openai" else {}, eps=eps,
                      reranker=name if name in ("http", "cross-encoder") else "")


def test_a_reranker_that_failed_to_load_is_an_error_in_status_health_and_answers(fake: FakeModelServer,
                                                                                   tmp_path: Path) -> None:
    """``reranker = "http"`` with a bad ``[plugin.http]`` table: ``status`` lists the failure, ``/health`` is
    degraded with it, and each search answer says its order is the fused one."""
    ws = notes(tmp_path / "ws")
    eps = [ep for group in GROUPS for ep in entry_points(group=group) if ep.name != "openai"] + [OPENAI_EP]
    registry = load_registry(config={"openai": {"base_url": fake.url, "model": "fake"},
                                     "http": {"base_url": fake.url, "api_key_env": "QMD_TEST_UNSET_RERANK_KEY"}},
                             prefer={"text": "openai"}, eps=eps, reranker="http")
    indexer = open_indexer(tmp_path, ws, registry, reranker="http")
    try:
        status = index_once(indexer)
        assert status["plugin_errors"] == ["reranker plugin http failed to load: ValueError: [plugin.http] "
                                           "api_key_env names 'QMD_TEST_UNSET_RERANK_KEY', which is not set in the "
                                           "environment"]
        health = indexer.view.health_answer()
        assert health["status"] == "degraded" and health["reasons"] == status["plugin_errors"]
        degraded: list[str] = []
        assert indexer.view.searcher().search(SearchRequest(query="flat white", k=2), degraded)
        assert degraded == ["fusion order: reranker http failed to load"]
    finally:
        indexer.close()
