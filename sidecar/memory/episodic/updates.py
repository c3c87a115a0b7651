"""Knowledge updates: a person who tells the same thing again, changed ("I moved to Denver" after "I
live in Boston", "three times a week now"), means the newer telling. Among the turns packed for a
call, a newer turn of the same speaker that says most of what an older one was matched on (its query
terms, weighed by idf) scores just above it; the older keeps its score. What is packed does not
change (a question about the change still finds both): the context scores the current value first.
A question asking for an earlier value ("my previous goal", "before I got the air fryer") wants no
such order (asks_before). Updates.newer_first is mixed into _UserIndex (index.py); EpisodicSource
applies it to what the builder packed (CandidateBatch.rescore); the rule itself is fastpath.newer_first."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np

import fastpath
from sidecar.memory.episodic.terms import stem

if TYPE_CHECKING:
    from sidecar.memory.episodic.ranking import Ranking

_NONE = np.zeros(0, np.int64)
# Words with which a question asks for the value as it is now ("What model am I currently working
# on?"): they say when, not what, so an older telling that happens to say "current" is not updated
# only by a newer one that says it too.
_NOW_TERMS = frozenset(stem(w) for w in "current currently now nowadays recent recently latest lately still "
                                        "present presently".split())
# "used to" alone is not enough: "What have I used to edit videos?" asks what is.
_BEFORE_RE = re.compile(r"\b(?:previous(?:ly)?|earlier|before|originally|initially|formerly|at\s+first|"
                        r"did\s+(?:i|you|we|they|he|she)\s+use\s+to)\b", re.I)


def asks_before(query: str) -> bool:
    """Whether a question asks for an earlier value or how one changed ("What was my previous goal?",
    "What did I buy before the air fryer?"): the newest telling is not the one it wants first."""
    return _BEFORE_RE.search(query) is not None


class Updates:
    """Scores of packed turns, newer tellings of the same thing above older ones."""

    def newer_first(self, q_terms: list[str], rows: np.ndarray, scores: np.ndarray, r: Ranking) -> np.ndarray:
        """`scores` of these rows with each newer telling lifted just above the older ones it updates:
        same speaker and role, at least r.update_cover of what the older turn was matched on (the
        query's terms but those saying "now") said by the newer one too, and the newer scoring at least
        r.update_min of the older."""
        postings = []
        for t in dict.fromkeys(t for t in q_terms if t not in _NOW_TERMS):
            arrays = self._arrays(t)
            postings.append(_NONE if arrays is None else arrays[0])
        who = self.speaker_of[rows].astype(np.int64) * 16 + self.roles[rows]
        return fastpath.newer_first(postings, len(self.ids), rows, self.timestamps[rows], who, scores,
                                    r.update_cover, r.update_min)
