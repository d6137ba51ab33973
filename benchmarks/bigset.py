"""Text and dense vectors of the large chunk sets of ``make bench`` step 7 (100,000 by default, up to 1,000,000).

Text (``scifact_passages``): real SciFact abstracts cut into windows, no invented words. First pass: windows of
2, 3, 4 and 6 consecutive sentences at every start (the 100k set). SciFact has 5,183 abstracts and 48,089
sentences, so even every contiguous sentence span gives only ~270k distinct texts; larger sets add passes of word
windows of an abstract (title excluded): 32, 48, 64, 96, 128, then 24 consecutive words, starting at every 4th
word, one pass per width, each distinct window kept once (978,681 texts before the 24-word pass).

Dense vectors (``anchored_vectors``): embedding 1M texts with all-MiniLM-L6-v2 on 2 CPU cores takes hours, so only
``k`` anchors are embedded for real by the product's embedder: passages ``round(linspace(0, n - 1, k))``, evenly
spread in corpus order. Passage ``i`` between anchors ``a <= i < b`` gets ``(1 - t) e_a + t e_b + N(0, sigma)``
per dimension with ``t = (i - a) / (b - a)``, L2-normalised: a mix of the real embeddings of the nearest windows
before and after it (the same or a neighbouring abstract), noise so that no two points coincide. Anchors keep
their real embedding exactly. The vectors stay in the real embeddings' region of the sphere; a passage's vector
is not its own text's embedding, so this set measures speed and memory, not relevance.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

SENTENCE_WIDTHS = (2, 3, 4, 6)
WORD_WIDTHS = (32, 48, 64, 96, 128, 24)
WORD_STRIDE = 4
NOISE_SIGMA = 0.02  # per dimension: ~0.4 of a unit vector's length over 384 dimensions, before normalising


def _abstracts(scifact: Path) -> Iterator[list[str]]:
    """Each SciFact abstract as its sentences (split after ``.``, ``!`` or ``?`` followed by white space)."""
    corpus_path = scifact / "corpus.jsonl.gz"
    opener: Any = gzip.open if corpus_path.exists() else open
    corpus_path = corpus_path if corpus_path.exists() else scifact / "corpus.jsonl"
    with opener(corpus_path, "rt", encoding="utf-8") as handle:
        for line in handle:
            yield [s for s in re.split(r"(?<=[.!?])\s+", json.loads(line)["text"]) if s.strip()]


def scifact_passages(scifact: Path, n: int) -> list[str]:
    """``n`` distinct real passages of SciFact (see the module docstring), in corpus order within each pass.
    Raises ``RuntimeError`` when the passes give fewer than ``n``."""
    passages: dict[str, None] = {}
    docs = list(_abstracts(scifact))
    for sentences in docs:
        for width in SENTENCE_WIDTHS:
            for start in range(0, max(1, len(sentences) - width + 1)):
                passages.setdefault(" ".join(sentences[start : start + width]), None)
        if len(passages) >= n:
            return list(passages)[:n]
    for width in WORD_WIDTHS:
        for sentences in docs:
            words = " ".join(sentences).split()
            for start in range(0, max(1, len(words) - width + 1), WORD_STRIDE):
                passages.setdefault(" ".join(words[start : start + width]), None)
            if len(passages) >= n:
                return list(passages)[:n]
    raise RuntimeError(f"only {len(passages)} distinct SciFact passages (asked for {n})")


def scifact_sentences(scifact: Path, n: int, min_words: int = 6) -> list[str]:
    """The first ``n`` distinct real SciFact abstract sentences of at least ``min_words`` words, in corpus order
    (short notes for the 10,000-file rescan of ``make bench``). Raises ``RuntimeError`` when there are fewer."""
    sentences: dict[str, None] = {}
    for abstract in _abstracts(scifact):
        for sentence in abstract:
            if len(sentence.split()) >= min_words:
                sentences.setdefault(sentence.strip(), None)
        if len(sentences) >= n:
            return list(sentences)[:n]
    raise RuntimeError(f"only {len(sentences)} distinct SciFact sentences (asked for {n})")


def anchored_vectors(passages: list[str], k: int, embedder: Any, cache: Path | None = None,
                     seed: int = 0) -> Iterator[np.ndarray]:
    """Row by row, the dense vector of each passage (``(dim,)`` float32, L2-normalised), from ``k`` real
    embeddings (``embedder.encode``) of anchor passages (see the module docstring). ``cache``: an ``.npz`` file
    (``np.savez``: ``anchors``, ``vectors``) of the anchors' embeddings, reused when its anchors match (same ``n``,
    ``k``; the caller names it by model)."""
    n = len(passages)
    anchors = np.unique(np.round(np.linspace(0, n - 1, min(k, n))).astype(np.int64))
    real: np.ndarray | None = None
    if cache is not None and cache.exists():
        with np.load(cache) as stored:
            if np.array_equal(stored["anchors"], anchors):
                real = stored["vectors"].astype(np.float32)
    if real is None:
        real = np.asarray(embedder.encode([passages[int(i)] for i in anchors]), dtype=np.float32)
        if cache is not None:
            cache.parent.mkdir(parents=True, exist_ok=True)
            np.savez(cache, anchors=anchors, vectors=real)
    rng = np.random.default_rng(seed)
    dim = real.shape[1]
    j = 0
    for i in range(n):
        while j + 1 < len(anchors) and anchors[j + 1] <= i:
            j += 1
        if anchors[j] == i:
            yield real[j].copy()
            continue
        b = min(j + 1, len(anchors) - 1)
        t = (i - anchors[j]) / max(1, anchors[b] - anchors[j])
        vec = (1 - t) * real[j] + t * real[b] + rng.normal(0, NOISE_SIGMA, dim).astype(np.float32)
        yield (vec / np.linalg.norm(vec)).astype(np.float32)
