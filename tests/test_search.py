"""Retrieval through the product's search path: hybrid/dense/keyword, filters, snippets, CJK, and the agent-side
reads (paged get, recall, boot context) over the HTTP API."""

from __future__ import annotations

import tracemalloc
from datetime import UTC, date, datetime
from pathlib import Path

import numpy as np
import pytest
from conftest import write
from fastapi.testclient import TestClient

from indexer import bm25
from indexer.hits import snippet
from indexer.points import Hit, Payload, Query
from indexer.ranking import decay, fuse_scores, mmr
from indexer.recall import read_memory
from indexer.relevance import NOTHING, Evidence, held_terms, idf, judge, weighted_coverage
from indexer.schema import SearchRequest
from indexer.server import create_app
from indexer.worker import index_once

PARAPHRASE_NOTES = {
    "deploys.md": "# Deploys\n\nWe agreed that releases go out on Tuesday and Thursday mornings, never on Fridays.\n",
    "outage.md": "# Outage review\n\nThe export job failed overnight because the disk filled up with unrotated logs.\n",
    "tickets.md": "# Tickets\n\nThe disk-full problem on the batch host is tracked as ACME-4471; Marco owns the fix.\n",
    "rotation.md": "# Log rotation\n\nAfter the storage incident we rotate logs daily and keep a week of history.\n",
    "oncall.md": "# On-call\n\nNight pages about storage go to Marco; weekend pages go to the secondary.\n",
    "storage.md": "# Storage\n\nBatch hosts have small disks, so exports must stream instead of staging files.\n",
}


@pytest.fixture(name="indexed")
def indexed_fixture(tmp_path: Path, make_indexer):
    ws = tmp_path / "ws"
    write(ws / "MEMORY.md", "# Memory\n\nThe user is Dana, an SRE in Lisbon.\nShe prefers short answers.\n")
    for name, text in PARAPHRASE_NOTES.items():
        write(ws / "memory" / name, text)
    write(ws / "memory" / "zh" / "会议.md", "# 会议记录\n\n我们决定把数据库迁移安排在下周二晚上，负责人是王伟。\n")
    write(ws / "memory" / "ja" / "メモ.md", "# メモ\n\n東京オフィスの引っ越しは三月に予定されています。\n")
    indexer = make_indexer([{"agent": "main", "path": ws}])
    index_once(indexer)
    return indexer, ws


def _paths(hits) -> list[str]:
    return [h["path"] for h in hits]


@pytest.mark.parametrize("mode", ["hybrid", "keyword"])
def test_exact_token_is_found_first(indexed, mode: str) -> None:
    indexer, _ = indexed
    hits = indexer.view.searcher().search(SearchRequest(query="ACME-4471", k=3, mode=mode))
    assert _paths(hits)[0] == "memory/tickets.md"


def test_paraphrase_is_found_by_meaning(indexed) -> None:
    indexer, _ = indexed
    searcher = indexer.view.searcher()
    for mode in ("hybrid", "dense"):
        hits = searcher.search(SearchRequest(query="when are we allowed to ship new versions?", k=2, mode=mode))
        assert _paths(hits)[0] == "memory/deploys.md"


@pytest.mark.parametrize("mode", ["hybrid", "keyword"])
def test_chinese_and_japanese_queries_find_their_notes(indexed, mode: str) -> None:
    indexer, _ = indexed
    searcher = indexer.view.searcher()
    assert _paths(searcher.search(SearchRequest(query="数据库迁移", k=2, mode=mode)))[0] == "memory/zh/会议.md"
    assert _paths(searcher.search(SearchRequest(query="東京オフィス", k=2, mode=mode)))[0] == "memory/ja/メモ.md"


def test_filters_narrow_the_answer(indexed) -> None:
    indexer, _ = indexed
    searcher = indexer.view.searcher()
    narrowed = searcher.search(SearchRequest(query="meeting", k=10, path_prefix="memory/zh"))
    assert set(_paths(narrowed)) == {"memory/zh/会议.md"}
    assert _paths(searcher.search(SearchRequest(query="Dana", k=10, collection="memory-root-main"))) == ["MEMORY.md"]
    assert searcher.search(SearchRequest(query="disk", k=10, kind="image")) == []
    strong = searcher.search(SearchRequest(query="ACME-4471", k=10, mode="keyword", min_score=1.0))
    assert strong and all(h["score"] >= 1.0 for h in strong)
    with pytest.raises(KeyError, match="unknown collection"):
        searcher.search(SearchRequest(query="x", collection="nope"))


def test_hits_carry_the_contract(indexed) -> None:
    indexer, _ = indexed
    [hit] = indexer.view.searcher().search(SearchRequest(query="Dana", k=1))
    assert hit == {**hit, "collection": "memory-root-main", "agent": "main", "path": "MEMORY.md", "start_line": 1,
                   "end_line": 4, "kind": "markdown", "citation": "MEMORY.md#L1-L4"}
    assert isinstance(hit["score"], float) and hit["snippet"].startswith("# Memory")


def test_snippet_is_centred_on_the_best_lines_and_capped() -> None:
    lines = [f"filler line {i} about nothing in particular" for i in range(60)]
    lines[41] = "the rollback script lives in ops/rollback.sh"
    body, start, end = snippet("\n".join(lines), "where is the rollback script", first_line=10)
    assert len(body) <= 700 and "ops/rollback.sh" in body
    assert start <= 51 <= end and body.splitlines()[51 - start] == lines[41]


@pytest.mark.parametrize("method", ["rrf", "dbsf"])
def test_fusion_gives_qdrant_clients_own_answer_on_its_own_point_type(method: str) -> None:
    """``fuse_scores`` hands qdrant-client's fusion light stand-ins for ``ScoredPoint``; the ids, scores and order
    must be what the library gives for real ``ScoredPoint``s: overlapping lists, ties, a one-item list, an empty
    list."""
    import random
    import uuid

    from qdrant_client.http import models
    from qdrant_client.hybrid.fusion import distribution_based_score_fusion, reciprocal_rank_fusion

    rng = random.Random(7)
    ids = [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(150)]
    dense = sorted(((i, rng.random()) for i in ids[:100]), key=lambda x: -x[1])
    keyword = sorted(((i, round(rng.uniform(0, 9), 1)) for i in ids[50:]), key=lambda x: -x[1])  # ties
    for lists in ([dense, keyword], [dense, keyword[:1]], [dense, []]):
        points = [[models.ScoredPoint(id=i, version=0, score=s) for i, s in scored] for scored in lists]
        expected = (reciprocal_rank_fusion(points, limit=120, ranking_constant_k=60) if method == "rrf"
                    else distribution_based_score_fusion(points, limit=120))
        assert fuse_scores(lists, method, 60, 120) == [(str(p.id), p.score) for p in expected]


@pytest.mark.parametrize("method", ["rrf", "dbsf"])
def test_fusion_weights_scale_each_points_part_of_one_list(method: str) -> None:
    """With weights, each list is fused alone by the library and a weighed point's part of that list is multiplied
    by its factor before the sum: weights of 1 give the library's scores, and a factor moves only the parts it
    names."""
    dense = [("a", 0.9), ("b", 0.5), ("c", 0.4), ("d", 0.1)]
    keyword = [("c", 7.0), ("d", 6.0), ("e", 1.0)]
    plain = dict(fuse_scores([dense, keyword], method, 60, 10))
    ones = dict(fuse_scores([dense, keyword], method, 60, 10, [{"a": 1.0, "c": 1.0}, None]))
    assert ones.keys() == plain.keys() and all(ones[k] == pytest.approx(plain[k]) for k in plain)
    dense_part = dict(fuse_scores([dense], method, 60, 10))
    weighed = fuse_scores([dense, keyword], method, 60, 10, [{"a": 0.4, "c": 0.4}, None])
    scores = dict(weighed)
    assert scores["a"] == pytest.approx(0.4 * dense_part["a"])
    assert scores["c"] == pytest.approx(plain["c"] - 0.6 * dense_part["c"])
    assert scores["b"] == pytest.approx(plain["b"]) and scores["d"] == pytest.approx(plain["d"])
    assert [pid for pid, _ in weighed] == sorted(scores, key=lambda pid: -scores[pid])


@pytest.mark.parametrize("method", ["rrf", "dbsf"])
def test_fusion_ranks_like_qdrants_own_fusion(indexed, method: str) -> None:
    """Our pooled fusion (qdrant-client's implementation) orders a single collection as Qdrant Edge fuses it."""
    import qdrant_edge as qe

    indexer, _ = indexed
    searcher = indexer.view.searcher(fusion=method, prefetch_limit=100)
    query = "who owns the storage problems?"
    fused = searcher.retrieve(SearchRequest(query=query, k=10, mode="hybrid", collection="memory-dir-main"))
    ours = [h.payload.path for h in fused]
    dense = dict(searcher._embed_query(query))["text"]
    terms = indexer.terms.query(query)
    shard = indexer.store._shard("memory-dir-main")
    native = shard.query(qe.QueryRequest(
        limit=10, with_payload=True, query=qe.Fusion.Rrf(k=60) if method == "rrf" else qe.Fusion.Dbsf(),
        prefetches=[qe.Prefetch(limit=100, query=qe.Query.Nearest(dense.tolist(), using="text")),
                    qe.Prefetch(limit=100, query=qe.Query.Nearest(qe.SparseVector(indices=terms[0], values=terms[1]),
                                                                  using="bm25"))]))
    # items of equal fused score (with RRF: one first in the dense list, another first in BM25) may come in either
    # order; the int8 query embedding varies in its last bits between runs, so such ties come and go
    tied = {h.payload.path for h in fused if sum(abs(h.score - o.score) < 1e-9 for o in fused) > 1}
    assert [p if p not in tied else "tie" for p in ours[:3]] == [
        p if p not in tied else "tie" for p in [p.payload["path"] for p in native][:3]]


# -- agent-side reads through the API ---------------------------------------------------------------------------
@pytest.fixture(name="api")
def api_fixture(indexed) -> TestClient:
    indexer, _ = indexed
    indexer.state.ready.set()
    return TestClient(create_app(indexer.view), base_url="http://127.0.0.1:8743")  # the Host a local client sends


def test_api_search_health_status(api: TestClient) -> None:
    assert api.get("/health").json() == {"status": "ok", "ready": True, "append": {"main": "off"}}
    assert api.get("/status").json()["collections"]["memory-dir-main"]["files"] == 8
    hits = api.post("/search", json={"query": "ACME-4471", "k": 1, "mode": "keyword"}).json()["hits"]
    assert hits[0]["path"] == "memory/tickets.md"
    assert api.post("/search", json={"query": "x", "agent": "ghost"}).status_code == 404
    assert api.post("/search", json={"query": "x", "mode": "fuzzy"}).status_code == 422


def test_paged_read_continues_where_it_stopped(api: TestClient, indexed) -> None:
    _, ws = indexed
    write(ws / "memory" / "log.md", "".join(f"line {i}\n" for i in range(1, 101)))
    page = api.get("/get", params={"path": "memory/log.md", "from": 10, "lines": 5}).json()
    assert (page["from"], page["to"], page["truncated"], page["next_from"]) == (10, 14, True, 15)
    assert page["text"] == "\n".join(f"line {i}" for i in range(10, 15))
    page = api.get("/get", params={"path": "memory/log.md", "from": 95, "max_chars": 1000}).json()
    assert (page["to"], page["truncated"], page["next_from"]) == (100, False, None)
    page = api.get("/get", params={"path": "memory/log.md", "max_chars": 20}).json()
    assert page["text"] == "line 1\nline 2\nline 3" and page["next_from"] == 4  # whole lines only


@pytest.mark.parametrize("path", ["../outside.md", "memory/../../outside.md", "/etc/passwd", "memory/link.md",
                                  "memory/table.csv", "memory/photo.png",
                                  "notes.txt", "memory/.hidden/x.md"])
def test_reads_outside_memory_are_refused(api: TestClient, indexed, tmp_path: Path, path: str) -> None:
    _, ws = indexed
    write(tmp_path / "outside.md", "secret")
    write(ws / "notes.txt", "not memory")
    write(ws / "memory" / "table.csv", "secret: a text file no plugin claims is not memory")
    write(ws / "memory" / "photo.png", b"\x89PNG\r\n\x1a\n secret bytes")
    write(ws / "memory" / ".hidden" / "x.md", "hidden")
    (ws / "memory" / "link.md").symlink_to(tmp_path / "outside.md")
    response = api.get("/get", params={"path": path})
    assert response.status_code == 403, response.text
    assert "secret" not in response.text


def test_missing_memory_file_and_unknown_agent_are_404(api: TestClient) -> None:
    assert api.get("/get", params={"path": "memory/nope.md"}).status_code == 404
    assert api.get("/get", params={"path": "MEMORY.md", "agent": "ghost"}).status_code == 404


def test_a_200_mb_file_is_read_without_loading_it(indexed, tmp_path: Path) -> None:
    indexer, ws = indexed
    big = ws / "memory" / "big.md"
    line = ("x" * 99 + "\n").encode()
    with open(big, "wb") as handle:
        block = line * 10_000
        for _ in range(200):  # 200 MB
            handle.write(block)
    tracemalloc.start()
    page = read_memory(indexer.collections, "memory/big.md", from_line=1, lines=3)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert page["to"] == 3 and page["next_from"] == 4
    assert peak < 5 * 1024 * 1024


def test_recall_lists_everything_or_searches(api: TestClient) -> None:
    listed = api.post("/recall", json={"query": "*", "k": 100}).json()["hits"]
    assert [h["path"] for h in listed] == sorted(h["path"] for h in listed)
    assert len(listed) == 9 and all(h["score"] is None for h in listed)
    assert api.post("/recall", json={"query": "all", "k": 2}).json()["hits"] == listed[:2]
    found = api.post("/recall", json={"query": "ACME-4471", "k": 1}).json()["hits"]
    assert found[0]["path"] == "memory/tickets.md"


def test_boot_context_fits_the_budget_in_whole_lines(api: TestClient, indexed) -> None:
    _, ws = indexed
    context = api.post("/boot", json={"budget_chars": 400}).json()
    assert context["used_chars"] == len(context["text"]) <= 400
    assert context["included"][0] == "MEMORY.md#L1-L4"  # the root memory file comes first
    assert context["omitted"], "a 400-character budget cannot hold every note"
    sources = {p.relative_to(ws).as_posix(): p.read_text().splitlines()
               for p in [ws / "MEMORY.md", *(ws / "memory").rglob("*.md")]}
    for block in context["text"].split("\n## "):
        header, *body = block.removeprefix("## ").split("\n")
        path, lines = header.split("#L")
        start = int(lines.split("-L")[0])
        assert body == sources[path][start - 1 : start - 1 + len(body)], "whole lines, copied exactly"
    big = api.post("/boot", json={"budget_chars": 100_000}).json()
    assert big["omitted"] == [] and len(big["included"]) == 9


def test_since_filters_by_modification_time_through_the_api(tmp_path: Path, make_indexer) -> None:
    import os
    import time

    ws = tmp_path / "ws"
    old = write(ws / "memory" / "2025-01-10.md", "# Deploy\n\nThe deploy window moved to Tuesday.\n")
    write(ws / "memory" / "today.md", "# Deploy\n\nThe deploy window is now Thursday morning.\n")
    month_ago = time.time() - 30 * 86_400
    os.utime(old, (month_ago, month_ago))
    indexer = make_indexer([{"agent": "main", "path": ws}])
    index_once(indexer)
    api = TestClient(create_app(indexer.view), base_url="http://127.0.0.1:8743")

    def paths(since: str | None) -> list[str]:
        body = {"query": "deploy window", "k": 5, **({"since": since} if since else {})}
        response = api.post("/search", json=body)
        assert response.status_code == 200, response.text
        return sorted(h["path"] for h in response.json()["hits"])

    assert paths(None) == ["memory/2025-01-10.md", "memory/today.md"]
    assert paths("7d") == ["memory/today.md"]
    assert paths("45d") == ["memory/2025-01-10.md", "memory/today.md"]
    assert paths(time.strftime("%Y-%m-%d", time.localtime(month_ago - 86_400))) == paths(None)
    bad = api.post("/search", json={"query": "deploy", "since": "last tuesday"})
    assert bad.status_code == 422 and "7d" in bad.text  # refused at the contract, naming the forms it reads


@pytest.mark.parametrize("backend", ["edge", "server"])
def test_until_keeps_files_modified_before_on_every_face(tmp_path: Path, make_indexer, request: pytest.FixtureRequest,
                                                         backend: str) -> None:
    """``until`` through the Python client, the HTTP body, the MCP tool and the CLI flag, on Qdrant Edge and a
    Qdrant server (skipped without its binary): a month-old note is kept, today's is not."""
    import json
    import os
    import socket
    import threading
    import time

    import anyio
    import uvicorn
    from click.testing import CliRunner
    from conftest import backend_store, wait_for
    from mcp import Client as McpClient

    from indexer.cli import main
    from indexer.client import Client, ClientError
    from indexer.mcp import build_server

    ws = tmp_path / "ws"
    old = write(ws / "memory" / "2025-01-10.md", "# Deploy\n\nThe deploy window moved to Tuesday.\n")
    write(ws / "memory" / "today.md", "# Deploy\n\nThe deploy window is now Thursday morning.\n")
    month_ago = time.time() - 30 * 86_400
    os.utime(old, (month_ago, month_ago))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    indexer = make_indexer([{"agent": "main", "path": ws}], store=backend_store(request, backend), port=port)
    index_once(indexer)
    indexer.state.ready.set()
    week_ago = time.strftime("%Y-%m-%d", time.localtime(time.time() - 7 * 86_400))
    older = ["memory/2025-01-10.md"]

    def paths(hits) -> list[str]:
        return sorted(h["path"] for h in hits)

    server = uvicorn.Server(uvicorn.Config(create_app(indexer.view), host="127.0.0.1", port=port, log_config=None,
                                           access_log=False, lifespan="on", ws="none"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, timeout_s=30)
        with Client(port=port) as client:
            assert paths(client.search("deploy window", k=5)) == ["memory/2025-01-10.md", "memory/today.md"]
            assert paths(client.search("deploy window", k=5, until="7d")) == older
            assert paths(client.search("deploy window", k=5, until=week_ago)) == older
            assert paths(client.search("deploy window", k=5, since="45d", until="7d")) == older
            assert client.search("deploy window", k=5, until="45d") == []
            body = {"query": "deploy window", "k": 5, "until": "7d"}
            assert paths(client._call("POST", "/search", json=body)["hits"]) == older
            with pytest.raises(ClientError, match="until must be a duration") as bad:
                client.search("deploy", until="last tuesday")
            assert bad.value.status_code == 422

            async def tool() -> dict:
                async with McpClient(build_server(client)) as mcp:
                    result = await mcp.call_tool("memory_search", {"query": "deploy window", "k": 5, "until": "7d"})
                    assert not result.is_error
                    return result.structured_content

            assert paths(anyio.run(tool)["hits"]) == older
        cli = CliRunner().invoke(main, ["search", "deploy window", "--until", "7d", "--json", "--port", str(port)])
        assert cli.exit_code == 0, cli.output
        assert paths(json.loads(cli.stdout)["hits"]) == older
        typo = CliRunner().invoke(main, ["search", "deploy", "--until", "last tuesday", "--port", str(port)])
        assert typo.exit_code == 2 and "until must be a duration" in typo.output
    finally:
        server.should_exit = True
        thread.join(30)


@pytest.mark.parametrize("endpoint,extra", [
    ("/search", ', "mode": "hybrid"'), ("/search", ', "mode": "dense"'), ("/search", ', "mode": "keyword"'),
    ("/recall", ""), ("/boot", ""),
])
def test_a_lone_surrogate_query_is_answered_not_a_500(api: TestClient, endpoint: str, extra: str) -> None:
    """JSON allows "\\ud800" (an unpaired UTF-16 surrogate); Python keeps it, the tokenizer cannot encode it."""
    body = '{"query": "disk \\ud800 ACME-4471"' + extra + '}'
    assert "\\ud800" in body
    response = api.post(endpoint, content=body.encode(), headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text

# -- optional re-ranking: temporal decay, MMR, and "nothing relevant" --------------------------------------------
def _hit(id_: str, score: float, path: str, text: str = "") -> Hit:
    return Hit(id_, score, Payload(path=path, text=text))


def test_temporal_decay_halves_a_daily_note_per_half_life_and_spares_evergreen_files() -> None:
    now = datetime(2026, 3, 31, tzinfo=UTC).timestamp()
    hits = [_hit("old", 1.0, "memory/2026-03-01.md"), _hit("new", 0.8, "memory/log/2026-03-31.md"),
            _hit("root", 0.9, "MEMORY.md"), _hit("topic", 0.7, "memory/projects/deploy.md")]
    out = {h.id: h.score for h in decay(hits, half_life_days=30, now_s=now)}
    assert out == {"old": 0.5, "new": 0.8, "root": 0.9, "topic": 0.7}
    assert [h.id for h in decay(hits, 30, now)] == ["root", "new", "topic", "old"]


def test_mmr_pushes_a_near_duplicate_below_a_different_hit() -> None:
    hits = [_hit("a", 3.0, "a.md", "deploy on tuesday mornings only"),
            _hit("a2", 2.9, "b.md", "deploy on tuesday mornings only please"),
            _hit("c", 2.6, "c.md", "the on-call rota lives in the wiki"),
            _hit("d", 1.0, "d.md", "lunch orders close at noon")]
    assert [h.id for h in mmr(hits, 0.7, 4)] == ["a", "c", "a2", "d"]
    assert [h.id for h in mmr(hits, 1.0, 4)] == ["a", "a2", "c", "d"]


def test_hits_carry_raw_scores_and_say_when_nothing_is_relevant(indexed) -> None:
    indexer, _ = indexed
    searcher = indexer.view.searcher()
    [hit] = searcher.search(SearchRequest(query="ACME-4471", k=1, mode="hybrid"))
    assert -1 <= hit["dense_score"] <= 1 and hit["keyword_score"] > 0
    [dense] = searcher.search(SearchRequest(query="ACME-4471", k=1, mode="dense"))
    assert dense["keyword_score"] is None and dense["dense_score"] == pytest.approx(dense["score"], abs=1e-5)
    [keyword] = searcher.search(SearchRequest(query="ACME-4471", k=1, mode="keyword"))
    assert searcher.answer(SearchRequest(query="ACME-4471", k=1, mode="keyword")).relevant is None  # no dense list


def _evidence(cosine=None, frequencies=None, terms=(), period=None, asked=None, dense=True):
    def weights():
        if asked is not None:
            asked.append("weights")
        return {t: idf((frequencies or {}).get(t, 0), 100) for t in terms}

    return Evidence(cosine, dense, weights, period)


def test_relevance_weighs_the_query_terms_by_how_rare_they_are_in_the_index(indexed) -> None:
    """One common word must not carry a question: "name" is in most notes, "cat" in none, so a hit holding "name"
    holds little of the question's weight (the share of terms said true: 1 of 2 reached relevance_coverage)."""
    indexer, _ = indexed
    terms = indexer.view.terms
    [cat, name] = [terms.query(word)[0][0] for word in ("cat", "name")]
    hit = Hit("a", 1.0, Payload(text="Name: Dana. Works as an SRE."))
    common = judge(hit, _evidence(0.30, {name: 80, cat: 0}, [cat, name]), terms, "what is my cat's name?", 0.42, 0.5)
    assert common.relevant is False and common.level == "low" and "'cat' not in the hit" in common.reason
    assert judge(hit, _evidence(0.30, {name: 1, cat: 80}, [cat, name]), terms, "cat name", 0.42, 0.5).relevant
    assert weighted_coverage({cat: idf(0, 100), name: idf(80, 100)}, {name}) < 0.2
    # Chinese is written without spaces: the missing word is named, not the whole question
    [user, tea] = [terms.query(word)[0][0] for word in ("用户", "茶")]
    hit = Hit("b", 1.0, Payload(text="用户喜欢咖啡。"))
    said = judge(hit, _evidence(0.30, {user: 80, tea: 0}, [user, tea]), terms, "用户喝什么茶", 0.42, 0.5)
    assert "'茶' not in the hit" in said.reason, said.reason


def test_relevance_levels_and_what_counts_as_evidence(indexed) -> None:
    indexer, _ = indexed
    terms = indexer.view.terms
    query = terms.query("disk outage")[0]
    holds = Hit("a", 1.0, Payload(text="The disk filled up.", context="Outage review"))
    asked: list[str] = []
    sure = judge(holds, _evidence(0.9, terms=query, asked=asked), terms, "disk outage", 0.42, 0.5)
    assert (sure.relevant, sure.level) == (True, "high") and sure.reason == "cosine 0.90 >= 0.42"
    assert asked == []  # close in meaning: no term looked up (the hot path)
    far = Hit("b", 1.0, Payload(text="Banana bread needs ripe bananas."))
    assert judge(far, _evidence(0.2), terms, "zzz", 0.42, 0.5) == (False, "none", "cosine 0.20 < 0.42")
    words = judge(holds, _evidence(0.2, terms=query), terms, "disk outage", 0.42, 0.5)
    assert (words.relevant, words.level) == (True, "medium") and "telling words 100%" in words.reason
    only = judge(holds, _evidence(None, terms=query, dense=False), terms, "disk outage", 0.42, 0.5)
    assert only.relevant is None and only.level == "medium"  # keyword only: no meaning to judge by
    assert judge(None, _evidence(0.9), terms, "disk outage", 0.42, 0.5) == NOTHING


def test_a_hit_dated_in_the_period_asked_answers_it_and_one_dated_outside_is_not_sure(indexed) -> None:
    """A question that names a period is answered by a hit dated in it, whatever its words; a hit dated outside it
    may tell of another time, so its cosine alone makes it "medium" at most (a transcript turn of another day said
    "high" on its cosine 0.64 alone)."""
    indexer, _ = indexed
    terms = indexer.view.terms
    week = (date(2026, 11, 23), date(2026, 11, 29))
    daily = Hit("a", 1.0, Payload(text="Lunch with Marco.", extra={"note_date": "2026-11-27"}))
    inside = judge(daily, _evidence(0.2, period=week), terms, "what happened last week?", 0.42, 0.5)
    assert (inside.relevant, inside.level) == (True, "medium") and "dated 2026-11-27, in the period" in inside.reason
    other = Hit("b", 1.0, Payload(text="We deployed the export job.", extra={"note_date": "2026-10-02"}))
    outside = judge(other, _evidence(0.64, period=week), terms, "what did we deploy last week?", 0.42, 0.5)
    assert (outside.relevant, outside.level) == (True, "medium"), outside
    assert "dated 2026-10-02, outside the period asked" in outside.reason
    undated = judge(Hit("c", 1.0, Payload(text="We deploy on Tuesdays.")), _evidence(0.64, period=week), terms,
                    "what did we deploy last week?", 0.42, 0.5)
    assert (undated.relevant, undated.level) == (True, "high")  # an undated note names no other time


def test_the_reason_names_a_missing_word_only_when_it_reads_as_a_word() -> None:
    from indexer.relevance import plain

    assert all(plain(w) for w in ("cat", "Seuss", "MSRV", "配送路线", "Müller"))
    assert not any(plain(w) for w in ("MIIEowIBAAKCAQEA", "ghp_Zx8Yw7Vu6Ts5", "AKIAZ4QXW7PLMNB3KJ5T", "hunter2",
                                      "ABCDEFGHIJKLMNOP"))


def test_held_terms_are_the_hits_context_and_text_as_the_index_tokenises_them(indexed) -> None:
    indexer, _ = indexed
    terms = indexer.view.terms
    hit = Hit("a", 1.0, Payload(text="The disk filled up on the batch host.", context="Outage review"))
    query = terms.query("disk outage Marco pages")[0]
    assert set(query) & held_terms(hit, terms) == {terms.query("disk")[0][0], terms.query("outage")[0][0]}
    assert not set(terms.query("banana bread")[0]) & held_terms(hit, terms)


DEMO = Path(__file__).resolve().parent.parent / "deploy" / "demo-workspace"


def test_the_demo_workspace_says_relevant_when_it_is_and_only_then(make_indexer) -> None:
    """On the shipped demo workspace: a question about something memory never mentions is not relevant although
    one of its words ("name") is in a note (it said true); "what happened yesterday?" as of the day after a daily
    note finds that note first and is relevant (it said false: no word of the question is in it)."""
    indexer = make_indexer([{"agent": "demo", "path": DEMO}])
    index_once(indexer)
    searcher = indexer.view.searcher()
    cat = searcher.answer(SearchRequest(query="what is my cat's name?"))
    assert cat.relevant is False and cat.relevance["level"] in ("low", "none"), cat.relevance
    assert "'cat'" in cat.relevance["reason"]
    yesterday = searcher.answer(SearchRequest(query="what happened yesterday?", as_of="2026-11-28"))
    assert yesterday.hits[0]["path"] == "memory/2026-11-27.md"
    assert yesterday.relevant is True and "2026-11-27" in yesterday.relevance["reason"], yesterday.relevance
    deploy = searcher.answer(SearchRequest(query="when can we deploy?"))
    assert deploy.relevant is True and deploy.relevance["level"] in ("high", "medium")


def test_relevant_does_not_depend_on_k(indexed) -> None:
    """The flag is judged on the whole candidate lists, so asking for fewer hits never flips it (it did: the best
    cosine among the returned hits, so k=1 could say false where k=2 said true)."""
    indexer, _ = indexed
    searcher = indexer.view.searcher()
    for query in ("when can we deploy?", "disk filled up", "ACME-4471", "recipe for banana bread"):
        flags = {searcher.answer(SearchRequest(query=query, k=k)).relevant for k in (1, 2, 6, 20)}
        assert len(flags) == 1, (query, flags)


def test_one_hit_gets_one_verdict_whatever_collections_the_request_selects(indexed) -> None:
    """The answer's verdict is its first hit's, on that hit's own evidence weighed over its agent's whole index:
    asking the root collection alone or every collection, the same first hit gets the same flag, level and reason
    (judged on the whole search, the selected collections' document frequencies weighed its words: 17 % of the
    telling words alone, 39 % with every collection, and a candidate of another collection could lend its cosine)."""
    indexer, _ = indexed
    searcher = indexer.view.searcher()
    for query in ("where does Dana live?", "does she like long answers?", "which city is the SRE in?"):
        alone = searcher.answer(SearchRequest(query=query, k=3, collection="memory-root-main"))
        every = searcher.answer(SearchRequest(query=query, k=3))
        assert alone.hits[0]["path"] == every.hits[0]["path"] == "MEMORY.md", query
        assert (alone.relevant, alone.relevance) == (every.relevant, every.relevance), query


def test_a_snippet_starts_at_the_lines_that_matched_not_at_the_title() -> None:
    lines = ["# Deploy windows", "", "We ship from the main branch.", "Builds take ten minutes.", "",
             "Rollbacks use the previous tag.", "", "Freeze: no deploys on Fridays.", "Ask Dana for an exception."]
    body, start, end = snippet("\n".join(lines), "freeze fridays", first_line=9)
    assert (start, end) == (16, 17) and body == "\n".join(lines[7:])
    # the line before, in the same paragraph, leads in; so does a heading right over the paragraph
    body, start, _ = snippet("\n".join(lines), "dana exception", first_line=9)
    assert start == 16 and body.startswith("Freeze")
    body, start, _ = snippet("\n".join(lines), "main branch", first_line=9)
    assert start == 9 and body.startswith("# Deploy windows")
    # no word in common (a dense-only hit): the chunk from its first line
    assert snippet("\n".join(lines), "zzz", first_line=9)[1] == 9


def test_a_hit_on_a_front_matter_note_shows_the_body_line_that_matched(make_indexer, tmp_path) -> None:
    ws = tmp_path / "ws"
    write(ws / "memory" / "deploys.md",
          "---\ntitle: Deploy windows\ntags: [ops]\n---\n\n# Deploy windows\n\nWe ship from the main branch.\n"
          "Builds take ten minutes.\n\nRollbacks use the previous tag.\n\nFreeze: no deploys on Fridays.\n")
    indexer = make_indexer([{"agent": "main", "path": ws}])
    index_once(indexer)
    [hit] = indexer.view.searcher().search(SearchRequest(query="freeze on fridays", k=1))
    assert (hit["start_line"], hit["snippet"]) == (13, "Freeze: no deploys on Fridays.")


# -- exact rare words in hybrid search ----------------------------------------------------------------------------
_ADJECTIVES = ("weekly", "quarterly", "shared", "team", "release", "security", "budget", "design", "hiring",
               "support", "travel", "vendor")
_NOUNS = ("review", "plan", "meeting", "report", "channel", "policy", "checklist", "calendar", "template", "board",
          "rota")
# 132 everyday memory notes that define things, so that a "what is ...?" question has 132 strong dense rivals and the
# dense list (100 deep) leaves out a note that only mentions a codeword in passing, as in a real workspace
GLOSSARY_NOTES = {f"{a}-{n}.md": f"# The {a} {n}\n\nWhat is the {a} {n}? It is where the team keeps track of {a} "
                                  f"work and decisions; Dana owns it.\n" for a in _ADJECTIVES for n in _NOUNS}
# notes a dense model finds close to "mirthwick" (its word pieces: mirth, wick), none holding the word itself
NEAR_NOTES = {
    "mirth.md": "# Mirth\n\nWhat is mirth? Mirth is cheerful laughter; the team retreat was full of it.\n",
    "wick.md": "# Candle wicks\n\nWhat is a wick? The cotton wick of a candle draws up the melted wax.\n",
    "wicker.md": "# Wicker\n\nWhat is wicker? Woven willow; the balcony chairs are wicker.\n",
    "mirthful.md": "# Mirthful evenings\n\nWhat is a mirthful evening? Board games and laughter at Dana's.\n",
    "wickets.md": "# Wickets\n\nWhat is a wicket? In cricket, the three stumps the bowler aims at.\n",
    "candles.md": "# Candles\n\nTrim the wick of the beeswax candles to 5 mm before lighting them.\n",
}
# the codeword sits in one sentence of a note about something else
GARDEN = ("# Garden\n\nThe tomatoes on the balcony need water every second evening in summer, more in a heatwave.\n"
          "Basil does better in the kitchen window than outside; pinch the flowers off so it keeps its leaves.\n"
          "The lemon tree comes inside in October and goes back out after the last frost in April.\n"
          "Slugs ate the lettuce twice last year: copper tape around the raised bed stopped them.\n"
          "Seeds for next spring: cherry tomatoes, runner beans, courgettes, chard and sweet peas.\n"
          "The shed's padlock hint is mirthwick.\n"
          "Compost goes in the green bin on Mondays; the brown bin is for garden cuttings only.\n"
          "The hose splitter leaks at the tap; a new washer is in the drawer with the string.\n"
          "Prune the roses in late February, above an outward-facing bud, and feed them in March.\n")


def test_a_rare_exact_word_ranks_first_in_hybrid_search(tmp_path: Path, make_indexer) -> None:
    """A word only one note holds gives a BM25 list of one hit; plain DBSF scores a lone hit 0.5 whatever its BM25
    score, below the best dense hits of a "what is ...?" question (about 1): here the note falls behind a dense
    rival, and in a 1,858-chunk vault, where the note is not in the dense list at all, out of the top 5 for 15 of
    44 codewords (``benchmarks/codewords.py``). With the candidates' true BM25 zeros in the statistics
    (``with_keyword_zeros``) the exact match ranks first."""
    ws = tmp_path / "ws"
    for name, text in {**GLOSSARY_NOTES, **NEAR_NOTES, "garden.md": GARDEN}.items():
        write(ws / "memory" / name, text)
    query, path = "what is mirthwick?", "memory/garden.md"
    indexer = make_indexer([{"agent": "main", "path": ws}])
    index_once(indexer)
    searcher = indexer.view.searcher(fusion="dbsf")
    assert _paths(searcher.search(SearchRequest(query=query, k=5, mode="keyword")))[:1] == [path]
    dense = dict(searcher.embed_query(query))["text"]
    lists = indexer.store.scores("memory-dir-main", Query(limit=100, dense={"text": dense},
                                                          sparse=indexer.terms.query(query)))
    plain = [str(pid) for pid, _ in fuse_scores(list(lists.values()), "dbsf", 60, 5)]  # Qdrant's DBSF as it is
    ours = searcher.retrieve(SearchRequest(query=query, k=5, mode="hybrid"))
    target = next(h.id for h in ours if h.payload.path == path)
    assert plain[0] != target  # the bug: plain DBSF puts a dense rival above the exact match
    assert ours[0].id == target


def test_numbers_are_keyword_terms(tmp_path: Path, make_indexer) -> None:
    """Qdrant's multilingual tokenizer drops a token of digits alone: "ZX-4471" and "ZX-9999" had the same terms,
    and "invoice 4471" searched as "invoice". A standalone number is a term of its own (``indexer.bm25.NUMBER``),
    a number inside a word stays part of it, and a note whose points carry the old terms is re-indexed once."""
    ws = tmp_path / "ws"
    write(ws / "memory" / "a.md", "# Tickets\n\nTicket ZX-4471: the export job ran out of disk.\n")
    write(ws / "memory" / "b.md", "# Tickets\n\nTicket ZX-9999: the export job ran out of disk.\n")
    write(ws / "memory" / "c.md", "# Invoices\n\nInvoice 4471 was paid on 2024-03-12; invoice 512 is overdue.\n")
    write(ws / "memory" / "d.md", "# Parts\n\nPart A4471 ships from the Lisbon depot.\n")
    indexer = make_indexer([{"agent": "main", "path": ws}])
    index_once(indexer)
    searcher = indexer.view.searcher()

    def keyword(query: str) -> list[str]:
        return _paths(searcher.search(SearchRequest(query=query, k=5, mode="keyword")))

    assert keyword("ZX-9999")[0] == "memory/b.md" and keyword("ZX-4471")[0] == "memory/a.md"
    assert sorted(keyword("4471")) == ["memory/a.md", "memory/c.md"]
    assert keyword("invoice 512") == ["memory/c.md"]
    assert keyword("2024-03-12") == ["memory/c.md"]
    assert keyword("A4471") == ["memory/d.md"]  # one word: its digits are not a number of their own


def test_a_store_with_the_old_keyword_terms_is_reindexed_once(tmp_path: Path, make_indexer, monkeypatch) -> None:
    """Points written before numbers were terms carry ``TERMS_VERSION`` 1 in their ``file_hash``: the next start
    re-indexes each file once (vectors from the embedding cache), and its numbers are then found."""
    ws = tmp_path / "ws"
    write(ws / "memory" / "c.md", "# Invoices\n\nInvoice 4471 was paid on 2024-03-12; invoice 512 is overdue.\n")
    write(ws / "memory" / "e.md", "# Errands\n\nBuy coffee beans and renew the passport.\n")
    with monkeypatch.context() as old:
        old.setattr(bm25, "TERMS_VERSION", 1)
        old.setattr(bm25.Bm25Terms, "_number_ids", lambda self, text: set())
        first = make_indexer([{"agent": "main", "path": ws}])
        index_once(first)
        assert _paths(first.view.searcher().search(SearchRequest(query="4471", k=5, mode="keyword"))) == []
        first.store.close()
    second = make_indexer([{"agent": "main", "path": ws}])
    status = index_once(second)
    assert status["cache_hits"] == 2 and status["chunks_embedded"] == 0  # re-indexed; vectors cached
    hits = second.view.searcher().search(SearchRequest(query="4471", k=5, mode="keyword"))
    assert _paths(hits) == ["memory/c.md"]
    assert {h.file_hash.split("+")[2] for h in second.store.scroll("memory-dir-main", ["file_hash"])} == {
        f"terms{bm25.TERMS_VERSION}"}
    second.store.close()
    third = make_indexer([{"agent": "main", "path": ws}])
    status = index_once(third)
    assert status["cache_hits"] == 0 and status["chunks_embedded"] == 0, "re-indexed once, then unchanged"


def test_a_bad_query_vector_answers_from_keyword_search_and_says_why(indexed) -> None:
    indexer, _ = indexed
    real = indexer.view.registry.embedders["text"]

    class NaNQueries:  # fault injection: the real embedder, whose query vectors come back NaN
        def __getattr__(self, name: str):
            return getattr(real, name)

        def embed_query(self, text: str):
            return np.full(real.dim, np.nan, dtype=np.float32)

    searcher = indexer.view.searcher()
    searcher.embedders = {"text": NaNQueries()}
    answer = searcher.answer(SearchRequest(query="ACME-4471", k=3))
    assert answer.hits[0]["path"] == "memory/tickets.md"
    assert answer.degraded and answer.degraded[0].startswith("keyword only: bad answer: text embedder answered NaN")
    assert answer.relevant is None  # judged by nothing: no dense list
