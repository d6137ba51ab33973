"""Queries over the indexed collections: embed the query, search each collection, merge, cut snippets.

A search is an ``indexer.schema.SearchRequest``. A hit (``indexer.schema.Hit``, the JSON the API and ``search --json``
return) carries ``collection``, ``agent``, ``path``
(workspace-relative), ``start_line``/``end_line`` (1-based, inclusive: the lines the snippet shows), ``score``,
``snippet`` (at most ``SNIPPET_CHARS`` characters, starting at the lines that best match the query), ``kind``,
``citation`` (``path#Lstart-Lend``), ``dense_score`` (the raw cosine similarity of the query's text embedding, in
[-1, 1]) and ``keyword_score`` (the raw BM25 score, >= 0), each ``None`` when the hit was not in that list, and,
where they apply, the fields the extractor plugins declare in ``hit_fields`` (``Registry.hit_fields``), e.g.
``start_s``/``end_s`` (audio) or ``width``/``height`` (images).

When the query cannot be embedded now (the embedder raises ``EmbedUnavailable``: its server is down), a hybrid or
dense search answers from keyword search instead, and says so: the caller's ``degraded`` list gets
``"keyword only: <why>"`` (``SearchResponse.degraded``), and ``FallbackStats`` counts it for ``status`` and
``/metrics``.

``relevant(hits, floor)`` says whether the best dense score among the hits clears a relevance floor: the fused
score cannot say it, since fusion normalises each query's lists (DBSF top-1 is about 2 for any query).
"""

from __future__ import annotations

import datetime
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, cast

import numpy as np

from indexer import schema
from indexer.api import Embedder
from indexer.bm25 import Bm25Terms
from indexer.chunking import split_lines
from indexer.config import Settings
from indexer.errors import EmbedUnavailable
from indexer.plugins import Registry
from indexer.points import NO_PAYLOAD, SPARSE, Hit, Payload, Query, search_filter
from indexer.rerank import Reranker, RerankStats, rerank
from indexer.schema import SearchRequest, names, search_request
from indexer.store import Store
from indexer.workspace import Collection

SNIPPET_CHARS = 700  # the reference agent's snippet cap
_WORD = re.compile(r"\w+", re.UNICODE)
_HEADING = re.compile(r" {0,3}#{1,6}(?:[ \t]|$)")  # an ATX heading line
LEAD_LINES = 2  # lines above the best-matching one a snippet may start at


class FallbackStats:
    """Searches that answered from keyword search because the query could not be embedded (``keyword_only``), and
    the last reason; ``on_fallback`` (e.g. ``Metrics.error``) is told each one's kind. Shared by the searchers of
    one daemon (``StatusView``); any thread may count."""

    def __init__(self, on_fallback: Callable[[str], None] | None = None) -> None:
        self.keyword_only = 0
        self.last_reason: str | None = None
        self._on_fallback = on_fallback
        self._lock = threading.Lock()

    def count(self, reason: str) -> None:
        with self._lock:
            self.keyword_only += 1
            self.last_reason = reason
        if self._on_fallback is not None:
            self._on_fallback("search_keyword_only")

    def as_dict(self) -> dict[str, Any]:
        """``{"keyword_only": int, "last_reason": str | None}`` for ``status``."""
        return {"keyword_only": self.keyword_only, "last_reason": self.last_reason}


def join_degraded(notes: Sequence[str]) -> str | None:
    """``SearchResponse.degraded`` from a search's notes: joined with ``"; "``, ``None`` when there are none."""
    return "; ".join(dict.fromkeys(notes)) or None


#: the former name of a search's arguments, kept for callers that build one with the query first
SearchParams = search_request


def _terms(text: str) -> set[str]:
    words = {w.lower() for w in _WORD.findall(text)}
    # CJK runs have no spaces: single characters stand in for words
    words |= {ch for w in words for ch in w if "\u3040" <= ch <= "\u9fff" or "\uac00" <= ch <= "\ud7af"}
    return words


def snippet(text: str, query: str, first_line: int, limit: int = SNIPPET_CHARS) -> tuple[str, int, int]:
    """``(snippet, start_line, end_line)``: whole lines of ``text`` (which starts at ``first_line``), at most
    ``limit`` characters, starting at the line sharing most words with ``query`` (the first of equals; the first
    line when no line shares a word): led in by up to ``LEAD_LINES`` lines of its paragraph above it, or, when it
    opens its paragraph, by the heading right over it, then as many lines below it as fit. A single line longer
    than ``limit`` is cut. Lines are ``split_lines``' (``\\n``, ``\\r\\n`` or a lone ``\\r`` ends one) and joined with
    ``\\n``."""
    lines = split_lines(text)
    terms = _terms(query)
    best = max(range(len(lines)), key=lambda i: (len(terms & _terms(lines[i])), -i)) if terms else 0
    lo, size = best, len(lines[best])
    lead = limit // 2  # the lines above take at most half the snippet

    def fits(j: int) -> bool:
        return size + 1 + len(lines[j]) <= lead

    while lo > 0 and best - lo < LEAD_LINES and lines[lo - 1].strip() and fits(lo - 1):
        lo -= 1
        size += 1 + len(lines[lo])
    if lo == best:  # the line opens its paragraph: the heading over it (across blank lines) names its section
        above = next((j for j in range(lo - 1, max(lo - 1 - LEAD_LINES, -1), -1) if lines[j].strip()), None)
        if above is not None and _HEADING.match(lines[above]) and fits(above):
            size += sum(1 + len(line) for line in lines[above:lo])
            lo = above
    hi = best
    while hi + 1 < len(lines) and size + 1 + len(lines[hi + 1]) <= limit:
        hi += 1
        size += 1 + len(lines[hi])
    while hi > best and not lines[hi].strip():
        hi -= 1
    body = "\n".join(lines[lo : hi + 1])
    if len(body) > limit:
        body = body[: limit - 1] + "…"
    return body, first_line + lo, first_line + hi


def _round(value: float | None) -> float | None:
    return None if value is None else round(float(value), 6)


def relevant(hits: Sequence[schema.Hit], floor: float) -> bool | None:
    """Whether the best raw dense score (cosine) among ``hits`` is at least ``floor``; ``None`` when no hit has a
    dense score (a keyword-only search), ``False`` for no hits."""
    if not hits:
        return False
    scores = [score for h in hits if (score := h.get("dense_score")) is not None]
    return max(scores) >= floor if scores else None


def to_hit(hit: Hit, query: str, hit_fields: Sequence[str] = ()) -> schema.Hit:
    """The API's hit for a scored point; the payload fields named in ``hit_fields`` are copied when present."""
    p = hit.payload
    if p.modality == "text":
        body, start, end = snippet(p.text, query, p.start_line)
    else:
        body, start, end = p.text[:SNIPPET_CHARS], p.start_line, p.end_line
    out = schema.Hit(collection=p.collection, agent=p.agent, path=p.path, start_line=start, end_line=end,
                     score=round(hit.score, 6), snippet=body, kind=p.kind, citation=f"{p.path}#L{start}-L{end}",
                     dense_score=_round(hit.dense_score), keyword_score=_round(hit.keyword_score))
    media = {key: p.get(key) for key in hit_fields if p.get(key) is not None}
    # the schema allows a plugin's own keys (extra="allow"), which a TypedDict cannot declare
    return cast(schema.Hit, {**out, **media}) if media else out


class Searcher:
    """Answers ``SearchRequest``s over ``collections`` in ``store`` with the loaded embedders; ``terms`` must be the
    ``Bm25Terms`` the points were indexed with. Build it with ``from_settings`` to get the configured defaults."""

    def __init__(self, collections: Sequence[Collection], store: Store, embedders: Mapping[str, Embedder],
                 terms: Bm25Terms,
                 mode: str = "hybrid", fusion: str = "dbsf", rrf_k: int = 60, prefetch_limit: int = 100,
                 min_scores: dict[str, float] | None = None, hit_fields: Sequence[str] = (),
                 mmr_lambda: float | None = None, half_life_days: float | None = None,
                 now: Callable[[], float] = time.time, reranker: Reranker | None = None, rerank_top_n: int = 20,
                 rerank_budget_s: float = 2.0, rerank_stats: RerankStats | None = None,
                 fallback_stats: FallbackStats | None = None, notes: Sequence[str] = ()) -> None:
        self.collections = list(collections)
        self.store = store
        self.embedders = embedders
        self.terms = terms
        self.hit_fields = tuple(hit_fields)  # payload fields hits carry (``Registry.hit_fields``)
        self.mode, self.fusion, self.rrf_k, self.prefetch_limit = mode, fusion, rrf_k, prefetch_limit
        # per-vector floors applied before fusion: score-normalising fusion (DBSF) would otherwise lift the best
        # of an irrelevant list (e.g. images for a query no picture matches) to the top
        self.min_scores = dict(min_scores or {})
        # optional re-ranking of the fused list, off by default (see ``decay``, ``mmr``, ``indexer.rerank``)
        self.mmr_lambda, self.half_life_days, self.now = mmr_lambda, half_life_days, now
        self.reranker, self.rerank_top_n, self.rerank_budget_s = reranker, rerank_top_n, rerank_budget_s
        # fail-open counters (``status`` reports the daemon's, shared by its searchers)
        self.rerank_stats = rerank_stats if rerank_stats is not None else RerankStats()
        self.fallback_stats = fallback_stats if fallback_stats is not None else FallbackStats()
        self._embed_query = lru_cache(maxsize=256)(self.embed_query)
        self.notes = tuple(notes)  # said in every answer's ``degraded`` (a configured reranker that failed to load)

    @classmethod
    def from_settings(cls, settings: Settings, collections: Sequence[Collection], store: Store,
                      registry: Registry, terms: Bm25Terms, **overrides: Any) -> Searcher:
        """The one factory: a ``Searcher`` with ``registry``'s embedders and ``hit_fields``, the configured defaults
        (``search_mode``, ``fusion``, ``rrf_k``, ``prefetch_limit``, ``image_min_score``, ``mmr_lambda``,
        ``temporal_half_life_days``, ``rerank_top_n``, ``rerank_budget_s``) and the reranker the ``reranker`` setting
        names, as ``registry`` loaded it (none when the setting is empty, the plugin failed to load, or ``registry``
        was loaded for another ``reranker``); ``overrides`` replace any of ``__init__``'s keyword arguments
        (benchmarks compare modes and fusions this way)."""
        defaults: dict[str, Any] = {"mode": settings.search_mode, "fusion": settings.fusion, "rrf_k": settings.rrf_k,
                                    "prefetch_limit": settings.prefetch_limit,
                                    "min_scores": {"image": settings.image_min_score},
                                    "hit_fields": registry.hit_fields,
                                    "mmr_lambda": settings.mmr_lambda,
                                    "half_life_days": settings.temporal_half_life_days,
                                    "reranker": registry.configured_reranker(settings.reranker),
                                    "rerank_top_n": settings.rerank_top_n,
                                    "rerank_budget_s": settings.rerank_budget_s,
                                    "notes": [f"fusion order: reranker {settings.reranker} failed to load"]
                                    if settings.reranker and registry.configured_reranker(settings.reranker) is None
                                    and any(r.name == settings.reranker and r.status == "failed"
                                            for r in registry.records) else []}
        return cls(collections, store, registry.embedders, terms, **{**defaults, **overrides})

    def embed_query(self, text: str) -> tuple[tuple[str, np.ndarray], ...]:
        """``((modality, (dim,) float32 vector), ...)``: ``text`` embedded by every embedder, sorted by modality,
        uncached (``retrieve`` caches the last 256 queries)."""
        return tuple((modality, e.embed_query(text)) for modality, e in sorted(self.embedders.items()))

    def warm(self, text: str) -> None:
        """Embed ``text`` into the query cache now, so a following ``retrieve`` of it times the search alone."""
        self._embed_query(text)

    def targets(self, params: SearchRequest) -> list[Collection]:
        """The collections ``params`` selects (``agent``, ``collection``); raises ``KeyError`` naming an unknown
        agent or collection."""
        chosen = self.collections
        if params.agent:
            chosen = [c for c in chosen if c.agent == params.agent]
            if not chosen:
                raise KeyError(f"unknown agent {params.agent!r}")
        wanted = names(params.collection)
        if wanted:
            unknown = set(wanted) - {c.name for c in self.collections}
            if unknown:
                raise KeyError(f"unknown collection {sorted(unknown)[0]!r}")
            chosen = [c for c in chosen if c.name in wanted]
        return chosen

    def retrieve(self, params: SearchRequest, degraded: list[str] | None = None) -> list[Hit]:
        """Fused hits (raw payloads), best first: the lists of every selected collection (ids and scores only)
        are pooled per vector (dense text, dense image, BM25), each pool cut to ``prefetch_limit``, the pools fused,
        and the payloads of the ``k`` kept hits read by id. A query the embedders cannot embed now
        (``EmbedUnavailable``) is answered from keyword search, with ``"keyword only: <why>"`` appended to
        ``degraded`` (see the module); so is any other reason the answer is less than the configured search (e.g.
        ``indexer.rerank.DEGRADED``). Raises ``KeyError`` (unknown agent or collection) and ``ValueError`` (a bad
        mode, or a time ``parse_time`` cannot read)."""
        mode = params.mode or self.mode
        if mode not in ("hybrid", "dense", "keyword"):
            raise ValueError(f"mode must be hybrid, dense or keyword, got {mode!r}")
        targets = self.targets(params)
        point_filter = search_filter(params)
        if not params.query.strip():
            return []
        if degraded is not None:
            degraded.extend(self.notes)
        dense: dict[str, np.ndarray] = {}
        if mode != "keyword":
            try:
                dense = dict(self._embed_query(params.query))
            except EmbedUnavailable as exc:  # the model is loading or its server is down: keyword search can answer
                reason = f"keyword only: {(str(exc).splitlines() or ['embedder unavailable'])[0][:160]}"
                self.fallback_stats.count(reason)
                if degraded is not None:
                    degraded.append(reason)
                mode = "keyword"
        sparse = None
        if mode != "dense":
            sparse = self.terms.query(params.query)
        depth = max(self.prefetch_limit, params.k)
        query = Query(limit=depth, dense=dense, sparse=sparse, thresholds=self.min_scores, filter=point_filter)
        pools: dict[str, list[tuple[Any, float]]] = {}  # vector name -> (point id, score) over every collection
        whole: dict[str, bool] = {}  # vector name -> every collection answered fewer than ``depth`` (nothing cut)
        owner: dict[Any, str] = {}  # point id -> its collection
        for collection in targets:
            for using, pairs in self.store.scores(collection.name, query).items():
                pools.setdefault(using, []).extend(pairs)
                whole[using] = whole.get(using, True) and len(pairs) < depth
                owner.update((pid, collection.name) for pid, _ in pairs)
        lists = {using: sorted(pairs, key=lambda p: -p[1])[:depth] for using, pairs in pools.items() if pairs}
        if not lists:
            return []
        if self.fusion == "dbsf" and whole.get(SPARSE):
            lists = with_keyword_zeros(lists)
        fused = (next(iter(lists.values())) if len(lists) == 1
                 else fuse_scores(list(lists.values()), self.fusion, self.rrf_k, depth))
        if params.min_score is not None and not self.half_life_days:  # with decay: on the decayed scores
            fused = [p for p in fused if p[1] >= params.min_score]
        if not (self.half_life_days or self.reranker is not None or self.mmr_lambda is not None):
            fused = fused[: params.k]  # the default: only the k kept become Hits with string ids and payloads
        ids = {str(pid): pid for pid, _ in fused}  # Hit id -> the backend's point id
        where = {key: owner[pid] for key, pid in ids.items()}
        hits = [Hit(key, score, NO_PAYLOAD) for key, (_, score) in zip(ids, fused)]
        if self.half_life_days:  # dates come from the paths: those stages read payloads of every candidate
            hits = decay(self._with_payloads(hits, where), self.half_life_days, self.now())
            if params.min_score is not None:
                hits = [h for h in hits if h.score >= params.min_score]
        if self.reranker is not None:
            hits = rerank(self._with_payloads(hits[: self.rerank_top_n], where) + hits[self.rerank_top_n :],
                          params.query, self.reranker, self.rerank_top_n, self.rerank_budget_s, self.rerank_stats,
                          degraded=degraded)
        if self.mmr_lambda is not None:
            hits = mmr(self._with_payloads(hits, where), self.mmr_lambda, params.k)
        raw = {using: dict(pairs) for using, pairs in pools.items()}
        return [replace(h, dense_score=raw.get("text", {}).get(ids[h.id]),
                        keyword_score=raw.get(SPARSE, {}).get(ids[h.id]))
                for h in self._with_payloads(hits[: params.k], where)]

    def _with_payloads(self, hits: Sequence[Hit], owner: Mapping[str, str]) -> list[Hit]:
        """``hits`` with their payloads read by id (one request per collection; ``owner``: point id -> collection);
        those already carrying one are kept as they are, and a point deleted meanwhile drops out."""
        missing = [h for h in hits if not h.payload.abs_path]
        payloads: dict[str, Payload] = {}
        for name in dict.fromkeys(owner[h.id] for h in missing):
            payloads.update(self.store.payloads(name, [h.id for h in missing if owner[h.id] == name]))
        return [h if h.payload.abs_path else replace(h, payload=payloads[h.id]) for h in hits
                if h.payload.abs_path or h.id in payloads]

    def search(self, params: SearchRequest, degraded: list[str] | None = None) -> list[schema.Hit]:
        """The ``params.k`` best hits across the selected collections, best first, as the API's hits; ``degraded``
        collects why the answer is less than the configured search (``retrieve``)."""
        return [to_hit(hit, params.query, self.hit_fields) for hit in self.retrieve(params, degraded)]


_DAILY = re.compile(r"(?:^|/)memory/(?:.*/)?(\d{4})-(\d{2})-(\d{2})\.md$")


def decay(hits: Sequence[Hit], half_life_days: float, now_s: float) -> list[Hit]:
    """Temporal decay as the reference agent does it: the score of a dated daily note (``memory/YYYY-MM-DD.md``) is
    multiplied by ``0.5 ** (age_days / half_life_days)`` (age from the file-name date to ``now_s``, Unix seconds;
    never negative); every other file is evergreen and kept as is. Returns the hits re-sorted by score."""
    out = []
    for h in hits:
        match = _DAILY.search(str(h.payload.get("path", "")))
        if match:
            try:
                day = datetime.date(*map(int, match.groups()))
            except ValueError:
                out.append(h)
                continue
            midnight = datetime.datetime(day.year, day.month, day.day, tzinfo=datetime.UTC).timestamp()
            age_days = max(0.0, (now_s - midnight) / 86400)
            h = Hit(h.id, h.score * 0.5 ** (age_days / half_life_days), h.payload)
        out.append(h)
    return sorted(out, key=lambda h: -h.score)


def mmr(hits: Sequence[Hit], lam: float, k: int) -> list[Hit]:
    """Maximal marginal relevance (Carbonell & Goldstein 1998) over a ranked list: repeatedly take the hit that
    maximises ``lam * relevance - (1 - lam) * max similarity to the hits taken``, with relevance the score scaled
    to [0, 1] by the list's min and max and similarity the Jaccard overlap of the hits' word sets (as the reference
    agent does). ``lam = 1`` keeps the order. Returns the first ``k`` picks, then the rest in their order."""
    if len(hits) < 2 or lam >= 1:
        return list(hits)
    top, bottom = hits[0].score, min(h.score for h in hits)
    span = (top - bottom) or 1.0
    words = [_terms(str(h.payload.get("text", ""))) for h in hits]
    left = list(range(len(hits)))
    picked: list[int] = []
    similar = [0.0] * len(hits)  # each hit's max similarity to the picks so far, updated per pick: O(k * n) pairs
    while left and len(picked) < k:
        best = max(left, key=lambda i: lam * (hits[i].score - bottom) / span - (1 - lam) * similar[i])
        picked.append(best)
        left.remove(best)
        for i in left:
            similar[i] = max(similar[i], len(words[i] & words[best]) / (len(words[i] | words[best]) or 1))
    return [hits[i] for i in picked] + [hits[i] for i in left]


def load_fusion() -> None:
    """Import the fusion code ``fuse_scores`` uses (qdrant-client: its pydantic models take ~2 s to import on 2 cores).
    The daemon calls this before it reports ready, so the first search does not pay for it."""
    import qdrant_client.hybrid.fusion  # noqa: F401


@dataclass(slots=True)
class _Scored:
    """What qdrant-client's fusion functions read and write of a ``ScoredPoint``: ``id`` and ``score``. Building
    pydantic ``ScoredPoint``s for two lists of 100 candidates cost 0.85 of the 1.04 ms a DBSF took (AMD EPYC,
    AVX2); with these it takes 0.19 ms, same order, same scores."""

    id: Any
    score: float


def with_keyword_zeros(lists: Mapping[str, Sequence[tuple[Any, float]]]) -> dict[str, list[tuple[Any, float]]]:
    """``lists`` (vector name -> ``(point id, score)`` pairs, best first) with the BM25 list (``SPARSE``) extended by a
    score of 0.0 for every candidate of the other lists it lacks. Call it only when the BM25 list is whole (its
    search returned fewer hits than asked): a chunk absent from it then holds none of the query's terms, and 0 is
    its exact BM25 score, the function's theoretical minimum.

    Why: DBSF normalises each list by the mean +/- 3 standard deviations of the scores in it, so a term that only
    one chunk holds (a codeword, an identifier) leaves a BM25 list of one hit, which DBSF scores 0.5 (or of two or
    three hits, which it spreads around 0.5): the exact match then weighs less than the best dense hits, which
    carry about 1. With the candidates' true zeros in the statistics the exact match stands out as it does in the
    BM25 ranking itself (a lone hit among 100 candidates: about 1.7). Normalising by the scoring function's
    theoretical minimum instead of the observed one is the remedy Bruch, Gai and Ingber give for score-based
    fusion ("An Analysis of Fusion Functions for Hybrid Retrieval", ACM TOIS 42(1), 2023, section 4: TMM). When
    the BM25 list was cut at the search depth, the absent candidates' scores are unknown and ``lists`` is left as
    it is. Measured (docs/benchmarks.md): codeword queries in the hybrid top 5 108 -> 129 of 132; the dev set's
    nDCG@10 (0.885) and SciFact's (0.7303), whose BM25 lists of common words are long, unchanged."""
    keyword = lists.get(SPARSE)
    if not keyword or len(lists) < 2:
        return {using: list(pairs) for using, pairs in lists.items()}
    present = {pid for pid, _ in keyword}
    absent = dict.fromkeys(pid for using, pairs in lists.items() if using != SPARSE
                           for pid, _ in pairs if pid not in present)
    return {using: list(pairs) + ([(pid, 0.0) for pid in absent] if using == SPARSE else [])
            for using, pairs in lists.items()}


def fuse_scores(lists: Sequence[Sequence[tuple[Any, float]]], method: str, rrf_k: int,
                limit: int) -> list[tuple[Any, float]]:
    """Fuse ranked ``(point id, score)`` lists, best first, with Qdrant's own algorithms, as qdrant-client implements
    them for its local mode: RRF (score of a point = sum over lists of ``1 / (rank + k - 1)``, rank 1-based; Cormack
    et al. 2009 with Qdrant's offset) or DBSF (each list's scores normalised by mean +/- 3 standard deviations, then
    summed). Returns at most ``limit`` ``(point id, fused score)`` pairs, best first."""
    from qdrant_client.hybrid.fusion import distribution_based_score_fusion, reciprocal_rank_fusion

    responses: list[Any] = [[_Scored(pid, score) for pid, score in pairs] for pairs in lists]
    if method == "rrf":
        fused = reciprocal_rank_fusion(responses, limit=limit, ranking_constant_k=rrf_k)
    else:
        fused = distribution_based_score_fusion(responses, limit=limit)
    # the library returns the objects it was given (its annotations say ScoredPoint)
    return [(p.id, float(p.score)) for p in cast(list[_Scored], fused)]

