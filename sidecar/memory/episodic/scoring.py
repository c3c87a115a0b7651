"""The ranking of a query over a user's turns (Fusion.rank, mixed into _UserIndex): the window BM25
of the query and of its expansions (lexical.py, expansion.py), fused with the dense cosine (whose
share depends on what the question asks: asks_when, asks_for_kinds), times the priors (priors.py);
and the cut of a ranking to its best rows (_best_first)."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

import fastpath
from sidecar.memory.episodic.lexical import _decay
from sidecar.memory.episodic.terms import QUESTION_WORDS, stem, terms

if TYPE_CHECKING:
    from sidecar.memory.episodic.ranking import Ranking


_KIND_WORDS = frozenset("kind kinds type types sort sorts".split())
_AUXILIARIES = frozenset("did does do is was has have are were would could can might will should".split())
_NOT_PLURALS = frozenset("this his its was has does always perhaps sometimes yes across".split())


def asks_when(query: str) -> bool:
    """A question asking when something happened or for how long: "When did...", "How long has...".
    The event's words and its day's date header answer it; a model's cosine pulls towards turns on the
    same topic at other times, so Ranking.when_dense_weight may give meaning less weight."""
    return query.lstrip().lower().startswith(("when ", "how long "))


def asks_for_kinds(query: str) -> bool:
    """A question asking for kinds of things rather than one fact: "What activities...", "Which cities...",
    "What kind of music...", or what two people both do or have in common. Its answers name instances
    (pottery, Paris) and seldom the kind, so Ranking.kind_dense_weight gives meaning more weight."""
    words = re.findall(r"[a-z']+", query.lower())
    if "both" in words or "common" in words:
        return True
    if not words or words[0] not in ("what", "which"):
        return False
    for w in words[1:4]:  # up to the verb: "What [outdoor activities] has...", "Which [new games] did..."
        if w in _KIND_WORDS:
            return True
        if w in _AUXILIARIES:
            return False
        if len(w) > 3 and w.endswith("s") and not w.endswith(("ss", "us", "is")) and w not in _NOT_PLURALS:
            return True
    return False


class Fusion:
    """The fused ranking, as a method of _UserIndex (index.py)."""

    def query_terms(self, query: str, r: Ranking) -> tuple[list[str], set[str]]:
        """(the query's terms as matched against turns, the speakers' names as terms)."""
        names = {stem(x) for name in self.speakers for x in name.split()}
        kept = _query_terms(query, r.stem, frozenset(names) if r.drop_names else frozenset(), r.question_stopwords)
        return list(kept), names

    def rank(self, query: str, qvec: np.ndarray | None, exclude_session: str, r: Ranking,
             relative: tuple[tuple[int, int], ...] = ()) -> np.ndarray:
        """Fused score per row (-inf for rows of the excluded session); `relative`: the query's
        relative dates as spans of days (relative_dates.relative_spans)."""
        n = len(self.ids)
        w = self.window
        decay = _decay(r.prev_decay, r.next_decay, r.neighbours, w)
        q_terms, names = self.query_terms(query, r)
        # The query's terms, the terms said with them and their similar words: window counts in one pass.
        assoc = self.associated(q_terms, names, r) if r.assoc_terms > 0 and r.assoc_weight > 0 else []
        similar = self.similar(q_terms, names, r) if r.similar_terms > 0 and r.similar_weight > 0 else []
        win, assoc_win, similar_win = self.window_bm25_groups(
            [q_terms if r.window_doc > 0 else [], assoc, similar], decay, r.k1, r.b)
        if r.window_doc >= 1.0:
            lex = win
        else:
            lex = self.smooth(self.bm25(q_terms, r.k1, r.b), decay)
            if r.window_doc > 0:
                lex = ((1.0 - r.window_doc) * lex / max(float(lex.max()), 1e-9)
                       + r.window_doc * win / max(float(win.max()), 1e-9))
        top = float(lex.max()) if n else 0.0
        score = lex / top if top > 0 else lex
        if r.session_weight > 0 and n:
            best = np.zeros(len(self.session_rows), np.float32)
            np.maximum.at(best, self.session_of[:n], score)
            score = score + r.session_weight * best[self.session_of[:n]]
        share = r.dense_weight
        if r.when_dense_weight and asks_when(query):
            share = r.when_dense_weight
        elif r.kind_dense_weight and asks_for_kinds(query):
            share = r.kind_dense_weight
        if qvec is not None and share > 0 and np.any(qvec):
            dense = np.zeros(n + 1, np.float32)
            dense[:n] = fastpath.int8_dot(self.codes[:n], self.scales[:n], qvec)  # context_mix is in the rows
            np.maximum(dense, 0.0, out=dense)
            if r.dense_neighbours:
                dense = self.smooth(dense, decay)
            else:
                dense = dense[:n]
            dtop = float(dense.max())
            if dtop > 0:
                score = (1.0 - share) * score + share * dense / dtop
        score = score.astype(np.float64)
        mult = self._query_prior(query, r, relative)
        if exclude_session and exclude_session in self.session_rows:
            mult[self.session_rows[exclude_session]] = 0.0
        near = self.proximity_postings(q_terms, score * mult, r) if r.proximity_weight > 0 and len(q_terms) > 1 else {}
        near_win = self.window_bm25_groups([list(near)], decay, r.k1, r.b, near)[0] if near else None
        for extra, weight in ((assoc_win, r.assoc_weight), (similar_win, r.similar_weight),
                              (near_win, r.proximity_weight)):
            if extra is None:
                continue
            etop = float(extra.max()) if n else 0.0
            if etop > 0:
                score = score + weight * extra / etop
        if r.prf_docs > 0 and r.prf_weight > 0 and n > r.prf_docs:
            fb = self._feedback(score * mult, q_terms, names, r)
            if fb:
                extra = self.window_bm25(fb, decay, r.k1, r.b)
                etop = float(extra.max())
                if etop > 0:
                    score = score + r.prf_weight * extra / etop
        mult *= self._turn_prior(r)
        score = score * mult
        if r.spread > 0 and n:
            padded = np.append(score, 0.0)  # previous and next turn:
            score = np.maximum(score, r.spread * padded[self._neighbour_rows()[:, w - 1:w + 1]].max(axis=1))
        if r.diversity > 0 and n:
            top = np.argsort(-score, kind="stable")[: min(n, r.max_candidates)]
            sess = self.session_of[top]
            order = np.lexsort((np.arange(len(top)), sess))  # by session, best first inside one
            first = np.r_[True, sess[order][1:] != sess[order][:-1]]
            starts = np.maximum.accumulate(np.where(first, np.arange(len(order)), 0))
            rank_in = np.empty(len(top), np.int64)
            rank_in[order] = np.arange(len(order)) - starts
            score[top] = score[top] / (1.0 + r.diversity * rank_in)
        score[mult == 0.0] = -np.inf
        return score


@lru_cache(maxsize=4096)
def _query_terms(query: str, stemmed: bool, names: frozenset[str], question_stopwords: bool) -> tuple[str, ...]:
    """Fusion.query_terms' terms (a query is asked again at other budgets, and rescored each call)."""
    q_terms = terms(query, stemmed=stemmed)
    if names:
        q_terms = [t for t in q_terms if t not in names] or q_terms
    if question_stopwords:
        q_terms = [t for t in q_terms if t not in QUESTION_WORDS] or q_terms
    return tuple(q_terms)


def _best_first(score: np.ndarray, most: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, their scores): the at most `most` rows of positive finite score, best first (ties by row)."""
    live = np.where(np.isfinite(score) & (score > 0), score, -1.0)
    order = fastpath.ranking_order(live)[:min(int(np.count_nonzero(live > 0)), most)]
    return order, score[order]
