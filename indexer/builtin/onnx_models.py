"""The text model in ONNX Runtime: the int8 model chunks are embedded with, and the query models, which open without
torch.

**Chunks (int8 precision).** int8 is the torch model exported to ONNX from the local weights (traced with eager
attention), its weight matrices quantized to int8 per output channel with ONNX Runtime's dynamic quantization
(activations are quantized per batch at run time), and run by ONNX Runtime in place of the transformer inside the
sentence-transformers pipeline, so tokenization, pooling and normalisation stay the model's own. Down-projection
matrices (more inputs than outputs: the feed-forward output after GELU, whose activations carry outliers) stay fp32:
quantizing them cost more accuracy than it gained speed. Activation scales are set per batch, so an int8 vector
depends slightly on its batch-mates.

The export happens once, at first use, into ``<cache_dir>/<model>-<hash>-onnx-int8-v<format>/`` (written to a
temporary directory, then renamed), together with ``quality.json``: the cosine between int8 and fp32 vectors of a
fixed set of sentences. An export that fails, or whose mean cosine is under ``INT8_MIN_COSINE``, leaves the embedder
on fp32 with one log line.

**Queries (every precision, on the CPU).** A query runs on a model of its own, ``query-v<format>.onnx``
(``export_query``): with int8, the same quantization in a graph fused for one short text, beside the chunks' export;
with fp32 and bf16, the fp32 trace itself, in ``<cache_dir>/<model>-<hash>-onnx-fp32/`` (the same vector as the fp32
model within float rounding; bf16 chunks are matched by an fp32 query). Beside it are its quality record
(``.json``: the cosine to the model's own vectors, its pooling) and its tokenizer (``.tokenizer.json``), so
``open_query_model`` opens it with ONNX Runtime and ``tokenizers`` alone: a restart answers queries in full in well
under a second, while ``import sentence_transformers`` (torch, transformers) and the model's load take 10-20 s
(docs/performance.md, "Restart").

sentence-transformers' own ``backend="onnx"`` needs ``optimum-onnx``, whose only release
pins ``transformers<4.58`` while sentence-transformers 6 needs ``transformers>=5``, so the ONNX session is wired in
here instead. The measurements behind each choice are in docs/performance.md ("int8 embedding"). The ONNX Runtime
sessions and encoders these exports run on, and the check of their quality records, are
``indexer.builtin.onnx_runtime``.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from indexer.builtin.onnx_runtime import (
    FP32_MIN_COSINE,
    INT8_MIN_COSINE,
    OnnxQueryEncoder,
    onnx_transformer,
    quality_passed,
    query_threads,
    tokenizer_for,
)

log = structlog.get_logger("qmd_indexer.embedding")

INT8_FORMAT = 2  # bump when the export recipe changes: part of the export's directory name and of model_id
# (2: traced with eager attention, so a new id and one re-embedding)
# The attention the int8 export is traced with: eager runs int8 batches faster than SDPA (docs/performance.md).
EXPORT_ATTENTION = "eager"
# bump when the query model's recipe changes (``export_query``): part of its file names. Queries are never stored,
# so a new recipe needs no re-embedding and is not part of ``model_id``. (2: its tokenizer and pooling are saved
# beside it, so it opens without torch; fp32 and bf16 get one too. 3: the fp32 query model is fused too.)
QUERY_FORMAT = 3
# The int8 quality check: short and long, prose, code, lists, numbers, names, other languages.
PROBE_SENTENCES = (
    "Remember to renew the TLS certificate for the staging cluster before Friday.",
    "The user prefers short answers and dislikes bullet points.",
    "def retry(fn, attempts=3):\n    for i in range(attempts):\n        try:\n            return fn()\n"
    "        except OSError:\n            pass",
    "Meeting notes 2024-03-12: budget approved, hiring paused until Q3, Alice owns the migration.",
    "Mitochondria are the membrane-bound organelles that generate most of the cell's chemical energy.",
    "- buy milk\n- call the dentist\n- send the invoice to ACME Corp (#4711)",
    "Der Vertrag verlängert sich automatisch um ein Jahr, wenn er nicht gekündigt wird.",
    "Error: connection refused (ECONNREFUSED) at 127.0.0.1:6333 while upserting 512 points.",
    "Her favourite book is One Hundred Years of Solitude; she reread it last summer in Lisbon.",
    "Vitamin D supplementation did not reduce the incidence of fractures in older adults in a randomized trial.",
    "ok",
    ("The quarterly revenue grew 14% year over year, driven by subscriptions in Europe and Japan, while hardware "
     "sales declined for the third consecutive quarter and operating costs rose with the new data centre."),
)



def int8_dir(cache_dir: Path, base_id: str, fingerprint: str = "") -> Path:
    """Where the int8 export of ``base_id`` lives: ``<cache_dir>/<model>-<hash8>-onnx-int8-v<format>``, the hash over
    the model id and ``fingerprint`` (``model_fingerprint`` of its files), so weights replaced in place are exported
    again rather than served from the old export."""
    return _export_dir(cache_dir, base_id, fingerprint, f"int8-v{INT8_FORMAT}")


def query_model_path(cache_dir: Path, base_id: str, fingerprint: str, precision: str) -> Path:
    """The query model of ``base_id`` at ``precision``: ``query-v<format>.onnx`` in ``int8_dir`` for int8, else in
    ``<cache_dir>/<model>-<hash8>-onnx-fp32/`` (fp32 and bf16 share it; hash as in ``int8_dir``)."""
    folder = int8_dir(cache_dir, base_id, fingerprint) if precision == "int8" else \
        _export_dir(cache_dir, base_id, fingerprint, "fp32")
    return folder / f"query-v{QUERY_FORMAT}.onnx"


def _export_dir(cache_dir: Path, base_id: str, fingerprint: str, kind: str) -> Path:
    digest = hashlib.sha256(f"{base_id}\0{fingerprint}".encode() if fingerprint else base_id.encode()).hexdigest()[:8]
    return cache_dir / f"{Path(base_id).name}-{digest}-onnx-{kind}"


def trace_fp32(model: Any, path: Path) -> None:
    """Export the Hugging Face transformer of ``model`` (a loaded fp32 ``SentenceTransformer``) to the ONNX file
    ``path``: inputs the tokenizer's (``input_ids``, ``attention_mask``, ``token_type_ids`` where the model has
    them), output ``last_hidden_state`` ``(batch, tokens, hidden)`` float32, both axes dynamic, opset 17, traced
    with ``EXPORT_ATTENTION``. ``model`` is left as it was. Raises whatever ``torch.onnx.export`` raises."""
    import torch

    hf = model[0].model
    names = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in model.tokenizer.model_input_names]

    class Hidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.hf = hf

        def forward(self, *tensors: Any) -> Any:
            return self.hf(**dict(zip(names, tensors))).last_hidden_state

    sample = model.tokenizer(["an example sentence", "a second, longer example sentence"], padding=True,
                             return_tensors="pt")
    axes = {name: {0: "batch", 1: "tokens"} for name in [*names, "last_hidden_state"]}
    # traced with eager attention: the SDPA trace adds an IsNaN and a Where over every attention matrix (its
    # guard for fully masked rows) and shape nodes, which slow an int8 batch (EXPORT_ATTENTION)
    attention = hf.config._attn_implementation
    hf.set_attn_implementation(EXPORT_ATTENTION)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer notes
            torch.onnx.export(Hidden().eval(), tuple(sample[n] for n in names), str(path),
                              input_names=names, output_names=["last_hidden_state"], dynamic_axes=axes,
                              opset_version=17, dynamo=False)
    finally:
        hf.set_attn_implementation(attention)  # the fp32 model keeps its own (faster in torch)


def _down_projections(onnx_path: Path) -> list[str]:
    """Names of the ``MatMul`` nodes of ``onnx_path`` whose weight has more inputs than outputs (a feed-forward
    block's output projection, after the GELU)."""
    import onnx

    graph = onnx.load(str(onnx_path)).graph
    weights = {w.name: tuple(w.dims) for w in graph.initializer}
    return [node.name for node in graph.node if node.op_type == "MatMul"
            and any(len(weights.get(i, ())) == 2 and weights[i][0] > weights[i][1] for i in node.input)]


def export_int8(model: Any, target: Path) -> dict[str, Any]:
    """Export ``model`` (a loaded fp32 ``SentenceTransformer`` whose first module is a Hugging Face transformer)
    to ``target/model.onnx``, int8-quantized, with ``target/quality.json``; returns the quality record
    ``{"min_cosine", "mean_cosine", "passed", ...}``. Written to a temporary directory beside ``target`` and
    renamed, so ``target`` is either complete or absent. Raises whatever the export or quantization raises."""
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        hf = model[0].model
        trace_fp32(model, tmp / "fp32.onnx")
        quant_pre_process(str(tmp / "fp32.onnx"), str(tmp / "prepared.onnx"), skip_symbolic_shape=True)
        down = _down_projections(tmp / "prepared.onnx")
        quantize_dynamic(str(tmp / "prepared.onnx"), str(tmp / "model.onnx"), op_types_to_quantize=["MatMul"],
                         per_channel=True, weight_type=QuantType.QInt8, nodes_to_exclude=down)
        (tmp / "fp32.onnx").unlink()
        (tmp / "prepared.onnx").unlink()

        threads = torch.get_num_threads()
        reference = model.encode(list(PROBE_SENTENCES), normalize_embeddings=True, convert_to_numpy=True)
        model[0].model = onnx_transformer(tmp / "model.onnx", hf.config, threads)
        try:
            quantized = model.encode(list(PROBE_SENTENCES), normalize_embeddings=True, convert_to_numpy=True)
        finally:
            model[0].model = hf
        cosines = np.sum(reference * quantized, axis=1)
        quality = {"min_cosine": round(float(cosines.min()), 5), "mean_cosine": round(float(cosines.mean()), 5),
                   "threshold": INT8_MIN_COSINE, "passed": bool(cosines.mean() >= INT8_MIN_COSINE),
                   "sentences": len(PROBE_SENTENCES), "fp32_down_projections": len(down), "format": INT8_FORMAT}
        (tmp / "quality.json").write_text(json.dumps(quality, indent=2) + "\n", encoding="utf-8")
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "quality.json").exists():  # another process finished first: use that one
                raise
            shutil.rmtree(tmp, ignore_errors=True)
        return quality
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def export_query(model: Any, path: Path, quantize: bool) -> dict[str, Any]:
    """Export the query model of ``model`` (a loaded fp32 ``SentenceTransformer`` that ``OnnxQueryEncoder``
    supports) to ``path``, with its quality record (``path`` with ``.json``) and tokenizer (``.tokenizer.json``)
    beside it; returns the record ``{"min_cosine", "mean_cosine", "passed", "pooling", "quantized", ...}``. Each
    file is written under a temporary name and renamed, the model last. Raises whatever the export, optimisation or
    quantization raises.

    The recipe (``QUERY_FORMAT``): the fp32 trace, then ONNX Runtime's transformer optimizer (BERT fusions:
    attention, embedding and skip layer norms, bias GELU); with ``quantize``, then the chunks' model's quantization
    (``export_int8``: weight matrices int8 per output channel, attention included, down-projections fp32): one short
    text runs through far fewer nodes fused (fp32: 3.70 -> 3.26 ms p50, docs/performance.md), and a batch of long ones
    ran slower fused, so the int8 chunks keep the plain graph (fp32 chunks run on this file only while the model
    loads). The quality check compares with the fp32 model's own vectors (``INT8_MIN_COSINE``, ``FP32_MIN_COSINE``)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process
    from onnxruntime.transformers.optimizer import optimize_model

    config = model[0].model.config
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.stem}-", dir=path.parent))
    try:
        trace_fp32(model, tmp / "fp32.onnx")
        beside = sorted(p.name for p in tmp.iterdir() if p.name != "fp32.onnx")
        if beside:  # over 2 GiB: torch saved the weights as files beside the graph, which one query file cannot hold
            raise ValueError(f"the model's trace keeps its weights in {len(beside)} files beside it (a model over 2 "
                             f"GiB): queries run on the model's own modules")
        fused = optimize_model(str(tmp / "fp32.onnx"), model_type="bert", opt_level=0,
                               num_heads=int(getattr(config, "num_attention_heads", 0)),
                               hidden_size=int(getattr(config, "hidden_size", 0)))
        fused.save_model_to_file(str(tmp / "fused.onnx"))
        fusions = {name: n for name, n in fused.get_fused_operator_statistics().items() if n}
        if quantize:
            quant_pre_process(str(tmp / "fused.onnx"), str(tmp / "prepared.onnx"), skip_symbolic_shape=True)
            quantize_dynamic(str(tmp / "prepared.onnx"), str(tmp / "query.onnx"),
                             op_types_to_quantize=["MatMul", "Attention"], per_channel=True,
                             weight_type=QuantType.QInt8, nodes_to_exclude=_down_projections(tmp / "prepared.onnx"),
                             extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
        else:
            os.replace(tmp / "fused.onnx", tmp / "query.onnx")
        (tmp / "query.tokenizer.json").write_text(tokenizer_for(model), encoding="utf-8")
        reference = model.encode(list(PROBE_SENTENCES), normalize_embeddings=True, convert_to_numpy=True)
        encoder = OnnxQueryEncoder.for_model(tmp / "query.onnx", model, query_threads())
        cosines = np.array([float(encoder(text) @ ref) for text, ref in zip(PROBE_SENTENCES, reference)])
        threshold = INT8_MIN_COSINE if quantize else FP32_MIN_COSINE
        quality = {"min_cosine": round(float(cosines.min()), 7), "mean_cosine": round(float(cosines.mean()), 7),
                   "threshold": threshold, "passed": bool(cosines.mean() >= threshold),
                   "sentences": len(PROBE_SENTENCES), "quantized": quantize, "fusions": fusions,
                   "pooling": "cls" if encoder.cls else "mean", "max_seq_length": int(model.max_seq_length),
                   "format": QUERY_FORMAT}
        (tmp / "query.json").write_text(json.dumps(quality, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp / "query.tokenizer.json", path.with_suffix(".tokenizer.json"))
        os.replace(tmp / "query.json", path.with_suffix(".json"))
        os.replace(tmp / "query.onnx", path)
        return quality
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


_QUERY_FILE = re.compile(r"query-v(\d+)\.(?:onnx|json|tokenizer\.json)")


def drop_older_formats(path: Path) -> None:
    """Delete the query models of an older ``QUERY_FORMAT`` beside ``path`` (``query-v<n>.onnx`` and its
    ``.json``/``.tokenizer.json``, n < this format: about 90 MB a model that nothing reads once this format's
    export has passed), logged in one line naming them (``query_model_dropped``). A file that cannot be deleted
    is left and logged; nothing raises."""
    dropped = []
    for old in sorted(path.parent.iterdir()):
        match = _QUERY_FILE.fullmatch(old.name)
        if match is None or int(match[1]) >= QUERY_FORMAT:
            continue
        try:
            old.unlink()
        except OSError as exc:
            log.warning("query_model_drop_failed", path=str(old), error=str(exc))
            continue
        dropped.append(old.name)
    if dropped:
        log.info("query_model_dropped", folder=str(path.parent), files=dropped, format=QUERY_FORMAT)


def release_export_memory() -> None:
    """Free what an export left behind: the ONNX optimizer's graphs hold reference cycles (a bf16 model's first
    start: 1,137 MiB resident after its query model's export, 913 after ``gc.collect``, 693 once the heap is trimmed
    as well; a later start, with the export on disk, 642)."""
    from indexer.pipeline import trim_heap

    gc.collect()
    trim_heap()


def query_model(model: Any, path: Path, quantize: bool, fallback: Path | None = None) -> Path | None:
    """The ONNX file queries of ``model`` run on: ``path`` (``query_model_path``), exported on first use
    (``export_query``) and used when its quality record passes; else ``fallback`` (int8: the chunks' own
    ``model.onnx``), with one log line saying why. An export that raised is recorded as failed and not retried for
    this ``QUERY_FORMAT``; a passing record whose files have gone (deleted by hand) is exported again, and so is
    one that cannot be read (a write cut short by a full disk)."""
    record = path.with_suffix(".json")
    try:
        quality = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # absent, or unreadable: export (again)
        quality = None
    if not isinstance(quality, dict):
        quality = None
    files = (path, path.with_suffix(".tokenizer.json"))
    if quality is not None and quality_passed(quality) and not all(f.exists() for f in files):
        log.warning("query_model_missing", path=str(path), action="export again")
        quality = None
    if quality is None:
        started = time.monotonic()
        try:
            quality = export_query(model, path, quantize)
        except Exception as exc:  # the chunks' model still serves queries
            quality = {"passed": False, "error": f"{type(exc).__name__}: {exc}", "format": QUERY_FORMAT,
                       "quantized": quantize}
            try:
                record.parent.mkdir(parents=True, exist_ok=True)
                partial = record.with_name(f".{record.name}.tmp")
                partial.write_text(json.dumps(quality, indent=2) + "\n", encoding="utf-8")
                os.replace(partial, record)
            except OSError:
                pass
        else:
            log.info("query_model_exported", path=str(path), mean_cosine=quality["mean_cosine"],
                     seconds=round(time.monotonic() - started, 1))
            if quality_passed(quality):
                drop_older_formats(path)
        release_export_memory()
    if quality_passed(quality) and all(f.exists() for f in files):
        return path
    why = quality.get("error") or f"quality check failed: mean cosine {quality.get('mean_cosine')} < " \
        f"{INT8_MIN_COSINE if quantize else FP32_MIN_COSINE}"
    log.warning("query_model_unavailable", fallback=fallback.name if fallback else "the model's modules", error=why)
    return fallback


def use_int8(model: Any, cache_dir: Path, base_id: str, fingerprint: str = "",
             queries: OnnxQueryEncoder | None = None,
             progress: Callable[[str], None] | None = None) -> tuple[dict[str, Any], OnnxQueryEncoder | None]:
    """Swap ``model``'s transformer for the int8 ONNX one, exporting it first unless ``cache_dir`` has it (for this
    ``fingerprint`` of the model's files: ``int8_dir``).

    Returns the quality record and, for a model ``OnnxQueryEncoder`` supports, the encoder queries run on
    (``query_model``'s file: ``queries`` itself where it is already open on that file); when the record did not
    pass, ``model`` is left unchanged and no encoder is built. Raises what ``export_int8`` raises (then ``model`` is
    unchanged too). ``progress`` is told ``"exporting query model"`` before the query model is made or opened.
    """
    import torch

    target = int8_dir(cache_dir, base_id, fingerprint)
    if (target / "quality.json").exists():
        quality = json.loads((target / "quality.json").read_text(encoding="utf-8"))
    else:
        quality = export_int8(model, target)
        release_export_memory()
        log.info("int8_exported", path=str(target), mean_cosine=quality["mean_cosine"], passed=quality["passed"])
    quality["passed"] = quality["mean_cosine"] >= INT8_MIN_COSINE  # judged now, so a changed threshold applies
    if not quality["passed"]:
        return quality, None
    threads = torch.get_num_threads()
    if OnnxQueryEncoder.supports(model):  # before the swap: the query export traces the torch model
        if progress is not None:
            progress("exporting query model")
        path = query_model(model, query_model_path(cache_dir, base_id, fingerprint, "int8"), True,
                           fallback=target / "model.onnx")
        if queries is None or queries.path != path:
            queries = OnnxQueryEncoder.for_model(path or target / "model.onnx", model, threads)
    else:
        queries = None
    model[0].model = onnx_transformer(target / "model.onnx", model[0].model.config, threads)
    return quality, queries
