"""Whether a search found anything relevant: the ``relevant`` flag and its graded ``relevance`` (level and reason).

The fused score cannot say it (fusion normalises each query's lists: DBSF top-1 is about 2 for any query), so
``judge`` reads the evidence itself, on the whole candidate lists before ``k`` cuts them (``k`` never changes it):

- **meaning**: the best raw dense cosine of the query against any candidate (``"text"`` list);
- **telling words**: the query's BM25 terms weighed by their inverse document frequency in the searched
  collections (``idf``: Qdrant's own formula over the index's document frequencies), so a word most notes hold
  ("name", "happened") weighs little and a word no note holds weighs most: the evidence of a candidate is the
  IDF-weighted share of the query's terms its text and context hold (``weighted_coverage``), the best of the first
  fused candidates counting. A question whose telling word is nowhere in memory ("my cat's name") is unanswered
  however close its common words come;
- **the period**: a question that names a period ("yesterday", "on 3 May"; ``indexer.dates.query_period``) is
  answered by a note dated in it (``note_date``) among the first hits.

``relevant`` is true when the cosine reaches ``Settings.relevance_floor``, one of the first candidates holds
``relevance_coverage`` of the weighted terms, or a dated note answers the period. Levels: ``high`` (a cosine of
``DENSE_SURE`` or more, or two kinds of evidence), ``medium`` (one kind), both relevant; ``low`` (something
related: a cosine near the floor or some of the words) and ``none`` (nothing found or nothing close). Measured
with ``benchmarks/relevance_table.py`` on the devvault, convmem, sessmem and zhmem dev sets and the demo workspace
(docs/performance.md, "Nothing relevant"): also requiring the words beside a cosine between the floor and 0.6
flagged more unanswerable questions false (zhmem 4/5, devvault 4/8 with 0.62) but fewer right answers true on
every set (devvault 29/32, convmem 201/212, sessmem 196/209, zhmem 19/34), so it is not done.

Cost: a query whose cosine reaches ``relevance_floor`` reads nothing more; else the payloads of the first
``RELEVANCE_DEPTH`` fused candidates are read once (the stages read most of them anyway) and each query term's
document frequency is looked up (one keyword search per term of at most ``DF_DEPTH`` points, cached per
collection state by ``DocumentFrequencies``).
"""

from __future__ import annotations

import datetime
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, NamedTuple

from indexer.bm25 import Bm25Terms
from indexer.points import SPARSE, Hit
from indexer.schema import Relevance

#: fused candidates whose keyword terms are read (a fixed number: ``k`` never changes the flag)
RELEVANCE_DEPTH = 10
#: a cosine of at least this (never below ``dense_floor``) is ``high``; between ``dense_floor`` and it, ``medium``
DENSE_SURE = 0.6
#: not relevant, but a cosine within this of ``dense_floor`` (or some of the query's words found) is ``low``, else
#: ``none``
LOW_MARGIN = 0.1
#: keyword search depth of one term's document-frequency lookup: a term in more points is common (its IDF is
#: computed as if in this many, an upper bound of its weight)
DF_DEPTH = 256

Level = Literal["high", "medium", "low", "none"]


class Judgement(NamedTuple):
    """``relevant`` (``None``: keyword-only search, no meaning to judge by) and the graded ``relevance``."""

    relevant: bool | None
    level: Level
    reason: str

    def as_dict(self) -> Relevance:
        """``{"level", "reason"}``: the answer's ``relevance``."""
        return {"level": self.level, "reason": self.reason}


NOTHING = Judgement(False, "none", "nothing found")


def idf(df: int, n: int) -> float:
    """Qdrant's IDF of a term in ``df`` of ``n`` points: ``ln(1 + (n - df + 0.5) / (df + 0.5))`` (>= 0)."""
    return math.log(1.0 + max(n - df + 0.5, 0.0) / (df + 0.5))


def weighted_coverage(weights: Mapping[int, float], held: set[int]) -> float:
    """The share of the query's term weights (term id -> IDF) that ``held`` (a candidate's term ids) holds, in
    [0, 1]; 0.0 when the query has no weighted term."""
    total = sum(weights.values())
    return sum(w for t, w in weights.items() if t in held) / total if total > 0 else 0.0


def term_coverage(query_terms: Sequence[int], hits: Sequence[Hit], bm25: Bm25Terms) -> float:
    """The largest share of ``query_terms`` (BM25 term ids of the query) that one of ``hits`` holds in its context
    and text, by the same tokenizer and stemmer as the index; 0.0 when the query has no term."""
    wanted = set(query_terms)
    if not wanted:
        return 0.0
    return max((len(wanted & held_terms(h, bm25)) / len(wanted) for h in hits), default=0.0)


def held_terms(hit: Hit, bm25: Bm25Terms) -> set[int]:
    """The BM25 term ids of ``hit``'s context and text (as the index holds them)."""
    vector = bm25.document(f"{hit.payload.context}\n{hit.payload.text}")
    return set(vector[0]) if vector else set()


class Evidence(NamedTuple):
    """What ``judge`` reads, each asked only when needed: the first fused candidates with their payloads, the
    query's term ids with their document frequencies and the number of points searched, and whether a note dated
    in the query's period is among the first hits (``None``: the query names no period)."""

    candidates: Callable[[], Sequence[Hit]]
    frequencies: Callable[[Sequence[int]], tuple[dict[int, int], int]]
    in_period: Callable[[], str | None]


def dated_in(hits: Sequence[Hit], period: tuple[datetime.date, datetime.date] | None) -> str | None:
    """The date (``YYYY-MM-DD``) of the first of ``hits`` whose note is dated in ``period`` (first and last day
    inclusive, as ``indexer.ranking.boost_period`` reads ``note_date``); ``None`` without a period or such a hit."""
    if not period:
        return None
    first, last = period[0].isoformat(), period[1].isoformat()
    return next((day for h in hits if (day := str(h.payload.get("note_date", "") or "")) and first <= day <= last),
                None)


def judge(lists: Mapping[str, Sequence[tuple[Any, float]]], query_terms: Sequence[int], evidence: Evidence,
          bm25: Bm25Terms, query: str, dense_floor: float, coverage_floor: float) -> Judgement:
    """The ``relevant`` flag and its level and reason, from a search's whole candidate lists (vector name ->
    ``(point id, score)`` pairs, before fusion and ``k``), the BM25 ``query_terms`` of ``query`` and ``evidence``
    (see the module). ``dense_floor``: ``Settings.relevance_floor``; ``coverage_floor``: ``relevance_coverage``."""
    dense, keyword = lists.get("text"), lists.get(SPARSE)
    if not dense and not keyword:
        return NOTHING
    cosine = max((score for _, score in dense), default=-1.0) if dense else None
    day = evidence.in_period()
    said = [f"cosine {cosine:.2f}" if cosine is not None else "keyword only"]
    dated = [f"a note dated {day}, in the period asked"] if day else []
    if cosine is not None and cosine >= dense_floor:  # close in meaning: nothing more is read (the hot path)
        sure = cosine >= max(DENSE_SURE, dense_floor)
        return Judgement(True, "high" if sure or day else "medium", "; ".join(said + dated))
    words, missing = _words(query_terms, evidence, bm25) if query_terms and keyword else (0.0, None)
    if query_terms:
        said.append(f"telling words {words:.0%}"
                    + (f" ({_word(query, missing, bm25)} in no hit)" if missing is not None else ""))
    reason = "; ".join(said + dated)
    if day or words >= coverage_floor:
        level: Level = "high" if day and words >= coverage_floor else "medium"
    elif words > 0 or (cosine is not None and cosine >= dense_floor - LOW_MARGIN):
        level = "low"
    else:
        level = "none"
    relevant = level in ("high", "medium") if dense else None
    return Judgement(relevant, level, reason)


def _words(query_terms: Sequence[int], evidence: Evidence, bm25: Bm25Terms) -> tuple[float, int | None]:
    """The best IDF-weighted share of the query's terms one of the first candidates holds, and the query's rarest
    term (its telling word) when that candidate lacks it."""
    frequencies, n = evidence.frequencies(query_terms)
    weights = {t: idf(frequencies.get(t, 0), n) for t in set(query_terms)}
    best, held = 0.0, set[int]()
    for hit in evidence.candidates():
        terms = held_terms(hit, bm25)
        share = weighted_coverage(weights, terms)
        if share > best:
            best, held = share, terms
    rarest = max(weights, key=lambda t: (weights[t], t)) if weights else None
    return best, (rarest if rarest is not None and rarest not in held else None)


_WORD = re.compile(r"\w+")


def _word(query: str, term: int, bm25: Bm25Terms) -> str:
    """The word of ``query`` that gives BM25 term ``term`` (quoted), else ``"its rarest word"``."""
    for word in _WORD.findall(query):
        if term in bm25.query(word)[0]:
            return repr(word)
    return "its rarest word"


class DocumentFrequencies:
    """Each term's document frequency in a set of collections, looked up by keyword search (``lookup``: term id ->
    points holding it, at most ``DF_DEPTH``) and cached by collection state (the collections' point count) so a
    repeated term costs nothing until the collections change; at most ``size`` entries. Thread-safe."""

    def __init__(self, size: int = 4096) -> None:
        self._cache: OrderedDict[tuple[Any, int], int] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def get(self, state: Any, terms: Sequence[int], lookup: Callable[[int], int]) -> dict[int, int]:
        """Term id -> document frequency for ``terms`` in the collections whose state is ``state`` (hashable)."""
        out: dict[int, int] = {}
        for term in dict.fromkeys(terms):
            key = (state, term)
            with self._lock:
                known = self._cache.get(key)
                if known is not None:
                    self._cache.move_to_end(key)
            if known is None:
                known = lookup(term)
                with self._lock:
                    self._cache[key] = known
                    while len(self._cache) > self._size:
                        self._cache.popitem(last=False)
            out[term] = known
        return out
