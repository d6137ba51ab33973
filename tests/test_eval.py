"""The evaluation harness (benchmarks.eval): its metrics against hand-computed values, and one run on a tiny BEIR-format
corpus written into tmp_path (never ../shared)."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

from benchmarks import eval as ev
from indexer.chunking import chunk_text


def test_ndcg_matches_hand_computed_values() -> None:
    gains = {"a": 1, "b": 1}
    assert ev.ndcg_at_k(["a", "b", "x"], gains) == pytest.approx(1.0)
    # one relevant at rank 2 of two relevant: (1/log2(3)) / (1 + 1/log2(3))
    expected = (1 / math.log2(3)) / (1 + 1 / math.log2(3))
    assert ev.ndcg_at_k(["x", "a"], gains) == pytest.approx(expected)
    assert ev.ndcg_at_k(["x"] * 10 + ["a"], gains, k=10) == 0.0
    assert ev.ndcg_at_k(["a"], {}) == 0.0


def test_ndcg_uses_graded_gains_and_the_ideal_order() -> None:
    gains = {"a": 2, "b": 1}
    dcg = 1 + 2 / math.log2(3)  # b first, then a
    idcg = 2 + 1 / math.log2(3)
    assert ev.ndcg_at_k(["b", "a"], gains) == pytest.approx(dcg / idcg)


def test_recall_and_dedupe() -> None:
    assert ev.recall_at_k(["a", "x", "b"], {"a": 1, "b": 1, "c": 1}, k=2) == pytest.approx(1 / 3)
    assert ev.recall_at_k(["a"], {"a": 0}) == 0.0
    assert ev.dedupe(["d1", "d2", "d1", "d3", "d2"]) == ["d1", "d2", "d3"]


def _beir(folder: Path) -> Path:
    docs = [
        ("d1", "Coffee", "The user drinks a flat white without sugar every morning."),
        ("d2", "Deploys", "Deploy windows are Tuesday and Thursday mornings. No deploys on Fridays."),
        ("d3", "Travel", "Flights to Lisbon are booked for March with a window seat."),
        ("d4", "Incidents", "The export job ran out of disk on batch-02 during the night."),
        ("d5", "Garden", "Tomatoes need watering twice a week in summer."),
    ]
    folder.mkdir(parents=True)
    with gzip.open(folder / "corpus.jsonl.gz", "wt", encoding="utf-8") as handle:
        for doc_id, title, text in docs:
            handle.write(json.dumps({"_id": doc_id, "title": title, "text": text, "metadata": {}}) + "\n")
    queries = [("q1", "what coffee does the user drink"), ("q2", "when can we deploy"),
               ("q3", "disk full export job"), ("q9", "a query of the other split")]
    (folder / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in queries))
    (folder / "qrels").mkdir()
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\nq3\td4\t1\n")
    return folder


def test_load_scifact_reads_a_beir_folder(tmp_path: Path) -> None:
    data = ev.load_scifact(_beir(tmp_path / "scifact"), "test")
    assert len(data.corpus) == 5 and data.corpus["d1"][0] == "Coffee"
    assert set(data.queries) == {"q1", "q2", "q3"}  # only queries with qrels in the split
    assert data.qrels["q2"] == {"d2": 1}


def test_missing_data_is_a_clear_error_and_exit_status_2(tmp_path: Path, capsys) -> None:
    with pytest.raises(ev.DataMissing, match="not found"):
        ev.load_scifact(tmp_path / "nowhere")
    (tmp_path / "partial").mkdir()
    with pytest.raises(ev.DataMissing, match="corpus"):
        ev.load_scifact(tmp_path / "partial")
    assert ev.main(["--data", str(tmp_path / "nowhere"), "--state", str(tmp_path / "state")]) == 2
    assert "SciFact data folder not found" in capsys.readouterr().err


def test_workspace_is_rewritten_only_where_content_changed(tmp_path: Path) -> None:
    corpus = {"d1": ("Title", "Body one."), "d2": ("", "Body two.")}
    assert ev.write_workspace(corpus, tmp_path / "ws") == 2
    assert (tmp_path / "ws" / "memory" / "d1.md").read_text() == "# Title\n\nBody one.\n"
    assert ev.write_workspace(corpus, tmp_path / "ws") == 0
    assert ev.write_workspace({"d1": ("Title", "Changed.")}, tmp_path / "ws") == 1
    assert sorted(p.name for p in (tmp_path / "ws" / "memory").iterdir()) == ["d1.md"]


def test_a_title_stays_with_the_start_of_a_long_paragraph() -> None:
    # a toy tokenizer (one token per word) keeps this independent of the model
    def words(text: str) -> list[tuple[int, int]]:
        import re

        return [m.span() for m in re.finditer(r"\S+", text)]

    paragraph = " ".join(f"Sentence {i} has five words." for i in range(40))  # 200 tokens, one line
    chunks = chunk_text(f"# A title\n\n{paragraph}\n", words, max_tokens=60, overlap_tokens=12)
    assert chunks[0].text.startswith("# A title\n\nSentence 0")
    assert all(c.n_tokens <= 60 for c in chunks)
    for before, after in zip(chunks, chunks[1:]):
        assert after.text.split(".")[0] in before.text, "consecutive chunks share a sentence"
        assert after.text.startswith("Sentence"), "chunks start at a sentence"


@pytest.mark.slow
def test_the_harness_scores_every_method_through_the_product(tmp_path: Path, registry) -> None:
    data = ev.load_scifact(_beir(tmp_path / "scifact"), "test")
    run = ev.evaluate(data, tmp_path / "eval", registry, prefetch=10)
    results = run["results"]
    assert {"dense", "keyword (Qdrant BM25)", "hybrid rrf", "hybrid dbsf", "bm25s"} <= set(results)
    assert run["index"]["files"] == 5 and run["index"]["chunks_embedded"] == 5
    for label in ("dense", "hybrid rrf", "hybrid dbsf"):
        assert results[label]["queries"] == 3
        assert results[label]["ndcg@10"] > 0.6, label  # these queries are easy
        assert results[label]["recall@100"] == 1.0
    again = ev.evaluate(data, tmp_path / "eval", registry, prefetch=10)
    assert again["index"]["chunks_embedded"] == 0  # the index and the embedding cache are reused
    assert again["results"]["hybrid dbsf"]["ndcg@10"] == pytest.approx(results["hybrid dbsf"]["ndcg@10"])


def test_overlap_is_a_markdown_extractor_setting(tmp_path: Path) -> None:
    from indexer.builtin.markdown import MarkdownExtractor
    from indexer.testing import check_extractor, whitespace_context

    paragraph = " ".join(f"Sentence {i} has five words." for i in range(40))
    note = tmp_path / "long.md"
    note.write_text(f"# A title\n\n{paragraph}\n")
    context = whitespace_context(60)
    plain = check_extractor(MarkdownExtractor({"overlap_ratio": 0.0}), note, "markdown", context)
    overlapping = check_extractor(MarkdownExtractor({"overlap_ratio": 0.2}), note, "markdown", context)
    assert sum(len(c.text.split()) for c in plain) == len(note.read_text().split())  # no word repeated
    assert sum(len(c.text.split()) for c in overlapping) > sum(len(c.text.split()) for c in plain)  # overlap
    assert overlapping == check_extractor(MarkdownExtractor({}), note, "markdown", context)  # 0.2 is the default
    with pytest.raises(ValueError, match="overlap_ratio"):
        MarkdownExtractor({"overlap_ratio": 1.5})


def test_a_sample_keeps_each_query_with_its_relevant_documents(tmp_path: Path) -> None:
    data = ev.sample(ev.load_scifact(_beir(tmp_path / "scifact"), "test"), 2)
    assert list(data.queries) == ["q1", "q2"] and set(data.qrels) == {"q1", "q2"}
    assert {"d1", "d2"} <= set(data.corpus)


def test_bm25_variants_are_product_settings() -> None:
    assert ev.bm25_variant("default") == ev.bm25_variant("default").model_copy()
    assert ev.bm25_variant("nostem").stemmer is False
    assert ev.bm25_variant("word").tokenizer == "word"
    assert ev.bm25_variant("avglen100").avg_len == 100.0
