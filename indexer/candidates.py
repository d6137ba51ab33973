"""A search's candidates: every selected collection's lists (ids and scores only), pooled per vector name,
fused into one ranked list (``gather``), and the payloads read as the post-fusion stages ask for them
(``Candidates``). ``indexer.search.Searcher`` ranks and judges what this gathers.

Fusion: the dense text, dense image and BM25 lists of all target collections are pooled per vector name and each
pool cut to the query's depth (``prefetch_limit``); a BM25 list that matched nothing meaningful does not vote
(``indexer.ranking.keyword_votes``); DBSF counts a whole BM25 list's true zeros (``with_keyword_zeros``); each dense
text part is weighed by its collection's source (``indexer.workspace.Source.dense_weight``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from indexer.bm25 import Bm25Terms
from indexer.points import NO_PAYLOAD, SPARSE, Filter, Hit, Payload, Query
from indexer.ranking import VOTE_DEPTH, fuse_scores, keyword_votes, with_keyword_zeros
from indexer.relevance import DF_DEPTH, DocumentFrequencies
from indexer.search_settings import SearchSettings
from indexer.store import Store
from indexer.workspace import Collection


@dataclass
class Candidates:
    """One search's fused candidates, best first (``fused``: ``(point id, score)``), each point's collection
    (``owner``) and raw score per vector name (``raw``: ``{"text": {id: cosine}, SPARSE: {id: BM25}}``); payloads are
    read through ``reader`` (``with_payloads``) as the stages ask for them, each once."""

    fused: Sequence[tuple[Any, float]]
    owner: Mapping[Any, str]
    raw: Mapping[str, Mapping[Any, float]]
    reader: Callable[[Sequence[Hit], Mapping[str, str]], list[Hit]]
    _ids: dict[str, Any] = field(default_factory=dict)  # Hit id -> the backend's point id
    _read: dict[str, Hit] = field(default_factory=dict)  # Hit id -> the hit with its payload

    def first(self, n: int) -> list[Hit]:
        """The first ``n`` candidates as hits with their payloads (a point deleted meanwhile drops out)."""
        chosen = [(str(pid), pid, score) for pid, score in self.fused[:n]]
        self._ids.update((key, pid) for key, pid, _ in chosen)
        fresh = [Hit(key, 0.0, NO_PAYLOAD) for key, _, _ in chosen if key not in self._read]
        self._read.update((h.id, h) for h in self.reader(fresh, {h.id: self.owner[self._ids[h.id]] for h in fresh}))
        return [Hit(key, score, self._read[key].payload) for key, _, score in chosen if key in self._read]

    def exhausted(self, n: int, floor: float | None) -> bool:
        """Whether no candidate after the first ``n`` could pass: there is none, or (the fused list being sorted)
        the ``n``-th scores under ``floor``."""
        return n >= len(self.fused) or (floor is not None and self.fused[n - 1][1] < floor)

    def scored(self, hit: Hit) -> Hit:
        """``hit`` with its raw ``dense_score`` and ``keyword_score`` (``None``: not in that list)."""
        pid = self._ids[hit.id]
        return replace(hit, dense_score=self.raw.get("text", {}).get(pid),
                       keyword_score=self.raw.get(SPARSE, {}).get(pid))

    def owner_of(self, hit: Hit | None) -> str | None:
        """The collection ``hit`` was found in (``None`` without a hit)."""
        return None if hit is None else self.owner.get(self._ids[hit.id])


def gather(store: Store, terms: Bm25Terms, settings: SearchSettings, targets: Sequence[Collection], query: Query,
           text: str) -> Candidates | None:
    """The fused candidates of ``query`` (for query ``text``) over ``targets`` (``None``: no list found any): the
    pools of every collection, the keyword list left out where it does not vote, fused by ``settings.fusion``."""
    lists, whole, owner = pools(store, targets, query)
    if not lists:
        return None
    raw = {using: dict(pairs) for using, pairs in lists.items()}
    keyword = lists.get(SPARSE)
    if keyword and len(lists) > 1 and not _keyword_votes(store, terms, query, text, keyword, owner):
        lists = {using: pairs for using, pairs in lists.items() if using != SPARSE}
    if settings.fusion == "dbsf" and whole.get(SPARSE):
        lists = with_keyword_zeros(lists)
    fused = (next(iter(lists.values())) if len(lists) == 1
             else fuse_scores(list(lists.values()), settings.fusion, settings.rrf_k, query.limit,
                              weights(targets, lists, owner)))
    return Candidates(fused, owner, raw, partial(with_payloads, store))


def pools(store: Store, targets: Sequence[Collection], query: Query) -> tuple[dict[str, list[tuple[Any, float]]],
                                                                            dict[str, bool], dict[Any, str]]:
    """Per vector name, the ``(point id, score)`` candidates of every target collection, best first, cut to the
    query's depth; per vector name whether no collection's list was cut; each point id's collection."""
    pooled: dict[str, list[tuple[Any, float]]] = {}
    whole: dict[str, bool] = {}
    owner: dict[Any, str] = {}
    for collection in targets:
        for using, pairs in store.scores(collection.name, query).items():
            pooled.setdefault(using, []).extend(pairs)
            whole[using] = whole.get(using, True) and len(pairs) < query.limit
            owner.update((pid, collection.name) for pid, _ in pairs)
    lists = {using: sorted(pairs, key=lambda p: -p[1])[: query.limit] for using, pairs in pooled.items() if pairs}
    return lists, whole, owner


def weights(targets: Sequence[Collection], lists: Mapping[str, Sequence[tuple[Any, float]]],
            owner: Mapping[Any, str]) -> list[dict[Any, float] | None]:
    """Per fused list, point id -> its factor in fusion: a dense text part gets its collection's source's
    ``dense_weight`` (``indexer.workspace.Source``) where that is not 1; other lists and points are not weighed."""
    weight = {c.name: c.source.dense_weight for c in targets if c.source.dense_weight != 1.0}
    if not weight:
        return []
    return [{pid: weight[owner[pid]] for pid, _ in pairs if owner[pid] in weight} if using == "text" else None
            for using, pairs in lists.items()]


def _keyword_votes(store: Store, terms: Bm25Terms, query: Query, text: str, keyword: Sequence[tuple[Any, float]],
                   owner: Mapping[Any, str]) -> bool:
    """Whether the BM25 list ``keyword`` votes in fusion (``indexer.ranking.keyword_votes``): the terms its first
    ``VOTE_DEPTH`` hits hold, read from their payloads and tokenised as the index was."""
    numbers = terms.number_terms(text)
    if not numbers:  # every hit of a keyword list holds a word of the query: it votes (no payload read)
        return True
    first = [Hit(str(pid), 0.0, NO_PAYLOAD) for pid, _ in keyword[:VOTE_DEPTH]]
    read = with_payloads(store, first, {h.id: owner[pid] for h, (pid, _) in zip(first, keyword)})
    held = [set(vector[0]) if (vector := terms.document(f"{h.payload.context}\n{h.payload.text}")) else set()
            for h in read]
    return keyword_votes(set(query.sparse[0]) if query.sparse else set(), numbers, held)


def with_payloads(store: Store, hits: Sequence[Hit], owner: Mapping[str, str]) -> list[Hit]:
    """``hits`` with their payloads read by id (one request per collection; ``owner``: point id -> collection);
    those already carrying one are kept as they are, and a point deleted meanwhile drops out."""
    missing = [h for h in hits if not h.payload.abs_path]
    payloads: dict[str, Payload] = {}
    for name in dict.fromkeys(owner[h.id] for h in missing):
        payloads.update(store.payloads(name, [h.id for h in missing if owner[h.id] == name]))
    return [h if h.payload.abs_path else replace(h, payload=payloads[h.id])
            for h in hits if h.payload.abs_path or h.id in payloads]


def cosine_of(store: Store, collection: str, hit: Hit, vector: Any) -> float | None:
    """``hit``'s dense text cosine to the query ``vector``, by a dense search of its one point in ``collection``
    (for a hit found by keyword search alone); ``None`` when it has no text vector."""
    one = Query(limit=1, dense={"text": vector},
                filter=Filter(abs_path=hit.payload.abs_path, chunk_index=hit.payload.chunk_index))
    return next((score for _, score in store.scores(collection, one).get("text", ())), None)


def frequencies(store: Store, cache: DocumentFrequencies, targets: Sequence[Collection],
                terms: Sequence[int]) -> tuple[dict[int, int], int]:
    """``(term id -> points holding it, at most DF_DEPTH per collection; points searched)`` over ``targets``, whole
    (no filter): the document frequencies ``indexer.relevance`` weighs the query's terms by, cached in ``cache`` by
    the collections' point counts."""
    sizes = tuple((c.name, store.count(c.name)) for c in targets)

    def lookup(term: int) -> int:
        probe = Query(limit=DF_DEPTH, sparse=([term], [1.0]))
        return sum(len(store.scores(name, probe).get(SPARSE, ())) for name, _ in sizes)

    return cache.get(sizes, terms, lookup), sum(n for _, n in sizes)
