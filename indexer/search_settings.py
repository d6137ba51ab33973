"""What shapes every search of a ``Searcher``: ``SearchSettings``, read once from the daemon's ``Settings``
(``from_settings``), and the constants they default to, each with where it was measured."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from indexer.config import Settings
from indexer.plugins import Registry

#: how much a note dated in the period the query names gains (``indexer.ranking.boost_period``): its fused score
#: times 1 + this. Measured on convmem (docs/benchmarks.md, "Conversation memory")
TIME_BOOST = 1.0


@dataclass(frozen=True, slots=True)
class SearchSettings:
    """What shapes every search of a ``Searcher``: the defaults a request may override (``mode``), the fusion
    (``fusion``, ``rrf_k``, ``prefetch_limit``: candidates per vector), per-vector score floors before fusion
    (``min_scores``: image cosine), the payload fields hits carry (``hit_fields``), the post-fusion stages
    (``half_life_days``, ``time_boost``, ``rerank_top_n``/``rerank_budget_s`` in seconds, ``mmr_lambda``) and the
    relevance floors (``relevance``). ``from_settings`` reads them from the daemon's ``Settings``."""

    mode: str = "hybrid"
    fusion: str = "dbsf"
    rrf_k: int = 60
    prefetch_limit: int = 100
    min_scores: Mapping[str, float] = field(default_factory=dict)
    hit_fields: tuple[str, ...] = ()
    half_life_days: float | None = None
    time_boost: float = TIME_BOOST
    rerank_top_n: int = 20
    rerank_budget_s: float = 2.0
    mmr_lambda: float | None = None
    dense_floor: float | None = None  # None: the text model's own (``indexer.calibration``)
    coverage_floor: float = 0.5
    corpus: str = "all"  # the corpus of a request that names none (``default_corpus``)

    @classmethod
    def from_settings(cls, settings: Settings, registry: Registry) -> SearchSettings:
        """The configured search of ``settings`` (``search_mode``, ``fusion``, ``rrf_k``, ``prefetch_limit``,
        ``image_min_score``, ``temporal_half_life_days``, ``rerank_top_n``, ``rerank_budget_s``, ``mmr_lambda``,
        ``relevance_floor``, ``relevance_coverage``) with ``registry``'s ``hit_fields``."""
        return cls(mode=settings.search_mode, fusion=settings.fusion, rrf_k=settings.rrf_k,
                   prefetch_limit=settings.prefetch_limit, min_scores={"image": settings.image_min_score},
                   hit_fields=tuple(registry.hit_fields), half_life_days=settings.temporal_half_life_days,
                   rerank_top_n=settings.rerank_top_n, rerank_budget_s=settings.rerank_budget_s,
                   mmr_lambda=settings.mmr_lambda, dense_floor=settings.relevance_floor,
                   coverage_floor=settings.relevance_coverage, corpus=settings.default_corpus)


SETTING_NAMES = frozenset(f.name for f in fields(SearchSettings))
