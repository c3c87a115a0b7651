"""The ranker's knobs (Ranking) and its two profiles: DEFAULT_RANKING (no model at run time) and
MODEL_RANKING (with a model embedder). `bench/recall.py --offline DIR --ranking k=v,...` compares
knobs in seconds; the experiments behind these defaults are in docs/episodic-tuning-history.md."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class Ranking:
    """Knobs of the ranker. A user's index is built with the few _index_knobs() names (changing one
    rebuilds it); the others only weigh what it holds."""

    # The window: each turn is scored together with its same-session neighbours.
    neighbours: int = 4  # same-session turns on each side scored with the turn
    prev_decay: float = 0.55  # weight of the k-th previous turn: prev_decay ** k
    next_decay: float = 0.55  # weight of the k-th next turn: next_decay ** k
    # Lexical: BM25 over stemmed terms.
    k1: float = 1.2  # BM25 term-frequency saturation
    b: float = 1.0  # BM25 length normalisation; 1: fully normalised (a long turn matches more by chance)
    session_weight: float = 0.0  # share of the best-matching turn of the same session
    drop_names: bool = True  # leave the people's names out of the lexical query (the speaker boost has them)
    question_stopwords: bool = False  # leave the words of how a question is asked (QUESTION_WORDS) out
    window_doc: float = 1.0  # weight of BM25 over the window as one document, against per-turn BM25 smoothed
    # Fusion with the dense cosine.
    dense_weight: float = 0.25  # share of the dense cosine in the fused score
    kind_dense_weight: float = 0.0  # ... for a question asking for kinds (asks_for_kinds); 0: as above
    when_dense_weight: float = 0.0  # ... for a question asking when (asks_when); 0: as above
    dense_neighbours: bool = True  # smooth the cosine over the window's neighbours as the lexical score is
    # Priors (multipliers, priors.py).
    speaker_boost: float = 1.0  # turns spoken by a person the query names
    person_roles: bool = True  # a query naming nobody: boost the role it asks about (question_person)
    date_boost: float = 0.3  # turns of a session in the month the query names
    year_boost: float = 0.3  # ... in a year the query names without a month
    day_boost: float = 1.0  # turns of a session near a day the query names
    day_before: int = 0  # days before the named day that count as near it
    day_after: int = 7  # days after the named day that count as near it (events are told later)
    relative_boost: float = 0.5  # turns near a day the query names relative to the time of asking ("two weeks ago")
    # Index building.
    stem: bool = True  # stem terms (terms.stem); off: the words as written
    date_headers: bool = True  # one "[8 May 2023]" item per day instead of the date on every turn
    # Query expansion (expansion.py).
    prf_docs: int = 10  # pseudo-relevance feedback: top turns whose strongest terms expand the query
    prf_terms: int = 8  # ... how many of their terms
    prf_weight: float = 0.1  # ... their share
    assoc_terms: int = 5  # terms the user says most with the query's terms (PMI over turns) widen the query
    assoc_weight: float = 0.08  # ... their share
    assoc_min: int = 2  # turns a term must share with a query term
    # Shaping of the fused score: neighbours' spread, voice and proper-noun priors, diversity, openers.
    spread: float = 0.0  # a turn scores at least spread * the score of its previous/next turn
    self_boost: float = 0.2  # a turn saying more "I/my/we" than "you" (about its speaker): * (1 + self_boost)
    other_penalty: float = 0.2  # a turn saying more "you/your" (about the listener): * (1 - other_penalty)
    proper_boost: float = 0.15  # a turn naming someone or something that is no speaker (a specific fact)
    diversity: float = 0.0  # the j-th best turn of a session is divided by 1 + diversity * j
    opener_boost: float = 0.4  # the k-th turn of a session: * (1 + opener_boost * opener_decay ** k)
    opener_decay: float = 0.3  # ... (a session opens with the news since the last one)
    # Contextual vectors: each turn also embedded with its previous same-session turns, so an answer
    # ("Yes, pottery!") carries its question; mixed into the turn's one vector when it is indexed.
    embed_context: int = 1  # previous turns embedded with each turn (0: the turn alone)
    embed_context_chars: int = 400  # of each previous turn, the last this many characters
    context_mix: float = 0.5  # dense part: context_mix * contextual cosine + (1 - context_mix) * turn's own
    dense_query_names: bool = True  # False: the speakers' names are left out of the query that is embedded
    # Similar words: the user's own terms nearest each query term in the static word vectors ("married"
    # -> husband, wife), the vocabulary gap a lexical ranker misses.
    similar_terms: int = 10  # per query term, at most this many
    similar_weight: float = 0.25  # ... their share
    similar_min: float = 0.4  # ... whose cosine with the query term is at least this
    # Term proximity (proximity.py): pairs of the query's neighbouring terms said close together.
    proximity_weight: float = 0.3  # their window BM25's share (0: off)
    proximity_gap: int = 3  # at most this many terms apart
    proximity_chars: int = 8_192  # characters of turns read again per query, the best-scored first
    # Knowledge updates (updates.py): among the packed turns, a newer telling of the same thing (same
    # speaker, most of what the older turn was matched on said again) scores just above the older one.
    update_min: float = 0.5  # the newer must score at least this share of the older (0: off)
    update_cover: float = 0.5  # ... and say this share of the older's query terms, weighed by idf
    update_window: int = 32  # the packed turns compared: the most relevant this many
    # Long turns (passages.py): a turn longer than this share of the recall budget is packed as its
    # best passage, that long (0: whole turns only).
    passage_share: float = 0.125
    passage_min: int = 96  # ... never cut below this many tokens
    # Candidates handed to the builder.
    candidate_factor: float = 1.6  # return turns worth this multiple of the category budget
    max_candidates: int = 600  # rows kept per ranking at most


DEFAULT_RANKING = Ranking()
# With a model embedder (the optional `model` profile): its cosine weighs more (but for a question
# asking when), the turn's cosine is fused half and half with its contextual one instead of smoothed
# over the neighbours, the query is embedded without the speakers' names, and the similar words keep the
# share they were measured at with the model (term proximity was measured without it: off).
MODEL_RANKING = replace(DEFAULT_RANKING, dense_weight=0.55, kind_dense_weight=0.6, when_dense_weight=0.25,
                        prev_decay=0.7, next_decay=0.7, self_boost=0.0, other_penalty=0.0, dense_neighbours=False,
                        embed_context=1, context_mix=0.5, dense_query_names=False, assoc_weight=0.15, b=1.0,
                        prf_docs=10, prf_weight=0.05, similar_weight=0.2, proximity_weight=0.0)


def _index_knobs(r: Ranking) -> tuple[int, bool, int, int, float, bool]:
    """What a user's index is built with (EpisodicSource._load): its neighbour window, date headers,
    contextual vectors and stemming; the other knobs only weigh what it holds."""
    return max(r.neighbours, r.embed_context, 1), r.date_headers, r.embed_context, r.embed_context_chars, r.context_mix, r.stem
