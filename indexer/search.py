"""Queries over the indexed collections: embed the query, search each collection, fuse, re-rank, cut snippets.

A search is an ``indexer.schema.SearchRequest``. A hit (``indexer.schema.Hit``, the JSON the API and ``search --json``
return) carries ``collection``, ``agent``, ``path``
(workspace-relative), ``start_line``/``end_line`` (1-based, inclusive: the lines the snippet shows), ``score``,
``snippet`` (at most ``SNIPPET_CHARS`` characters, starting at the lines that best match the query; a conversation
window is shown whole up to ``WINDOW_CHARS``), ``kind``, ``citation`` (``path#Lstart-Lend``), ``dense_score`` (the raw
cosine similarity of the query's text embedding, in [-1, 1]) and ``keyword_score`` (the raw BM25 score, >= 0), each
``None`` when the hit was not in that list, and, where they apply, the fields the extractor plugins declare in
``hit_fields`` (``Registry.hit_fields``), e.g. ``start_s``/``end_s`` (audio) or ``width``/``height`` (images).

When the query cannot be embedded now (the embedder raises ``EmbedUnavailable``: its server is down), a hybrid or
dense search answers from keyword search instead, and says so: the caller's ``degraded`` list gets
``"keyword only: <why>"`` (``SearchResponse.degraded``), and ``FallbackStats`` counts it for ``status`` and
``/metrics``.

Whether anything relevant was found (``Answer.relevant``) and how sure that is (``Answer.relevance``: level and
reason) is ``indexer.relevance.judge``'s, on each of the answer's first ``JUDGED_HITS`` hits on its own evidence
(whatever ``k``): one hit gets one verdict whatever the request selects.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import replace
from functools import cache, lru_cache, partial
from typing import Any, NamedTuple

import numpy as np

from indexer import schema
from indexer.api import Embedder, check_vectors
from indexer.bm25 import Bm25Terms
from indexer.calibration import DEFAULT, Floor
from indexer.candidates import Candidates, cosine_of, frequencies, gather
from indexer.config import Settings
from indexer.contract import RERANKERS, declared
from indexer.dates import may_name_time, query_period
from indexer.errors import BadVectors, EmbedUnavailable
from indexer.hits import narrowed, shown, to_hit
from indexer.plugins import Registry
from indexer.points import Hit, Query, search_filter
from indexer.ranking import (
    at_least,
    boost_period,
    collapse,
    decay,
    mmr,
)
from indexer.relevance import NOTHING, DocumentFrequencies, Evidence, Judgement, idf, judge
from indexer.rerank import Reranker, RerankStats, rerank
from indexer.schema import SearchRequest, names, search_request
from indexer.search_settings import SETTING_NAMES, SearchSettings
from indexer.store import Store
from indexer.workspace import Collection, select

#: the answer's first hits whose verdicts decide its own (``Searcher._judged``), whatever its ``k``
JUDGED_HITS = 3
#: hits read per hit asked before ``collapse`` thins them (overlapping windows drop out)
COLLAPSE_DEPTH = 3


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


class Answer(NamedTuple):
    """What ``Searcher.answer`` returns: the ``hits`` (API hits, best first), whether anything ``relevant`` was
    found, why the answer is less than the configured search (``degraded`` notes) and the graded ``relevance``
    (``{"level", "reason"}``; ``indexer.relevance.judge``)."""

    hits: list[schema.Hit]
    relevant: bool | None
    degraded: list[str]
    relevance: schema.Relevance = {"level": "none", "reason": "nothing found"}  # noqa: RUF012 - never mutated


class Searcher:
    """Answers ``SearchRequest``s over ``collections`` in ``store`` with the loaded embedders; ``terms`` must be the
    ``Bm25Terms`` the points were indexed with. Build it with ``from_settings`` to get the configured search."""

    def __init__(self, collections: Sequence[Collection], store: Store, embedders: Mapping[str, Embedder],
                 terms_: Bm25Terms, settings: SearchSettings | None = None, reranker: Reranker | None = None,
                 rerank_stats: RerankStats | None = None, fallback_stats: FallbackStats | None = None,
                 now: Callable[[], float] = time.time, notes: Sequence[str] = (),
                 floor: Floor | None = None) -> None:
        self.collections = list(collections)
        self.store = store
        self.embedders = embedders
        self.terms = terms_
        self.settings = settings or SearchSettings()
        self.reranker = reranker
        self.now = now
        # fail-open counters (``status`` reports the daemon's, shared by its searchers)
        self.rerank_stats = rerank_stats if rerank_stats is not None else RerankStats()
        self.fallback_stats = fallback_stats if fallback_stats is not None else FallbackStats()
        self._embed_query = lru_cache(maxsize=256)(self.embed_query)
        self.frequencies = DocumentFrequencies()  # the query terms' document frequencies (``indexer.relevance``)
        self.notes = tuple(notes)  # said in every answer's ``degraded`` (a configured reranker that failed to load)
        # the text model's relevance floor (``indexer.calibration``), unless ``settings.dense_floor`` names one
        self.floor = floor if floor is not None else Floor(None, embedders.get("text"), None)

    @classmethod
    def from_settings(cls, settings: Settings, collections: Sequence[Collection], store: Store,
                      registry: Registry, terms_: Bm25Terms, **overrides: Any) -> Searcher:
        """The one factory: a ``Searcher`` with ``registry``'s embedders, ``SearchSettings.from_settings`` and the
        reranker the ``reranker`` setting names, as ``registry`` loaded it (none when the setting is empty, the
        plugin failed to load, or ``registry`` was loaded for another ``reranker``). ``overrides`` replace any field
        of ``SearchSettings`` or any other keyword of ``__init__`` (benchmarks compare modes and fusions this
        way); an unknown name raises ``TypeError``."""
        search = SearchSettings.from_settings(settings, registry)
        search = replace(search, **{k: v for k, v in overrides.items() if k in SETTING_NAMES})
        reranker = registry.configured_reranker(settings.reranker)
        failed = settings.reranker and reranker is None and any(
            r.name == settings.reranker and r.status == "failed" for r in registry.records)
        parts = {"reranker": reranker, "floor": Floor(None, registry.embedders.get("text"), settings.state_dir),
                 "notes": [f"fusion order: reranker {settings.reranker} failed to load"] if failed else [],
                 **{k: v for k, v in overrides.items() if k not in SETTING_NAMES}}
        return cls(collections, store, registry.embedders, terms_, search, **parts)

    @property
    def mode(self) -> str:
        """The configured search mode (a request's ``mode`` overrides it)."""
        return self.settings.mode

    def embed_query(self, text: str) -> tuple[tuple[str, np.ndarray], ...]:
        """``((modality, (dim,) float32 vector), ...)``: ``text`` embedded by every embedder, sorted by modality,
        uncached (``retrieve`` caches the last 256 queries). Each vector is checked (``check_vectors``: the
        embedder's size, finite, non-zero); a bad one raises ``EmbedUnavailable`` ("bad answer"), so the search
        answers from keyword search and says why."""
        out = []
        for modality, embedder in sorted(self.embedders.items()):
            vector = embedder.embed_query(text)
            try:
                check_vectors(np.asarray(vector)[None, :], 1, getattr(embedder, "dim", None), f"{modality} embedder")
            except BadVectors as exc:
                raise EmbedUnavailable(f"bad answer: {exc}") from exc
            out.append((modality, vector))
        return tuple(out)

    def warm(self, text: str) -> None:
        """Embed ``text`` into the query cache now, so a following ``retrieve`` of it times the search alone."""
        self._embed_query(text)

    def targets(self, params: SearchRequest) -> list[Collection]:
        """The collections ``params`` selects (``agent``, ``collection``, ``corpus``: the memory files, the session
        transcripts or all, default ``SearchSettings.corpus``; ``indexer.workspace.select``); raises ``KeyError``
        naming an unknown agent or collection."""
        wanted = names(params.collection)
        corpus = params.corpus or ("all" if wanted else self.settings.corpus)  # named collections are asked for
        return select(self.collections, params.agent or None, corpus, wanted)

    def _query(self, params: SearchRequest, point_filter: Any, degraded: list[str] | None) -> tuple[Query, str]:
        """The Qdrant query for ``params`` and the mode it runs in: keyword when the query cannot be embedded now
        (the model is loading or its server is down), noted in ``degraded``."""
        mode = _mode(params, self.settings)
        dense: dict[str, np.ndarray] = {}
        if mode != "keyword":
            try:
                dense = dict(self._embed_query(params.query))
            except EmbedUnavailable as exc:
                reason = f"keyword only: {(str(exc).splitlines() or ['embedder unavailable'])[0][:160]}"
                self.fallback_stats.count(reason)
                if degraded is not None:
                    degraded.append(reason)
                mode = "keyword"
        sparse = self.terms.query(params.query) if mode != "dense" else None
        depth = max(self.settings.prefetch_limit, params.k)
        return Query(limit=depth, dense=dense, sparse=sparse, thresholds=self.settings.min_scores,
                     filter=point_filter), mode

    def _stages(self, params: SearchRequest, degraded: list[str] | None,
                period: tuple[datetime.date, datetime.date] | None, fused: Sequence[tuple[Any, float]],
                depth: int) -> tuple[list[Callable[[list[Hit]], list[Hit]]], int]:
        """The post-fusion stages ``params`` runs, in order (``indexer.ranking``), from the settings and the query,
        each taking and returning hits with payloads; and how many of the ``fused`` candidates (best first) they
        need: ``depth`` for the collapse; all of them for a stage that re-orders the whole list (decay, MMR); for
        the period boost, those its factor can lift into the first ``depth`` (``_boost_depth``)."""
        s = self.settings
        stages: list[Callable[[list[Hit]], list[Hit]]] = []
        need = depth
        if self.reranker is not None:
            need = max(need, s.rerank_top_n)
        whole = bool(s.half_life_days or s.mmr_lambda is not None)
        if whole:
            need = s.prefetch_limit + params.k
        if s.half_life_days:
            stages.append(partial(decay, half_life_days=s.half_life_days, now_s=self.now()))
        if params.min_score is not None:
            stages.append(partial(at_least, min_score=params.min_score))
        if period:
            stages.append(partial(boost_period, period=period, boost=s.time_boost))
            need = s.prefetch_limit + params.k if whole else _boost_depth(fused, need, s.time_boost)
        if self.reranker is not None:
            stages.append(partial(rerank, query=params.query, reranker=self.reranker, top_n=s.rerank_top_n,
                                  budget_s=s.rerank_budget_s, stats=self.rerank_stats, degraded=degraded))
        if s.mmr_lambda is not None:
            stages.append(partial(mmr, lam=s.mmr_lambda, k=params.k))
        stages.append(self._collapse(params.query, narrow=self.reranker is None and s.mmr_lambda is None,
                                     cut=len(fused) > need, limit=max(params.k, JUDGED_HITS)))
        return stages, need

    @staticmethod
    def _collapse(query: str, narrow: bool, cut: bool, limit: int | None) -> Callable[[list[Hit]], list[Hit]]:
        """The last stage (``indexer.ranking.collapse``): no hit shows lines a better one shows. Windows are
        narrowed (``indexer.hits.narrowed``) where ``narrow`` (scores in one order: not after a reranker, whose
        scores cover its first ``rerank_top_n`` hits only, nor after MMR, whose order is not by score); ``cut``: the
        hits are the first of the candidates, so a narrowed hit must stay above the last one's score; ``limit``: the
        hits that are used (``None``: all)."""
        def stage(hits: list[Hit]) -> list[Hit]:
            settled = min((h.score for h in hits), default=None) if cut else None
            return collapse(hits, lambda h: shown(h.payload, query)[1:], narrowed if narrow else None, settled,
                            limit)

        return stage

    def answer(self, params: SearchRequest) -> Answer:
        """The ``params.k`` best hits across the selected collections as the API's hits, whether anything relevant
        was found and how sure that is (``indexer.relevance.judge``), and the ``degraded`` notes (see
        ``retrieve``)."""
        degraded: list[str] = []
        hits, found = self._retrieve(params, degraded)
        return Answer([to_hit(hit, params.query, self.settings.hit_fields) for hit in hits], found.relevant, degraded,
                      found.as_dict())

    def retrieve(self, params: SearchRequest, degraded: list[str] | None = None) -> list[Hit]:
        """Fused hits (raw payloads), best first: the lists of every selected collection (ids and scores only)
        are pooled per vector (dense text, dense image, BM25), each pool cut to ``prefetch_limit``, the pools fused,
        the post-fusion stages run (``_stages``) on the payloads of the candidates they need, and the ``k`` kept.
        A query the embedders cannot embed now (``EmbedUnavailable``) is answered from keyword search, with
        ``"keyword only: <why>"`` appended to ``degraded`` (see the module); so is any other reason the answer is
        less than the configured search (e.g. ``indexer.rerank.DEGRADED``). Raises ``KeyError`` (unknown agent or
        collection) and ``ValueError`` (a bad mode, or a time ``parse_time`` cannot read)."""
        return self._retrieve(params, degraded)[0]

    def _retrieve(self, params: SearchRequest, degraded: list[str] | None) -> tuple[list[Hit], Judgement]:
        _mode(params, self.settings)
        targets = self.targets(params)
        times = params.times()  # ValueError: a time it cannot read
        if not params.query.strip():
            return [], NOTHING
        if degraded is not None:
            degraded.extend(self.notes)
        period_of = self._period(params.query, times.as_of)  # read on another thread while the query is embedded
        query, _ = self._query(params, search_filter(params, times), degraded)
        candidates = gather(self.store, self.terms, self.settings, targets, query, params.query)
        if candidates is None:
            return [], NOTHING
        period = period_of()
        hits = [candidates.scored(h) for h in self._ranked(params, degraded, period, candidates)]
        return hits[: params.k], self._judged(hits[:JUDGED_HITS], candidates, query, period, params.query)

    def _judged(self, hits: Sequence[Hit], candidates: Candidates, query: Query,
                period: tuple[datetime.date, datetime.date] | None, text: str) -> Judgement:
        """The answer's verdict: the first of ``hits`` (the answer's first ``JUDGED_HITS``, whatever its ``k``)
        that ``indexer.relevance.judge`` finds relevant, else the first hit's verdict (``NOTHING`` without one).
        The query's term weights are looked up once per agent, for every hit of that agent."""
        terms = query.sparse[0] if query.sparse else ()

        @cache
        def weights(agent: str) -> dict[int, float]:  # the IDF of the query's terms over the agent's whole index
            if not terms:
                return {}
            counts, n = frequencies(self.store, self.frequencies, select(self.collections, agent), terms)
            return {t: idf(counts.get(t, 0), n) for t in set(terms)}

        first = NOTHING
        floor = self.settings.dense_floor
        for i, hit in enumerate(hits):
            if floor is None:  # the model's own, asked when there is a hit; measured only for a dense search
                floor = (self.floor.get() if query.dense else self.floor.known() or DEFAULT).floor
            verdict = judge(hit, self._evidence(hit, candidates.owner_of(hit), query, period, weights), self.terms,
                            text, floor, self.settings.coverage_floor)
            if i == 0:
                first = verdict
            if verdict.relevant is not False:  # relevant, or keyword only (not judged: the first says so)
                return first if verdict.relevant is None else verdict._replace(
                    reason=verdict.reason if i == 0 else f"hit {i + 1}: {verdict.reason}")
        return first

    def _evidence(self, hit: Hit, collection: str | None, query: Query,
                  period: tuple[datetime.date, datetime.date] | None,
                  weights: Callable[[str], dict[int, float]]) -> Evidence:
        """``hit``'s own evidence for ``indexer.relevance.judge``: its dense cosine (looked up by a dense search
        of its one point when it came from keyword search alone), and ``weights`` of its agent (its whole index,
        whatever collections the request selected)."""
        dense = query.dense.get("text")
        cosine = hit.dense_score
        if cosine is None and dense is not None and collection is not None:
            cosine = cosine_of(self.store, collection, hit, dense)
        agent = next((c.agent for c in self.collections if c.name == collection), None)
        floor = declared(RERANKERS, self.reranker, "relevance_floor") if self.reranker is not None else None
        rerank = (hit.rerank_score, float(floor)) if hit.rerank_score is not None and floor is not None else None
        return Evidence(cosine, dense is not None, partial(weights, agent) if agent is not None else dict,
                        period, rerank)

    def _ranked(self, params: SearchRequest, degraded: list[str] | None,
                period: tuple[datetime.date, datetime.date] | None, candidates: Candidates) -> list[Hit]:
        """The first ``candidates`` after the post-fusion stages: as many of them as the stages need (``_stages``),
        with their payloads, run through them. When the stages leave fewer than ``k`` (windows sharing their lines,
        a long turn's pieces, a ``min_score``) and more candidates could pass, twice as many are read and ranked
        again, so an answer is not short while candidates remain (not after a reranker, which would be asked
        twice)."""
        depth = params.k * COLLAPSE_DEPTH
        floor = params.min_score if not self.settings.half_life_days else None  # decay re-scores every candidate
        while True:
            stages, need = self._stages(params, degraded, period, candidates.fused, depth)
            hits = candidates.first(need)
            for stage in stages:
                hits = stage(hits)
            if len(hits) >= params.k or candidates.exhausted(need, floor) or self.reranker is not None:
                return hits
            depth *= 2

    def _period(self, text: str, as_of: datetime.datetime | None
                ) -> Callable[[], tuple[datetime.date, datetime.date] | None]:
        """The days query ``text`` names as of ``as_of`` (``query_period``), read on a short-lived thread of its own
        while the query is embedded: dateparser's ~2 ms of Python overlaps the model's run, which releases the GIL (a
        first-time question that names a time: embedding + period 6.2 -> 4.6 ms p50, docs/performance.md). Calling
        the result waits for the thread and returns the period, or raises what ``query_period`` raised."""
        if not self.settings.time_boost or not may_name_time(text):
            return lambda: None
        period: Future[tuple[datetime.date, datetime.date] | None] = Future()

        def read() -> None:
            try:
                period.set_result(query_period(text, as_of))
            except BaseException as exc:  # raised again by ``period.result()``, on the search's thread
                period.set_exception(exc)

        threading.Thread(target=read, name="query-period", daemon=True).start()
        return period.result

    def search(self, params: SearchRequest, degraded: list[str] | None = None) -> list[schema.Hit]:
        """The ``params.k`` best hits across the selected collections, best first, as the API's hits; ``degraded``
        collects why the answer is less than the configured search (``retrieve``)."""
        return [to_hit(hit, params.query, self.settings.hit_fields) for hit in self.retrieve(params, degraded)]


def _mode(params: SearchRequest, settings: SearchSettings) -> str:
    """The mode ``params`` runs in (its own, else the configured one); raises ``ValueError`` for another."""
    mode = params.mode or settings.mode
    if mode not in ("hybrid", "dense", "keyword"):
        raise ValueError(f"mode must be hybrid, dense or keyword, got {mode!r}")
    return mode


def _boost_depth(fused: Sequence[tuple[Any, float]], need: int, boost: float) -> int:
    """How many of ``fused`` (``(point id, score)``, best first) the period boost must read so that its first
    ``need`` are those of boosting them all: a candidate counts when its best score (boosted or not: a factor of
    ``1 + boost`` raises a positive score and lowers a negative one) reaches the ``need``-th best of the scores
    each candidate keeps at worst. Both bounds fall with the fused score, so the count is a prefix of ``fused``.
    A time question then reads the payloads of these instead of every candidate (docs/performance.md)."""
    if len(fused) <= need:
        return len(fused)
    factor = 1 + boost
    floor = sorted((min(score, score * factor) for _, score in fused), reverse=True)[need - 1]
    return sum(1 for _, score in fused if max(score, score * factor) >= floor)
