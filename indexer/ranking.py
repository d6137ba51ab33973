"""The ranking after the searches: fusion of the per-vector lists, and the stages that re-order the fused hits.

Fusion (``fuse_scores``, ``with_keyword_zeros``) turns the dense and BM25 candidate lists into one ranked list; a BM25
list that matched nothing meaningful does not vote (``keyword_votes``).
The post-fusion stages each take the fused hits (payloads read) and return them re-ordered or thinned;
``indexer.search.Searcher`` builds the list of stages a search runs from its settings and the query:

- ``decay``: temporal decay of dated daily notes (off by default: ``temporal_half_life_days``);
- ``at_least``: a request's ``min_score``, on the fused (and decayed) score;
- ``boost_period``: a soft boost for notes dated in the period the query names (``in May 2023``, ``last week``:
  ``indexer.dates.query_period``);
- ``indexer.rerank.rerank``: a cross-encoder or rerank server (off unless configured);
- ``mmr``: maximal marginal relevance (off by default: ``mmr_lambda``);
- ``collapse``: one hit per stretch of lines, so overlapping chunks (windows of one conversation) do not fill the
  top with the same lines.
"""

from __future__ import annotations

import datetime
import heapq
import re
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, replace
from typing import Any, cast

from indexer.points import SPARSE, Hit, Payload

_WORD = re.compile(r"\w+", re.UNICODE)


def terms(text: str) -> set[str]:
    """The lower-cased words of ``text``; in CJK runs (no spaces) each character stands in for a word."""
    words = {w.lower() for w in _WORD.findall(text)}
    words |= {ch for w in words for ch in w if "\u3040" <= ch <= "\u9fff" or "\uac00" <= ch <= "\ud7af"}
    return words


#: a dated daily note: ``memory/YYYY-MM-DD.md``, or OpenClaw's slugged ``memory/YYYY-MM-DD-<slug>.md`` (its
#: session-memory hook's), in any folder under ``memory/``; dated by the prefix, as OpenClaw's temporal decay reads it
_DAILY = re.compile(r"(?:^|/)memory/(?:.*/)?(\d{4})-(\d{2})-(\d{2})(?:-[^/]+)?\.md$")


def decay(hits: Sequence[Hit], half_life_days: float, now_s: float) -> list[Hit]:
    """Temporal decay as the reference agent does it: the score of a dated daily note (``memory/YYYY-MM-DD.md``,
    ``memory/YYYY-MM-DD-<slug>.md``) is multiplied by ``0.5 ** (age_days / half_life_days)`` (age from the file-name
    date to ``now_s``, Unix seconds; never negative); every other file (``MEMORY.md``, ``USER.md``, topic notes) is
    evergreen and kept as is. Returns the hits re-sorted by score."""
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


def at_least(hits: Sequence[Hit], min_score: float) -> list[Hit]:
    """The hits whose score reaches ``min_score`` (a request's ``min_score``), in their order."""
    return [h for h in hits if h.score >= min_score]


def mmr(hits: Sequence[Hit], lam: float, k: int) -> list[Hit]:
    """Maximal marginal relevance (Carbonell & Goldstein 1998) over a ranked list: repeatedly take the hit that
    maximises ``lam * relevance - (1 - lam) * max similarity to the hits taken``, with relevance the score scaled
    to [0, 1] by the list's min and max and similarity the Jaccard overlap of the hits' word sets (as the reference
    agent does). ``lam = 1`` keeps the order. Returns the first ``k`` picks, then the rest in their order."""
    if len(hits) < 2 or lam >= 1:
        return list(hits)
    top, bottom = hits[0].score, min(h.score for h in hits)
    span = (top - bottom) or 1.0
    words = [terms(str(h.payload.get("text", ""))) for h in hits]
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


def boost_period(hits: Sequence[Hit], period: tuple[datetime.date, datetime.date], boost: float) -> list[Hit]:
    """``hits`` with the score of each whose note is dated in ``period`` (its payload's ``note_date``, first and
    last day inclusive) multiplied by ``1 + boost``, re-sorted by score (a soft boost: undated notes and notes of
    other days stay, at their score)."""
    first, last = period[0].isoformat(), period[1].isoformat()

    def inside(h: Hit) -> bool:
        day = str(h.payload.get("note_date", ""))
        return bool(day) and first <= day <= last

    return sorted((Hit(h.id, h.score * (1 + boost), h.payload) if inside(h) else h for h in hits),
                  key=lambda h: -h.score)


#: a narrowed window's score is its window's times (turns kept / turns) ** this: its match may lie in the turns it
#: no longer shows. Measured (docs/benchmarks.md, "Session transcripts"): 0 (score kept) to 1 (proportional) on
#: sessmem and convmem, 0.5 the best of both together.
NARROWED_EXPONENT = 0.5


def collapse(hits: Sequence[Hit], shown: Callable[[Hit], tuple[int, int]],
             narrow: Callable[[Payload, Sequence[tuple[int, int]]], tuple[Payload, float] | None] | None = None,
             settled: float | None = None, limit: int | None = None) -> list[Hit]:
    """``hits`` less the lines a better hit of the same file already shows (``shown(hit)``: first and last line,
    inclusive): consecutive windows of one conversation share turns, and a hit that shows the lines another already
    shows only takes the place of a new one. Without ``narrow``, such a hit drops out and the order is kept.

    With ``narrow`` (``indexer.hits.narrowed``: a window's payload cut to its turns outside the lines given, and the
    share of its turns kept), ``hits`` must be in score order (comparable scores, best first) and are taken best
    first: a hit overlapping the lines of those taken is cut to its turns they do not show, its score lowered by the
    share ``** NARROWED_EXPONENT`` (``lowered``), and goes back in line at that score, so it yields turns only to
    hits that end up better than it; one it cannot narrow (no turns known, or none left) drops out. ``settled``:
    when ``hits`` are the first of a longer list, the lowest score a hit not in ``hits`` may have stood above; a
    narrowed hit below it drops out, as a hit of that list it never met could outrank it (so the first ``k`` of
    an answer are the first ``k`` of a longer one). ``limit``: at most this many hits, the first of the whole
    answer (the rest are not looked at)."""
    taken: dict[str, list[tuple[int, int]]] = {}
    out: list[Hit] = []
    if narrow is None:
        for h in hits:
            if limit is not None and len(out) >= limit:
                break
            start, end = shown(h)
            ranges = taken.setdefault(h.payload.path, [])
            if not any(start <= b and a <= end for a, b in ranges):
                ranges.append((start, end))
                out.append(h)
        return out
    line = [(-h.score, n, h) for n, h in enumerate(hits)]  # best first; equals in the order given
    heapq.heapify(line)
    order = len(line)
    while line and (limit is None or len(out) < limit):
        _, _, h = heapq.heappop(line)
        start, end = shown(h)
        ranges = taken.setdefault(h.payload.path, [])
        if not any(start <= b and a <= end for a, b in ranges):
            ranges.append((start, end))
            out.append(h)
            continue
        cut = narrow(h.payload, ranges)
        if cut is None:
            continue
        score = lowered(h.score, cut[1] ** NARROWED_EXPONENT)
        if settled is not None and score < settled:
            continue
        heapq.heappush(line, (-score, order, replace(h, score=score, payload=cut[0])))
        order += 1
    return out


def lowered(score: float, factor: float) -> float:
    """``score`` lowered by ``factor`` (0 < factor <= 1): times it when positive, divided by it when negative (a
    cosine or fused score below 0 times a factor would rise)."""
    return score * factor if score >= 0 else score / factor


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


#: keyword hits whose terms decide whether the keyword list votes in fusion (``keyword_votes``)
VOTE_DEPTH = 3


def keyword_votes(query_terms: Set[int], number_terms: Set[int], held: Sequence[Set[int]]) -> bool:
    """Whether the BM25 list takes part in fusion: the query's terms (``query_terms``, BM25 term ids) less its
    numbers (``number_terms``: ``indexer.bm25.Bm25Terms.number_terms``) are its words; the list votes when one of
    its first ``VOTE_DEPTH`` hits (``held``: each hit's term ids) holds one of them, or when the query has no words.

    Why: a question in one language about notes in another (an English question over Chinese notes) has keyword
    hits that share only a number with it (an amount, a day). RRF gives that list's first hit as much as the dense
    list's first, so the meaningless list drags the dense one down (on zhmem's plain scripts, e5 alone found 0.947
    of the English questions in its top 5, fused with BM25 by RRF 0.737: zhmem's README). A list whose first hits
    hold a word of the question still votes, however few: the share of the words held is no test, since a rare
    identifier (``EVA`` in an English question over Chinese notes, ``October`` in a note's date) is a real match
    (with a 25 % floor on that share, zhmem's English nDCG@10 fell from 0.917 to 0.845: docs/models.md)."""
    words = set(query_terms) - set(number_terms)
    return not words or any(words & terms for terms in held)


def fuse_scores(lists: Sequence[Sequence[tuple[Any, float]]], method: str, rrf_k: int, limit: int,
                weights: Sequence[Mapping[Any, float] | None] = ()) -> list[tuple[Any, float]]:
    """Fuse ranked ``(point id, score)`` lists, best first, with Qdrant's own algorithms, as qdrant-client implements
    them for its local mode: RRF (score of a point = sum over lists of ``1 / (rank + k - 1)``, rank 1-based; Cormack
    et al. 2009 with Qdrant's offset) or DBSF (each list's scores normalised by mean +/- 3 standard deviations, then
    summed). ``weights[i]`` (optional, per list): point id -> the factor its part from list ``i`` is multiplied by
    before the sum (absent: 1; with no weights the sum is the library's own, in its order). Returns at most
    ``limit`` ``(point id, fused score)`` pairs, best first."""
    from qdrant_client.hybrid.fusion import distribution_based_score_fusion, reciprocal_rank_fusion

    if any(weights):
        total: dict[Any, float] = {}
        for i, pairs in enumerate(lists):  # each list alone through the library, its parts weighed and summed
            factor = weights[i] if i < len(weights) else None
            for pid, part in fuse_scores([pairs], method, rrf_k, len(pairs)):
                total[pid] = total.get(pid, 0.0) + part * (factor.get(pid, 1.0) if factor else 1.0)
        return sorted(total.items(), key=lambda item: item[1], reverse=True)[:limit]
    responses: list[Any] = [[_Scored(pid, score) for pid, score in pairs] for pairs in lists]
    if method == "rrf":
        fused = reciprocal_rank_fusion(responses, limit=limit, ranking_constant_k=rrf_k)
    else:
        fused = distribution_based_score_fusion(responses, limit=limit)
    # the library returns the objects it was given (its annotations say ScoredPoint)
    return [(p.id, float(p.score)) for p in cast(list[_Scored], fused)]

