"""The ONNX Runtime side of the text model: the sessions the exports of ``indexer.builtin.onnx_models`` run on, with
torch (``onnx_transformer``, inside sentence-transformers' pipeline) and without it (``OnnxQueryEncoder`` for one
query, ``OnnxDocumentEncoder`` for chunks while the model loads), and the check of an export's quality record that
decides whether it may be opened (``quality_passed``). Opening an export here needs ONNX Runtime, ``tokenizers``
and numpy only; making one (torch) is ``indexer.builtin.onnx_models``'s job.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from indexer.api import l2_normalise

# mean cosine between int8 and fp32 vectors of ``indexer.builtin.onnx_models.PROBE_SENTENCES`` for int8 to be used
# (see docs/performance.md)
INT8_MIN_COSINE = 0.99
# mean cosine between the fp32 query model's vectors and the fp32 model's for it to be used: an fp32 trace
# reproduces the model within float rounding (min cosine 0.99999994 for all-MiniLM-L6-v2), so anything under this is
# a wrong export (pooling, tokenizer), not a precision trade
FP32_MIN_COSINE = 0.999


def quality_passed(record: dict[str, Any]) -> bool:
    """Whether a quality record passes its recipe's threshold, judged now (so a changed threshold applies)."""
    threshold = INT8_MIN_COSINE if record.get("quantized", True) else FP32_MIN_COSINE
    try:
        return "error" not in record and float(record["mean_cosine"]) >= threshold
    except (KeyError, TypeError, ValueError):
        return False


def onnx_session(onnx_path: Path, threads: int, spin: bool) -> Any:
    """An ONNX Runtime CPU session on ``threads`` threads; with ``spin`` its threads spin-wait for the next call
    (ONNX Runtime's default), else they sleep as soon as a run ends. Its memory pattern planning is off: it keeps a
    plan and its buffers per input shape, and every batch of chunks has a shape of its own (batches of 20-256 word
    pieces, 150 runs: the process grew 283 MiB with it, 151 without, at the same speed; docs/performance.md)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.enable_mem_pattern = False
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    return ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])


def onnx_transformer(onnx_path: Path, config: Any, threads: int) -> Any:
    """A ``torch.nn.Module`` that stands in for the Hugging Face model inside sentence-transformers' ``Transformer``
    module: it takes the tokenizer's tensors and returns ``{"last_hidden_state": (batch, tokens, hidden) float32}``
    from an ONNX Runtime session on ``threads`` threads. ``config`` is the original model's (read by
    sentence-transformers). Its threads spin-wait for the next batch (ONNX Runtime's default: a first index is
    markedly slower without it, docs/performance.md); queries run on ``OnnxQueryEncoder``'s session, whose threads
    sleep."""
    import torch

    class OnnxTransformer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.session = onnx_session(onnx_path, threads, spin=True)
            self.input_names = [i.name for i in self.session.get_inputs()]
            self.config = config

        def forward(self, **features: Any) -> dict[str, Any]:
            feed = {name: features[name].cpu().numpy().astype(np.int64) for name in self.input_names}
            (hidden,) = self.session.run(["last_hidden_state"], feed)
            return {"last_hidden_state": torch.from_numpy(hidden)}

    return OnnxTransformer()


def saved_query(query_path: Path, onnx_path: Path) -> tuple[str, bool] | None:
    """``(tokenizer JSON, CLS pooling)`` saved beside the query model ``query_path`` (``export_query``: its
    ``.json`` quality record and ``.tokenizer.json``), for a model file ``onnx_path`` that exists; ``None`` when a
    file is missing or unreadable, or the record did not pass or names another pooling than mean or CLS."""
    try:
        record = json.loads(query_path.with_suffix(".json").read_text(encoding="utf-8"))
        tokenizer = query_path.with_suffix(".tokenizer.json").read_text(encoding="utf-8")
    except (OSError, ValueError):
        return None
    if not (isinstance(record, dict) and quality_passed(record) and record.get("pooling") in ("mean", "cls")
            and onnx_path.is_file()):
        return None
    return tokenizer, record["pooling"] == "cls"


class OnnxQueryEncoder:
    """One query to its ``(dim,)`` float32 L2-normalised embedding, without sentence-transformers' per-call
    machinery: the model's fast tokenizer (truncating at ``max_seq_length`` word pieces, special tokens included, as
    the model's ``Transformer`` module does), an ONNX Runtime session, and the model's pooling (mean over the tokens,
    or the first token's state). Its tokenizer and session are its own, so a query does not wait for a batch of
    chunks being embedded, and neither needs torch (``open``).

    The session's threads sleep as soon as a run ends, since a search goes on to its Qdrant calls on the same
    cores (spinning threads cost a search CPU time it needs there: docs/performance.md).

    Same vector as ``encode([text])[0]`` on the same ONNX file (``tests/test_embedding_precision.py``), and faster
    than the model's own modules on the same file (docs/performance.md). Build it only for a model ``supports``
    accepts. Thread-safe."""

    _FIELDS = {"input_ids": "ids", "attention_mask": "attention_mask", "token_type_ids": "type_ids"}

    def __init__(self, onnx_path: Path, tokenizer_json: str, cls: bool, threads: int) -> None:
        """``tokenizer_json``: a ``tokenizers`` tokenizer (``Tokenizer.to_str()``) that truncates as the model does
        and does not pad (``tokenizer_for``); ``cls``: pool the first token's state, else the mean of all."""
        from tokenizers import Tokenizer

        self.path = onnx_path
        self.session = onnx_session(onnx_path, threads, spin=False)
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.tokenizer = Tokenizer.from_str(tokenizer_json)
        self.cls = cls
        self._lock = threading.Lock()

    @classmethod
    def for_model(cls, onnx_path: Path, model: Any, threads: int) -> OnnxQueryEncoder:
        """The encoder of ``model`` (a loaded ``SentenceTransformer`` that ``supports`` accepts) on ``onnx_path``."""
        return cls(onnx_path, tokenizer_for(model), model[1].pooling_mode == "cls", threads)

    @classmethod
    def open(cls, onnx_path: Path, threads: int) -> OnnxQueryEncoder | None:
        """The query model ``export_query`` saved at ``onnx_path``, opened with ONNX Runtime and ``tokenizers``
        alone (no torch, no sentence-transformers: well under a second); ``None`` when its quality record is
        missing or did not pass, or a file is gone. Raises what ONNX Runtime raises for a damaged file."""
        saved = saved_query(onnx_path, onnx_path)
        return None if saved is None else cls(onnx_path, saved[0], saved[1], threads)

    @staticmethod
    def supports(model: Any) -> bool:
        """Whether ``model`` is a plain text encoder this class reproduces exactly: a ``Transformer`` (fast
        tokenizer, no lower-casing, no per-task lengths), ``Pooling`` by mean or first token, maybe ``Normalize``,
        and no default prompt or truncated dimension (``encode`` applies those)."""
        modules = list(model)
        kinds = [type(m).__name__ for m in modules]
        if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
            return False
        if getattr(model, "default_prompt_name", None) or getattr(model, "truncate_dim", None):
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


class OnnxDocumentEncoder:
    """Chunks to ``(n, dim)`` float32 L2-normalised embeddings and a text's token offsets without torch: the model's
    ONNX file the chunks are embedded with (int8: the export's ``model.onnx``; fp32: the fused fp32 trace, the query
    model's file) and the query model's tokenizer and pooling (``export_query``'s record), so a note saved while the
    model itself still loads (``import sentence_transformers``: 10-20 s) is embedded at once, to the vectors the
    loaded model gives on the same file (the int8 one within its per-batch activation scales). Batches are padded
    to their longest text; pooling masks the padding out. Thread-safe (the tokenizer under a lock)."""

    def __init__(self, onnx_path: Path, tokenizer_json: str, cls: bool, threads: int) -> None:
        from tokenizers import Tokenizer

        self.path = onnx_path
        self.session = onnx_session(onnx_path, threads, spin=False)
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.tokenizer = Tokenizer.from_str(tokenizer_json)  # truncates as the model does (``tokenizer_for``)
        self.untruncated = Tokenizer.from_str(tokenizer_json)
        self.untruncated.no_truncation()
        self.cls = cls
        self._lock = threading.Lock()

    @classmethod
    def open(cls, onnx_path: Path, query_path: Path, threads: int) -> OnnxDocumentEncoder | None:
        """The encoder on ``onnx_path`` with the tokenizer and pooling saved beside the query model ``query_path``
        (``export_query``); ``None`` when a file is missing or the query model's record did not pass. Raises what
        ONNX Runtime raises for a damaged file."""
        saved = saved_query(query_path, onnx_path)
        return None if saved is None else cls(onnx_path, saved[0], saved[1], threads)

    def token_offsets(self, text: str) -> list[tuple[int, int]]:
        """``(start, end)`` character offsets of each token of ``text``, special tokens excluded, untruncated (what
        the model's tokenizer gives with ``add_special_tokens=False``)."""
        with self._lock:
            encoding = self.untruncated.encode(text, add_special_tokens=False)
        return [(int(start), int(end)) for start, end in encoding.offsets]

    def __call__(self, texts: list[str]) -> np.ndarray:
        with self._lock:
            encodings = self.tokenizer.encode_batch(texts)
        width = max(len(e.ids) for e in encodings)
        fields = OnnxQueryEncoder._FIELDS
        feed = {name: np.array([getattr(e, fields[name]) + [0] * (width - len(e.ids)) for e in encodings],
                               dtype=np.int64) for name in self.input_names}
        (hidden,) = self.session.run(["last_hidden_state"], feed)
        if self.cls:
            pooled = hidden[:, 0]
        else:
            mask = np.array([[1] * len(e.ids) + [0] * (width - len(e.ids)) for e in encodings], dtype=np.float32)
            pooled = (hidden * mask[:, :, None]).sum(axis=1) / mask.sum(axis=1, keepdims=True)
        return l2_normalise(pooled.astype(np.float32))


def tokenizer_for(model: Any) -> str:
    """``model``'s fast tokenizer as ``tokenizers`` JSON, truncating at its ``max_seq_length`` word pieces (special
    tokens included) and without padding: what one query needs."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(model.tokenizer.backend_tokenizer.to_str())
    tokenizer.enable_truncation(int(model.max_seq_length))
    tokenizer.no_padding()
    return str(tokenizer.to_str())


def query_threads() -> int:
    """Threads a query session runs on: the CPUs this process may use (as torch's default, without importing it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)

