"""Qdrant Edge (``qdrant-edge-py``): Qdrant's engine inside this process, one shard per collection; the embedded
default, far faster than qdrant-client's local mode (docs/performance.md, "Qdrant Edge").

HNSW index: ``EdgeShard.optimize()`` holds the GIL for its whole run, so ``build_index`` runs it in a child process
(``edge_optimize``) on a copy of the shard and swaps the copy in (``Store.swap``), replaying the writes made
meanwhile; the daemon calls it for a collection of at least ``edge_hnsw_min_points`` points that has none.

Large collections (``qdrant_on_disk_vectors``, ``qdrant_quantization``, applied at creation): vectors, their int8
copy, the HNSW graph and payload indexes are memory-mapped in Qdrant's ``Memory.Cold`` tier (read on first use;
``edge_config``), so a million-point shard loads reading almost nothing; ``edge_warm`` then brings the search files
into the page cache. Without on-disk vectors the int8 copy is pinned in RAM. Dense searches use the int8 copy and
rescore with the originals; Qdrant builds that copy when ``build_index`` optimizes a segment. On tmpfs every new
collection is created so, whatever the setting: there the files are memory already (see ``__init__``); a
restart there still backs the holes of the payload indexes' files, which Edge reads through in every tier, and
checks that room first (``edge_warm.load_room_bytes``).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from indexer.errors import CollectionDamaged, StateDirFull, StoreLocked
from indexer.points import INTEGER_FIELDS, KEYWORD_FIELDS, SPARSE, STATE_KEY, FileState, Filter, Point, Query
from indexer.safeio import lock_exclusive
from indexer.store.base import SCROLL_PAGE, Store
from indexer.store.dialect import Dialect, point_from_record
from indexer.store.edge_config import REBUILD_HINT, collection_record, edge_config, field_index, shard_config
from indexer.store.edge_optimize import optimize_copy
from indexer.store.edge_states import HASH_FIELD, file_states_by_facets
from indexer.store.edge_warm import CREATE_BYTES, DELETE_BYTES, Warmer, load_room_bytes, points_bytes
from indexer.watchmode import filesystem_type

log = structlog.get_logger("qmd_indexer.store")


# keyword payload indexes of an Edge collection (file_hash and file_state: for ``file_states``)
_KEYWORDS = (*KEYWORD_FIELDS, HASH_FIELD, STATE_KEY)
_HNSW_RECORD = "qmd-hnsw.json"  # in a shard's folder: {"points": n}, its point count when its index was built


class EdgeStore(Store):
    """One Edge shard per collection under ``root`` (``<state_dir>/qdrant/<collection>/``, write-ahead logged).

    Only one process can hold the store: ``<root>/.lock`` is locked (``flock``) before anything under ``root`` is
    read, created or deleted, and held until ``close()``, so a second command (``index --once --reindex`` beside a
    running daemon) fails with ``StoreLocked`` before it touches a shard. Queries thus go through the daemon. Shards
    are never ``optimize()``d in this process (it holds the GIL for its whole run, a minute or more); large
    ones get their HNSW index from ``build_index`` (a child process on a copy), smaller ones are scanned exactly.

    Edge writes through memory maps, so a write on a full file system does not fail: the process dies of SIGBUS.
    Each write (create, upsert, delete) first checks with ``os.statvfs`` that ``root``'s file system keeps
    ``min_free_bytes`` (bytes) free beyond what the write needs, else raises ``StateDirFull`` (a
    ``StoreUnavailable``) and sets ``degraded``; one ``state_dir_full`` log line per outage, one
    ``state_dir_space_recovered`` when a write fits again. Reads are never refused.
    """

    kind = "edge"

    def __init__(self, root: Path, min_free_bytes: int = 0, on_disk_vectors: bool = False,
                 quantization: str = "none") -> None:
        import qdrant_edge as qe

        super().__init__(Dialect(qe, qe.RangeFloat))
        self._qe = qe
        self.root = root
        self.min_free_bytes = min_free_bytes
        self.root.mkdir(parents=True, exist_ok=True)
        # for new collections (see the module docstring). On tmpfs the files are memory already: Edge's default
        # tiers would load a second copy, and the read faults of loading back the files' preallocated holes with
        # tmpfs pages (edge_warm), so new collections there are cold too (nothing needs warming) and have no
        # integer lookup map (range filters do not use it; its Gridstore files take 3 MiB at each first restart).
        self.on_tmpfs = filesystem_type(root) == "tmpfs"
        self.on_disk_vectors = on_disk_vectors or self.on_tmpfs
        self.quantization = quantization  # "none" or "int8", for new collections
        self._rescored: dict[str, Any] = {}  # physical collection -> its dense search params (quantized: rescore)
        self._shards: dict[str, Any] = {}
        self._lock_fd: int | None = None
        # while ``build_index`` runs: (physical collection copied, the writes made to it since, in order)
        self._journal: tuple[str, list[tuple[str, Any]]] | None = None
        self.warmer = Warmer()  # reads a cold shard's search files into the page cache after it loads

    def _hold(self) -> None:
        """Take the store's process lock if not yet held. Raises ``StoreLocked`` when another process holds it."""
        if self._lock_fd is not None:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock_fd = lock_exclusive(self.root / ".lock", f"the embedded store {self.root}")

    def free_bytes(self) -> int:
        """Bytes available to this process on ``root``'s file system (``statvfs``: ``f_bavail * f_frsize``)."""
        st = os.statvfs(self.root)
        return st.f_bavail * st.f_frsize

    def ensure_room(self, need_bytes: int) -> None:
        """Raise ``StateDirFull`` unless ``need_bytes`` fit with ``min_free_bytes`` to spare (see the class)."""
        free = self.free_bytes()
        if free >= self.min_free_bytes + need_bytes:
            if self.degraded:
                self.degraded = False
                log.info("state_dir_space_recovered", path=str(self.root), free_bytes=free)
            return
        if not self.degraded:
            self.degraded = True
            log.error("state_dir_full", path=str(self.root), free_bytes=free, needed_bytes=need_bytes,
                      margin_bytes=self.min_free_bytes,
                      hint="store writes are refused and retried; searches answer from what is indexed; free "
                           "space (or lower state_min_free_bytes) and indexing resumes")
        raise StateDirFull(f"the state directory {self.root} has {free} bytes free, under the "
                           f"{self.min_free_bytes} byte margin plus {need_bytes} for this write")

    def _read_aliases(self) -> dict[str, str]:
        self._hold()
        try:
            return {str(k): str(v) for k, v in json.loads((self.root / "aliases.json").read_text()).items()}
        except FileNotFoundError:
            return {}

    def _set_alias(self, name: str, new: str | None, old: str) -> None:
        aliases = self._read_aliases()
        if new is None:
            aliases.pop(name, None)
        else:
            aliases[name] = new
        tmp = self.root / "aliases.json.tmp"
        with open(tmp, "w") as handle:
            handle.write(json.dumps(aliases, sort_keys=True))
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(self.root / "aliases.json")  # atomic: a crash leaves the old or the new mapping
        for shard in (new,):
            if shard is not None and shard in self._shards:
                self._shards[shard].flush()

    def _meta_path(self, name: str) -> Path:
        return self.root / name / "qmd-collection.json"

    def _shard(self, name: str) -> Any:
        shard = self._shards.get(name)
        if shard is None:
            self._hold()
            self._ensure_room_to_load(name)
            try:
                shard = self._qe.EdgeShard.load(str(self.root / name))
            except Exception as exc:  # qdrant-edge raises plain Exceptions; a held WAL lock says WouldBlock
                if "WouldBlock" in str(exc) or "lock" in str(exc).lower():
                    raise StoreLocked(
                        f"the embedded store {self.root} is in use by another process (a running daemon?); "
                        f"query it with `qmd-indexer search`, or stop it first") from None
                raise CollectionDamaged(f"the embedded collection {self.root / name} cannot be loaded "
                                        f"({str(exc)[:300]}); {REBUILD_HINT}") from None
            self._shards[name] = shard
            cold = any(v.get("memory") == "cold" for v in self._edge_config(name).get("vectors", {}).values())
            if cold and not self.on_tmpfs:
                self.warmer.warm(name, self.root / name)
        return shard

    def _ensure_room_to_load(self, name: str) -> None:
        """On tmpfs, loading a shard backs the holes of the files it reads through with memory (its payload indexes'
        Gridstore files; its vectors unless cold: ``edge_warm.load_room_bytes``) and a full tmpfs kills the process
        with SIGBUS: raise ``StateDirFull`` (logged once) unless that room is there."""
        if self.on_tmpfs:
            vectors = self._edge_config(name).get("vectors") or {}
            cold = bool(vectors) and all(v.get("memory") == "cold" for v in vectors.values())
            try:
                self.ensure_room(load_room_bytes(self.root / name, cold))
            except StateDirFull as exc:
                raise StateDirFull(f"{exc}: loading {name} on tmpfs backs its index files with memory") from None

    def _dense_config(self, name: str) -> dict[str, int] | None:
        self._hold()
        meta = self._meta_path(name)
        if not meta.exists():
            return None
        shard = self._shard(name)
        record = collection_record(meta)
        integer_missing = record.get("integer_indexes") != list(INTEGER_FIELDS)  # made before range filters
        keyword_missing = [k for k in _KEYWORDS if k not in record.get("keyword_indexes", KEYWORD_FIELDS)]
        if integer_missing or keyword_missing:  # made before those indexes existed: add them, once
            for key in INTEGER_FIELDS if integer_missing else ():
                shard.update(field_index(self._qe, key, True, self.on_disk_vectors, lookup=not self.on_tmpfs))
            for key in keyword_missing:
                shard.update(field_index(self._qe, key, False, self.on_disk_vectors))
            self._write_meta(name, record["dense"])
        self._report_settings(name)
        return {k: int(v) for k, v in record["dense"].items()}

    def _edge_config(self, name: str) -> dict[str, Any]:
        return shard_config(self.root / name)

    def _report_settings(self, name: str) -> None:
        """One log line when ``name`` was created with other vector settings than the configured ones."""
        config = self._edge_config(name)
        vectors = config.get("vectors") or {}
        on_disk = bool(vectors) and all(v.get("memory") == "cold" or v.get("on_disk") for v in vectors.values())
        quantized = "int8" if (config.get("quantization_config") or {}).get("scalar") else "none"
        differ = {key: {"collection": have, "configured": want}
                  for key, have, want in (("on_disk_vectors", on_disk, self.on_disk_vectors),
                                          ("quantization", quantized, self.quantization)) if have != want}
        self._settings_differ(name, differ)

    def _search_params(self, name: str) -> Any:
        """Dense search params of ``name``: with its int8 copy, rescore the candidates with the original vectors."""
        if name not in self._rescored:
            quantized = bool((self._edge_config(name).get("quantization_config") or {}).get("scalar"))
            qe = self._qe
            self._rescored[name] = qe.SearchParams(quantization=qe.QuantizationSearchParams(rescore=True)) \
                if quantized else None
        return self._rescored[name]

    def _create(self, name: str, dense: dict[str, int]) -> None:
        self._hold()
        self.ensure_room(CREATE_BYTES)
        qe = self._qe
        self._abandon(name)
        path = self.root / name
        if path.exists():  # a shard without our metadata: an interrupted create; start it over
            shutil.rmtree(path)
        self._rescored.pop(name, None)
        shard = qe.EdgeShard.create(str(path), edge_config(qe, dense, self.on_disk_vectors, self.quantization))
        for key in _KEYWORDS:
            shard.update(field_index(qe, key, False, self.on_disk_vectors))
        for key in INTEGER_FIELDS:
            shard.update(field_index(qe, key, True, self.on_disk_vectors, lookup=not self.on_tmpfs))
        self._shards[name] = shard
        self._write_meta(name, dense)

    def _write_meta(self, name: str, dense: dict[str, int]) -> None:
        tmp = self._meta_path(name).with_suffix(".tmp")
        tmp.write_text(json.dumps({"dense": dense, "sparse": [SPARSE], "integer_indexes": list(INTEGER_FIELDS),
                                   "keyword_indexes": list(_KEYWORDS)}))
        tmp.replace(self._meta_path(name))

    def _add_vector(self, name: str, vector: str, size: int) -> None:
        qe = self._qe
        self.ensure_room(CREATE_BYTES)
        self._abandon(name)
        self._shard(name).update(qe.UpdateOperation.create_dense_vector(vector, size, qe.Distance.Cosine))
        dense = self._dense_config(name) or {}
        dense[vector] = size
        self._write_meta(name, dense)

    def _upsert(self, name: str, points: Sequence[Point]) -> None:
        qe = self._qe
        self.ensure_room(points_bytes(points))
        edge_points = [qe.Point(id=uuid.UUID(p.id), vector=self.dialect.vectors(p), payload=p.payload.to_payload())
                       for p in points]
        self._shard(name).update(qe.UpdateOperation.upsert_points(edge_points))
        self._record(name, "upsert", points)

    def _delete(self, name: str, flt: Filter) -> None:
        self.ensure_room(DELETE_BYTES)
        self._shard(name).update(self._qe.UpdateOperation.delete_points_by_filter(self.dialect.filter(flt)))
        self._record(name, "delete", flt)

    # HNSW index, built beside ----------------------------------------------------------------------------------
    def _record(self, name: str, op: str, arg: Any) -> None:
        if self._journal is not None and self._journal[0] == name:
            self._journal[1].append((op, arg))

    def _abandon(self, name: str) -> None:
        """A change ``build_index`` cannot replay (a new vector, a drop, a re-create): its copy is discarded."""
        if self._journal is not None and self._journal[0] == name:
            self._journal = None

    def index_state(self, name: str) -> tuple[int, int]:
        """``(points, points when its HNSW index was built)`` of collection ``name``; the second is 0 when it has
        none. (Edge's ``ShardInfo.indexed_vectors_count`` counts sparse vectors too, so the HNSW graph files of its
        segments, ``segments/*/vector_index-<dense>/graph.bin``, and the count ``build_index`` records say it.)"""
        with self._lock:
            physical = self._target(name)
            points = int(self._shard(physical).count(self._qe.CountRequest(exact=True)))
            if not any((self.root / physical / "segments").glob("*/vector_index-*/graph.bin")):
                return points, 0
            try:
                return points, int(json.loads((self.root / physical / _HNSW_RECORD).read_text())["points"])
            except (OSError, ValueError, KeyError):
                return points, points  # built by hand (``optimize()``)

    def build_index(self, name: str, stop: threading.Event | None = None, nice: int = 10,
                    timeout_s: float = 7200.0) -> float | None:
        """Build the HNSW index of collection ``name`` without holding the store (or this process's GIL) while it
        builds, and swap it in. Returns the seconds it took, or ``None`` when it was given up (``stop`` set, or a
        change that cannot be replayed: a re-create, a new vector, another rebuild swapped first).

        Steps: under the store's lock, flush the shard and copy its folder to ``rebuild_target(name)`` (searches
        wait for the copy: docs/performance.md) and start recording every upsert and delete made to it;
        a child process (``nice`` +10) runs ``optimize()`` on the copy; under the lock again, the indexed copy is
        loaded, the recorded writes replayed onto it in order, and ``swap`` points ``name`` at it and drops the
        old shard. Raises ``RuntimeError`` when the child fails (its last output in the message); the copy is removed.
        """
        started = time.monotonic()
        with self._lock:
            old = self._target(name)
            new = self.rebuild_target(name)
            self._shard(old).flush()
            shutil.copytree(self.root / old, self.root / new)
            (self.root / new / _HNSW_RECORD).write_text(json.dumps({"points": self._count(old)}))
            self._journal = (old, [])
        returncode, output = optimize_copy(self.root / new, stop, nice, timeout_s)
        with self._lock:
            journal, self._journal = self._journal, None
            if returncode != 0 or journal is None or self._target(name) != old:
                shutil.rmtree(self.root / new, ignore_errors=True)
                if returncode not in (0, -9):
                    raise RuntimeError(f"building the HNSW index of {name} failed ({returncode}): {output}")
                return None
            for op, arg in journal[1]:
                if op == "upsert":
                    self._upsert(new, arg)
                else:
                    self._delete(new, arg)
            self.swap(name, new)
        return time.monotonic() - started

    def _scroll(self, name: str, fields: list[str] | None) -> Iterator[Mapping[str, Any]]:
        qe = self._qe
        shard = self._shard(name)
        offset = None
        while True:
            records, offset = shard.scroll(qe.ScrollRequest(offset=offset, limit=SCROLL_PAGE,
                                                            with_payload=fields if fields else True,
                                                            with_vector=False))
            for record in records:
                yield dict(record.payload or {})
            if offset is None:
                return

    def file_states(self, name: str) -> dict[str, FileState]:
        """``abs_path -> FileState`` of collection ``name`` from its payload indexes, not a scroll over every point
        (``indexer.store.edge_states``: a restart at a million points)."""
        with self._lock:
            physical = self._target(name)
            return file_states_by_facets(self._shard(physical), self._qe, self.dialect, name, self._count(physical))

    def _names(self) -> list[str]:
        self._hold()
        return sorted(path.name for path in self.root.iterdir() if path.is_dir())  # a dir without metadata: cut short

    def _points_page(self, name: str, offset: Any, limit: int) -> tuple[list[Point], Any]:
        records, offset = self._shard(name).scroll(self._qe.ScrollRequest(offset=offset, limit=limit,
                                                                          with_payload=True, with_vector=True))
        return [point_from_record(r.id, r.vector, r.payload) for r in records], offset

    def _query(self, name: str, searches: dict[str, Any], flt: Any, query: Query,
               with_payload: bool) -> dict[str, list[tuple[Any, float, Mapping[str, Any] | None]]]:
        qe = self._qe
        params = self._search_params(name)
        requests = [qe.QueryRequest(limit=query.limit, query=qe.Query.Nearest(vector, using=using), filter=flt,
                                    with_payload=with_payload, score_threshold=query.thresholds.get(using),
                                    params=None if using == SPARSE else params)
                    for using, vector in searches.items()]
        answers = self._shard(name).query_batch(qe.QueryBatchRequest(requests))
        return {using: [(p.id, p.score, p.payload) for p in points] for using, points in zip(searches, answers)}

    def _retrieve(self, name: str, ids: list[str]) -> list[tuple[Any, Mapping[str, Any] | None]]:
        records = self._shard(name).retrieve([uuid.UUID(i) for i in ids], with_payload=True, with_vector=False)
        return [(r.id, r.payload) for r in records]

    def _count(self, name: str) -> int:
        return int(self._shard(name).count(self._qe.CountRequest(exact=True)))

    def _drop(self, name: str) -> None:
        self._hold()
        self._abandon(name)
        self._rescored.pop(name, None)
        shard = self._shards.pop(name, None)
        if shard is not None:
            shard.close()
        shutil.rmtree(self.root / name, ignore_errors=True)

    def flush(self) -> None:
        with self._lock:
            for shard in self._shards.values():
                shard.flush()

    def close(self) -> None:
        self.warmer.close()
        with self._lock:
            for shard in self._shards.values():
                shard.flush()
                shard.close()
            self._shards.clear()
            if self._lock_fd is not None:
                os.close(self._lock_fd)  # releases the flock
                self._lock_fd = None
