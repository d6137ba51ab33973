"""The backend-neutral store: its public operations, its lock, and the one translation of filters and queries.

Each backend (``edge.py``, ``server.py``) implements the ``_``-prefixed primitives and hands a ``Dialect`` (the
model classes of its client library) to the shared translation, so a filter or query is written once.

``replace_file`` upserts a file's new points and deletes its points of any other content hash while holding the
store's lock, and every query takes that lock too, so a search never sees two versions of one file.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from indexer.errors import CollectionMismatch
from indexer.points import SPARSE, STATE_FIELDS, FileState, Filter, Hit, Payload, Point, Query

SCROLL_PAGE = 1024  # payloads per scroll request


@dataclass(frozen=True, slots=True)
class Dialect:
    """The model classes of one client library. ``qdrant_edge`` and ``qdrant_client.models`` share the names and
    keyword arguments used here (``Filter(must=, should=, must_not=)``, ``FieldCondition(key=, match=, range=)``,
    ``MatchValue(value=)``, ``MatchAny(any=)``, ``SparseVector(indices=, values=)``); only the range class differs."""

    models: Any
    range: Any  # the range condition class: ``qdrant_edge.RangeFloat`` / ``models.Range``

    def match(self, key: str, value: str) -> Any:
        return self.models.FieldCondition(key=key, match=self.models.MatchValue(value=value))

    def filter(self, f: Filter) -> Any:
        """The library's filter for ``f``, or ``None`` when ``f`` has no condition."""
        m = self.models
        must: list[Any] = []
        if f.abs_path is not None:
            must.append(self.match("abs_path", f.abs_path))
        if f.path_prefix:
            prefix = f.path_prefix.strip("/")
            must.append(m.Filter(should=[self.match("path", prefix), self.match("dirs", prefix)]))
        if f.kinds:
            must.append(m.FieldCondition(key="kind", match=m.MatchAny(any=list(f.kinds))))
        if f.since_ns is not None:
            must.append(m.FieldCondition(key="mtime_ns", range=self.range(gte=float(f.since_ns))))
        must_not = [self.match("file_hash", f.except_hash)] if f.except_hash is not None else None
        if not must and not must_not:
            return None
        return m.Filter(must=must or None, must_not=must_not)

    def vectors(self, point: Point) -> dict[str, Any]:
        """A point's named vectors: dense as lists of floats, sparse as the library's ``SparseVector``."""
        out: dict[str, Any] = {name: values.tolist() for name, values in point.dense.items()}
        for name, (indices, values) in point.sparse.items():
            out[name] = self.models.SparseVector(indices=indices, values=values)
        return out

    def searches(self, query: Query) -> dict[str, Any]:
        """Vector name -> the query vector to search it with: one per dense vector, plus BM25 if terms are given."""
        out: dict[str, Any] = {using: vector.tolist() for using, vector in query.dense.items()}
        if query.sparse and query.sparse[0]:
            out[SPARSE] = self.models.SparseVector(indices=query.sparse[0], values=query.sparse[1])
        return out


def file_states(payloads: Iterator[Mapping[str, Any]]) -> dict[str, FileState]:
    """``abs_path -> FileState`` from the ``STATE_FIELDS`` of every point of a collection."""
    seen: dict[str, tuple[set[str], int, Payload]] = {}
    for raw in payloads:
        p = Payload.from_payload(raw)
        hashes, n, first = seen.get(p.abs_path, (set(), 0, p))
        hashes.add(p.file_hash)
        seen[p.abs_path] = (hashes, n + 1, first)
    return {path: FileState(first.file_hash, first.size_bytes, first.mtime_ns, n,
                            len(hashes) == 1 and n == first.chunk_count,
                            first.ctime_ns, first.inode, first.device)
            for path, (hashes, n, first) in seen.items()}


def point_from_record(pid: Any, vectors: Mapping[str, Any] | None, payload: Mapping[str, Any] | None) -> Point:
    """A ``Point`` from a stored record: its id, named vectors (dense: list of floats; sparse: an object with
    ``indices`` and ``values``) and payload."""
    dense: dict[str, np.ndarray] = {}
    sparse: dict[str, tuple[list[int], list[float]]] = {}
    for vname, value in (vectors or {}).items():
        if hasattr(value, "indices"):
            sparse[vname] = (list(value.indices), list(value.values))
        else:
            dense[vname] = np.asarray(value, np.float32)
    return Point(str(pid), dense, sparse, Payload.from_payload(payload or {}))


class Store:
    """Backend-neutral base: subclasses implement the ``_``-prefixed primitives; this class holds the lock.

    ``degraded`` is true while writes to the store are failing (a server backend retrying or giving up)."""

    kind = "abstract"
    degraded = False

    def __init__(self, dialect: Dialect) -> None:
        self._lock = threading.RLock()
        self.dialect = dialect

    def ensure_collection(self, name: str, dense: dict[str, int]) -> None:
        """Create collection ``name`` with named vectors ``dense`` (name -> size) plus the BM25 sparse vector, or
        check an existing one. Raises ``CollectionMismatch`` if a vector's size differs; a missing named vector
        (a modality enabled later) is added."""
        with self._lock:
            existing = self._dense_config(name)
            if existing is None:
                self._create(name, dense)
                return
            for vector, size in dense.items():
                if vector in existing and existing[vector] != size:
                    raise CollectionMismatch(
                        f"collection {name!r} holds {vector!r} vectors of size {existing[vector]}, but the configured "
                        f"embedder makes {size}; the model changed. Rebuild it with "
                        f"`qmd-indexer index --once --reindex` (or `run --reindex`)."
                    )
                if vector not in existing:
                    self._add_vector(name, vector, size)

    def upsert(self, name: str, points: Sequence[Point]) -> None:
        """Insert or overwrite ``points`` (by id) in ``name``; for bulk loads. The daemon uses ``replace_file``."""
        with self._lock:
            if points:
                self._upsert(name, points)

    def replace_file(self, name: str, abs_path: str, file_hash: str, points: Sequence[Point]) -> None:
        """Make ``points`` the only points of ``abs_path`` in ``name``: upsert, then delete other hashes."""
        with self._lock:
            if points:
                self._upsert(name, points)
            self._delete(name, Filter(abs_path=abs_path, except_hash=file_hash))

    def delete_file(self, name: str, abs_path: str) -> None:
        """Remove every point of ``abs_path`` from ``name``."""
        with self._lock:
            self._delete(name, Filter(abs_path=abs_path))

    def file_states(self, name: str) -> dict[str, FileState]:
        """``abs_path -> FileState`` for every file with points in ``name`` (one scroll over the payloads)."""
        with self._lock:
            return file_states(self._scroll(name, list(STATE_FIELDS)))

    def search(self, name: str, query: Query) -> dict[str, list[Hit]]:
        """Run ``query`` on ``name``: vector name (``"text"``, ``"image"``, ``"bm25"``) -> hits, best first."""
        searches = self.dialect.searches(query)
        if not searches:
            return {}
        flt = self.dialect.filter(query.filter)
        with self._lock:
            answers = self._query(name, searches, flt, query)
        return {using: [Hit(str(pid), float(score), Payload.from_payload(payload or {}))
                        for pid, score, payload in answer]
                for using, answer in answers.items()}

    def count(self, name: str) -> int:
        """Exact number of points in ``name``."""
        with self._lock:
            return self._count(name)

    def drop(self, name: str) -> None:
        """Delete collection ``name`` and all its points (for ``--reindex``)."""
        with self._lock:
            self._drop(name)

    def scroll(self, name: str, fields: Sequence[str] | None = None) -> list[Payload]:
        """Every payload in ``name`` (only ``fields``, if given; the rest take ``Payload``'s defaults)."""
        with self._lock:
            return [Payload.from_payload(raw) for raw in self._scroll(name, list(fields) if fields else None)]

    def collections(self) -> dict[str, dict[str, int]]:
        """Every collection in the store: name -> its dense vectors (name -> size)."""
        with self._lock:
            return {name: self._dense_config(name) or {} for name in self._names()}

    def scroll_points(self, name: str, page: int = SCROLL_PAGE) -> Iterator[Point]:
        """Every point of ``name`` with its vectors and payload, read ``page`` points per request (the lock is
        held per page, not across the iteration)."""
        offset: Any = None
        while True:
            with self._lock:
                points, offset = self._points_page(name, offset, page)
            yield from points
            if offset is None:
                return

    def flush(self) -> None:
        """Persist what is buffered (Edge); a no-op for a server."""

    def close(self) -> None:
        """Release the backend (file locks, connections)."""

    # primitives ------------------------------------------------------------------------------------------------
    def _dense_config(self, name: str) -> dict[str, int] | None:
        raise NotImplementedError

    def _create(self, name: str, dense: dict[str, int]) -> None:
        raise NotImplementedError

    def _add_vector(self, name: str, vector: str, size: int) -> None:
        raise NotImplementedError

    def _upsert(self, name: str, points: Sequence[Point]) -> None:
        raise NotImplementedError

    def _delete(self, name: str, flt: Filter) -> None:
        raise NotImplementedError

    def _scroll(self, name: str, fields: list[str] | None) -> Iterator[Mapping[str, Any]]:
        raise NotImplementedError

    def _names(self) -> list[str]:
        raise NotImplementedError

    def _points_page(self, name: str, offset: Any, limit: int) -> tuple[list[Point], Any]:
        """Up to ``limit`` points from ``offset`` (``None``: the start), and the next offset (``None``: done)."""
        raise NotImplementedError

    def _query(self, name: str, searches: dict[str, Any], flt: Any,
               query: Query) -> dict[str, list[tuple[Any, float, Mapping[str, Any] | None]]]:
        """Per vector name, ``(point id, score, payload)`` best first; ``flt`` is already translated."""
        raise NotImplementedError

    def _count(self, name: str) -> int:
        raise NotImplementedError

    def _drop(self, name: str) -> None:
        raise NotImplementedError
