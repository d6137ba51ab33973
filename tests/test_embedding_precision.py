"""Text-embedding precision: the ``auto`` chooser per CPU flags, the int8 (ONNX Runtime) path against fp32, its
cached export, and the fallback to fp32 when the export fails. Real model, real ONNX export, files in tmp_path."""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from structlog.testing import capture_logs

import indexer.builtin.onnx_models
from indexer.builtin.embedding import SentenceTransformerEmbedder
from indexer.builtin.onnx_models import QUERY_FORMAT, export_int8, int8_dir
from indexer.builtin.onnx_runtime import INT8_MIN_COSINE, OnnxQueryEncoder
from indexer.builtin.text_model import (
    DEFAULT_MODEL,
    PRECISIONS,
    choose_precision,
    cpu_flags,
    int8_available,
    resolve_model,
)
from indexer.config import Settings
from indexer.config_load import load_settings
from indexer.errors import ConfigError
from indexer.model_loading import load_sentence_transformer

SENTENCES = [
    "Deploy windows are Tuesday and Thursday mornings; no deploys on Fridays.",
    "The export job ran out of disk on batch-02 during the nightly run.",
    "The user drinks a flat white without sugar.",
    "Vitamin D supplementation did not reduce fractures in older adults.",
]
AVX2_ONLY = {"fpu", "sse4_2", "avx", "avx2", "fma"}
AVX512_NO_BF16 = AVX2_ONLY | {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"}


@pytest.mark.parametrize(
    ("flags", "int8_ok", "expected"),
    [
        (AVX512_NO_BF16 | {"avx512_bf16"}, True, "bf16"),  # e.g. AMD Zen 4, Intel Cooper Lake
        (AVX2_ONLY | {"amx_bf16", "amx_tile"}, False, "bf16"),  # e.g. Intel Sapphire Rapids
        (AVX512_NO_BF16, True, "int8"),  # e.g. Intel Ice Lake server
        (AVX2_ONLY, True, "int8"),  # e.g. AMD Zen 2/3
        (AVX2_ONLY, False, "fp32"),  # ONNX Runtime not installed
        (set(), False, "fp32"),  # flags unreadable
    ],
)
def test_auto_picks_by_cpu_flags(flags: set[str], int8_ok: bool, expected: str) -> None:
    assert choose_precision("auto", "cpu", flags, int8_ok) == expected


def test_explicit_precision_and_other_devices() -> None:
    for precision in ("fp32", "bf16", "int8"):
        assert choose_precision(precision, "cpu", AVX2_ONLY, True) == precision
    assert choose_precision("auto", "cuda", AVX512_NO_BF16 | {"avx512_bf16"}, True) == "fp32"
    with pytest.raises(ValueError, match="precision must be one of"):
        choose_precision("fp16", "cpu", AVX2_ONLY, True)


def test_cpu_flags_read_from_this_machine() -> None:
    flags = cpu_flags()
    if Path("/proc/cpuinfo").exists():
        assert "fpu" in flags  # every x86 and most Linux CPU flag lines carry it
    assert SentenceTransformerEmbedder({"precision": "auto"}).precision == choose_precision(
        "auto", "cpu", flags, int8_available())


def test_precision_setting_validated(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("QMD_INDEXER_PRECISION", raising=False)  # the session's, when forced (conftest)
    assert Settings().precision == "auto"
    assert Settings(precision="int8").precision == "int8"
    config = tmp_path / "config.toml"
    config.write_text('precision = "fp16"\n')
    with pytest.raises(ConfigError, match="precision"):
        load_settings(config)


@pytest.mark.slow
@pytest.mark.skipif(not int8_available(), reason="onnxruntime/onnx (the int8 extra) not installed")
def test_int8_close_to_fp32_and_export_reused(tmp_path: Path) -> None:
    cache = tmp_path / "models"
    fp32 = SentenceTransformerEmbedder({"precision": "fp32"})
    with capture_logs() as first_logs:
        int8 = SentenceTransformerEmbedder({"precision": "int8", "cache_dir": str(cache)})
        vectors = int8.embed_query(SENTENCES[0]), int8.encode(SENTENCES)
    assert int8.precision == "int8"
    assert [e["event"] for e in first_logs if e["event"] != "model_loading"] == ["int8_exported",
                                                                                 "query_model_exported"]
    query, batch = vectors
    assert batch.shape == (len(SENTENCES), 384) and batch.dtype == np.float32
    assert query.shape == (384,) and query.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(batch, axis=1), 1.0, atol=1e-5)
    cosines = np.sum(batch * fp32.encode(SENTENCES), axis=1)
    assert cosines.min() > 0.98, cosines
    # queries run on their own model (fused, more of it int8): close to the chunk's vector, not equal
    assert float(query @ batch[0]) > 0.98
    assert float(query @ fp32.embed_query(SENTENCES[0])) > 0.98

    ids = {fp32.model_id, int8.model_id, SentenceTransformerEmbedder({"precision": "bf16"}).model_id}
    assert len(ids) == 3  # int8 vectors never share an embedding-cache key with fp32 or bf16 ones

    (export,) = cache.iterdir()  # one finished export, no temporary folder left behind
    query_file = f"query-v{QUERY_FORMAT}.onnx"
    assert sorted(p.name for p in export.iterdir()) == ["model.onnx", "quality.json", f"query-v{QUERY_FORMAT}.json",
                                                        query_file, f"query-v{QUERY_FORMAT}.tokenizer.json"]
    before = (export / "model.onnx").stat()
    with capture_logs() as second_logs:
        again = SentenceTransformerEmbedder({"precision": "int8", "cache_dir": str(cache)})
        np.testing.assert_allclose(again.encode(SENTENCES), batch, atol=1e-6)
        np.testing.assert_allclose(again.embed_query(SENTENCES[0]), query, atol=1e-6)
    # from the cache: no second export (chunks on the export's own file, before any load)
    assert [e["event"] for e in second_logs if e["event"] != "model_loading"] == ["document_model_opened",
                                                                                  "query_model_opened"]
    assert again.model_id == int8.model_id
    assert [p.name for p in cache.iterdir()] == [export.name]
    assert (export / "model.onnx").stat().st_mtime_ns == before.st_mtime_ns
    assert again._query_encoder is not None and again._query_encoder.path == export / query_file


@pytest.mark.slow
@pytest.mark.skipif(not int8_available(), reason="onnxruntime/onnx (the int8 extra) not installed")
def test_failed_export_falls_back_to_fp32(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the model cache should be\n")
    with capture_logs() as logs:
        embedder = SentenceTransformerEmbedder({"precision": "int8", "cache_dir": str(blocker / "models")})
        vectors = embedder.encode(SENTENCES)
    assert embedder.precision == "fp32"
    assert embedder.model_id == SentenceTransformerEmbedder({"precision": "fp32"}).model_id
    assert vectors.shape == (len(SENTENCES), 384)
    # the same unusable folder leaves fp32 queries on the model's own modules, said once too
    assert [(e["event"], e["log_level"], e["fallback"]) for e in logs if e["event"] != "model_loading"] == [
        ("int8_unavailable", "warning", "fp32"), ("query_model_unavailable", "warning", "the model's modules")]


def test_status_says_which_precision(make_indexer, workspace: Path) -> None:
    indexer = make_indexer([{"agent": "main", "path": workspace}])
    text = indexer.registry.embedders["text"]
    assert text.model is not None  # loaded, as the daemon's worker does before it is ready
    embedding = indexer.view.status()["embedding"]
    assert embedding == {"model_id": text.model_id, "precision": text.precision, "query_file": text.query_file,
                         "relevance_floor": f"{text.relevance_floor:.2f} (model)"}
    assert embedding["precision"] in PRECISIONS and embedding["precision"] != "auto"
    # the ONNX file single queries run on (query-v<QUERY_FORMAT>.onnx; with int8 model.onnx where it is unavailable)
    assert (embedding["query_file"] is None) == (not OnnxQueryEncoder.supports(text.model))


def test_encode_batches_texts_of_similar_length_and_keeps_their_order(registry, monkeypatch) -> None:
    """The model gets batches of similar length, longest first (a batch is padded to its longest text: in document
    order, short chunks padded to a long one cost ~20% more CPU a chunk), and the vectors come back in the order of
    the texts: each is the text's own embedding (the nearest of those embedded alone)."""
    embedder = registry.embedders["text"]
    texts = ["short one", "a much longer text " * 12, "mid length text here " * 3, "tiny", "another long text " * 10,
             "medium sized text " * 4]
    alone = np.stack([embedder.encode([t])[0] for t in texts])
    batches: list[list[str]] = []
    model_encode = embedder.model.encode
    monkeypatch.setattr(embedder.model, "encode", lambda batch, **kw: batches.append(list(batch)) or
                        model_encode(batch, **kw))
    monkeypatch.setattr(embedder, "batch_size", 2)
    together = embedder.encode(texts)
    lengths = [[len(t) for t in batch] for batch in batches]
    assert lengths == [sorted((len(t) for t in texts), reverse=True)[i : i + 2] for i in range(0, 6, 2)]
    assert together.shape == (6, embedder.dim)
    similarity = together @ alone.T  # int8 quantizes activations per batch: a text's vector moves with its batch
    assert list(similarity.argmax(axis=1)) == list(range(6)) and similarity.diagonal().min() > 0.98


def test_a_query_embeds_to_the_vector_encode_gives_it(registry, monkeypatch) -> None:
    """Without a query model, ``embed_query`` runs the model's modules without ``encode``'s bookkeeping: same
    vector, truncation included; a model with a default prompt goes through ``encode``, which prepends it."""
    embedder = registry.embedders["text"]
    monkeypatch.setattr(embedder, "_query_encoder", None)
    for text in (SENTENCES[0], "ok", "deploy window " * 300):  # the last is past the model's 256 word pieces
        query = embedder.embed_query(text)
        assert query.shape == (embedder.dim,) and query.dtype == np.float32
        np.testing.assert_allclose(query, embedder.encode([text])[0], atol=1e-6)
    plain = embedder.embed_query(SENTENCES[0])
    monkeypatch.setattr(embedder.model, "prompts", {"query": "query: "})
    monkeypatch.setattr(embedder.model, "default_prompt_name", "query")
    prompted = embedder.embed_query(SENTENCES[0])
    np.testing.assert_allclose(prompted, embedder.encode([SENTENCES[0]])[0], atol=1e-6)
    assert float(prompted @ plain) < 0.999  # the prompt was applied


@pytest.fixture(scope="module")
def fp32_embedder(tmp_path_factory: pytest.TempPathFactory) -> SentenceTransformerEmbedder:
    """An fp32 embedder, loaded, its query model exported into a temporary folder."""
    if not int8_available():
        pytest.skip("onnxruntime/onnx not installed: queries run on the model's own modules")
    embedder = SentenceTransformerEmbedder({"precision": "fp32", "cache_dir": str(tmp_path_factory.mktemp("models"))})
    embedder.embed_query("warm-up")  # loads the model, which exports its query model
    return embedder


def test_fp32_and_bf16_queries_run_on_a_query_model_that_gives_the_fp32_vector(fp32_embedder) -> None:
    """fp32 queries run on their own ONNX model, fused (attention and layer norms as one node each: fewer nodes for
    a short text), ``encode``'s vector within float rounding (truncation included); bf16 chunks share it, so their
    queries get the fp32 vector too."""
    assert fp32_embedder.query_file == f"query-v{QUERY_FORMAT}.onnx"
    assert fp32_embedder._query_encoder is not None
    record = json.loads(fp32_embedder._query_encoder.path.with_suffix(".json").read_text(encoding="utf-8"))
    assert not record["quantized"] and record["fusions"].get("Attention", 0) >= 1
    import onnx  # installed where the fixture did not skip (``int8_available``)

    ops = {node.op_type for node in onnx.load(str(fp32_embedder._query_encoder.path)).graph.node}
    assert "Attention" in ops and "SkipLayerNormalization" in ops
    for text in QUERIES:
        np.testing.assert_allclose(fp32_embedder.embed_query(text), fp32_embedder.encode([text])[0], atol=2e-5)
    bf16 = SentenceTransformerEmbedder({"precision": "bf16", "cache_dir": str(fp32_embedder.cache_dir)})
    assert bf16.open_query_model() and bf16.query_file == fp32_embedder.query_file
    assert bf16._query_encoder is not None and fp32_embedder._query_encoder is not None
    assert bf16._query_encoder.path == fp32_embedder._query_encoder.path


# Opens the query model saved in argv[1] with torch and sentence-transformers made unimportable, embeds the texts
# of argv[2] (JSON) as queries and as chunks (the document model), and prints {"opened", "vectors", "documents",
# "chunks", "offsets", "loaded"} as JSON.
_WITHOUT_TORCH = """
import json, sys
sys.modules["torch"] = None  # any import of torch now raises ImportError
sys.modules["sentence_transformers"] = None
from indexer.builtin.embedding import SentenceTransformerEmbedder
embedder = SentenceTransformerEmbedder({"precision": "fp32", "cache_dir": sys.argv[1]})
opened = embedder.open_query_model()
texts = json.loads(sys.argv[2])
vectors = [embedder.embed_query(text).tolist() for text in texts]
documents = embedder.open_document_model()
chunks, offsets = embedder.encode(texts).tolist(), embedder.token_offsets(texts[0])
print(json.dumps({"opened": opened, "vectors": vectors, "documents": documents, "chunks": chunks, "offsets": offsets,
                  "loaded": embedder._model.loaded}))
"""


def test_a_saved_query_model_answers_queries_without_torch(fp32_embedder) -> None:
    """At a restart the query model an earlier load saved opens with ONNX Runtime and ``tokenizers`` alone (torch
    cannot even be imported here) and gives the same vectors as the loaded model's queries: a restart answers
    queries in full before ``import sentence_transformers`` is done."""
    done = subprocess.run([sys.executable, "-c", _WITHOUT_TORCH, str(fp32_embedder.cache_dir), json.dumps(QUERIES)],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["opened"] and answer["documents"] and not answer["loaded"]
    for text, vector in zip(QUERIES, answer["vectors"]):
        np.testing.assert_allclose(np.array(vector, dtype=np.float32), fp32_embedder.embed_query(text), atol=1e-6)
    # chunks too (a note saved while the model loads): the model's vectors and token offsets, without torch
    np.testing.assert_allclose(np.array(answer["chunks"], dtype=np.float32), fp32_embedder.encode(QUERIES), atol=2e-5)
    assert [tuple(o) for o in answer["offsets"]] == fp32_embedder.token_offsets(QUERIES[0])


@pytest.mark.parametrize("damage", ["truncated model", "empty record"])
def test_a_damaged_query_model_is_exported_again(fp32_embedder, tmp_path: Path, damage: str) -> None:
    """A saved query model ONNX Runtime cannot read (a truncated copy, a disk error), or a quality record cut
    short (a full disk), is exported again by the load, not left to fail every start or to fail the load."""
    cache = tmp_path / "models"
    shutil.copytree(fp32_embedder.cache_dir, cache)
    assert fp32_embedder._query_encoder is not None
    saved = cache / fp32_embedder._query_encoder.path.relative_to(fp32_embedder.cache_dir)
    if damage == "truncated model":
        saved.write_bytes(saved.read_bytes()[:5000])
    else:
        saved.with_suffix(".json").write_text("")
    again = SentenceTransformerEmbedder({"precision": "fp32", "cache_dir": str(cache)})
    with capture_logs() as logs:
        assert not again.open_query_model()
        vector = again.embed_query(QUERIES[0])  # loads the model, which exports the query model again
    said = ["query_model_unreadable"] if damage == "truncated model" else []
    assert [e["event"] for e in logs if e["event"] != "model_loading"] == [*said, "query_model_exported"]
    assert again.query_file == saved.name and saved.stat().st_size > 5000
    assert json.loads(saved.with_suffix(".json").read_text())["passed"]
    np.testing.assert_allclose(vector, fp32_embedder.embed_query(QUERIES[0]), atol=1e-6)


def test_an_export_of_this_query_format_deletes_the_query_models_of_older_formats(fp32_embedder,
                                                                                   tmp_path: Path) -> None:
    """Once a new ``QUERY_FORMAT``'s export has passed, the query models of older formats beside it (about 90 MB
    each, which nothing opens any more) are deleted; other files of the folder, and the new model, stay."""
    cache = tmp_path / "models"
    shutil.copytree(fp32_embedder.cache_dir, cache)
    assert fp32_embedder._query_encoder is not None
    saved = cache / fp32_embedder._query_encoder.path.relative_to(fp32_embedder.cache_dir)
    saved.with_suffix(".json").write_text("")  # unreadable record: the load exports this format again
    older = [f"query-v{n}{suffix}" for n in range(1, QUERY_FORMAT) for suffix in (".onnx", ".json", ".tokenizer.json")]
    kept = ["model.onnx", "query-v2.onnx.bak", f"query-v{QUERY_FORMAT + 1}.onnx"]
    for name in older + kept:
        (saved.parent / name).write_bytes(b"x")
    again = SentenceTransformerEmbedder({"precision": "fp32", "cache_dir": str(cache)})
    with capture_logs() as logs:
        again.embed_query(QUERIES[0])  # loads the model, which exports the query model again
    left = {p.name for p in saved.parent.iterdir()}
    assert not left & set(older) and set(kept) <= left and saved.name in left
    assert [e["files"] for e in logs if e["event"] == "query_model_dropped"] == [sorted(older)]


@pytest.fixture(scope="module")
def int8_embedder(tmp_path_factory: pytest.TempPathFactory) -> SentenceTransformerEmbedder:
    """An int8 embedder whatever this CPU's ``auto`` would pick, exported into a temporary folder."""
    if not int8_available():
        pytest.skip("onnxruntime/onnx (the int8 extra) not installed")
    embedder = SentenceTransformerEmbedder({"precision": "int8", "cache_dir": str(tmp_path_factory.mktemp("models"))})
    assert embedder.precision == "int8"
    return embedder


QUERIES = [SENTENCES[0], "ok", "  leading and trailing spaces  ", "Grüße aus Köln: 東京の天気は?",
           "deploy window " * 300]  # the last is past the model's 256 word pieces


@pytest.mark.slow
@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_the_query_encoder_gives_the_vector_encode_gives_on_the_same_onnx_file(int8_embedder, pooling: str,
                                                                                 monkeypatch) -> None:
    """``OnnxQueryEncoder`` reproduces the model's tokenizer, truncation and pooling: on the chunks' own ONNX file
    it gives ``encode``'s vector."""
    model = int8_embedder.model
    monkeypatch.setattr(model[1], "pooling_mode", pooling)
    chunks_model = int8_dir(int8_embedder.cache_dir, int8_embedder.base_id, int8_embedder.fingerprint) / "model.onnx"
    encoder = OnnxQueryEncoder.for_model(chunks_model, model, threads=1)
    vectors = [encoder(text) for text in QUERIES]
    for text, vector in zip(QUERIES, vectors):
        assert vector.shape == (384,) and vector.dtype == np.float32
        np.testing.assert_allclose(vector, int8_embedder.encode([text])[0], atol=1e-5)
    if pooling == "cls":  # the pooling was applied: the first token's state is not the mean
        monkeypatch.setattr(model[1], "pooling_mode", "mean")
        assert float(vectors[0] @ OnnxQueryEncoder.for_model(chunks_model, model, threads=1)(QUERIES[0])) < 0.99


def test_the_query_encoder_takes_only_models_it_reproduces(registry, monkeypatch) -> None:
    model = registry.embedders["text"].model
    assert OnnxQueryEncoder.supports(model)
    monkeypatch.setattr(model[1], "pooling_mode", "max")
    assert not OnnxQueryEncoder.supports(model)
    monkeypatch.setattr(model[1], "pooling_mode", "mean")
    monkeypatch.setattr(model[0], "do_lower_case", True)
    assert not OnnxQueryEncoder.supports(model)
    monkeypatch.setattr(model[0], "do_lower_case", False)
    monkeypatch.setattr(model, "default_prompt_name", "query")  # ``encode`` prepends it: queries go through it
    assert not OnnxQueryEncoder.supports(model)


@pytest.mark.slow
def test_int8_queries_run_on_their_own_model_and_wait_for_no_batch(int8_embedder) -> None:
    """The query model (``export_query``) gives vectors near the chunks': each query's nearest chunk is its
    own text. Its tokenizer and session are its own, so a query completes while a batch holds the model."""
    encoder = int8_embedder._query_encoder
    assert encoder is not None and encoder.path.name == f"query-v{QUERY_FORMAT}.onnx"
    chunks = int8_embedder.encode(QUERIES)
    queries = np.stack([int8_embedder.embed_query(text) for text in QUERIES])
    similarity = queries @ chunks.T
    assert list(similarity.argmax(axis=1)) == list(range(len(QUERIES)))
    assert similarity.diagonal().min() > 0.94, similarity.diagonal()  # "ok" is the farthest: 0.95
    with int8_embedder._use:  # as a batch of chunks does while it runs
        done = concurrent.futures.ThreadPoolExecutor(1).submit(int8_embedder.embed_query, "deploy windows")
        np.testing.assert_allclose(done.result(timeout=30), int8_embedder.embed_query("deploy windows"), atol=1e-6)


@pytest.mark.slow
def test_a_query_model_deleted_by_hand_is_exported_again(int8_embedder, tmp_path: Path) -> None:
    """A passing record whose ``query-v<format>.onnx`` is gone does not leave queries on the chunks' model
    silently: the file is exported again, with a warning saying so."""
    assert int8_embedder.model is not None  # exported by now
    cache = tmp_path / "models"
    shutil.copytree(int8_embedder.cache_dir, cache)
    query_file = int8_dir(cache, int8_embedder.base_id, int8_embedder.fingerprint) / f"query-v{QUERY_FORMAT}.onnx"
    query_file.unlink()
    with capture_logs() as logs:
        again = SentenceTransformerEmbedder({"precision": "int8", "cache_dir": str(cache)})
        vector = again.embed_query(SENTENCES[0])
    events = [e["event"] for e in logs if e["event"] != "model_loading"]
    assert events == ["query_model_missing", "query_model_exported"]
    assert query_file.exists() and again._query_encoder is not None and again._query_encoder.path == query_file
    assert float(vector @ int8_embedder.embed_query(SENTENCES[0])) > 0.9999


@pytest.mark.slow
def test_a_query_model_under_the_quality_bar_leaves_queries_on_the_chunks_model(int8_embedder, monkeypatch) -> None:
    """A query model whose probe cosine is under ``INT8_MIN_COSINE`` is not used (one warning); nor is one whose
    export raised, and that failure is recorded, not retried at every start."""
    cache = int8_embedder.cache_dir
    export = int8_dir(cache, int8_embedder.base_id, int8_embedder.fingerprint)
    record = export / f"query-v{QUERY_FORMAT}.json"
    quality = json.loads(record.read_text())
    assert quality["passed"] and quality["mean_cosine"] >= INT8_MIN_COSINE
    record.write_text(json.dumps({**quality, "mean_cosine": 0.95}))  # as an export under the bar would leave it
    with capture_logs() as logs:
        strict = SentenceTransformerEmbedder({"precision": "int8", "cache_dir": str(cache)})
        assert strict.model_id == int8_embedder.model_id  # the chunks' int8 passed: its record says so unloaded
        assert strict.model is not None
    assert strict._query_encoder is not None and strict._query_encoder.path == export / "model.onnx"
    said = [e for e in logs if e["event"] != "model_loading"]
    assert [(e["event"], e["log_level"]) for e in said] == [("query_model_unavailable", "warning")]
    assert "quality check failed" in said[0]["error"]

    for name in (f"query-v{QUERY_FORMAT}.onnx", f"query-v{QUERY_FORMAT}.json", f"query-v{QUERY_FORMAT}.tokenizer.json"):
        (export / name).unlink()

    def trace_fails(model: Any, path: Path) -> None:
        raise RuntimeError("no space left for the trace")

    monkeypatch.setattr(indexer.builtin.onnx_models, "trace_fp32", trace_fails)
    for _ in range(2):  # the second start reads the recorded failure
        with capture_logs() as logs:
            fallback = SentenceTransformerEmbedder({"precision": "int8", "cache_dir": str(cache)})
            np.testing.assert_allclose(fallback.embed_query(SENTENCES[0]), fallback.encode(SENTENCES[:1])[0],
                                       atol=1e-5)
        assert fallback._query_encoder is not None and fallback._query_encoder.path == export / "model.onnx"
        assert [(e["event"], e["error"]) for e in logs if e["event"] != "model_loading"] == [
            ("query_model_unavailable", "RuntimeError: no space left for the trace")]
    assert sorted(p.name for p in export.iterdir()) == ["model.onnx", "quality.json", f"query-v{QUERY_FORMAT}.json"]


@pytest.mark.slow
@pytest.mark.skipif(not int8_available(), reason="onnxruntime/onnx (the int8 extra) not installed")
def test_int8_export_traces_eager_attention_and_leaves_the_fp32_model_as_it_was(tmp_path: Path) -> None:
    import onnx

    model = load_sentence_transformer(resolve_model(DEFAULT_MODEL)[1], "cpu")
    attention = model[0].model.config._attn_implementation
    export_int8(model, tmp_path / "int8")
    ops = {node.op_type for node in onnx.load(str(tmp_path / "int8" / "model.onnx")).graph.node}
    # an SDPA trace guards fully masked rows with IsNaN + Where over every attention matrix: a quarter of the time
    assert "Softmax" in ops and "IsNaN" not in ops
    assert model[0].model.config._attn_implementation == attention


@pytest.mark.slow
def test_int8_runs_a_query_on_threads_that_do_not_spin_and_batches_on_ones_that_do(int8_embedder,
                                                                                      monkeypatch) -> None:
    onnx = int8_embedder.model[0].model
    encoder = int8_embedder._query_encoder
    spin = {name: session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning")
            for name, session in (("batches", onnx.session), ("queries", encoder.session))}
    assert spin == {"batches": "1", "queries": "0"}
    calls: list[tuple[str, int]] = []

    class Recording:  # the real session, noting which one ran a batch of how many texts
        def __init__(self, name: str, real: Any) -> None:
            self.name, self.real = name, real

        def run(self, outputs: Any, feed: dict[str, Any]) -> Any:
            calls.append((self.name, len(next(iter(feed.values())))))
            return self.real.run(outputs, feed)

    monkeypatch.setattr(onnx, "session", Recording("batches", onnx.session))
    monkeypatch.setattr(encoder, "session", Recording("queries", encoder.session))
    int8_embedder.embed_query(SENTENCES[0])
    int8_embedder.encode(SENTENCES[:3])
    int8_embedder.encode(SENTENCES[:1])  # a file of one chunk is a batch too: the chunks' model embeds it
    assert calls == [("queries", 1), ("batches", 3), ("batches", 1)]


def _cpu_has_bf16() -> bool:
    return choose_precision("auto", "cpu", cpu_flags(), False) == "bf16"


#: every precision path, forced by the daemon's ``precision`` setting whatever this CPU's ``auto`` would pick: a bf16
#: machine runs the int8 path too (bf16 only where the CPU has native bf16; elsewhere torch emulates it, slowly)
FORCED_PRECISIONS = [
    "fp32", "int8",
    pytest.param("bf16", marks=pytest.mark.skipif(not _cpu_has_bf16(), reason="no native bf16 on this CPU")),
]


@pytest.mark.parametrize("precision", FORCED_PRECISIONS)
def test_each_precision_path_indexes_and_answers_hybrid_searches(tmp_path: Path, workspace: Path, precision: str,
                                                                 monkeypatch) -> None:
    """A daemon forced to each precision by its setting (a fresh model cache: the int8 and query models are exported
    into it) indexes the workspace, runs at that precision and answers hybrid searches with dense scores."""
    from conftest import make_settings, wait_for

    from indexer.daemon import Indexer
    from indexer.memory import LocalMemory
    from indexer.schema import SearchRequest
    from indexer.worker import index_once

    if precision == "int8" and not int8_available():
        pytest.skip("onnxruntime/onnx (the int8 extra) not installed")
    monkeypatch.setenv("QMD_INDEXER_PRECISION", precision)  # the environment beats the file (and the session's)
    settings = make_settings(tmp_path, [{"agent": "main", "path": workspace}], precision=precision,
                             model_cache_dir=tmp_path / "models")  # its own: the session's cache has the exports
    daemon = Indexer.open(settings)  # the store opens before any model loads or export runs (the API listens then)
    try:
        text: Any = daemon.registry.embedders["text"]
        assert not text._model.loaded and not text.loading
        with capture_logs() as logs:
            load = text.preload()  # what the daemon does once the API listens: the first start exports, saying so
            loading = wait_for(lambda: daemon.view.status()["models"]["text"].get("loading"), timeout_s=60)
            load.join(300)
        assert loading["phase"] in ("loading model", "exporting int8 model", "exporting query model")
        assert 0 <= loading["percent"] < 100
        assert "loading" not in daemon.view.status()["models"]["text"]
        phases = [(e["phase"], e["percent"]) for e in logs if e["event"] == "model_loading"]
        exports = ["exporting int8 model"] if precision == "int8" else []
        assert [p for p, _ in phases] == ["loading model", *exports, "exporting query model"], phases
        assert [p for _, p in phases] == sorted(p for _, p in phases) and phases[0][1] == 0
        status = index_once(daemon)
        assert status["ready"] and status["files_failed"] == 0 and status["queue_depth"] == 0, status
        assert status["embedding"]["precision"] == precision == text.precision
        expected = {"fp32": text.base_id, "int8": f"{text.base_id}@int8-onnx-v2", "bf16": f"{text.base_id}@bf16"}
        assert text.model_id == expected[precision]
        answer = LocalMemory(daemon.view).search(SearchRequest(query="export job out of disk", mode="hybrid"))
        assert "degraded" not in answer
        assert answer["hits"][0]["path"] == "memory/incidents.md" and answer["hits"][0]["dense_score"] > 0.3
    finally:
        daemon.close()


def test_int8_model_id_is_known_before_the_model_loads(tmp_path: Path) -> None:
    """``model_id`` (the store's identity, read before the API listens) never loads the model: with no export yet it
    is int8's (the load exports it); with a quality record that did not pass, fp32's (the load falls back)."""
    if not int8_available():
        pytest.skip("onnxruntime/onnx (the int8 extra) not installed")
    config = {"precision": "int8", "cache_dir": str(tmp_path / "models")}
    pending = SentenceTransformerEmbedder(config)
    assert pending.int8_state() == "pending" and pending.model_id.endswith("@int8-onnx-v2")
    record = int8_dir(tmp_path / "models", pending.base_id, pending.fingerprint) / "quality.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"mean_cosine": 0.5, "passed": False}))
    failed = SentenceTransformerEmbedder(config)
    assert failed.int8_state() == "failed" and failed.model_id == failed.base_id
    assert not pending._model.loaded and not failed._model.loaded and not failed.loading
