"""The plugin contract: the values that cross from a file to a Qdrant point, and the four plugin kinds.

A plugin is an object registered under one of five entry-point groups (see ``GROUPS``). The entry point names a
factory: a class or function called with that plugin's config table (a ``dict``, empty when none is configured).
Factories must be cheap: load models lazily, on the first ``embed``/``extract`` call, so that ``qmd-indexer
plugins`` never imports torch.

Flow for one file::

    path, first bytes --Classifier.classify--> kind (e.g. "markdown", "image")
    FileInfo(kind)    --Extractor.extract-->   Chunk, Chunk, ...   (text with 1-based line ranges, or image bytes)
    [Chunk]           --Embedder.embed-->      (n, dim) float32, L2-normalised, one row per chunk

Chunks are grouped by ``modality`` and each group goes to the embedder of that modality; its vectors are stored in
the Qdrant named vector of the same name (``"text"``, ``"image"``). At search time an optional ``Reranker`` (the
one the ``reranker`` setting names) rescores the first fused hits::

    query, [hit text, ...] --Reranker.score--> [float, ...]   (higher is more relevant; the hits are re-sorted)

A session transcript (a ``*.jsonl`` file of a workspace's ``sessions`` folder) is read by the first
``TranscriptFormat`` whose ``sniff`` claims its first bytes, one JSON record a line (``indexer.sources.transcripts``)::

    first bytes --TranscriptFormat.sniff--> True
    record      --TranscriptFormat.read-->  TranscriptRecord(session_id, timestamp, messages)

The Protocols below are the one statement of the contract: ``indexer.contract`` derives the load-time checks from
them (``CONTRACT``: annotated attributes without a default and methods are required; an attribute with a default in
the Protocol is an optional declaration a plugin may omit) and ``indexer.testing`` runs the same checks. What a new
media kind needs is declared by its plugins, never edited into the core: an extractor's ``media = True`` gates its
kinds behind a workspace's ``multimodal`` settings, its ``hit_fields`` name the payload fields search hits carry, and
an embedder's ``modality`` names a Qdrant named vector.

Helpers plugins may use are re-exported here (``chunk_text``, ``decode_text``, ``load_sentence_transformer``,
``LazyModel``, ``KeyedCache`` and its ``cache_key``, ``l2_normalise``, the errors): import them from
``indexer.api``, not from the modules that implement them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol, runtime_checkable

import numpy as np

from indexer.cache import KeyedCache, cache_key
from indexer.errors import BadVectors, EmbedError, EmbedUnavailable, ExtractError, FileSkipped

if TYPE_CHECKING:  # the helpers import this module; see __getattr__ below
    from indexer.chunking import TextChunk, chunk_text
    from indexer.model_loading import LazyModel, load_sentence_transformer
    from indexer.safeio import decode_text

__all__ = [
    "GROUPS", "HEAD_BYTES", "BadVectors", "Chunk", "Classifier", "EmbedError", "EmbedUnavailable", "Embedder",
    "ExtractContext", "ExtractError", "Extractor", "FileInfo", "FileSkipped", "Message", "Reranker", "TextChunk",
    "TextEmbedder", "TranscriptFormat", "TranscriptRecord", "KeyedCache", "LazyModel",
    "cache_key", "chunk_text", "check_vectors", "decode_text", "l2_normalise", "load_sentence_transformer",
]

#: the entry-point groups, in this order: classifiers, extractors, embedders, rerankers, transcript formats
#: (``indexer.contract.PROTOCOLS`` maps each to the Protocol below its objects must satisfy)
GROUPS = ("qmd_indexer.classifiers", "qmd_indexer.extractors", "qmd_indexer.embedders", "qmd_indexer.rerankers",
          "qmd_indexer.transcripts")

#: how many bytes of a file a classifier sees (enough for every magic number we sniff)
HEAD_BYTES = 512


@dataclass(frozen=True, slots=True)
class FileInfo:
    """One file handed to an extractor.

    ``path`` is absolute and never a symlink; ``rel_path`` is relative to the workspace, with ``/`` separators;
    ``size_bytes`` is from the ``stat`` taken just before extraction; ``kind`` is what the classifier answered.
    Read the file with ``read_bytes()`` (or ``open()``), never through ``path``: the daemon's opener resolves it
    beneath the workspace with no symlink followed, so a directory swapped for a symlink meanwhile is refused.
    ``indexer.testing.check_extractor`` fails an extractor that reads ``path``.
    """

    path: Path
    rel_path: str
    kind: str
    size_bytes: int
    opener: Callable[[], BinaryIO] | None = field(default=None, compare=False, repr=False)

    def open(self) -> BinaryIO:
        """The file opened for binary reading (the caller closes it); ``open(path, "rb")`` without an opener.
        Raises ``OSError`` (the daemon's opener: also for a symlink met beneath the workspace)."""
        return self.opener() if self.opener is not None else open(self.path, "rb")

    def read_bytes(self) -> bytes:
        """The whole file as ``bytes``, read through ``open()``: the one way an extractor should read its file.

        No size limit of its own: the daemon skips a file over ``max_file_bytes`` (text kinds) or
        ``multimodal.max_file_bytes`` (media kinds) by its ``stat`` before extraction, so ``size_bytes`` is within
        the cap unless the file grew since. Raises ``ExtractError("cannot read: <reason>")`` for any ``OSError``
        (gone, permission denied, a symlink swapped in beneath the workspace); decode text with ``decode_text``.
        """
        try:
            with self.open() as handle:
                return handle.read()
        except OSError as exc:
            raise ExtractError(f"cannot read: {exc.strerror or exc}") from exc


@dataclass(frozen=True, slots=True)
class Chunk:
    """One unit that becomes one Qdrant point.

    - ``text``: what is shown as the snippet and, after ``context``, embedded (``modality == "text"``); for an
      image, a short caption such as the file name.
    - ``start_line``/``end_line``: 1-based, inclusive line range in the source file (1, 1 for non-text media).
    - ``kind``: the source kind (``"markdown"``, ``"image"``, ``"audio"``, ...), stored in the payload.
    - ``modality``: which embedder and named vector this chunk goes to (``"text"``, ``"image"``, or another
      modality an embedder plugin declares).
    - ``data``: raw bytes for non-text modalities (the image file), else ``None``.
    - ``start_s``/``end_s``: time range in seconds for audio transcript segments, else ``None``.
    - ``meta``: small JSON-serialisable extras copied into the payload (e.g. ``{"width": 640, "height": 427}``);
      those the extractor names in ``hit_fields`` are also copied into search hits.
    - ``context``: text chunks only: the document context (e.g. ``"Deploy runbook > Rollback"``, see
      ``indexer.sections.chunk_markdown``) that is embedded and keyword-indexed with ``text`` but not shown;
      ``embed_text`` joins the two.
    """

    text: str
    start_line: int = 1
    end_line: int = 1
    kind: str = "markdown"
    modality: str = "text"
    data: bytes | None = None
    start_s: float | None = None
    end_s: float | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)
    context: str = ""

    @property
    def embed_text(self) -> str:
        """What a text embedder and BM25 see: ``context``, a newline and ``text`` (``text`` alone without one)."""
        return f"{self.context}\n{self.text}" if self.context else self.text


@dataclass(frozen=True, slots=True)
class ExtractContext:
    """What an extractor may know about the text embedder, so it can size chunks to the model.

    ``token_offsets(text)`` returns the ``(start, end)`` character offsets of each model token of ``text`` (no
    special tokens); ``max_tokens`` is how many such tokens one chunk may hold without being truncated by the model.
    """

    max_tokens: int
    token_offsets: Callable[[str], list[tuple[int, int]]]


@runtime_checkable
class Classifier(Protocol):
    """Names the media kind of a file from its path and first ``HEAD_BYTES`` bytes.

    Classifiers run in ascending ``priority`` (built-ins use 100); the first non-``None`` answer wins. ``classify``
    must not raise for unknown input: it returns ``None`` to defer.
    """

    priority: int

    def classify(self, path: Path, head: bytes) -> str | None: ...


@runtime_checkable
class Extractor(Protocol):
    """Turns a file of one of ``kinds`` into chunks.

    Raises ``indexer.errors.ExtractError`` (with a human reason) for corrupt or unsupported input; the daemon logs
    one line naming the file and indexes the rest of the workspace.

    Optional declarations (defaults below when a plugin omits them):

    - ``media``: ``True`` for media kinds (``"image"``, ``"audio"``): files of ``kinds`` are indexed only where a
      workspace's ``multimodal`` settings allow the kind, under its ``multimodal.max_file_bytes`` cap, and are
      never served by ``read``.
    - ``hit_fields``: payload fields (from ``Chunk.start_s``/``end_s`` or ``Chunk.meta``) that search hits carry
      through to the API, e.g. ``("start_s", "end_s")`` or ``("width", "height", "format")``.
    - ``notice``: one line saying what the loaded plugin runs without and what to install (e.g. ``"OCR off:
      Tesseract is not installed (...)"``); empty: nothing. ``qmd-indexer plugins`` and ``status`` show it, and
      it is logged once (``plugin_limited``) where a workspace enables the plugin's media kinds.
    """

    kinds: frozenset[str]
    media: bool = False
    hit_fields: tuple[str, ...] = ()
    notice: str = ""

    def extract(self, file: FileInfo, context: ExtractContext) -> Iterator[Chunk]: ...


@runtime_checkable
class Embedder(Protocol):
    """Embeds chunks of one modality into a fixed-size dense space.

    - ``model_id``: stable identifier of the model and its settings; part of the payload (and of the embedding-cache
      key when there is no ``identity``).
    - ``modality``: the chunks it accepts and the Qdrant named vector it fills (``"text"``, ``"image"``, or any
      lowercase name a plugin declares; ``MODALITY_PATTERN``).
    - ``dim``: vector size, may be learnt lazily; ``max_tokens``: a text model's input limit (chunks are sized to it).

    ``embed(chunks)`` returns ``(len(chunks), dim)`` float32, rows L2-normalised. ``embed_query(text)`` returns
    ``(dim,)`` float32, L2-normalised: the query embedded into this space (for an image embedder, its text tower),
    so a text query can search this modality. A ``"text"`` embedder must satisfy ``TextEmbedder``.

    Errors, both from ``indexer.errors`` (re-exported here):

    - ``EmbedError`` for an input it cannot embed (undecodable image bytes): the file is marked failed, its points go.
    - ``EmbedUnavailable`` (a subclass) when it cannot answer now (a server down, 429, 5xx, a timeout, a model still
      loading), with ``retry_after_s`` when the server said how long to wait: indexing retries the files later with
      backoff and never marks them failed nor removes their points; a search answers from keyword search with
      ``degraded`` set. An embedder behind a network must raise this, not ``EmbedError``, for anything transient.

    Optional declarations, read with ``indexer.contract.declared`` (defaults below; not evaluated at load):

    - ``identity``: what made the vectors, in full (model, precision, a fingerprint of its files; for a remote model
      its endpoint host, model, vector size and prefixes). A change of it rebuilds the collections safely
      (``on_model_change``), it keys the embedding cache and ``status`` shows it. Default: ``model_id``.
    - ``precision`` (``"fp32"``, ``"int8"``...) and ``query_file`` (the file single queries run on, where it differs
      from the chunks' model), shown by ``status``.
    - ``relevance_floor``: a text model's query-chunk cosine from which a hit is relevant (``indexer.relevance``;
      MiniLM's unrelated pairs sit near 0.2, e5's near 0.75). ``None``: MiniLM's 0.42; the setting wins over both.

    - loading (``indexer.service``, ``status``): ``preload()`` starts the load on a thread it returns (queries may
      raise ``EmbedUnavailable`` meanwhile); ``loading``, ``load_error``, ``load_times`` (seconds per step),
      ``load_progress`` (``{"phase", "percent"}``); ``unavailable()``: why it cannot embed now, never waiting.
    """

    model_id: str
    modality: str
    dim: int
    max_tokens: int | None
    identity: str = ""
    precision: str | None = None
    query_file: str | None = None
    relevance_floor: float | None = None
    preload: Callable[[], threading.Thread | None] | None = None
    loading: bool = False
    load_error: BaseException | None = None
    load_times: Mapping[str, float] = MappingProxyType({})
    load_progress: Mapping[str, Any] | None = None
    unavailable: Callable[[], str | None] | None = None

    def embed(self, chunks: Sequence[Chunk]) -> np.ndarray: ...

    def embed_query(self, text: str) -> np.ndarray: ...


@runtime_checkable
class TextEmbedder(Embedder, Protocol):
    """The embedder of modality ``"text"``: it also sizes chunks, so extractors can fit them to the model.

    - ``max_tokens``: how many model tokens one input may hold before the model truncates it (positive ``int``).
    - ``token_offsets(text)``: ``(start, end)`` character offsets of each model token of ``text``, no special
      tokens; the pipeline hands both to extractors as ``ExtractContext``.

    Offsets: what must hold is that the list is in text order, each pair within ``0 <= start <= end <= len(text)``,
    and that ``max_tokens`` of them cover no more text than one input may hold; chunks end on the ``end`` of a
    token. Tokens need not be the model's own: an embedder without the model's tokenizer (a remote one) may give a
    conservative stand-in, e.g. one "token" per character against a budget in characters. Gaps between tokens
    (whitespace) are allowed and the tokens need not cover them. Model tokens proper (word pieces) are optional: they
    only make chunks fuller. An input that is still too long for the model must never be truncated silently: split
    it and embed the parts (or raise ``EmbedError``).

    Checked when the plugin loads: a text embedder without ``token_offsets`` fails there with a plugin error.
    """

    max_tokens: int  # narrows Embedder.max_tokens: a text embedder always has a limit

    def token_offsets(self, text: str) -> list[tuple[int, int]]: ...


@runtime_checkable
class Reranker(Protocol):
    """Rescores the first fused hits of a search (``indexer.rerank``); used only when the ``reranker`` setting names
    it (off by default), so at most one is loaded.

    - ``model_id``: identifies the model and its settings (``status`` shows it), e.g. the model directory.
    - ``score(query, texts, timeout_s=None)``: one float per text, in order, higher meaning the text answers
      ``query`` better (e.g. a cross-encoder's logit); the scores become the hits' ``score``. ``timeout_s`` is the
      search's ``rerank_budget_s``, in seconds: a plugin that can stop waiting (an HTTP request) gives up by then
      and raises ``TimeoutError``. The parameter is optional in a plugin's signature: a ``score(query, texts)`` is
      called without it. Raise on failure: the search then keeps the fused order (it fails open), says so in the
      answer's ``degraded`` and ``status`` counts it, as it does when scoring takes longer than ``rerank_budget_s``.
    - ``relevance_floor`` (optional, default ``None``): the score from which a text answers the query (0.5 for a
      probability, 0 for a logit). Declared, the reranker decides whether a hit it scored is relevant
      (``indexer.relevance``: a model that reads the question and the passage together knows better than a
      cosine); ``None``: its scores order the hits only.
    """

    model_id: str
    relevance_floor: float | None = None

    def score(self, query: str, texts: Sequence[str], timeout_s: float | None = None) -> list[float]: ...


@dataclass(frozen=True, slots=True)
class Message:
    """One message of a session transcript, as a ``TranscriptFormat`` reads it from one record.

    - ``role``: ``"user"``, ``"assistant"`` or ``"tool"`` (a tool's result); other roles are not indexed.
    - ``text``: what was said, the visible text only (no thinking, no tool call arguments).
    - ``timestamp``: when, ISO 8601 as the record gives it (``2023-05-08T13:57:00.000Z``); empty when unknown.
    """

    role: str
    text: str
    timestamp: str = ""


@dataclass(frozen=True, slots=True)
class TranscriptRecord:
    """What one JSON record of a transcript holds: the session's id and start where it says them (a header record),
    its ``timestamp`` (ISO 8601, empty when none) and the ``messages`` it carries (none for bookkeeping records:
    a model change, a summary)."""

    session_id: str = ""
    timestamp: str = ""
    messages: tuple[Message, ...] = ()


@runtime_checkable
class TranscriptFormat(Protocol):
    """Reads one transcript format (group ``qmd_indexer.transcripts``).

    - ``sniff(head)``: whether a ``*.jsonl`` file whose first ``HEAD_BYTES`` bytes are ``head`` is a transcript of
      this format (content sniffing: an index such as ``sessions.json``, a lock file or any other JSON Lines file
      must answer ``False``). Must not raise.
    - ``read(record)``: one parsed JSON object (a line of the file) as a ``TranscriptRecord``; a record of a type it
      does not know is an empty ``TranscriptRecord()``. Must not raise for unknown shapes.

    Formats are asked in ascending ``priority`` (built-ins use 100); the first to ``sniff`` true reads the file.
    """

    priority: int = 100

    def sniff(self, head: bytes) -> bool: ...

    def read(self, record: Mapping[str, Any]) -> TranscriptRecord: ...


#: the modality of the embedder that embeds text chunks and queries (always required)
TEXT = "text"
#: what an embedder's ``modality`` may be: it names a Qdrant named vector (``bm25`` is taken by keyword search)
MODALITY_PATTERN = r"[a-z][a-z0-9_]{0,31}"
RESERVED_MODALITIES = frozenset({"bm25"})


def check_vectors(vectors: Any, count: int, dim: int | None, source: str) -> np.ndarray:
    """An embedder's answer as a ``(count, dim)`` float32 array, checked where it enters: one vector per input,
    each of ``dim`` numbers (any size when ``dim`` is ``None``), finite, of non-zero norm. ``source`` names the
    embedder in the error. Raises ``BadVectors`` naming the first bad row and what is wrong with it."""
    try:
        array = np.asarray(vectors, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise BadVectors(f"{source} answered vectors that are not numbers: {exc}") from exc
    if array.ndim != 2 or array.shape[0] != count:
        raise BadVectors(f"{source} answered {array.shape[0] if array.ndim else 0} vector(s) for {count} input(s)")
    if dim is not None and array.shape[1] != dim:
        raise BadVectors(f"{source} answered vectors of size {array.shape[1]}, not the collection's {dim}")
    finite = np.isfinite(array).all(axis=1)
    if not finite.all():
        row = int(np.argmin(finite))
        kind = "NaN" if np.isnan(array[row]).any() else "inf"
        raise BadVectors(f"{source} answered {kind} in vector {row} of {count}")
    zero = ~np.any(array != 0, axis=1)
    if zero.any():
        raise BadVectors(f"{source} answered an all-zero vector ({int(np.argmax(zero))} of {count})")
    return array


def l2_normalise(vectors: np.ndarray) -> np.ndarray:
    """Rows of ``vectors`` scaled to unit L2 norm, as float32; zero rows stay zero. Shape is kept."""
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    out: np.ndarray = np.divide(vectors, norms, out=np.zeros_like(vectors), where=norms > 0)
    return out


_HELPERS = {
    "chunk_text": "indexer.chunking", "TextChunk": "indexer.chunking", "decode_text": "indexer.safeio",
    "load_sentence_transformer": "indexer.model_loading", "LazyModel": "indexer.model_loading",
}


def __getattr__(name: str) -> Any:
    """The re-exported helpers, imported on first use: they import this module, and ``load_sentence_transformer``
    must not pull torch into ``qmd-indexer plugins``."""
    module = _HELPERS.get(name)
    if module is None:
        raise AttributeError(f"module 'indexer.api' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
