"""How the built-in embedder (``indexer.builtin.embedding``) cuts texts into forward passes: texts of similar length
together, longest first, as ``SentenceTransformer.encode`` orders them for one call (a batch is padded to its longest
text, so batches in document order waste CPU on padding), at most ``batch_size`` texts and ``batch_tokens`` word
pieces a pass once padded (the activations of a pass grow with texts x length squared: docs/performance.md)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from indexer.api import l2_normalise

BATCH_TOKENS = 4096  # word pieces (padding included) one forward pass may hold: 16 chunks of 256


def batches(lengths: Sequence[int], order: Sequence[int], batch_size: int, batch_tokens: int,
            max_tokens: int) -> list[list[int]]:
    """``order`` (indexes of texts, longest first; ``lengths``: their lengths in characters, in that order) cut into
    the batches of one forward pass each: at most ``batch_size`` texts, and at most ``batch_tokens`` word pieces once
    padded to the batch's first (longest) text, counted as its characters plus [CLS] and [SEP] (a word piece holds a
    character at least), at most ``max_tokens + 2``. A text over the budget alone is a batch of one."""
    out: list[list[int]] = []
    limit = max_tokens + 2
    start = 0
    while start < len(order):
        width = min(lengths[start] + 2, limit)
        size = max(1, min(batch_size, batch_tokens // max(width, 1)))
        out.append(list(order[start : start + size]))
        start += size
    return out


def encode_batched(texts: list[str], encode: Callable[[list[str]], np.ndarray],
                   cut: Callable[[Sequence[int], Sequence[int]], list[list[int]]], dim: int) -> np.ndarray:
    """``(len(texts), dim)`` float32, L2-normalised, in the order of ``texts``: ``texts`` sorted longest first, cut
    into passes by ``cut`` (``batches`` with the embedder's limits), each pass one call of ``encode``, the vectors
    put back in the order of ``texts``."""
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    parts = [encode([texts[i] for i in batch]) for batch in cut([len(texts[i]) for i in order], order)]
    vectors = np.empty((len(texts), dim), dtype=np.float32)
    vectors[order] = np.concatenate([np.asarray(p, dtype=np.float32) for p in parts])
    return l2_normalise(vectors)


def model_pass(model: Any, lock: threading.Lock) -> Callable[[list[str]], np.ndarray]:
    """One forward pass of the ``SentenceTransformer`` ``model`` over a batch (normalised float32 vectors), under
    ``lock``: the embedder's tokenizer and model take turns, one batch at a time."""

    def encode(batch: list[str]) -> np.ndarray:
        with lock:
            vectors: np.ndarray = model.encode(batch, batch_size=len(batch), normalize_embeddings=True,
                                               convert_to_numpy=True, show_progress_bar=False)
        return vectors
    return encode
