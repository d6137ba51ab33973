"""What crosses into and out of Qdrant: points, their payload, ids, filters and queries. No I/O.

This is the one place that knows the collection schema (the README's "Collection schema" lists it for other tools):

- named dense vectors, one per modality (``"text"``, ``"image"``), cosine distance;
- ``SPARSE`` (``"bm25"``): BM25 term weights of the chunk text, with Qdrant's IDF modifier;
- the payload (``Payload``), written by ``Payload.to_payload`` and read back by ``Payload.from_payload`` only;
- payload indexes: keyword on ``KEYWORD_FIELDS``, integer on ``INTEGER_FIELDS`` (Edge also indexes ``file_hash``
  and ``file_state``, chunk 0's ``state_key``, for reading file states by facets).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from indexer.dates import RequestTimes
from indexer.schema import SearchRequest, names

SPARSE = "bm25"  # the sparse vector's name: BM25 terms with Qdrant's IDF modifier
KEYWORD_FIELDS = ("abs_path", "path", "dirs", "kind")  # keyword payload indexes (exact-match filters)
INTEGER_FIELDS = ("mtime_ns",)  # integer payload indexes (range filters: ``since``, ``until``)
STATE_FIELDS = ("abs_path", "file_hash", "size_bytes", "mtime_ns", "ctime_ns", "inode", "device",
                "chunk_count")  # what ``FileState`` needs


def point_id(collection: str, abs_path: str, chunk_index: int) -> str:
    """Deterministic point id: uuid5 of collection, absolute path and chunk index (RFC 4122 name-based UUID), so
    re-indexing a file overwrites its points instead of duplicating them."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"qmd-indexer:{collection}:{abs_path}#{chunk_index}"))


def ancestor_dirs(rel_path: str) -> list[str]:
    """``"a/b/c.md"`` -> ``["a", "a/b"]``: the payload field that makes directory-prefix filters exact matches."""
    parts = rel_path.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


@dataclass(frozen=True, slots=True, kw_only=True)
class Payload:
    """The payload of one point (one chunk of one file). Defaults stand for fields a partial read left out.

    ``path`` is workspace-relative with ``/`` separators, ``abs_path`` absolute; ``file_hash`` is the sha256 hex of
    the whole file and ``chunk_count`` its number of points (together they tell a complete write from an
    interrupted one); ``size_bytes``/``mtime_ns``/``ctime_ns``/``inode``/``device`` are the file's ``stat`` when
    indexed (-1: not recorded, so the next check re-hashes); ``start_line``/``end_line`` are 1-based and inclusive;
    ``text`` is the chunk's own lines (what a hit shows) and ``context`` the document context embedded and
    keyword-indexed with it (title > headings); ``chunking_version`` is ``indexer.chunking.CHUNKING_VERSION`` when it
    was chunked; ``start_s``/``end_s`` are seconds (audio); ``tail`` (a transcript's chunk 0 only) is where it was
    indexed up to (``indexer.sources.tailing.Tail.record``); ``extra`` holds a plugin's own fields (``Chunk.meta``,
    e.g. image ``width``/``height``), stored at the top level of the payload.
    """

    agent: str = ""
    collection: str = ""
    path: str = ""
    abs_path: str = ""
    file_hash: str = ""
    size_bytes: int = -1
    mtime_ns: int = -1
    ctime_ns: int = -1
    inode: int = -1
    device: int = -1
    chunk_index: int = 0
    chunk_count: int = -1
    start_line: int = 1
    end_line: int = 1
    text: str = ""
    context: str = ""
    kind: str = "markdown"
    modality: str = "text"
    model_id: str = ""
    chunking_version: int = 0
    start_s: float | None = None
    end_s: float | None = None
    tail: Mapping[str, Any] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_payload(self) -> dict[str, Any]:
        """The JSON object stored in Qdrant: every field, ``dirs`` (ancestor directories of ``path``), and
        ``extra`` merged in (it cannot override a field of ours). ``None`` times are left out."""
        out: dict[str, Any] = {k: v for k, v in self.extra.items() if k not in _OWN}
        for f in _FIELDS:
            value = getattr(self, f)
            if value is not None:
                out[f] = value
        out["dirs"] = ancestor_dirs(self.path)
        if self.chunk_index == 0:
            out[STATE_KEY] = state_key(self)
        return out

    def get(self, key: str, default: Any = None) -> Any:
        """A field of ours or of ``extra`` by name (``default`` when absent or ``None``)."""
        value = getattr(self, key, None) if key in _OWN else self.extra.get(key)
        return default if value is None else value

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> Payload:
        """Read a stored payload (whole or partial); unknown keys go to ``extra``."""
        known = {k: payload[k] for k in _FIELDS if k in payload and payload[k] is not None}
        for k in _INTS:
            if k in known:
                known[k] = int(known[k])
        extra = {k: v for k, v in payload.items() if k not in _OWN}
        return cls(**known, extra=extra)


NO_PAYLOAD = Payload()  # a hit or candidate whose payload was not read
_FIELDS = tuple(f.name for f in fields(Payload) if f.name != "extra")
_INTS = ("size_bytes", "mtime_ns", "ctime_ns", "inode", "device", "chunk_index", "chunk_count", "start_line",
         "end_line", "chunking_version")
_OWN = frozenset(_FIELDS) | {"dirs", "file_state"}
STATE_KEY = "file_state"  # on chunk 0 only: ``state_key`` of its file


def state_key(payload: Payload) -> str:
    """The file's indexed state in one string, stored on its chunk 0 (``STATE_KEY``) so that a facet over it reads
    every file's state off a keyword index, without reading each chunk 0's payload (``store.edge_states``): the
    JSON array of its ``STATE_FIELDS`` values, in that order."""
    return json.dumps([getattr(payload, f) for f in STATE_FIELDS], ensure_ascii=False, separators=(",", ":"))


def parse_state_keys(values: Sequence[str]) -> dict[str, FileState]:
    """``abs_path -> FileState`` of whole files (``points`` is the ``chunk_count``, ``complete`` true) from
    ``state_key`` values, parsed as one JSON document (far faster than value by value through ``Payload``:
    docs/performance.md, "Scans"). Raises ``ValueError`` on a malformed value, or when two values name one file."""
    try:
        rows = json.loads("[" + ",".join(values) + "]")
        if len(rows) != len(values):  # a value holding two arrays, or none
            raise ValueError(f"{len(values)} values held {len(rows)} states")
        states: dict[str, FileState] = {}
        for abs_path, file_hash, size, mtime, ctime, inode, device, chunk_count in rows:  # STATE_FIELDS' order
            if not isinstance(abs_path, str) or not isinstance(file_hash, str):
                raise TypeError(f"abs_path and file_hash must be strings: {abs_path!r}, {file_hash!r}")
            states[abs_path] = FileState(file_hash, int(size), int(mtime), int(chunk_count), True, int(ctime),
                                         int(inode), int(device))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"not file state keys: {exc}") from exc
    if len(states) != len(rows):
        raise ValueError("two state keys name one file")
    return states


@dataclass(frozen=True, slots=True)
class Point:
    """One point to upsert: ``dense`` maps a named vector to its ``(dim,)`` float32 values; ``sparse`` maps a
    sparse vector name to ``(indices, values)``."""

    id: str
    dense: dict[str, np.ndarray]
    sparse: dict[str, tuple[list[int], list[float]]]
    payload: Payload


@dataclass(frozen=True, slots=True)
class FileState:
    """What the store holds of one file: its content hash and the stat it was indexed at; ``complete`` is false
    when the points disagree (mixed hashes, or fewer points than ``chunk_count``: an interrupted write).
    ``ctime_ns``/``inode``/``device`` are -1 when not recorded (points written before they were)."""

    file_hash: str
    size_bytes: int
    mtime_ns: int
    points: int
    complete: bool
    ctime_ns: int = -1
    inode: int = -1
    device: int = -1
    # a transcript's ``indexer.sources.tailing.Tail`` (where it was indexed up to; stored in chunk 0's payload ``tail``)
    tail: Any = field(default=None, compare=False)

    def identity(self) -> tuple[int, int, int, int, int]:
        """``(size, mtime_ns, ctime_ns, inode, device)``: the stat that, all equal, lets a file skip its hash."""
        return (self.size_bytes, self.mtime_ns, self.ctime_ns, self.inode, self.device)


def stat_identity(st: Any) -> tuple[int, int, int, int, int]:
    """``FileState.identity`` of an ``os.stat_result``: any change of content moves at least one of these (an
    mtime put back by ``touch -r``/``cp -p``/``rsync -a`` still moves ``ctime_ns``; a replaced file moves
    ``inode``)."""
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


@dataclass(frozen=True, slots=True, kw_only=True)
class Filter:
    """Which points a search, scroll or delete sees; every given condition must hold.

    - ``path_prefix``: a workspace-relative file path or directory (``memory/projects``);
    - ``kinds``: source kinds (``markdown``, ``image``...), any of them;
    - ``since_ns``: files modified at or after this time (nanoseconds since the epoch, the payload's ``mtime_ns``);
    - ``until_ns``: files modified before this time (same unit; with ``since_ns``, the window ``[since, until)``);
    - ``abs_path``: one file; ``except_hash``: points whose ``file_hash`` differs (a file's stale points);
    - ``chunk_index``: points of that chunk index (with ``abs_path``: one point, a file's chunk 0 that carries its
      state).
    """

    path_prefix: str | None = None
    kinds: tuple[str, ...] = ()
    since_ns: int | None = None
    until_ns: int | None = None
    abs_path: str | None = None
    except_hash: str | None = None
    chunk_index: int | None = None


_NO_FILTER = Filter()


def search_filter(request: SearchRequest, times: RequestTimes) -> Filter:
    """The ``Filter`` of a search request's conditions on points (``path_prefix``, ``kind``, and the window of its
    ``times``, read once by ``SearchRequest.times``)."""
    return Filter(path_prefix=request.path_prefix, kinds=names(request.kind), since_ns=times.since_ns,
                  until_ns=times.until_ns)


@dataclass(frozen=True, slots=True, kw_only=True)
class Query:
    """One retrieval against one collection: a nearest-neighbour search per named dense vector in ``dense`` and,
    when ``sparse`` is given, one over the BM25 sparse vector; each returns up to ``limit`` points passing
    ``filter`` and scoring at least ``thresholds.get(vector name)``. Fusion of the lists is the caller's
    (``indexer.search``), so that lists from several collections are fused as one pool."""

    limit: int
    dense: Mapping[str, np.ndarray] = field(default_factory=dict)
    sparse: tuple[list[int], list[float]] | None = None
    filter: Filter = _NO_FILTER
    thresholds: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Hit:
    """A scored point: ``score`` is the cosine similarity (dense), BM25 score (keyword) or fused score; after fusion,
    ``dense_score``/``keyword_score`` are the point's raw scores in the text and BM25 lists (``None``: not in it),
    ``rerank_score`` the reranker's (``None``: not reranked)."""

    id: str
    score: float
    payload: Payload
    dense_score: float | None = None
    keyword_score: float | None = None
    rerank_score: float | None = None
