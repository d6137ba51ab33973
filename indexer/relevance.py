"""Whether a search found anything relevant: the ``relevant`` flag and its graded ``relevance`` (level and reason).

The fused score cannot say it (fusion normalises each query's lists: DBSF top-1 is about 2 for any query), so
``judge`` reads the evidence itself, and reads it **of one hit**. A hit's verdict depends on the hit, the question
and its agent's index alone, never on the rest of the answer, so one hit gets one verdict whatever the request's
``corpus``, collections or ``k`` (judged on the whole search, a note said false with ``corpus memory`` and true with
``corpus all``, where a transcript's cosine or other document frequencies decided). The answer's own verdict is
that of the first of its first three hits found relevant (``indexer.search.JUDGED_HITS``, read whatever ``k``).
The evidence:

- **a reranker's score**: with a reranker that declares a ``relevance_floor`` (``indexer.api.Reranker``; the
  built-in ones: 0.5), a hit it scored is relevant from that score on, whatever the rest says: a model that reads
  the question and the passage together separates answers (0.93-0.9997 with a cross-encoder) from gibberish
  (0.003) far better than a cosine;
- **meaning**: the hit's raw dense cosine to the query (looked up when the hit came from keyword search alone);
- **telling words**: the query's BM25 terms weighed by their inverse document frequency over every collection of
  the hit's agent (``idf``: Qdrant's own formula over the index's document frequencies), so a word most notes hold
  ("name", "happened") weighs little and a word no note holds weighs most: the evidence is the IDF-weighted share
  of the query's terms the hit's text and context hold (``weighted_coverage``). A question whose telling word is
  nowhere in memory ("my cat's name") is unanswered however close its common words come;
- **the period**: for a question that names a period ("yesterday", "on 3 May"; ``indexer.dates.query_period``), the
  hit's date (``note_date``: a dated note's day, a transcript turn's day) in the period is evidence.

``relevant`` is true when the cosine reaches the text model's floor (``indexer.calibration``: the
``relevance_floor`` setting, the floor the model declares, or one measured on a probe; the reason names it: ``cosine
0.47 >= 0.42``), the hit holds ``relevance_coverage`` of the weighted terms, or it is dated in the period asked.
Levels: ``high`` (a cosine of ``DENSE_SURE`` or more, or two kinds of evidence), ``medium`` (one kind), both
relevant; ``low`` (something related: a cosine near the floor or some of the words) and ``none`` (nothing found or
nothing close). A close hit dated outside the period asked is ``medium`` at most: it may tell of another time (a
transcript turn of another day said ``high`` on its cosine 0.64 alone), though a daily note often tells of days
before its own, so it is not refused (refusing it said false to 5 right top hits of 209 on convmem). Measured with
``benchmarks/relevance_table.py`` on the devvault, convmem, sessmem and zhmem dev sets and the demo workspace
(docs/performance.md, "Nothing relevant").

Cost: a hit whose cosine reaches ``relevance_floor`` reads nothing more (its payload was read for the answer);
else each query term's document frequency is looked up (one keyword search per term and collection of at most
``DF_DEPTH`` points, cached per collection state by ``DocumentFrequencies``).
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
from indexer.points import Hit
from indexer.schema import Relevance

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


def held_terms(hit: Hit, bm25: Bm25Terms) -> set[int]:
    """The BM25 term ids of ``hit``'s context and text (as the index holds them)."""
    vector = bm25.document(f"{hit.payload.context}\n{hit.payload.text}")
    return set(vector[0]) if vector else set()


class Evidence(NamedTuple):
    """One hit's own evidence: its dense cosine to the query (``None``: the hit has no dense text vector),
    whether the search was a dense one (``False``: keyword only, no meaning to judge by), the query's term weights
    (term id -> IDF over every collection of the hit's agent; asked only when the cosine does not decide), the
    period the query names (first and last day, inclusive; ``None``: none) and, when a reranker that declares a
    ``relevance_floor`` scored the hit, ``(its score, that floor)``: then the reranker decides."""

    cosine: float | None
    dense: bool
    weights: Callable[[], Mapping[int, float]]
    period: tuple[datetime.date, datetime.date] | None
    rerank: tuple[float, float] | None = None


def hit_day(hit: Hit) -> str | None:
    """The hit's date (its payload's ``note_date``, ``YYYY-MM-DD``), ``None`` when undated."""
    return str(hit.payload.get("note_date", "") or "") or None


def judge(hit: Hit | None, evidence: Evidence, bm25: Bm25Terms, query: str, dense_floor: float,
          coverage_floor: float) -> Judgement:
    """``hit``'s ``relevant`` flag and its level and reason (see the module), from ``evidence`` and ``query``
    (tokenised by ``bm25`` as the index was); ``NOTHING`` without a hit. ``dense_floor``:
    ``Settings.relevance_floor``; ``coverage_floor``: ``relevance_coverage``."""
    if hit is None:
        return NOTHING
    cosine, period = evidence.cosine, evidence.period
    day = hit_day(hit) if period else None
    inside = day is not None and period is not None and period[0].isoformat() <= day <= period[1].isoformat()
    outside = day is not None and not inside
    said = [versus(cosine, dense_floor) if cosine is not None else "no dense score" if evidence.dense
            else "keyword only"]
    dated = [f"dated {day}, {'in' if inside else 'outside'} the period asked"] if day else []
    if evidence.rerank is not None:
        return _reranked(*evidence.rerank, cosine is not None and cosine >= dense_floor, said + dated)
    close = cosine is not None and cosine >= dense_floor
    if close:  # close in meaning: nothing more is read (the hot path)
        sure = cosine is not None and cosine >= max(DENSE_SURE, dense_floor) and not outside
        return Judgement(True, "high" if sure or inside else "medium", "; ".join(said + dated))
    weights = evidence.weights()
    words, missing = _words(hit, weights, bm25)
    if weights:
        said.append(f"telling words {words:.0%}"
                    + (f" ({_word(query, missing, bm25)} not in the hit)" if missing is not None else ""))
    reason = "; ".join(said + dated)
    if inside or words >= coverage_floor:
        level: Level = "high" if inside and words >= coverage_floor else "medium"
    elif words > 0 or (cosine is not None and cosine >= dense_floor - LOW_MARGIN):
        level = "low"
    else:
        level = "none"
    return Judgement(level in ("high", "medium") if evidence.dense else None, level, reason)


def versus(cosine: float, floor: float) -> str:
    """``cosine 0.47 >= 0.42`` (or ``<``), with as many decimals (2 to 4) as tell the two apart: never
    ``cosine 0.42 < 0.42``."""
    for digits in (2, 3, 4):
        shown, line = f"{cosine:.{digits}f}", f"{floor:.{digits}f}"
        if shown != line:
            break
    return f"cosine {shown} {'>=' if cosine >= floor else '<'} {line}"


def _reranked(score: float, floor: float, close: bool, said: list[str]) -> Judgement:
    """The verdict of a reranker that scored the hit and declares ``floor``: relevant from ``floor``; ``high`` when
    the cosine agrees (``close``), else ``medium``; under the floor ``low`` when the cosine is close, else ``none``.
    The reason names it first (it decided)."""
    reason = "; ".join([f"rerank score {score:.3g} {'>=' if score >= floor else '<'} {floor:g}", *said])
    if score >= floor:
        return Judgement(True, "high" if close else "medium", reason)
    return Judgement(False, "low" if close else "none", reason)


def _words(hit: Hit, weights: Mapping[int, float], bm25: Bm25Terms) -> tuple[float, int | None]:
    """The IDF-weighted share of the query's terms ``hit`` holds, and the query's rarest term (its telling word)
    when the hit lacks it."""
    held = held_terms(hit, bm25)
    rarest = max(weights, key=lambda t: (weights[t], t)) if weights else None
    return weighted_coverage(weights, held), (rarest if rarest is not None and rarest not in held else None)


_WORD = re.compile(r"\w+")
PIECE_CHARS = 8  # the longest piece of a run of words without spaces (``用户喝什么茶``) tried as the missing word


def _word(query: str, term: int, bm25: Bm25Terms) -> str:
    """The word of ``query`` that gives BM25 term ``term`` (quoted) when it reads as a word (``plain``), else
    ``"its rarest word"``; of a run written without spaces, the shortest piece that gives it (``'茶'``, not the
    whole question ``'用户喝什么茶'``): an answer never repeats a token that may be a key pasted as a query, which
    the index holds only redacted (``indexer.redact``)."""
    for word in _WORD.findall(query):
        held = bm25.query(word)[0]
        if term not in held:
            continue
        if len(held) > 1:  # a run the tokenizer cuts into several words (Chinese, Japanese): name the one piece
            word = _piece(word, term, bm25)
        return repr(word) if plain(word) else "its rarest word"
    return "its rarest word"


def _piece(run: str, term: int, bm25: Bm25Terms) -> str:
    """The shortest piece of ``run`` (at most ``PIECE_CHARS`` characters, the first of equals) that is BM25 term
    ``term`` alone; ``run`` itself when none is."""
    for n in range(1, min(len(run), PIECE_CHARS) + 1):
        for i in range(len(run) - n + 1):
            if bm25.query(run[i : i + n])[0] == [term]:
                return run[i : i + n]
    return run


def plain(word: str) -> bool:
    """Whether ``word`` reads as a word people write: letters alone (any script), with at most its first letter a
    capital or all capitals up to 8 letters (an acronym); ``MIIEowIBAAKCAQEA`` or ``ghp_Zx8Yw7`` do not."""
    return word.isalpha() and (not any(c.isupper() for c in word[1:]) or (word.isupper() and len(word) <= 8))


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
