"""A Qdrant server or cluster through qdrant-client (or its in-process ``:memory:`` mode, which tests use as a
fast extra).

Writes are made to survive a cluster:

- an upsert is split into requests of at most ``batch_points`` points whose serialised body stays under the
  server's ``max_request_size_mb`` (a request over it is refused whole, so one huge note must not become one request);
- every request (a method marked ``@retried``, ``indexer.store.retry``) is retried with exponential backoff
  (tenacity) on transport errors, timeouts, HTTP 5xx/429 and the matching gRPC codes, then raises
  ``StoreUnavailable``. Repeating a write is safe even when the failed attempt was
  partly applied (a cluster answers 500 when a replica missed a write that the others took): point ids are
  deterministic (``indexer.points.point_id``), so an upsert overwrites the same points and a delete by filter
  deletes the same ones;
- ``degraded`` is true from the first failed write attempt until a write succeeds again (``status`` shows it).

Collection settings (shards, replicas, write consistency, on-disk vectors, int8 quantization) are applied only when
a collection is created; an existing collection that differs is reported in one log line and left as it is.

Tenancy (``ServerOptions.tenancy``: one Qdrant collection per logical collection, or tenants of shared physical
collections) is ``indexer.store.tenancy``'s, which ``ServerStore`` extends; the options and the shared collections'
names are ``indexer.store.layout``'s.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ParamSpec, TypeVar

from indexer.errors import CollectionMismatch, StoreUnavailable
from indexer.points import INTEGER_FIELDS, KEYWORD_FIELDS, SPARSE, Filter, Point, Query
from indexer.store.base import SCROLL_PAGE
from indexer.store.claims import ClaimingStore
from indexer.store.dialect import Dialect, point_from_record
from indexer.store.layout import PAYLOAD_M, REBUILD, TENANT_KEY, PerTenant, ServerOptions
from indexer.store.retry import retried, retried_methods, transient
from indexer.store.tenancy import TenantStore

P = ParamSpec("P")
R = TypeVar("R")
ATTEMPTS = 5  # tries per request: waits of 0.5, 1, 2, 4 s between them
_ENVELOPE_BYTES = 1024  # the upsert body's own JSON around the points (`{"points": [...]}`), with room to spare


def json_bytes(point: Point) -> int:
    """An upper bound of ``point``'s size in a REST upsert body (gRPC's protobuf is smaller), without serialising
    its vectors: the payload as compact UTF-8 JSON, 25 bytes per float (the longest ``repr`` of a float32 widened to
    a double, ``-1.2345678901234567e-05``, and a comma), 11 per sparse index, and 64 per object for keys and
    brackets. Serialising each point with pydantic instead is much slower (docs/performance.md, "Qdrant server")."""
    payload = len(json.dumps(point.payload.to_payload(), ensure_ascii=False, separators=(",", ":")).encode())
    floats = sum(v.size for v in point.dense.values()) + sum(len(values) for _, values in point.sparse.values())
    indices = sum(len(indices) for indices, _ in point.sparse.values())
    return len(point.id) + payload + 25 * floats + 11 * indices + 64 * (2 + len(point.dense) + len(point.sparse))


class ServerStore(ClaimingStore, TenantStore):
    """A Qdrant server or cluster at ``url`` (``":memory:"``: qdrant-client's in-process mode). Once ``claim``-ed
    (``indexer.store.claims``), every write primitive first ``guard``s the logical collection it writes."""

    kind = "server"

    def __init__(self, url: str, api_key: str = "", options: ServerOptions | None = None) -> None:
        from qdrant_client import QdrantClient, models

        super().__init__(Dialect(models, models.Range))
        self._m = models
        self.options = options or ServerOptions()
        self._failing = False
        self._local = url == ":memory:"
        self.shared = self.options.tenancy == "shared"
        self.auto = self.options.tenancy == "auto" and not self._local  # in-process: "collections"
        self._lives = {}
        self._claimed, self._lost, self.refused = {}, {}, {}
        if self.options.tenancy not in ("auto", "collections", "shared"):
            raise ValueError(f"tenancy must be 'auto', 'collections' or 'shared', not {self.options.tenancy!r}")
        if self._local:
            self.client = QdrantClient(location=":memory:")
        else:
            # check_compatibility=False: the client (1.20) is newer than the servers this is tested against (1.16),
            # and the check only warns about that gap; every call used here exists in both.
            self.client = QdrantClient(url=url, api_key=api_key or None, timeout=int(max(1, self.options.timeout_s)),
                                       prefer_grpc=self.options.prefer_grpc, grpc_port=self.options.grpc_port,
                                       check_compatibility=False)
        for method, write in retried_methods(type(self)).items():  # each request to the server (``retried``)
            setattr(self, method, self._retrying(getattr(self, method), write=write))

    def _retrying(self, fn: Callable[P, R], write: bool) -> Callable[P, R]:
        """``fn`` retried on transient errors (``ATTEMPTS`` tries, backoff 0.5 s doubling to 8 s), then
        ``StoreUnavailable``; for a write, ``degraded`` follows whether it is failing."""
        from tenacity import RetryError, Retrying, retry_if_exception, stop_after_attempt, wait_exponential

        def failed_once(_: Any) -> None:
            if write:
                self.degraded = True

        @functools.wraps(fn)
        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            # once a write has failed through all its retries, the next ones get one try each until one succeeds:
            # the caller retries them later, and an outage must not cost every queued file the whole backoff
            attempts = 1 if write and self._failing else ATTEMPTS
            retrying = Retrying(retry=retry_if_exception(transient), stop=stop_after_attempt(attempts),
                                wait=wait_exponential(multiplier=0.5, max=8), before_sleep=failed_once, reraise=False)
            try:
                result = retrying(fn, *args, **kwargs)
            except RetryError as exc:
                if write:
                    self.degraded = self._failing = True
                raise StoreUnavailable(f"Qdrant unreachable: {exc.last_attempt.exception()}") from None
            if write:
                self.degraded = self._failing = False
            return result

        return call

    @retried()
    def same_server(self, other: ServerStore) -> bool:
        """Whether this store and ``other`` talk to one server (or cluster), whatever their URLs say (``localhost``
        and ``127.0.0.1``, a trailing ``/``, a proxy): a probe collection made through ``other`` is looked for
        through this one, then deleted."""
        import uuid

        probe = f"qmd-migrate-probe-{uuid.uuid4().hex}"
        other.client.create_collection(probe, vectors_config=self._m.VectorParams(size=1,
                                                                                  distance=self._m.Distance.COSINE))
        try:
            return bool(self.client.collection_exists(probe))
        finally:
            other.client.delete_collection(probe)

    # collections ------------------------------------------------------------------------------------------------
    def _dense_config(self, name: str) -> dict[str, int] | None:
        return self._physical_config(self._where(name)[0])

    @retried()
    def _physical_config(self, name: str) -> dict[str, int] | None:
        """The dense vectors (name -> size) of physical collection ``name``, ``None`` when it does not exist."""
        if not self.client.collection_exists(name):
            return None
        info = self.client.get_collection(name)
        if not self._local:
            if any(key not in (info.payload_schema or {}) for key in INTEGER_FIELDS):
                for key in INTEGER_FIELDS:  # made before range filters existed
                    self.client.create_payload_index(name, key, self._m.PayloadSchemaType.INTEGER)
            self._report_settings(name, info)
        vectors = info.config.params.vectors
        return {k: int(v.size) for k, v in (vectors or {}).items()} if isinstance(vectors, dict) else {}

    def _report_settings(self, name: str, info: Any) -> None:
        """One log line when ``name`` was created with other settings than the configured ones."""
        o, params = self.options, info.config.params
        vectors = params.vectors if isinstance(params.vectors, dict) else {}
        wanted = {"shard_number": o.shard_number, "replication_factor": o.replication_factor,
                  "write_consistency_factor": o.write_consistency_factor}
        differ = {key: {"collection": getattr(params, key), "configured": value}
                  for key, value in wanted.items() if value is not None and getattr(params, key) != value}
        on_disk = all(bool(v.on_disk) for v in vectors.values()) if vectors else False
        if on_disk != o.on_disk_vectors:
            differ["on_disk_vectors"] = {"collection": on_disk, "configured": o.on_disk_vectors}
        quantized = "int8" if info.config.quantization_config is not None else "none"
        if quantized != o.quantization:
            differ["quantization"] = {"collection": quantized, "configured": o.quantization}
        self._settings_differ(name, differ)

    @retried()
    def _create(self, name: str, dense: dict[str, int]) -> None:
        import grpc
        from qdrant_client.http.exceptions import UnexpectedResponse

        m, o = self._m, self.options
        name = self._where(name)[0]
        extra: dict[str, Any] = {}
        if not self._local:  # the in-process mode has no shards, replicas or quantization
            extra = {"shard_number": o.shard_number, "replication_factor": o.replication_factor,
                     "write_consistency_factor": o.write_consistency_factor}
            if o.quantization == "int8":
                extra["quantization_config"] = m.ScalarQuantization(
                    scalar=m.ScalarQuantizationConfig(type=m.ScalarType.INT8, always_ram=True))
            if self.shared:  # one HNSW graph per tenant, none across them
                extra["hnsw_config"] = m.HnswConfigDiff(payload_m=PAYLOAD_M, m=0)
        try:
            self.client.create_collection(
                name,
                vectors_config={v: m.VectorParams(size=s, distance=m.Distance.COSINE,
                                                  on_disk=o.on_disk_vectors or None)
                                for v, s in dense.items()},
                sparse_vectors_config={SPARSE: m.SparseVectorParams(modifier=m.Modifier.IDF)},
                **extra,
            )
        except (UnexpectedResponse, ValueError, grpc.RpcError):
            # it exists: another daemon created the shared collection first, or a retried create whose first try a
            # cluster applied (gRPC ALREADY_EXISTS after a lost answer); use it (its indexes are created below)
            if not self.client.collection_exists(name):
                raise
        if not self._local:  # the in-process mode has no payload indexes (and warns)
            if self.shared:
                self.client.create_payload_index(name, TENANT_KEY, m.KeywordIndexParams(
                    type=m.KeywordIndexType.KEYWORD, is_tenant=True))
                self.client.create_payload_index(name, "agent", m.PayloadSchemaType.KEYWORD)
            for key in KEYWORD_FIELDS:
                self.client.create_payload_index(name, key, m.PayloadSchemaType.KEYWORD)
            for key in INTEGER_FIELDS:
                self.client.create_payload_index(name, key, m.PayloadSchemaType.INTEGER)

    @retried()
    def physical_count(self, physical: str, tenant: str | None = None) -> int:
        """See ``Store.physical_count``."""
        flt = None if tenant is None else self._m.Filter(must=[self.dialect.match(TENANT_KEY, tenant)])
        return int(self.client.count(physical, count_filter=flt, exact=True).count)

    @retried()
    def per_tenant(self, physical: str) -> PerTenant:
        """See ``Store.per_tenant``: read from the collection's payload schema and HNSW config."""
        info = self.client.get_collection(physical)
        schema = (info.payload_schema or {}).get(TENANT_KEY)
        data_type = str(getattr(getattr(schema, "data_type", None), "value", ""))
        indexed = schema is not None and data_type == "keyword" and bool(getattr(schema.params, "is_tenant", False))
        hnsw = info.config.hnsw_config
        return PerTenant(indexed, hnsw.m, hnsw.payload_m)

    @retried()
    def _add_vector(self, name: str, vector: str, size: int) -> None:
        raise CollectionMismatch(
            f"collection {name!r} has no {vector!r} vector (a modality was enabled after it was created); rebuild it "
            f"with `qmd-indexer index --once --reindex`."
        )

    @retried()
    def _names(self) -> list[str]:
        return sorted(c.name for c in self.client.get_collections().collections)

    # points -----------------------------------------------------------------------------------------------------
    def _upsert(self, name: str, points: Sequence[Point]) -> None:
        self.guard(name)
        physical, tenant = self._where(name)
        stamp = {TENANT_KEY: name.partition(REBUILD)[0]} if tenant is not None else {}
        for batch in self.batches(points):
            self._upsert_request(physical, [self._struct(p, stamp) for p in batch])

    def _struct(self, point: Point, stamp: Mapping[str, Any]) -> Any:
        """``point`` as qdrant-client's ``PointStruct``; ``stamp`` overrides payload fields (the tenant key: a point
        lands in the tenant it is written to, whatever its payload said)."""
        return self._m.PointStruct(id=point.id, vector=self.dialect.vectors(point),
                                   payload={**point.payload.to_payload(), **stamp})

    def batches(self, points: Sequence[Point]) -> Iterator[list[Point]]:
        """``points`` in order, in runs of at most ``batch_points`` whose upsert body (``json_bytes`` each) fits
        ``max_request_bytes``. Raises ``ValueError`` for one point that alone exceeds it."""
        limit = self.options.max_request_bytes - _ENVELOPE_BYTES
        batch: list[Point] = []
        size = 0
        for point in points:
            n = json_bytes(point)
            if n > limit:
                raise ValueError(f"point {point.id} ({point.payload.abs_path}#{point.payload.chunk_index}) takes up to "
                                 f"{n} bytes, over the request limit of {self.options.max_request_bytes}; raise "
                                 f"qdrant_max_request_mb (and the server's max_request_size_mb)")
            if batch and (size + n > limit or len(batch) >= self.options.batch_points):
                yield batch
                batch, size = [], 0
            batch.append(point)
            size += n
        if batch:
            yield batch

    @retried(write=True)
    def _upsert_request(self, name: str, structs: list[Any]) -> None:
        self.client.upsert(name, structs, wait=True)

    @retried(write=True)
    def _delete(self, name: str, flt: Filter) -> None:
        self.guard(name)
        physical, scoped = self._scoped(name, self.dialect.filter(flt))
        self.client.delete(physical, points_selector=self._m.FilterSelector(filter=scoped), wait=True)

    def _scroll(self, name: str, fields: list[str] | None) -> Iterator[Mapping[str, Any]]:
        offset = None
        while True:
            records, offset = self._scroll_page(name, offset, fields)
            for record in records:
                yield dict(record.payload or {})
            if offset is None:
                return

    @retried()
    def _scroll_page(self, name: str, offset: Any, fields: list[str] | None) -> Any:
        physical, flt = self._scoped(name)
        return self.client.scroll(physical, scroll_filter=flt, limit=SCROLL_PAGE, offset=offset,
                                  with_payload=fields if fields else True, with_vectors=False)

    @retried()
    def _points_page(self, name: str, offset: Any, limit: int) -> tuple[list[Point], Any]:
        physical, flt = self._scoped(name)
        records, offset = self.client.scroll(physical, scroll_filter=flt, limit=limit, offset=offset,
                                             with_payload=True, with_vectors=True)
        return [point_from_record(record.id, record.vector if isinstance(record.vector, dict) else None, record.payload)
                for record in records], offset

    @retried()
    def _query(self, name: str, searches: dict[str, Any], flt: Any, query: Query,
               with_payload: bool) -> dict[str, list[tuple[Any, float, Mapping[str, Any] | None]]]:
        m = self._m
        physical, flt = self._scoped(name, flt)
        requests = [m.QueryRequest(query=vector, using=using, filter=flt, limit=query.limit, with_payload=with_payload,
                                   score_threshold=query.thresholds.get(using))
                    for using, vector in searches.items()]
        answers = self.client.query_batch_points(physical, requests)
        return {using: [(p.id, p.score, p.payload) for p in answer.points]
                for using, answer in zip(searches, answers)}

    @retried()
    def _retrieve(self, name: str, ids: list[str]) -> list[tuple[Any, Mapping[str, Any] | None]]:
        if not self.shared:
            records = self.client.retrieve(name, ids, with_payload=True, with_vectors=False)
        else:  # by id and tenant: an id of another tenant is absent here
            physical, flt = self._scoped(name, self._has_id(ids))
            records, _ = self.client.scroll(physical, scroll_filter=flt, limit=len(ids), with_payload=True,
                                            with_vectors=False)
        return [(r.id, r.payload) for r in records]

    @retried()
    def _count(self, name: str) -> int:
        physical, flt = self._scoped(name)
        return int(self.client.count(physical, count_filter=flt, exact=True).count)

    @retried()
    def _drop(self, name: str) -> None:
        self.guard(name)
        physical, flt = self._scoped(name)
        if not self.client.collection_exists(physical):
            return
        if flt is None:
            self.client.delete_collection(physical)
        else:  # a tenant's points only
            self.client.delete(physical, points_selector=self._m.FilterSelector(filter=flt), wait=True)

    def drop(self, name: str) -> None:
        """See ``TenantStore.drop``; this daemon's claim of ``name`` ends with it (an agent removed)."""
        super().drop(name)
        if self.owner is not None:
            self.release([name], self.owner.id)

    @retried()
    def _read_aliases(self) -> dict[str, str]:
        return {a.alias_name: a.collection_name for a in self.client.get_aliases().aliases}

    @retried()
    def _set_alias(self, name: str, new: str | None, old: str) -> None:
        self.guard(name)
        m = self._m
        if old == name and new is not None and self.client.collection_exists(name):
            self.client.delete_collection(name)  # a plain collection of that name (made before aliases) gives way
        ops: list[Any] = []
        if old != name:
            ops.append(m.DeleteAliasOperation(delete_alias=m.DeleteAlias(alias_name=name)))
        if new is not None:
            ops.append(m.CreateAliasOperation(create_alias=m.CreateAlias(collection_name=new, alias_name=name)))
        if ops:
            self.client.update_collection_aliases(change_aliases_operations=ops)  # one atomic change

    def close(self) -> None:
        with self._lock:
            self.client.close()

