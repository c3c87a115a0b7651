"""Episodic recall: a user's past turns, across all their sessions, as BuildContext candidates
(category memories, source tag message:<id>), so an old turn is recallable in a new session.

Per (tenant, user) an in-process index: BM25 postings over stemmed terms, dense vectors (static
word vectors joined with hashed n-grams, sidecar.index.word_vectors; or the local model's), and
each turn's same-session neighbours. It is kept current by the store's append listener and
built from rows the first time a user is seen; beside a DuckDB file it is saved when the user leaves
memory (evicted, or the process closing) and restored on their next call while their rows are
unchanged (EpisodicSource._save / _restore). Never searched across users.

Ranking (no model at run time, see bench/recall.py for what each part adds): BM25 of the turn plus
its same-session neighbours with decaying weights (a fact is often spread over question and answer),
plus BM25 of the best turns' terms that other turns say too (pseudo-relevance
feedback), of the terms the user says most with the query's terms (pointwise mutual
information over their own turns) and of the user's terms nearest the query's in the static word
vectors ("married" -> husband, wife), fused with the dense cosine (of the turn, and of the turn
embedded with its previous one: an answer carries its question), times a boost for turns spoken by
a person the query names, for turns of a session in the month the query names or told on (or within
a week after) a day it names ("on 9 November, 2022"), and for a session's first turns (a session
opens with the news since the last one), for a turn in the first person ("I", "my": it tells of its
speaker) over one in the second ("you"), and for a turn naming someone or something that is no
speaker (a capitalised word inside a sentence). Terms are stemmed with irregular forms ("went" ->
go) and a dropped final "e" ("hike"/"hiking"). Packed turns read "Ann: text"; their date is one
"[8 May 2023]" item per day, packed ahead of that day's turns. Among the packed turns, a newer
telling of the same thing (same speaker, most of the older one's query terms said again) scores just
above the older one (updates.py). With a model embedder (MODEL_RANKING)
its cosine weighs more (more still for a question asking for kinds of things, "What activities...";
less for one asking when) and the query is embedded without the speakers'
names. A question's ranking is kept while the user's turns are the same (_RankedCache): the same
question again (an agent's tool loop, another budget) only cuts it to its budget.

Modules:
  ranking    the knobs (Ranking), DEFAULT_RANKING and MODEL_RANKING
  terms      words, the stemmer, question words, the speakers' names pattern
  dates      months, years and days a query names; a turn's date label; day header items
  expansion  similar words, co-occurrence, pseudo-relevance feedback
  lexical    BM25 of a turn's same-session window
  priors     speaker, role, date, voice, proper-noun and opener multipliers
  scoring    rank(): lexical + expansions fused with the dense cosine, times the priors
  index      _UserIndex, the per-user index (rows, postings, vectors, neighbours, freeze / restore)
  columns    texts and terms as one buffer each, decoded and looked up item by item (a restored index)
  cache      _RankedCache, a question's ranking kept while the user's turns are the same
  snapshots  where and under which names users' indexes are saved, and the files' format
  source     EpisodicSource, the CandidateSource (load, bounds, snapshots, forget, candidates)

The experiments behind the defaults are in docs/episodic-tuning-history.md."""

from sidecar.memory.episodic.dates import date_label, day_number, query_dates, query_days, render_turn
from sidecar.memory.episodic.expansion import precompute_similar, similar_rows, table_stems
from sidecar.memory.episodic.index import INDEXED_ROLES
from sidecar.memory.episodic.ranking import DEFAULT_RANKING, MODEL_RANKING, Ranking
from sidecar.memory.episodic.scoring import asks_for_kinds, asks_when
from sidecar.memory.episodic.snapshots import (
    CLEAN_MARK,
    MAX_SNAPSHOT_BYTES,
    SAVE_AT_CLOSE_S,
    SNAPSHOT_VERSION,
    snapshot_dir,
)
from sidecar.memory.episodic.source import MAX_TOTAL_TURNS, MAX_TURNS_PER_USER, MAX_USERS, EpisodicSource
from sidecar.memory.episodic.terms import QUESTION_WORDS, names_pattern, stem, terms
from sidecar.memory.episodic.updates import asks_before

__all__ = [
    "CLEAN_MARK", "DEFAULT_RANKING", "INDEXED_ROLES", "MAX_SNAPSHOT_BYTES", "MAX_TOTAL_TURNS",
    "MAX_TURNS_PER_USER",
    "MAX_USERS", "MODEL_RANKING", "QUESTION_WORDS", "SAVE_AT_CLOSE_S", "SNAPSHOT_VERSION", "EpisodicSource",
    "Ranking", "asks_before", "asks_for_kinds", "asks_when", "date_label", "day_number",
    "names_pattern", "precompute_similar", "query_dates", "query_days", "render_turn", "similar_rows",
    "snapshot_dir", "stem", "table_stems", "terms",
]
