"""The one translation between the store's values (``indexer.points``) and a client library's: a ``Dialect`` (the
model classes of ``qdrant_edge`` or ``qdrant_client.models``) turns a ``Filter`` or a ``Query`` into the library's
filter and query vectors and a ``Point`` into its named vectors; ``point_from_record`` and ``file_states`` read
stored records and payloads back. No I/O: each backend (``edge.py``, ``server.py``) hands its ``Dialect`` to
``indexer.store.base.Store``."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from indexer.points import SPARSE, FileState, Filter, Payload, Point, Query


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
        if f.until_ns is not None:
            must.append(m.FieldCondition(key="mtime_ns", range=self.range(lt=float(f.until_ns))))
        if f.chunk_index is not None:
            must.append(m.FieldCondition(key="chunk_index", match=m.MatchValue(value=f.chunk_index)))
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
    """``abs_path -> FileState`` from the ``STATE_FIELDS`` (and ``chunk_index``) of every point of a collection;
    a file's state is its chunk 0's where it has one (a transcript's tail rewrites chunk 0 with the file's new state
    and leaves its other points as they were, ``indexer.sync``)."""
    seen: dict[str, tuple[set[str], int, Payload]] = {}
    for raw in payloads:
        p = Payload.from_payload(raw)
        hashes, n, first = seen.get(p.abs_path, (set(), 0, p))
        hashes.add(p.file_hash)
        seen[p.abs_path] = (hashes, n + 1, p if p.chunk_index == 0 and "chunk_index" in raw else first)
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

