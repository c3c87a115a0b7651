"""Priors: multipliers of a turn's fused score. Query-dependent ones (a person the query names, or the
role it asks about; a month, year or day it names) and query-independent ones (a session's first
turns, a turn's voice, a turn naming someone or something that is no speaker); the per-turn features
the latter read (fastpath.voice, fastpath.capitalised) are computed when a turn is indexed. Priors'
methods are mixed into _UserIndex (index.py)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from fastpath.reference.scripts import as_typed
from sidecar.memory.episodic.dates import _EPOCH, query_dates, query_days
from sidecar.memory.episodic.terms import _WORD_RE
from sidecar.memory.question_person import asked_about

if TYPE_CHECKING:
    from sidecar.memory.episodic.ranking import Ranking


class Priors:
    """The ranker's multipliers, as methods of _UserIndex (index.py)."""

    def _query_prior(self, query: str, r: Ranking, relative: tuple[tuple[int, int], ...] = ()) -> np.ndarray:
        """Each turn's multiplier from what the query names: a speaker (or, naming nobody, the role it
        asks about), a month or year (the session's), a day (the turn told on or soon after it), or
        `relative` spans of days (relative_dates: "two weeks ago", resolved against the time of asking)."""
        n = len(self.ids)
        words = {as_typed(w).split("'")[0] for w in _WORD_RE.findall(query.lower())}  # "melanie's" names melanie
        named = [sid for name, sid in self.speakers.items() if name in words or name.split(" ")[0] in words]
        mult = np.ones(n)
        if named and r.speaker_boost and len(named) < len(self.speakers):
            flag = np.zeros(len(self.speakers) + 1, bool)  # by speaker id (np.isin sorts); -1 hits the last, False
            flag[named] = True
            mult *= np.where(flag[self.speaker_of[:n]], 1.0 + r.speaker_boost, 1.0)
        elif not named and r.person_roles and r.speaker_boost:
            role = asked_about(query)
            if role is not None:
                mult *= np.where(self.roles[:n] == int(role), 1.0 + r.speaker_boost, 1.0)
        named_days = query_days(query)
        months, years = query_dates(query, named_days)
        if months or years:
            ym = self.year_month[:n]
            boost = r.year_boost * np.logical_or.reduce([ym // 100 == y for y in years]) if years else np.zeros(n)
            for year, month in months:
                hit = (ym % 100 == month) & ((ym // 100 == year) if year else True)
                boost = np.maximum(boost, r.date_boost * hit)
            mult *= 1.0 + boost
        if named_days and r.day_boost:
            days = [(k, k) for k in (d.toordinal() - _EPOCH for d in named_days)]  # each a span of one day
            mult *= np.where(self._told_near(days, r), 1.0 + r.day_boost, 1.0)
        if relative and r.relative_boost:
            mult *= np.where(self._told_near(relative, r), 1.0 + r.relative_boost, 1.0)
        return mult

    def _told_near(self, spans: Iterable[tuple[int, int]], r: Ranking) -> np.ndarray:
        """Per turn, whether it was told in one of these (first, last) spans of days since the epoch or
        soon after: a day's events are told that day or in the days after ("yesterday", "last week")."""
        when = self.timestamps[:len(self.ids)] // 86_400_000
        near = np.zeros(len(when), bool)
        for first, last in spans:
            near |= (when >= first - r.day_before) & (when <= last + r.day_after)
        return near

    def _turn_prior(self, r: Ranking) -> np.ndarray:
        """Each turn's query-independent multiplier (session opener, voice, proper noun), kept until
        turns are added or the knobs change."""
        n = len(self.ids)
        key = (n, r.opener_boost, r.opener_decay, r.self_boost, r.other_penalty, r.proper_boost)
        if self._prior_key != key:
            prior = np.ones(n)
            if r.opener_boost:
                # A session opens with what happened since the last one: its first turns carry news.
                prior *= 1.0 + r.opener_boost * r.opener_decay ** self.position[:n].astype(np.float64)
            if r.self_boost or r.other_penalty:
                v = self.voice[:n]
                prior *= np.where(v > 0, 1.0 + r.self_boost, np.where(v < 0, 1.0 - r.other_penalty, 1.0))
            if r.proper_boost:
                prior *= np.where(self.proper[:n], 1.0 + r.proper_boost, 1.0)
            self._prior, self._prior_key = prior, key
        return self._prior
