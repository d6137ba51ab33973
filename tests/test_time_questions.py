"""What a question that names a time costs a search: its time expressions found once per question, each read once
per minute of the moment it counts from, dateparser loaded before the first such question, and the period boost
reading only the candidates its factor can lift into the first ones (same order as boosting them all)."""

from __future__ import annotations

import datetime
import random

import dateparser.search

from indexer import dates
from indexer.points import Hit, Payload
from indexer.ranking import boost_period
from indexer.search import _boost_depth

AS_OF = datetime.datetime(2023, 11, 1, 18, 30, 12)


def test_a_question_asked_again_is_not_parsed_again_and_keeps_its_moment(monkeypatch) -> None:
    calls: list[str] = []
    real = dateparser.search.search_dates

    def counted(text: str, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(text)
        return real(text, *args, **kwargs)

    monkeypatch.setattr(dateparser.search, "search_dates", counted)
    dates.time_phrases.cache_clear()
    query = "what did we ship the day before yesterday, in the evening?"
    first = dates.query_period(query, AS_OF)
    assert first == (datetime.date(2023, 10, 30), datetime.date(2023, 10, 30))
    assert dates.query_period(query, AS_OF + datetime.timedelta(seconds=20)) == first
    next_week = dates.query_period(query, AS_OF + datetime.timedelta(days=7))  # the same words, another moment
    assert next_week == (datetime.date(2023, 11, 6), datetime.date(2023, 11, 6))
    assert calls == [query]  # dateparser searched the question once
    assert dates.query_period("deploy windows", AS_OF) is None and calls == [query]  # no cue: never asked


def test_warm_dates_loads_dateparser_before_the_first_question() -> None:
    dates.warm_dates()
    assert dates.time_phrases("what happened yesterday?") == ("yesterday",)


def _hits(scores: list[float], rng: random.Random) -> list[Hit]:
    days = ["2023-06-02", "2023-07-14", ""]
    return [Hit(f"p{i}", s, Payload(path=f"memory/n{i}.md", extra={"note_date": d} if (d := rng.choice(days)) else {}))
            for i, s in enumerate(scores)]


def test_the_boost_reads_only_what_it_can_lift_and_ranks_those_as_boosting_every_candidate() -> None:
    rng = random.Random(7)
    period = (datetime.date(2023, 6, 1), datetime.date(2023, 6, 30))
    saved = total = 0
    for trial in range(300):
        n, need = rng.randint(1, 120), rng.choice([3, 18, 20, 30])
        low = -1.0 if trial % 3 == 0 else 0.0  # a dense-only search fuses raw cosines, which may be negative
        scores = sorted((rng.uniform(low, 2.0) for _ in range(n)), reverse=True)
        hits = _hits(scores, rng)
        boost = rng.choice([0.2, 1.0, 3.0])
        depth = _boost_depth([(h.id, h.score) for h in hits], need, boost)
        assert min(need, n) <= depth <= n
        every = boost_period(hits, period, boost)[:need]
        read = boost_period(hits[:depth], period, boost)[:need]
        assert [(h.id, h.score) for h in read] == [(h.id, h.score) for h in every]
        saved, total = saved + n - depth, total + n
    assert saved > 0.3 * total  # many candidates are never read
