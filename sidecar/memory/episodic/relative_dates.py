"""Relative dates in a query ("two weeks ago", "last Saturday", "in the past three months"), resolved
against the time of asking into spans of days, so the turns told then can be found as the days a
query names are (priors.py). English and Chinese ("三天前", "上周六", "过去两周"); a duration asked for
("how many days ago did I...") names no date."""

from __future__ import annotations

import datetime as dt
import re
from bisect import bisect_left
from collections.abc import Callable
from typing import NamedTuple

from sidecar.memory.episodic.dates import _EPOCH, utc_day, zh_count

_NUMBERS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
            "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "a couple of": 2, "couple of": 2,
            "a few": 3, "few": 3, "several": 4}
_NUMBER = r"(?P<n>\d{1,3}|" + "|".join(sorted(map(re.escape, _NUMBERS), key=len, reverse=True)) + r")"
_UNIT_DAYS = {"day": 1, "week": 7, "month": 30, "year": 365}
_UNIT = r"(?P<unit>day|week|month|year)s?"
_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")

# Years back name no time a turn was told ("a hobby I started years ago" is told any day): days,
# weeks and months only.
_AGO_RE = re.compile(rf"\b{_NUMBER}\s+(?P<unit>day|week|month)s?\s+ago\b", re.I)
# "the past month", "the last two weeks" (up to today); "last month" alone is the calendar month (_LAST_RE).
_WITHIN_RE = re.compile(rf"\b(?:in\s+)?(?:the\s+)?(?P<word>past|last)\s+(?:{_NUMBER}\s+)?{_UNIT}\b", re.I)
_LAST_RE = re.compile(r"\b(?:last|(?:this\s+)?past|previous)\s+(?P<what>weekend|week|month|night|"
                      + "|".join(_WEEKDAYS) + r")\b", re.I)
_THIS_RE = re.compile(r"\bthis\s+(?P<what>week|month|year)\b", re.I)
_DAY_RE = re.compile(r"\b(?P<what>the\s+day\s+before\s+yesterday|yesterday|today|this\s+morning|tonight)\b", re.I)
# The same in Chinese: "三天前" (three days ago), "两个星期前", "过去两周" / "最近三个月" (the past...),
# "上周" / "上周末" / "上个月" / "上周六" (Saturday of last week), "这周" / "本月" / "今年", "昨天", "前天".
_ZH_NUMBER = r"(?P<n>\d{1,3}|[一二两三四五六七八九十]{1,3}|几)"
_ZH_UNIT = r"(?P<unit>天|日|周|个?星期|个?礼拜|个月)"
_ZH_UNIT_DAYS = {"天": 1, "日": 1, "周": 7, "星期": 7, "礼拜": 7, "月": 30}
_ZH_AGO_RE = re.compile(rf"{_ZH_NUMBER}\s*{_ZH_UNIT}\s*(?:以)?前")
_ZH_WITHIN_RE = re.compile(rf"(?:过去|最近|近)(?:的)?\s*{_ZH_NUMBER}\s*{_ZH_UNIT}")
# "上周天气" is last week's weather: 天 names Sunday only after 星期 / 礼拜 ("上星期天").
_ZH_LAST_RE = re.compile(r"上个?(?:(?P<weekend>周末)|周(?P<day>[一二三四五六日])?|(?:星期|礼拜)(?P<sunday>[一二三四五六日天])?"
                         r"|(?P<month>月))")
_ZH_THIS_RE = re.compile(r"(?:这|本)个?(?P<what>周|星期|礼拜|月)|(?P<year>今年)")
_ZH_DAY_RE = re.compile(r"(?P<what>大前天|前天|昨天|昨晚|昨日|今天|今早|今晚|今日)")
_ZH_WEEKDAYS = "一二三四五六"  # 日 / 天: Sunday
# Every pattern above needs one of these words: most queries skip them all.
_HINT_RE = re.compile(r"\b(?:ago|past|last|previous|this|yesterday|today|morning|tonight)\b|[前上这本今昨过近]", re.I)


class RelativeDates(NamedTuple):
    """What a query names relative to its asking: the spans of days, and where it says them."""

    spans: tuple[tuple[int, int], ...]  # (first, last) days since the epoch (UTC), distinct, in the order found
    phrases: tuple[tuple[int, int], ...]  # (start, end) of the words naming them in the query, in its order

    def without_phrases(self, query: str) -> str:
        """The query with the words naming these times taken out ("What did I cook two weeks ago?" ->
        "What did I cook  ?"): once the date prior lifts the turns told then, "two", "week" and "ago"
        say nothing of what was asked, and "a couple of days" is no couple."""
        kept, at = [], 0
        for start, end in self.phrases:
            kept.append(query[at:start])
            at = end
        kept.append(query[at:])
        return " ".join(kept)


NO_RELATIVE_DATES = RelativeDates((), ())


def relative_spans(query: str, asked_at_ms: int) -> tuple[tuple[int, int], ...]:
    """(first, last) days since the epoch (UTC) of each time the query names relative to the time of
    asking, in the order found."""
    return relative_dates(query, asked_at_ms).spans


def relative_dates(query: str, asked_at_ms: int) -> RelativeDates:
    """The times the query names relative to the time of asking, and where it names them."""
    if not _HINT_RE.search(query):
        return NO_RELATIVE_DATES
    today = utc_day(asked_at_ms).date()
    spans: dict[tuple[dt.date, dt.date], None] = {}
    # The character spans already read, disjoint and in order (so also by end): the longest reading
    # wins. Found by bisection, as a long query may name thousands.
    taken: list[tuple[int, int]] = []
    starts: list[int] = []

    def add(m: re.Match[str], first: dt.date, last: dt.date) -> None:
        start, end = m.span()
        at = bisect_left(starts, end)  # the spans starting before this one ends
        if at and taken[at - 1][1] > start:  # the last of them ends furthest: it overlaps, if any does
            return
        taken.insert(at, (start, end))
        starts.insert(at, start)
        spans[min(first, today), min(last, today)] = None

    for m in _AGO_RE.finditer(query):
        add(m, *_ago(today, _count(m.group("n")), _UNIT_DAYS[m.group("unit").lower()]))
    for m in _WITHIN_RE.finditer(query):
        if not m.group("n") and m.group("word").lower() == "last":
            continue
        n = _count(m.group("n")) if m.group("n") else 1
        add(m, today - dt.timedelta(days=n * _UNIT_DAYS[m.group("unit").lower()]), today)
    for m in _LAST_RE.finditer(query):
        first, last = _last(m.group("what").lower(), today)
        add(m, first, last)
    for m in _THIS_RE.finditer(query):
        what = m.group("what").lower()
        start = {"week": today - dt.timedelta(days=today.weekday()), "month": today.replace(day=1),
                 "year": today.replace(month=1, day=1)}[what]
        add(m, start, today)
    for m in _DAY_RE.finditer(query):
        what = " ".join(m.group("what").lower().split())
        back = 2 if what.endswith("before yesterday") else 1 if what == "yesterday" else 0
        add(m, today - dt.timedelta(days=back), today - dt.timedelta(days=back))
    _chinese(query, today, add)
    return RelativeDates(tuple((a.toordinal() - _EPOCH, b.toordinal() - _EPOCH) for a, b in spans), tuple(taken))


def _chinese(query: str, today: dt.date, add: Callable[[re.Match[str], dt.date, dt.date], None]) -> None:
    """The Chinese relative times of the query, each given to add(match, first day, last day) as
    relative_dates reads the English ones."""
    for m in _ZH_AGO_RE.finditer(query):
        add(m, *_ago(today, zh_count(m.group("n")), _zh_unit_days(m)))
    for m in _ZH_WITHIN_RE.finditer(query):
        add(m, today - dt.timedelta(days=zh_count(m.group("n")) * _zh_unit_days(m)), today)
    monday = today - dt.timedelta(days=today.weekday())
    for m in _ZH_LAST_RE.finditer(query):
        if m.group("weekend"):
            first, last = _last("weekend", today)
        elif m.group("month"):
            first, last = _last("month", today)
        elif day := m.group("day") or m.group("sunday"):  # 上周六: the Saturday of last week, not the latest one
            first = last = monday - dt.timedelta(days=7 - (_ZH_WEEKDAYS.index(day) if day in _ZH_WEEKDAYS else 6))
        else:
            first, last = _last("week", today)
        add(m, first, last)
    for m in _ZH_THIS_RE.finditer(query):
        what = "year" if m.group("year") else "month" if m.group("what") == "月" else "week"
        add(m, {"week": monday, "month": today.replace(day=1), "year": today.replace(month=1, day=1)}[what], today)
    for m in _ZH_DAY_RE.finditer(query):
        what = m.group("what")
        back = 3 if what == "大前天" else 2 if what == "前天" else 1 if what.startswith("昨") else 0
        add(m, today - dt.timedelta(days=back), today - dt.timedelta(days=back))


def _ago(today: dt.date, n: int, unit: int) -> tuple[dt.date, dt.date]:
    """The span "n units ago" names: its day, give or take a slack ("two weeks ago" is told loosely,
    "2 days ago" is not)."""
    back = n * unit
    slack = max(1, back // 7) if unit > 1 else n // 3
    centre = today - dt.timedelta(days=back)
    return centre - dt.timedelta(days=slack), centre + dt.timedelta(days=slack)


def _zh_unit_days(m: re.Match[str]) -> int:
    """Days in a Chinese match's unit ("个月" -> 30, "个星期" -> 7, "天" -> 1)."""
    return _ZH_UNIT_DAYS[m.group("unit")[-2:].lstrip("个")]


def _count(word: str) -> int:
    word = " ".join(word.lower().split())
    return int(word) if word.isdigit() else _NUMBERS[word]


def _last(what: str, today: dt.date) -> tuple[dt.date, dt.date]:
    """The span "last <what>" names: the calendar week, weekend or month before this one, the
    weekday's latest day before today, or last night."""
    monday = today - dt.timedelta(days=today.weekday())
    if what == "week":
        return monday - dt.timedelta(days=7), monday - dt.timedelta(days=1)
    if what == "weekend":
        return monday - dt.timedelta(days=2), monday - dt.timedelta(days=1)
    if what == "month":
        last = today.replace(day=1) - dt.timedelta(days=1)
        return last.replace(day=1), last
    if what == "night":
        return today - dt.timedelta(days=1), today - dt.timedelta(days=1)
    back = (today.weekday() - _WEEKDAYS.index(what)) % 7 or 7
    day = today - dt.timedelta(days=back)
    return day, day
