"""Dates: the months, years and days a query names (query_dates, query_days), a turn's day and date
label, a packed turn's text, and the one "[8 May 2023]" header item per day that stands ahead of
that day's turns when dates are not written on every turn."""

from __future__ import annotations

import datetime as dt
import re

import fastpath
from sidecar.domain import Category, Role, render_message_line
from sidecar.services.limits import MAX_TIMESTAMP_MS
from sidecar.tokens import count_line

_MONTHS = {m.lower(): i for i, m in enumerate(
    ("January February March April May June July August September October November December").split(), 1)}
_MONTHS.update({k[:3]: v for k, v in list(_MONTHS.items())})
_MONTH_ALT = "|".join(sorted(_MONTHS, key=len, reverse=True))
_MONTH_RE = re.compile(r"\b(" + _MONTH_ALT + r")\b\.?(?:,?\s+(\d{4}))?", re.I)
_YEAR_RE = re.compile(r"\b(19\d\d|20\d\d)\b")
# "9 November, 2022", "13th of May 2023", "October 13, 2023", "August 11" (the year may be elsewhere).
_DAY_RES = (re.compile(r"\b(?P<d>\d{1,2})(?:st|nd|rd|th)?\s+(?:of\s+)?(?P<m>" + _MONTH_ALT
                       + r")\b\.?(?:,?\s+(?P<y>\d{4}))?", re.I),
            re.compile(r"\b(?P<m>" + _MONTH_ALT + r")\b\.?\s+(?P<d>\d{1,2})(?:st|nd|rd|th)?\b(?!:)(?:,?\s+(?P<y>\d{4}))?",
                       re.I))
# Chinese: "2023年5月8日", "5月8号", "五月八日", "2023年5月", "三月", "2022年".
_ZH_DIGITS = {"零": 0, "一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8, "九": 9}
_ZH_NUM = r"\d{1,2}|[一二三四五六七八九十]{1,3}"
_ZH_DAY_RE = re.compile(rf"(?:(?P<y>\d{{4}})\s*年\s*)?(?P<m>{_ZH_NUM})\s*月\s*(?P<d>{_ZH_NUM})\s*[日号]")
_ZH_MONTH_RE = re.compile(rf"(?:(?P<y>\d{{4}})\s*年\s*)?(?<![\d一二三四五六七八九十个])(?P<m>{_ZH_NUM})\s*月")
_ZH_YEAR_RE = re.compile(r"(?P<y>(?:19|20)\d\d)\s*年")
_EPOCH = dt.date(1970, 1, 1).toordinal()
# Every date pattern above needs a digit, a month's name or 月 / 年: a query with none skips them all.
_DATE_HINT = re.compile(r"\d|\b(?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)|[月年]", re.I)


def zh_count(word: str) -> int:
    """A count written in digits or Chinese numerals up to 99 ("三", "十二", "二十"); 几 (a few) is 3."""
    if word.isdigit():
        return int(word)
    if word == "几":
        return 3
    if "十" not in word:
        return _ZH_DIGITS.get(word, 0) if len(word) == 1 else 0
    tens, _, ones = word.partition("十")
    return (_ZH_DIGITS.get(tens, 0) if tens else 1) * 10 + (_ZH_DIGITS.get(ones, 0) if ones else 0)


def query_dates(query: str, days: set[dt.date] | None = None) -> tuple[set[tuple[int, int]], set[int]]:
    """(year-or-0, month) pairs and bare years named in a query ("in May 2023", "in 2022"); a year
    named with a month is not also a bare year. `days`: query_days(query), when the caller has it."""
    if not _DATE_HINT.search(query):
        return set(), set()
    found = _MONTH_RE.findall(query)
    months = {(int(y) if y else 0, _MONTHS[m.lower()]) for m, y in found
              if m.lower() != "may" or y}  # "may" alone is the verb far more often than the month
    for m in _ZH_MONTH_RE.finditer(query):
        if 1 <= (month := zh_count(m.group("m"))) <= 12:
            months.add((int(m.group("y")) if m.group("y") else 0, month))
    with_month = {y for y, _ in months}
    years = {int(y) for y in (*_YEAR_RE.findall(query), *_ZH_YEAR_RE.findall(query))} - with_month
    if days is None:
        days = query_days(query)
    months |= {(d.year, d.month) for d in days}
    years -= {d.year for d in days}
    months -= {(0, m) for y, m in months if y}  # "October 13, 2023" also read as a bare "October"
    return months, years


def query_days(query: str) -> set[dt.date]:
    """Calendar days a query names; a day without its year takes the query's only year."""
    out: set[dt.date] = set()
    if not _DATE_HINT.search(query):
        return out
    years = {int(y) for y in (*_YEAR_RE.findall(query), *_ZH_YEAR_RE.findall(query))}
    for pattern in (*_DAY_RES, _ZH_DAY_RE):
        for m in pattern.finditer(query):
            year = int(m.group("y")) if m.group("y") else (next(iter(years)) if len(years) == 1 else 0)
            if not year:
                continue
            month = zh_count(m.group("m")) if pattern is _ZH_DAY_RE else _MONTHS[m.group("m").lower()]
            try:
                out.add(dt.date(year, month, zh_count(m.group("d"))))
            except ValueError:
                continue
    return out


def utc_day(timestamp_ms: int) -> dt.datetime:
    """A stored timestamp's UTC time, held to the calendar: rows written before ingest bounded
    client timestamps must not break a user's recall."""
    return dt.datetime.fromtimestamp(min(max(timestamp_ms, 0), MAX_TIMESTAMP_MS) / 1000, dt.UTC)


def date_label(timestamp_ms: int) -> str:
    day = utc_day(timestamp_ms)
    return f"[{day.day} {day.strftime('%B')} {day.year}]"


def day_number(timestamp_ms: int) -> int:
    """yyyymmdd (UTC) of a timestamp."""
    day = utc_day(timestamp_ms)
    return day.year * 10000 + day.month * 100 + day.day


def render_turn(speaker: str, role: Role, text: str, timestamp_ms: int, *, dated: bool = True) -> str:
    """A past turn as packed: "[8 May 2023] Ann: text", or "Ann: text" when the date is a header item."""
    line = render_message_line(role, speaker, text)
    return f"{date_label(timestamp_ms)} {line}" if dated else line


def _midnight_ms(day: int) -> int:
    """00:00 UTC of a yyyymmdd day, in epoch milliseconds: the time a day header stands for."""
    return int(dt.datetime(day // 10000, day // 100 % 100, day % 100, tzinfo=dt.UTC).timestamp() * 1000)


def _day_item(day: int, timestamp_ms: int) -> tuple[str, int, int, int, str, bytes, int]:
    """A day's header item (see _UserIndex.day_items), made once per day."""
    label = date_label(timestamp_ms)
    tokens = count_line(label)
    exact, simhash = fastpath.text_keys([label])
    source, midnight = f"date:{day}", _midnight_ms(day)
    return (label, tokens, int(exact[0]), int(simhash[0]), source,
            fastpath.encode_item(source, Category.MEMORIES, tokens, label, 0, midnight, ()), midnight)
