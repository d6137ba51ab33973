"""A Qdrant server or cluster through qdrant-client (or its in-process ``:memory:`` mode, which tests use as a
fast extra). Calls are retried with exponential backoff (tenacity) and raise ``StoreUnavailable`` when the server
stays unreachable."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from indexer.errors import CollectionMismatch, StoreUnavailable
from indexer.points import INTEGER_FIELDS, KEYWORD_FIELDS, SPARSE, Filter, Point, Query
from indexer.store.base import SCROLL_PAGE, Dialect, Store

F = TypeVar("F", bound=Callable[..., Any])


def _retrying(fn: F) -> F:
    """Retry ``fn`` on transport errors (0.5 s, 1 s, 2 s... up to 5 tries), then raise ``StoreUnavailable``."""
    import httpx
    from qdrant_client.http.exceptions import ResponseHandlingException
    from tenacity import RetryError, retry, retry_if_exception_type, stop_after_attempt, wait_exponential

    transient = (ResponseHandlingException, httpx.TransportError, ConnectionError, TimeoutError)
    wrapped = retry(retry=retry_if_exception_type(transient), stop=stop_after_attempt(5),
                    wait=wait_exponential(multiplier=0.5, max=8), reraise=False)(fn)

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return wrapped(*args, **kwargs)
        except RetryError as exc:
            raise StoreUnavailable(f"Qdrant unreachable: {exc.last_attempt.exception()}") from None

    return call  # type: ignore[return-value]


class ServerStore(Store):
    """A Qdrant server or cluster at ``url`` (``":memory:"``: qdrant-client's in-process mode)."""

    kind = "server"

    def __init__(self, url: str, api_key: str = "", timeout_s: float = 10.0) -> None:
        from qdrant_client import QdrantClient, models

        super().__init__(Dialect(models, models.Range))
        self._m = models
        self._local = url == ":memory:"
        if self._local:
            self.client = QdrantClient(location=":memory:")
        else:
            self.client = QdrantClient(url=url, api_key=api_key or None, timeout=int(max(1, timeout_s)))
        for method in ("_dense_config", "_create", "_add_vector", "_upsert", "_delete", "_query", "_count", "_drop"):
            setattr(self, method, _retrying(getattr(self, method)))

    def _dense_config(self, name: str) -> dict[str, int] | None:
        if not self.client.collection_exists(name):
            return None
        info = self.client.get_collection(name)
        if not self._local and any(key not in (info.payload_schema or {}) for key in INTEGER_FIELDS):
            for key in INTEGER_FIELDS:  # made before range filters existed
                self.client.create_payload_index(name, key, self._m.PayloadSchemaType.INTEGER)
        vectors = info.config.params.vectors
        return {k: int(v.size) for k, v in (vectors or {}).items()} if isinstance(vectors, dict) else {}

    def _create(self, name: str, dense: dict[str, int]) -> None:
        m = self._m
        self.client.create_collection(
            name,
            vectors_config={v: m.VectorParams(size=s, distance=m.Distance.COSINE) for v, s in dense.items()},
            sparse_vectors_config={SPARSE: m.SparseVectorParams(modifier=m.Modifier.IDF)},
        )
        if not self._local:  # the in-process mode has no payload indexes (and warns)
            for key in KEYWORD_FIELDS:
                self.client.create_payload_index(name, key, m.PayloadSchemaType.KEYWORD)
            for key in INTEGER_FIELDS:
                self.client.create_payload_index(name, key, m.PayloadSchemaType.INTEGER)

    def _add_vector(self, name: str, vector: str, size: int) -> None:
        raise CollectionMismatch(
            f"collection {name!r} has no {vector!r} vector (a modality was enabled after it was created); rebuild it "
            f"with `qmd-indexer index --once --reindex`."
        )

    def _upsert(self, name: str, points: Sequence[Point]) -> None:
        structs = [self._m.PointStruct(id=p.id, vector=self.dialect.vectors(p), payload=p.payload.to_payload())
                   for p in points]
        self.client.upsert(name, structs, wait=True)

    def _delete(self, name: str, flt: Filter) -> None:
        self.client.delete(name, points_selector=self._m.FilterSelector(filter=self.dialect.filter(flt)), wait=True)

    def _scroll(self, name: str, fields: list[str] | None) -> Iterator[Mapping[str, Any]]:
        offset = None
        while True:
            records, offset = self.client.scroll(name, limit=SCROLL_PAGE, offset=offset,
                                                 with_payload=fields if fields else True, with_vectors=False)
            for record in records:
                yield dict(record.payload or {})
            if offset is None:
                return

    def _query(self, name: str, searches: dict[str, Any], flt: Any,
               query: Query) -> dict[str, list[tuple[Any, float, Mapping[str, Any] | None]]]:
        m = self._m
        requests = [m.QueryRequest(query=vector, using=using, filter=flt, limit=query.limit, with_payload=True,
                                   score_threshold=query.thresholds.get(using))
                    for using, vector in searches.items()]
        answers = self.client.query_batch_points(name, requests)
        return {using: [(p.id, p.score, p.payload) for p in answer.points]
                for using, answer in zip(searches, answers)}

    def _count(self, name: str) -> int:
        return int(self.client.count(name, exact=True).count)

    def _drop(self, name: str) -> None:
        if self.client.collection_exists(name):
            self.client.delete_collection(name)

    def close(self) -> None:
        with self._lock:
            self.client.close()
