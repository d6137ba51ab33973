"""The configuration a Qdrant Edge shard is created with (``EdgeStore``): its vectors, their memory tiers, its payload
indexes; and the two records that say how one was made: ours (``qmd-collection.json``) and Edge's own
(``edge_config.json``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from indexer.errors import CollectionDamaged
from indexer.points import SPARSE

REBUILD_HINT = "rebuild it from the memory files with `qmd-indexer index --once --reindex` (nothing else is lost)"


def collection_record(meta: Path) -> dict[str, Any]:
    """A collection's record, ``qmd-collection.json`` (``{"dense": {vector name: size}, ...}``). Raises
    ``CollectionDamaged`` when it cannot be read as one (not JSON, another value, sizes that are not integers)."""
    try:
        record = json.loads(meta.read_text())
        if not isinstance(record, dict) or not all(isinstance(size, int) for size in record["dense"].values()):
            raise ValueError("not a collection record")
    except (OSError, ValueError, KeyError, AttributeError) as exc:
        raise CollectionDamaged(f"{meta} is damaged ({type(exc).__name__}: {str(exc)[:200]}); {REBUILD_HINT}") from None
    return record


def shard_config(folder: Path) -> dict[str, Any]:
    """The shard's own record of how it was created (``edge_config.json``, written by Qdrant Edge); ``{}`` when it
    cannot be read (loading the shard then says what is wrong)."""
    try:
        config = json.loads((folder / "edge_config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def edge_config(qe: Any, dense: Mapping[str, int], on_disk_vectors: bool = False, quantization: str = "none") -> Any:
    """The ``qdrant_edge.EdgeConfig`` a collection is created with: cosine dense vectors ``name -> size`` and the
    BM25 sparse vector with Qdrant's IDF modifier; ``quantization`` "int8": a scalar int8 copy of the dense vectors.

    ``on_disk_vectors`` (a large collection): the original vectors, the int8 copy and the HNSW graph memory-mapped
    without pre-warming (``Memory.Cold``: pages are read on first use; ``edge_warm`` reads the search files in
    the background after a load), so that
    ``EdgeShard.load`` reads none of them (load times per tier: docs/performance.md, "Qdrant Edge"; an int8 copy
    ``Memory.Pinned`` is copied out of its file at every load). Otherwise the vectors are
    in Edge's default tier (``Cached``) and the int8 copy pinned in RAM. Edge applies these when a segment is
    built: ``EdgeShard.load(path, config)`` does not change the tier of existing segments."""
    if on_disk_vectors:
        vectors, scalar, graph = qe.Memory.Cold, qe.Memory.Cold, qe.Memory.Cold
    else:
        vectors, scalar, graph = None, qe.Memory.Pinned, None  # None: Edge's default (Cached)
    return qe.EdgeConfig(
        vectors={v: qe.EdgeVectorParams(size=s, distance=qe.Distance.Cosine, memory=vectors) for v, s in dense.items()},
        sparse_vectors={SPARSE: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)},
        quantization_config=qe.ScalarQuantizationConfig(type=qe.ScalarType.Int8, memory=scalar)
        if quantization == "int8" else None,
        # Qdrant's defaults (m 16, ef_construct 100, full scan under 10,000 KB), the graph's tier set
        hnsw_config=qe.HnswIndexConfig(m=16, ef_construct=100, full_scan_threshold=10_000, memory=graph)
        if graph is not None else None,
    )


def field_index(qe: Any, key: str, integer: bool, on_disk: bool, lookup: bool = True) -> Any:
    """The ``create_field_index`` operation of payload field ``key`` (keyword, or integer with range and, if
    ``lookup``, exact-match lookup); ``on_disk``: memory-mapped cold, not loaded into RAM at ``EdgeShard.load`` (see
    ``edge_config``). ``lookup`` False (only with ``on_disk``): no lookup map, which range filters (``since``,
    ``until``) do not use and which costs 3 MiB of tmpfs per collection at a restart (``edge_warm``)."""
    ops = qe.UpdateOperation
    if not on_disk:
        return ops.create_field_index(key, qe.PayloadSchemaType.Integer if integer else qe.PayloadSchemaType.Keyword)
    params = qe.IntegerIndexParams(lookup=lookup, range=True, memory=qe.Memory.Cold) if integer else \
        qe.KeywordIndexParams(memory=qe.Memory.Cold)
    return ops.create_field_index(key, params)
