"""Knowledge updates: a person who tells the same thing again, changed ("I moved to Denver" after "I
live in Boston", "three times a week now"), means the newer telling. Among the turns packed for a
call, a newer turn of the same speaker that says most of what an older one was matched on (its query
terms, weighed by idf) scores just above it; the older keeps its score. What is packed does not
change (a question about the change still finds both): the context scores the current value first.
Updates.newer_first is mixed into _UserIndex (index.py); EpisodicSource applies it to what the
builder packed (CandidateBatch.rescore); the rule itself is fastpath.newer_first."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

import fastpath

if TYPE_CHECKING:
    from sidecar.memory.episodic.ranking import Ranking

_NONE = np.zeros(0, np.int64)


class Updates:
    """Scores of packed turns, newer tellings of the same thing above older ones."""

    def newer_first(self, q_terms: list[str], rows: np.ndarray, scores: np.ndarray, r: Ranking) -> np.ndarray:
        """`scores` of these rows with each newer telling lifted just above the older ones it updates:
        same speaker and role, at least r.update_cover of what the older turn was matched on said by
        the newer one too, and the newer scoring at least r.update_min of the older."""
        postings = []
        for t in dict.fromkeys(q_terms):
            arrays = self._arrays(t)
            postings.append(_NONE if arrays is None else arrays[0])
        who = self.speaker_of[rows].astype(np.int64) * 16 + self.roles[rows]
        return fastpath.newer_first(postings, len(self.ids), rows, self.timestamps[rows], who, scores,
                                    r.update_cover, r.update_min)
