"""Dates of notes and of questions: when a note was written, and which days a question asks about.

``note_date`` finds a note's date (file name ``YYYY-MM-DD``, front matter ``date``, a dated heading) and
``date_words`` writes it the ways people ask for it (``Monday, 8 May 2023``): chunking puts it into the chunk's
context, embedded and keyword-indexed with the text, and into the payload (``date``).

``query_period`` reads a time expression in a question (``in May 2023``, ``on October 24, 2023``, ``last week``,
``yesterday``, ``two days ago``) with dateparser (scrapinghub/dateparser), relative to a moment (the request's
``as_of``, else now), as the days it spans: search boosts the notes dated in them (``indexer.search``), never
filters by them (``since``/``until`` are the filters). Chinese expressions (``10月3日``, ``2026年5月``, ``上周二``,
``昨天``, ``前天``, ``上个月``, ``三天前``) are read by ``zh_period``, here: dateparser's Chinese reads ``10月3日`` as
1 February and ``2023年5月`` as the year 3.
"""

from __future__ import annotations

import datetime
import re
import time
from dataclasses import dataclass
from functools import lru_cache

_ISO_DATE = re.compile(r"(?<!\d)(\d{4})-(\d{2})-(\d{2})(?!\d)")


def parse_iso_date(text: str) -> datetime.date | None:
    """The first valid ``YYYY-MM-DD`` date in ``text``, else ``None``."""
    for match in _ISO_DATE.finditer(text):
        try:
            return datetime.date(*map(int, match.groups()))
        except ValueError:
            continue
    return None


def note_date(rel_path: str, front_matter_date: object = None, title: str | None = None) -> datetime.date | None:
    """A note's date: its file name's ``YYYY-MM-DD``, else its front matter's ``date`` (a date, a date-time or an
    ISO string), else a ``YYYY-MM-DD`` in its title heading; ``None`` when none names one."""
    found = parse_iso_date(rel_path.rsplit("/", 1)[-1])
    if found is None and isinstance(front_matter_date, datetime.datetime):
        found = front_matter_date.date()
    elif found is None and isinstance(front_matter_date, datetime.date):
        found = front_matter_date
    elif found is None and isinstance(front_matter_date, str):
        found = parse_iso_date(front_matter_date)
    if found is None and title:
        found = parse_iso_date(title)
    return found


_WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")


def date_words(day: datetime.date) -> str:
    """``day`` as people write and ask for it, in English whatever the locale: ``Monday, 8 May 2023`` (which holds
    ``May 2023`` and the weekday as words a keyword search matches)."""
    return f"{_WEEKDAYS[day.weekday()]}, {day.day} {_MONTHS[day.month - 1]} {day.year}"


#: a time expression dateparser found counts only when it holds one of these: a digit, a month's name (``may``
#: only after ``in``/``of``/``early``/``late``, it is also a verb), a weekday or a relative word (dateparser also
#: reads "we", "sat" or "second" as times)
_CUE = re.compile(
    r"\d|\b(?:yesterday|today|tonight|ago|last|week|weekend|month|year|january|february|march|april|june|july|"
    r"august|september|october|november|december|jan|feb|mar|apr|jun|jul|aug|sept?|oct|nov|dec|monday|tuesday|"
    r"wednesday|thursday|friday|saturday|sunday)\b|\b(?:in|of|early|late|mid) may\b", re.IGNORECASE)
_PERIOD_DAYS = {"day": 1, "week": 7}


def query_period(query: str, as_of: datetime.datetime | None = None) -> tuple[datetime.date, datetime.date] | None:
    """``(first, last)`` days (inclusive) of the first time expression in ``query`` (English; a question with Han
    characters is read by ``zh_period`` first), relative to ``as_of`` (naive local time, to the minute; default
    now): a day (``on 24 October 2023``, ``yesterday``, ``two days ago``), the 7 days of a week (``last week``), a
    month (``in May 2023``; a month without a year is the latest
    one not after ``as_of``) or a year (``in 2023``). ``None`` when the query names no time.

    The expressions a query holds are found once per query (``time_phrases``: they do not depend on the moment)
    and each is read once per minute of ``as_of``, so a question asked again costs a dictionary look-up, not
    dateparser's few milliseconds (docs/performance.md)."""
    base = (as_of or datetime.datetime.now()).replace(second=0, microsecond=0)
    if _HAN.search(query):  # Chinese: ``zh_period`` (dateparser reads 10月3日 as 1 February)
        found = zh_period(query, base.date())
        if found:
            return found
    for phrase in time_phrases(query):
        period = _phrase_period(phrase, base)
        if period is not None:
            return period
    return None


def _settings(base: datetime.datetime | None) -> dict[str, object]:
    settings: dict[str, object] = {"PREFER_DATES_FROM": "past", "RETURN_AS_TIMEZONE_AWARE": False}
    if base is not None:
        settings["RELATIVE_BASE"] = base
    return settings


_HAN = re.compile(r"[\u4e00-\u9fff]")
_ZH_DIGITS = {"零": 0, "一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8, "九": 9}
_ZH_WEEKDAY = {"一": 0, "二": 1, "三": 2, "四": 3, "五": 4, "六": 5, "日": 6, "天": 6}
_ZH_DAYS_BACK = {"今天": 0, "今日": 0, "昨天": 1, "昨日": 1, "前天": 2, "大前天": 3}
_ZH = re.compile(
    r"(?P<ymd>(?:(?P<y>\d{4})年)?(?P<m>\d{1,2})月(?:(?P<d>\d{1,2})[日号])?)"  # 2026年10月3日, 10月3日, 10月
    r"|(?P<year>\d{4})年"  # 2026年
    r"|(?P<rel>大前天|前天|昨天|昨日|今天|今日)"
    r"|(?P<which>上上|上|这|本|下)?(?:个)?(?:周|星期|礼拜)(?P<wd>[一二三四五六日天])?"  # 上周, 上周二, 周二, 这周
    r"|(?P<mrel>上个?月|这个?月|本月)"
    r"|(?P<yrel>去年|今年|前年)"
    r"|(?P<n>\d{1,3}|[零一二两三四五六七八九十]{1,3})(?P<unit>天|日|周|个?星期|个?礼拜|个?月|年)(?:以)?前")


def _zh_number(text: str) -> int:
    """``12``, ``十二``, ``两``, ``二十`` as an int."""
    if text.isdigit():
        return int(text)
    if "十" in text:
        tens, _, ones = text.partition("十")
        return (_ZH_DIGITS.get(tens, 1) if tens else 1) * 10 + (_ZH_DIGITS.get(ones, 0) if ones else 0)
    return _ZH_DIGITS.get(text, 0)


def _month(year: int, month: int) -> tuple[datetime.date, datetime.date]:
    following = datetime.date(year + month // 12, month % 12 + 1, 1)
    return datetime.date(year, month, 1), following - datetime.timedelta(days=1)


def _months_back(day: datetime.date, months: int) -> tuple[int, int]:
    index = day.year * 12 + day.month - 1 - months
    return index // 12, index % 12 + 1


def zh_period(query: str, today: datetime.date) -> tuple[datetime.date, datetime.date] | None:
    """``(first, last)`` days (inclusive) of the first Chinese time expression in ``query``, relative to ``today``,
    as ``query_period`` reads English: a day (``10月3日``: the latest 3 October not after ``today``; ``2026年10月3日``,
    ``昨天``, ``前天``, ``三天前``, ``上周二``: Tuesday of last week, ``周二``: the latest Tuesday), a week (``上周``,
    ``这周``: Monday to Sunday), a month (``上个月``, ``10月``, ``2026年5月``) or a year (``去年``, ``2025年``).
    ``None`` when it names none (or an impossible date)."""
    monday = today - datetime.timedelta(days=today.weekday())
    for match in _ZH.finditer(query):
        try:
            if match["ymd"]:
                month = int(match["m"])
                year = int(match["y"]) if match["y"] else None
                if match["d"]:
                    day = datetime.date(year or today.year, month, int(match["d"]))
                    if year is None and day > today:
                        day = day.replace(year=today.year - 1)
                    return day, day
                if year is None:
                    year = today.year if month <= today.month else today.year - 1
                return _month(year, month)
            if match["year"]:
                year = int(match["year"])
                return datetime.date(year, 1, 1), datetime.date(year, 12, 31)
            if match["rel"]:
                day = today - datetime.timedelta(days=_ZH_DAYS_BACK[match["rel"]])
                return day, day
            if match["mrel"]:
                return _month(*_months_back(today, 1 if match["mrel"].startswith("上") else 0))
            if match["yrel"]:
                year = today.year - {"去年": 1, "今年": 0, "前年": 2}[match["yrel"]]
                return datetime.date(year, 1, 1), datetime.date(year, 12, 31)
            if match["unit"]:
                n, unit = _zh_number(match["n"]), match["unit"]
                if unit in ("天", "日"):
                    day = today - datetime.timedelta(days=n)
                    return day, day
                if unit.endswith("月"):
                    return _month(*_months_back(today, n))
                if unit == "年":
                    return datetime.date(today.year - n, 1, 1), datetime.date(today.year - n, 12, 31)
                start = monday - datetime.timedelta(weeks=n)
                return start, start + datetime.timedelta(days=6)
            which, weekday = match["which"], match["wd"]
            if which is None and weekday is None:  # "周" alone: no time
                continue
            week = monday - datetime.timedelta(weeks={"上上": 2, "上": 1, "下": -1}.get(which or "", 0))
            if weekday is None:
                return week, week + datetime.timedelta(days=6)
            day = week + datetime.timedelta(days=_ZH_WEEKDAY[weekday])
            if which is None and day > today:  # "周二" alone: the latest Tuesday
                day -= datetime.timedelta(weeks=1)
            return day, day
        except ValueError:  # 2月30日
            continue
    return None


def may_name_time(query: str) -> bool:
    """Whether ``query`` may name a time (``query_period`` would read more than a regular expression): it holds a
    cue (``_CUE``) or Han characters. A cheap test (a few microseconds)."""
    return bool(_CUE.search(query) or _HAN.search(query))


@lru_cache(maxsize=1024)
def time_phrases(query: str) -> tuple[str, ...]:
    """The time expressions dateparser's ``search_dates`` finds in ``query`` that hold a cue (``_CUE``), in order;
    ``()`` without a cue (dateparser is then not asked). Cached per query (1,024)."""
    if not _CUE.search(query):
        return ()
    from dateparser.search import search_dates

    found = search_dates(query, languages=["en"], settings=_settings(None)) or []
    return tuple(phrase for phrase, _ in found if _CUE.search(phrase))


@lru_cache(maxsize=1024)
def _phrase_period(phrase: str, base: datetime.datetime) -> tuple[datetime.date, datetime.date] | None:
    from dateparser.date import DateDataParser

    data = DateDataParser(languages=["en"], settings=_settings(base)).get_date_data(phrase)
    if data.date_obj is None:
        return None
    day = data.date_obj.date()
    if data.period == "year":
        return datetime.date(day.year, 1, 1), datetime.date(day.year, 12, 31)
    if data.period == "month":
        following = datetime.date(day.year + day.month // 12, day.month % 12 + 1, 1)
        return datetime.date(day.year, day.month, 1), following - datetime.timedelta(days=1)
    if data.period == "week":
        monday = day - datetime.timedelta(days=day.weekday())
        return monday, monday + datetime.timedelta(days=6)
    return day, day


def warm_dates() -> None:
    """Import dateparser and read one question now (about 0.7 s of loading its language data on 2 cores), so the
    first question that names a time does not pay for it; the daemon calls it while its model loads."""
    query_period("what happened yesterday?")


_DURATION = re.compile(r"^ *([0-9]+(?:\.[0-9]+)?) *(s|m|h|d|w) *$")  # as indexer.schema publishes it
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}


def parse_time(value: str, name: str = "since", now_s: float | None = None) -> int:
    """A time argument (``name``, for the error) as nanoseconds since the epoch: a duration back from ``now_s``
    (``90s``, ``30m``, ``12h``, ``7d``, ``2w``), an ISO 8601 date (``2026-11-01``: local midnight) or date-time
    (``2026-11-01T09:30``, local time unless it carries an offset; RFC 3339's lower-case ``t`` and ``z`` too).
    A moment beyond what 64 bits of nanoseconds hold (before 1677, after 2262) is clamped to that range. Raises
    ``ValueError`` naming the accepted forms."""
    match = _DURATION.match(value)
    if match:
        now = time.time() if now_s is None else now_s
        return _clamped((now - float(match[1]) * _SECONDS[match[2]]) * 1e9)
    try:
        moment = datetime.datetime.fromisoformat(value.upper())
    except ValueError:
        raise ValueError(f"{name} must be a duration such as 7d, 12h, 30m, 2w or an ISO date/date-time such as "
                         f"2026-11-01 or 2026-11-01T09:30, got {value!r}") from None
    try:
        return _clamped(moment.timestamp() * 1e9)
    except (OverflowError, OSError, ValueError):  # year 1 or 9999 shifted out of range by the local offset
        return _clamped(float("-inf") if moment.year < 1970 else float("inf"))


@dataclass(frozen=True, slots=True)
class RequestTimes:
    """A search request's times, each read once (``parse_time``) and shared by everything that asks: ``since_ns``
    and ``until_ns`` (nanoseconds since the epoch; the filter's window ``[since, until)``, ``None``: open) and
    ``as_of`` (the moment the query's own time words count from, naive local; ``None``: now)."""

    since_ns: int | None = None
    until_ns: int | None = None
    as_of: datetime.datetime | None = None


def request_times(since: str | None, until: str | None, as_of: str | None,
                  now_s: float | None = None) -> RequestTimes:
    """``RequestTimes`` of a request's ``since``, ``until`` (durations count back from ``now_s``, default now) and
    ``as_of``. Raises ``ValueError`` naming the field and the accepted forms."""
    return RequestTimes(None if since is None else parse_time(since, "since", now_s),
                        None if until is None else parse_time(until, "until", now_s),
                        None if not as_of else datetime.datetime.fromtimestamp(parse_time(as_of, "as_of") / 1e9))


def _clamped(ns: float) -> int:
    return int(max(-(2**63), min(2**63 - 1, ns)))
