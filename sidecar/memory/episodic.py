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
plus BM25 of the query's category words expanded through a small hand-written concept list ("pets"
-> dog, cat, turtle...) and the user's words nearest each concept's centroid in the static word vectors
("activities" -> jogging), of the best turns' terms that other turns say too (pseudo-relevance
feedback), of the terms the user says most with the query's terms (pointwise mutual
information over their own turns) and of the user's terms nearest the query's in the static word
vectors ("married" -> husband, wife), fused with the dense cosine (of the turn, and of the turn
embedded with its previous one: an answer carries its question; weighing more for a question asking
for kinds of things, "What activities..."), times a boost for turns spoken by
a person the query names, for turns of a session in the month the query names or told on (or within
a week after) a day it names ("on 9 November, 2022"), and for a session's first turns (a session
opens with the news since the last one), for a turn in the first person ("I", "my": it tells of its
speaker) over one in the second ("you"), and for a turn naming someone or something that is no
speaker (a capitalised word inside a sentence). Terms are stemmed with irregular forms ("went" ->
go) and a dropped final "e" ("hike"/"hiking"). Packed turns read "Ann: text"; their date is one
"[8 May 2023]" item per day, packed ahead of that day's turns. With a model embedder (MODEL_RANKING)
its cosine weighs more (but for a question asking when) and the query is embedded without the speakers'
names. Tuned on LoCoMo conversations 1-5 (bench/recall.py --offline compares knobs in seconds); about
1 ms per new question over a ~600-turn user in process. A question's ranking is kept while the user's
turns are the same (_RankedCache): the same question again (an agent's tool loop, another budget)
only cuts it to its budget."""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import logging
import math
import os
import pickle
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache, partial
from operator import itemgetter
from pathlib import Path

import numpy as np

import fastpath
from sidecar.assembly.candidates import (
    BuildInput,
    CandidateBatch,
    ItemMeta,
    Section,
    SoftCategory,
    client_vector_of,
)
from sidecar.domain import Category, Message, Role, Scope, render_message_line
from sidecar.index.embedders import Embedder
from sidecar.index.int8 import quantize_rows
from sidecar.index.word_vectors import StaticEmbedder, default_vectors
from sidecar.memory.question_person import asked_about
from sidecar.memory.recall import SupersededTurn
from sidecar.text import STOPWORDS
from sidecar.tokens import count_line, count_lines

INDEXED_ROLES = (Role.USER, Role.ASSISTANT)  # tool output and system text are not conversation memory
MAX_USERS = 2048  # users kept in memory; an evicted one is rebuilt from rows on its next call
# Memory bounds. A user's index holds their newest MAX_TURNS_PER_USER turns: past that it is rebuilt
# from the newest three quarters (older turns live on in extracted memories and summaries). All
# users together hold at most MAX_TOTAL_TURNS; the least recently used go first.
MAX_TURNS_PER_USER = 4096
MAX_TOTAL_TURNS = 262_144
BM25_K1, BM25_B = 1.2, 0.75
_SERIALS = itertools.count()
log = logging.getLogger("sidecar.episodic")


@dataclass(frozen=True, slots=True)
class Ranking:
    """Knobs of the ranker; defaults tuned on LoCoMo conversations 1-5 (bench/recall.py)."""

    neighbours: int = 4  # same-session turns on each side scored with the turn
    prev_decay: float = 0.55  # weight of the k-th previous turn: prev_decay ** k
    next_decay: float = 0.55  # weight of the k-th next turn
    k1: float = 1.2
    b: float = 1.0  # a window's BM25 fully normalised by its length: a long turn matches more by chance
    session_weight: float = 0.0  # share of the best-matching turn of the same session
    drop_names: bool = True  # leave the people's names out of the lexical query (the speaker boost has them)
    question_stopwords: bool = False
    window_doc: float = 1.0  # weight of BM25 over the window as one pseudo-document (coverage of distinct terms)
    dense_weight: float = 0.25  # share of the dense cosine in the fused score
    # ... for a question asking for kinds of things ("What activities...", "What kind of music...", "...both
    # like?"): its answers name instances (pottery, jazz), rarely the kind, so meaning may weigh more. 0: as
    # above (the default profile: it added nothing on both datasets; the model profile uses it).
    kind_dense_weight: float = 0.0
    # ... for a question asking when ("When did...", "How long ago..."): the event's words and its day's date
    # header answer it; a model's cosine pulls towards turns on the same topic at other times. 0: as above.
    when_dense_weight: float = 0.0
    dense_neighbours: bool = True
    speaker_boost: float = 1.0  # turns spoken by a person the query names
    # ... and, when it names nobody, the turns of the role it asks about: the user's for "I / my", the
    # assistant's for "you said / your list" (sidecar.memory.question_person).
    person_roles: bool = True
    date_boost: float = 0.3  # turns of a session in the month the query names
    year_boost: float = 0.3  # ... in a year the query names without a month
    day_boost: float = 1.0  # turns of a session near a day the query names
    day_before: int = 0  # days before / after the named day that count as near it
    day_after: int = 7
    stem: bool = True
    date_headers: bool = True  # one "[8 May 2023]" item per day instead of the date on every turn
    concept_weight: float = 0.4  # share of the CONCEPTS expansion of the query's category words
    # The concept list widened by the static word vectors: per category word of the query, up to
    # concept_similar of the user's terms whose cosine with the centroid of the word and its CONCEPTS
    # list is at least concept_min ("activities" -> jogging, leisure where the list has hiking, biking).
    concept_similar: int = 20
    concept_min: float = 0.45
    prf_docs: int = 10  # pseudo-relevance feedback: top turns whose strongest terms expand the query
    prf_terms: int = 8
    prf_weight: float = 0.1
    assoc_terms: int = 5  # terms the user says most with the query's terms (PMI over turns) widen the query
    assoc_weight: float = 0.08
    assoc_min: int = 2  # turns a term must share with a query term
    spread: float = 0.0  # a turn scores at least spread * the score of its previous/next turn
    # Voice: a turn that says more "I/my/we" than "you/your" tells of its speaker, where the facts
    # questions ask about are (LoCoMo 1-5: 37 % of such turns are evidence, 8 % of "you" turns).
    self_boost: float = 0.2  # a turn about its speaker: * (1 + self_boost)
    other_penalty: float = 0.2  # a turn about the listener: * (1 - other_penalty)
    # A turn naming someone or something (a capitalised word inside a sentence, not a speaker's name)
    # holds a specific fact (LoCoMo 1-5: 65 % of such turns are evidence, 21 % of the rest).
    proper_boost: float = 0.15
    diversity: float = 0.0  # the j-th best turn of a session is divided by 1 + diversity * j
    opener_boost: float = 0.4  # the k-th turn of a session: * (1 + opener_boost * opener_decay ** k)
    opener_decay: float = 0.3
    # Contextual vectors (an embedder's cosine only): each turn is also embedded together with its
    # embed_context previous same-session turns (each cut to its last embed_context_chars characters),
    # so an answer ("Yes, pottery!") carries its question; the dense part is context_mix * that cosine
    # + (1 - context_mix) * the turn's own, one vector per turn mixed when it is indexed (a new ranking
    # rebuilds the indexes). 0: the turn alone.
    embed_context: int = 1
    embed_context_chars: int = 400
    context_mix: float = 0.5
    dense_query_names: bool = True  # False: the speakers' names are left out of the query that is embedded
    # Similar words: per query term, up to similar_terms of the user's own terms whose static word
    # vectors (sidecar.index.word_vectors) have a cosine of at least similar_min with it ("married" ->
    # husband, wife) widen the query with similar_weight: the vocabulary gap a lexical ranker misses.
    similar_terms: int = 10
    similar_weight: float = 0.2
    similar_min: float = 0.4
    candidate_factor: float = 1.6  # return turns worth this multiple of the category budget
    max_candidates: int = 600


DEFAULT_RANKING = Ranking()
# Static word vectors (tuned on conversations 1-5 at 2k / 4k, read on 6-10, all ten shown): the user's
# words nearest the query's added to it (10 per term, cosine >= 0.4, weight 0.2; on the hashed
# cosine alone: 90.9 / 95.1 -> 91.8 / 95.6 %), the dense part from the static vectors joined with the
# hashed n-grams and each turn also embedded with its previous turn, the co-occurrence weight
# 0.15 -> 0.08: 90.9 / 95.1 -> 91.9 / 96.0 % (1-5 92.0 -> 92.7 / 95.8 -> 96.4; 6-10 89.8 -> 91.0 /
# 94.4 -> 95.5), multi-hop 86.3 -> 88.1 % at 4k; ~0.2 ms more per query (in process p50 0.62 -> 0.81
# ms). 5 or 14 similar words per term, cosine 0.35-0.55, weight 0.15-0.25 and the dense share 0.25
# moved 2k by at most 0.3; 256 or 384 dimensions instead of 128 by 0.0 to +0.2.
# BM25's length normalisation b 0.75 -> 1.0 (once the query had grown by its expansions, long turns
# matched more of it by chance): 91.9 / 96.0 -> 92.4 / 96.0 % (1-5 92.7 -> 93.2 / 96.4 -> 96.5;
# 6-10 91.0 -> 91.6 / 95.5 -> 95.5); b 0.9 was between; k1 0.9 and 1.5 lower at 2k. A score per token
# spent (score / tokens ** a) also helped at 2k (+0.6 at a = 0.1) but cost 4k 0.2: not taken.
# For multi-hop (list) questions, four parts together (all ten at 2k / 4k; multi-hop at 4k, by half):
# the concept list widened by the word vectors (20 kin per concept word, cosine >= 0.45), pseudo-relevance
# feedback (8 terms of the 10 best turns, weight 0.1), the dense share 0.2 -> 0.25 and 0.3 for a
# question asking for kinds of things: 92.38 / 95.97 -> 92.41 / 96.44 %, multi-hop 88.0 -> 90.1 %
# (conversations 1-5: 90.0 -> 91.6, 6-10: 86.1 -> 88.6). Each left out: kin 92.19 / 96.22 (mh 89.3),
# feedback 92.08 / 96.29 (89.9), the kinds share 92.52 / 96.34 (89.7), dense 0.2 92.49 / 96.41 (89.7).
# The cosine share 0.3-0.35 for every question reached multi-hop 89.5-90.1 but 2k 91.2-91.9.
# With a model embedder (the optional `model` profile, all-MiniLM-L6-v2): its cosine is worth a larger
# share than the hashed one's. Tuned on LoCoMo conversations 1-5 (bench/recall.py --profile model):
# 0.2 -> 0.5 added +1.0 / +0.7 points at 2k / 4k there and +1.1 / +1.1 on conversations 6-10;
# 0.4 and 0.6 were lower, 0.7 and 1.0 (dense alone) much lower.
# Re-tuned (conversations 1-5 at 2k / 4k, then read on 6-10): the turn's cosine fused half and half
# with the cosine of the turn embedded with its previous turn, in place of smoothing the cosine over
# the neighbours; the query embedded without the speakers' names (the speaker boost has them: a name
# pulled the cosine towards turns about the person rather than the fact); the association expansion
# and the proper-noun prior back on. 92.0 / 95.9 -> 92.7 / 96.3 % at 2k / 4k (1-5: 92.9 -> 93.2 /
# 96.4 -> 96.4; 6-10: 91.0 -> 92.1 / 95.3 -> 96.2), multi-hop 87.6 -> 90.1 % at 4k; turn-alone or
# contextual cosine alone, reciprocal-rank fusion and a cosine floor were lower. The voice prior
# stays off (lower with the model). Costs a second embedding per indexed turn and, for a query that
# names a speaker, a second query embedding (the memory source embeds the query as asked).
# The similar words from the static vectors (as in DEFAULT_RANKING) added 92.9 / 96.5 -> 93.0 / 96.8 %
# (1-5 93.4 -> 93.7 / 96.8 -> 97.0; 6-10 92.4 -> 92.3 / 96.2 -> 96.6), multi-hop 90.1 -> 91.3 % at 4k.
# BM25's b 0.75 -> 1.0 (as in DEFAULT_RANKING) with the model's share 0.5 -> 0.55, in process: 93.01 / 96.79 ->
# 93.02 / 97.00 % (1-5 96.96 -> 97.22, 6-10 96.62 -> 96.79 at 4k), multi-hop 91.3 -> 91.4; b = 1 alone
# 93.08 / 96.87; a share of 0.45 gave 93.12 / 96.78. Then the share 0.6 for a question asking for kinds
# of things and feedback from the 10 best turns at weight 0.05: 93.02 / 97.00 -> 93.17 / 97.11 % (4k: 1-5
# 97.22 -> 97.29, 6-10 96.79 -> 96.93), multi-hop 91.4 -> 92.0; feedback at 0.1 (as in DEFAULT_RANKING)
# 93.13 / 96.92; the concept kin 93.27 / 96.96 (left off: 4k on 1-5 97.22 -> 97.10).
# Temporal questions did worse with the model than without (95.3 against 97.1 % at 2k): for a question
# asking when, the cosine's share 0.25 (the default profile's) took 93.17 / 97.11 -> 93.39 / 97.14 % (2k:
# 1-5 94.02 -> 94.28, 6-10 92.33 -> 92.52; temporal 95.3 -> 96.4), 0.2 and 0.3 within 0.05; no gain
# without the model (0.0-0.1: 92.38 against 92.41). Also tried, lower at 2k: the static vectors' cosine
# mixed in (0.15 / 0.3 of the dense part: 92.97 / 92.88), the query vector moved towards the best
# turns' (Rocchio, 3-10 turns: 92.4-92.9), a turn outscored by its neighbour discounted (default: 91.6
# at 0.1). Later (2k / 4k against 93.39 / 97.13): packing by score per token (relevance / tokens ** a,
# a = 0.1-0.5: 93.27-92.30 / 97.05-96.10), the cosine counted above its 10th-70th percentile (93.28-93.46 /
# 96.64-97.15), each turn's vector also mixed with the turn embedded with its next one (0.15-0.5: 93.41-93.66
# / 96.84-96.97), maximal marginal relevance over the best 150 turns (93.26-92.79), each knob one step either
# way (at most 93.58 / 97.24: speaker_boost 0.7). Picking for each question the best of 12 rankings (dense
# share 0.1-1.0, one neighbour, decay 0.9, diversity, no feedback, ...: `bench/recall.py --offline DIR
# --profile model --ranking ...` given 12 times prints best_of), knowing the answers, recalls 95.88 / 98.21,
# the best of them alone 93.39 / 97.13: only a choice per question made with the answers passes the 2k target.
MODEL_RANKING = replace(DEFAULT_RANKING, dense_weight=0.55, kind_dense_weight=0.6, when_dense_weight=0.25,
                        prev_decay=0.7, next_decay=0.7, self_boost=0.0, other_penalty=0.0, dense_neighbours=False,
                        embed_context=1, context_mix=0.5, dense_query_names=False, assoc_weight=0.15, b=1.0,
                        prf_docs=10, prf_weight=0.05, concept_similar=0)

# ---------------------------------------------------------------------------------------- terms
_WORD_RE = re.compile(r"[0-9a-z]+(?:'[a-z]+)?|[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_VOWEL_RE = re.compile(r"[aeiouy]")
# Porter-like suffix rules, longest first: (suffix, replacement, minimum stem length).
_RULES = (("ational", "ate", 3), ("iveness", "ive", 3), ("fulness", "ful", 3), ("ization", "ize", 3),
          ("ations", "ate", 3), ("ation", "ate", 3), ("nesses", "", 3), ("ness", "", 3), ("ments", "", 4),
          ("ment", "", 4), ("ships", "", 3), ("ship", "", 3), ("ists", "", 3), ("ist", "", 3), ("ions", "", 3),
          ("ion", "", 3), ("ingly", "", 3), ("edly", "", 3), ("ies", "y", 2), ("ied", "y", 2), ("ing", "", 3),
          ("ers", "", 3), ("er", "", 3), ("ed", "", 3), ("ly", "", 4), ("es", "", 3), ("s", "", 3))
_DOUBLE = frozenset("bdfgmnprt")



# Irregular forms a suffix rule cannot reach, to the word their regular forms stem to.
_IRREGULAR = {
    "went": "go", "gone": "go", "going": "go", "goes": "go", "bought": "buy", "ran": "run", "swam": "swim",
    "children": "child", "kids": "kid", "taught": "teach", "made": "make", "took": "take", "taken": "take",
    "saw": "see", "seen": "see", "met": "meet", "felt": "feel", "won": "win", "wrote": "write",
    "written": "write", "began": "begin", "begun": "begin", "built": "build", "caught": "catch",
    "brought": "bring", "thought": "think", "found": "find", "gave": "give", "given": "give", "got": "get",
    "gotten": "get", "held": "hold", "kept": "keep", "left": "leave", "lost": "lose", "paid": "pay",
    "sang": "sing", "sung": "sing", "sold": "sell", "spent": "spend", "told": "tell", "flew": "fly",
    "ate": "eat", "eaten": "eat", "drew": "draw", "drawn": "draw", "grew": "grow", "grown": "grow",
    "knew": "know", "known": "know", "rode": "ride", "ridden": "ride", "fell": "fall", "fallen": "fall",
    "women": "woman", "men": "man", "people": "person", "mice": "mouse", "feet": "foot", "teeth": "tooth",
}
_STEM_E = True  # drop a final "e" after the rules: "hike"/"hiking", "dance"/"dancer" meet


@lru_cache(maxsize=1 << 16)  # a user's words repeat: turns at ingest, questions and names per call
def stem(word: str) -> str:
    """A compact English stemmer: "painting"/"painted"/"paints" -> "paint", "hobbies" -> "hobby",
    "hike"/"hiking"/"hiked" -> "hik", "went" -> "go"."""
    word = _IRREGULAR.get(word, word)
    if len(word) <= 3 or not word.isascii() or word.isdigit():
        return word
    if word.endswith("'s"):
        word = word[:-2]
    out = word
    for suffix, repl, min_len in _RULES:
        if word.endswith(suffix) and len(word) - len(suffix) >= min_len:
            base = word[: -len(suffix)]
            if not _VOWEL_RE.search(base):
                continue
            if suffix in ("ion", "ions") and not base.endswith(("t", "s")):
                continue  # "adoption" -> "adopt", "discussion" -> "discuss"; not "onion", "region"
            if suffix == "ly" and base.endswith("i"):
                continue  # "family", "daily": not an adverb
            if suffix in ("er", "ers") and base.endswith("e"):
                continue  # "career", "volunteers": not "car", "volunt" (so "volunteering" meets "volunteer")
            if suffix in ("es",) and not base.endswith(("sh", "ch", "x", "s", "z")):
                base = word[:-1]  # "games" -> "game", "wishes" -> "wish"
            if suffix in ("ing", "ed", "er", "ers") and len(base) > 3 and base[-1] == base[-2] and base[-1] in _DOUBLE:
                base = base[:-1]  # "running" -> "run"
            out = base + repl
            break
    if _STEM_E and len(out) > 3 and out.endswith("e") and not out.endswith("ee"):
        out = out[:-1]
    return out


# Words of how a question is asked, not of what it is about.
QUESTION_WORDS = frozenset(stem(w) for w in (
    "kind type likely would think thing things something ever many much often long did does "
    "doing get got go went say said mention mentioned tell told"
).split())


_KIND_WORDS = frozenset("kind kinds type types sort sorts".split())
_AUXILIARIES = frozenset("did does do is was has have are were would could can might will should".split())
_NOT_PLURALS = frozenset("this his its was has does always perhaps sometimes yes across".split())


def asks_when(query: str) -> bool:
    """A question asking when something happened or for how long: "When did...", "How long has..."
    (Ranking.when_dense_weight)."""
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


# General-English category words and what they usually stand for in a conversation, so a question
# about "pets" or "activities" also finds the turn that says "turtle" or "camping". Hand-written
# world knowledge (no model); added to the query with Ranking.concept_weight.
_CONCEPTS = {
    "pet": "dog dogs cat cats puppy kitten turtle turtles fish hamster rabbit bird parrot snake guinea",
    "animal": "dog cat turtle bird horse fish rabbit",
    "activity": "hiking camping swimming painting running yoga dancing cooking baking biking reading "
                "gardening surfing skiing climbing pottery volunteering walking fishing travel",
    "hobby": "painting reading writing hiking camping cooking baking gardening photography music guitar "
             "piano dancing pottery knitting gaming drawing",
    "interest": "hobby love enjoy passion favorite",
    "sport": "football soccer basketball baseball tennis golf hockey volleyball swimming running "
             "surfing skiing boxing kickboxing karate taekwondo yoga",
    "exercise": "running yoga gym workout swimming cycling biking hiking kickboxing lifting pilates training",
    "instrument": "guitar piano violin drums flute saxophone cello ukulele clarinet trumpet",
    "music": "song songs band concert guitar piano album singing",
    "band": "concert music singer album festival",
    "family": "kids children son daughter husband wife mom dad mother father brother sister parents "
              "grandma grandpa aunt uncle cousin fam",
    "kid": "son daughter children child kids",
    "child": "son daughter kids kid",
    "relationship": "boyfriend girlfriend partner husband wife married single dating divorce breakup",
    "job": "work career company office boss position hired interview",
    "career": "job work profession degree field",
    "food": "pizza pasta cake cookies bread salad soup dessert recipe dish meal",
    "dessert": "cake cookies pie ice cream chocolate brownies tart pudding mousse cupcakes",
    "recipe": "cook cooking bake baking dish made",
    "book": "novel novels read reading author books series",
    "author": "book novel writer wrote read",
    "writing": "write wrote screenplay script book novel poem poetry blog story journal article",
    "art": "painting paintings drawing sculpture pottery mural canvas",
    "travel": "trip vacation visited flew abroad country city beach",
    "trip": "vacation travel visited traveled road",
    "vacation": "trip travel visited beach holiday",
    "place": "city country town beach park",
    "location": "city country state town place visited",
    "country": "france spain italy germany japan china mexico canada england brazil",
    "state": "california texas florida york washington oregon colorado arizona carolina tennessee",
    "city": "paris london rome tokyo york boston chicago seattle",
    "event": "party festival concert parade conference wedding fundraiser competition",
    "volunteer": "shelter charity donate donated fundraiser",
    "cause": "charity fundraiser donate awareness volunteer support",
    "friend": "friends buddy buddies pal",
    "game": "games tournament play played board video",
    "item": "bought purchased got new",
    "outdoor": "hiking camping beach park trail mountains lake",
    "movie": "movies film films watched cinema",
    "film": "movie movies watched cinema",
    "show": "series watch watched episode season",
    "series": "show watch watched episode season books",
    "symbol": "flag necklace tattoo rainbow",
    "martial": "karate taekwondo kickboxing judo boxing",
    "religious": "church faith god pray",
    "political": "rights vote election conservative liberal",
    "allergy": "allergic allergies",
    "stress": "relax calm therapy escape peace",
    "injury": "hurt injured broke sprained pain",
    "school": "class college university course degree study student",
    "education": "school class college university course degree study",
}


def terms(text: str, *, stemmed: bool = True) -> list[str]:
    words = [w.split("'")[0] for w in _WORD_RE.findall(text.lower())]
    out = [w for w in words if w and w not in STOPWORDS]
    return [stem(w) for w in out] if stemmed else out


CONCEPTS = {stem(k): tuple(dict.fromkeys(t for w in v.split() for t in terms(w) if t != stem(k)))
            for k, v in _CONCEPTS.items()}


@lru_cache(maxsize=1)
def _stem_vectors() -> tuple[dict[str, int], list[str], np.ndarray]:
    """The static word vectors averaged per stem (built once, ~0.3 s: EpisodicSource.warm_up at start-up)."""
    index, mat = default_vectors().by_stem(stem)
    return index, list(index), mat


# (term, min_cosine) -> rows of the similar stems in the table; bounded by the table's stems (~14.5k,
# ~41 rows each at cosine 0.4) per min_cosine in use.
_SIMILAR: dict[tuple[str, float], np.ndarray] = {}
_NO_ROWS = np.zeros(0, np.int32)


def similar_rows(query_terms: Sequence[str], min_cosine: float) -> list[np.ndarray]:
    """Per term, the table rows (_stem_vectors) of the stems whose static word vectors have a cosine of
    at least min_cosine with its own, nearest first (the term itself left out; none for a term the
    table lacks). From _SIMILAR, which precompute_similar fills at start-up for the ranking's
    min_cosine; a term not in it yet costs a pass over the table (0.1-0.5 ms, memory-bound)."""
    index = _stem_vectors()[0]
    missing = [t for t in dict.fromkeys(query_terms) if t in index and (t, min_cosine) not in _SIMILAR]
    if missing:
        _fill_similar(missing, min_cosine)
    return [_SIMILAR.get((t, min_cosine), _NO_ROWS) for t in query_terms]


def precompute_similar(min_cosine: float, stop: Callable[[], bool] = lambda: False) -> None:
    """similar_rows of every stem of the table (~1 s on this machine, in the warm-up thread), so a
    query's new words cost no pass over the table; `stop` is asked between blocks."""
    keys = _stem_vectors()[1]
    _fill_similar([t for t in keys if (t, min_cosine) not in _SIMILAR], min_cosine, stop)


def _fill_similar(stems: list[str], min_cosine: float, stop: Callable[[], bool] = lambda: False,
                  block: int = 512) -> None:
    index, _, mat = _stem_vectors()
    for start in range(0, len(stems), block):
        if stop():
            return
        part = stems[start:start + block]
        sims = mat[[index[t] for t in part]] @ mat.T
        for t, row in zip(part, sims, strict=True):
            hits = np.flatnonzero(row >= min_cosine)
            hits = hits[np.argsort(-row[hits], kind="stable")]
            _SIMILAR[t, min_cosine] = hits[hits != index[t]].astype(np.int32)  # ~2.4 MB for all stems


def table_stems(rows: np.ndarray) -> tuple[str, ...]:
    """The stems of these table rows (similar_rows, concept_rows), in order."""
    keys = _stem_vectors()[1]
    return tuple(keys[i] for i in rows.tolist())


@lru_cache(maxsize=1024)  # keys: the CONCEPTS entries (~60) per concept_min in use
def concept_rows(concept: str, min_cosine: float) -> np.ndarray:
    """The table rows of the stems whose static word vectors have a cosine of at least min_cosine with
    the centroid of `concept` and its CONCEPTS words, nearest first: the hand-written list's kin."""
    index, _, mat = _stem_vectors()
    seeds = [index[t] for t in (concept, *CONCEPTS.get(concept, ())) if t in index]
    if not seeds:
        return _NO_ROWS
    centre = mat[seeds].mean(axis=0)
    centre /= max(float(np.linalg.norm(centre)), 1e-9)
    sims = mat @ centre
    hits = np.flatnonzero(sims >= min_cosine)
    return hits[np.argsort(-sims[hits], kind="stable")]


# ---------------------------------------------------------------------------------------- dates
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
_EPOCH = dt.date(1970, 1, 1).toordinal()
# Every date pattern above needs a digit or a month's name: a query with neither skips them all.
_DATE_HINT = re.compile(r"\d|\b(?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)", re.I)


def query_dates(query: str, days: set[dt.date] | None = None) -> tuple[set[tuple[int, int]], set[int]]:
    """(year-or-0, month) pairs and bare years named in a query ("in May 2023", "in 2022"); a year
    named with a month is not also a bare year. `days`: query_days(query), when the caller has it."""
    if not _DATE_HINT.search(query):
        return set(), set()
    found = _MONTH_RE.findall(query)
    months = {(int(y) if y else 0, _MONTHS[m.lower()]) for m, y in found
              if m.lower() != "may" or y}  # "may" alone is the verb far more often than the month
    with_month = {y for y, _ in months}
    years = {int(y) for y in _YEAR_RE.findall(query)} - with_month
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
    years = {int(y) for y in _YEAR_RE.findall(query)}
    for pattern in _DAY_RES:
        for m in pattern.finditer(query):
            year = int(m.group("y")) if m.group("y") else (next(iter(years)) if len(years) == 1 else 0)
            if not year:
                continue
            try:
                out.add(dt.date(year, _MONTHS[m.group("m").lower()], int(m.group("d"))))
            except ValueError:
                continue
    return out


# First-person words, and (group 2) second-person ones.
_PERSON_RE = re.compile(r"\b(i|i'm|i've|i'd|i'll|me|my|mine|myself|we|we're|we've|us|our|ours"
                        r"|(you|your|you're|you've|you'd|you'll|yours|yourself))\b", re.I)


def voice(text: str) -> int:
    """+1 when a turn says more "I/my/we" than "you/your" (it tells of its speaker), -1 when more
    "you/your" (it tells of the listener), else 0."""
    own = other = 0
    for m in _PERSON_RE.finditer(text):
        if m.group(2):
            other += 1
        else:
            own += 1
    return (own > other) - (other > own)


# A capitalised word that does not open a sentence: a name ("Laura", "Chicago", "Charlotte's Web").
_CAPITAL_RE = re.compile(r"(?<![.!?]\s)(?<![.!?]\s\")(?<!^)\b[A-Z][a-z]+")


def capitalised(text: str) -> tuple[str, ...]:
    """The lowercased words a turn capitalises inside its sentences."""
    return tuple(dict.fromkeys(w.lower() for w in _CAPITAL_RE.findall(text)))


@lru_cache(maxsize=64)
def _decay(prev_decay: float, next_decay: float, neighbours: int, window: int) -> np.ndarray:
    """Weights of the neighbours -window..-1, +1..+window: prev_decay ** k and next_decay ** k up to
    `neighbours` away, 0 beyond. Read-only: it is shared by every call with these knobs."""
    decay = np.array([prev_decay ** k for k in range(window, 0, -1)] + [next_decay ** k for k in range(1, window + 1)],
                     np.float32)
    decay[np.abs(np.r_[np.arange(-window, 0), np.arange(1, window + 1)]) > neighbours] = 0.0
    decay.flags.writeable = False
    return decay


def date_label(timestamp_ms: int) -> str:
    day = dt.datetime.fromtimestamp(timestamp_ms / 1000, dt.UTC)
    return f"[{day.day} {day.strftime('%B')} {day.year}]"


def day_number(timestamp_ms: int) -> int:
    """yyyymmdd (UTC) of a timestamp."""
    day = dt.datetime.fromtimestamp(timestamp_ms / 1000, dt.UTC)
    return day.year * 10000 + day.month * 100 + day.day


def render_turn(speaker: str, role: Role, text: str, timestamp_ms: int, *, dated: bool = True) -> str:
    """A past turn as packed: "[8 May 2023] Ann: text", or "Ann: text" when the date is a header item."""
    line = render_message_line(role, speaker, text)
    return f"{date_label(timestamp_ms)} {line}" if dated else line


# ---------------------------------------------------------------------------------------- index
# Per-row arrays of _UserIndex that a compaction copies as they are (session_of and nbr are renumbered).
_ROW_ARRAYS = ("codes", "scales", "tokens", "timestamps", "seqs", "roles", "speaker_of", "year_month", "day_of", "position",
               "doc_len", "voice", "proper", "exact", "simhash")


@dataclass
class _UserIndex:  # not slots: the arrays are set in __post_init__
    dim: int
    cap: int = 256
    window: int = 4
    dated: bool = True  # the date is part of each turn's text (else: one header item per day)
    context: int = 0  # previous same-session turns embedded with each turn (0: the turn alone)
    context_chars: int = 400  # of each previous turn, the last this many characters
    context_mix: float = 0.5  # share of the contextual vector in each row of `vectors` (with context > 0)
    ids: list[str] = field(default_factory=list)
    sessions: list[str] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    row_terms: list[tuple[str, ...]] = field(default_factory=list)  # distinct terms of each turn
    row_tfs: list[tuple[int, ...]] = field(default_factory=list)  # their counts: postings rebuild without re-parsing
    row_caps: list[tuple[str, ...]] = field(default_factory=list)  # words each turn capitalises (for `proper`)
    known: set[str] = field(default_factory=set)
    session_rows: dict[str, list[int]] = field(default_factory=dict)
    speakers: dict[str, int] = field(default_factory=dict)  # lowercased name -> speaker id
    postings: dict[str, tuple[list[int], list[int]]] = field(default_factory=dict)
    arrays: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    vocab: dict[str, int] = field(default_factory=dict)  # term -> id, for co-occurrence counts
    words: list[str] = field(default_factory=list)  # id -> term
    total_len: float = 0.0
    # yyyymmdd -> its header item: text, tokens, exact key, simhash, source tag, ContextItem bytes, time
    day_items: dict[int, tuple[str, int, int, int, str, bytes, int]] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)  # each turn's source tag, message:<id>
    # Each turn's ContextItem wire bytes, made the first time it is a candidate (None before), never
    # changed (a turn's text, tokens, role and time are fixed).
    bodies: list[bytes | None] = field(default_factory=list)
    # Turns that must not be recalled (a deleted memory's sources, store.recall_exclusions): kept as
    # neighbours of their session's turns, never ranked themselves.
    hidden: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.serial = next(_SERIALS)  # names this index in _RankedCache (never reused, unlike id())
        # A restored index (restore()) keeps its postings, per-turn terms and capitalised words in the
        # compact arrays it was saved as until a turn is added or it is compacted (_thaw).
        self._frozen: dict | None = None
        self._win_key: tuple | None = None  # (rows, decay) the cached window length norm is for
        self._win_norm = np.zeros(0, np.float32)
        self._said_rows: set[int] = set()  # _said(): the table rows (_stem_vectors) of the stems the user says
        self._said_upto = 0  # words counted into it
        self._prior_key: tuple | None = None  # (rows, knobs) the cached per-turn prior is for
        self._prior = np.ones(0)
        self._nbr_rows = np.zeros((0, 2 * self.window), np.int32)  # _neighbour_rows(), for this many rows
        self.term_df = np.zeros(256, np.int32)  # turns holding each term id
        # Each turn's distinct term ids: term_at[term_ptr[row]:term_ptr[row + 1]].
        self.term_at = np.zeros(4096, np.int32)
        self.term_ptr = np.zeros(self.cap + 1, np.int64)
        # Each turn's vector, mixed once here with its contextual vector (the turn embedded with its
        # `context` previous turns): (1 - mix) * v.q + mix * c.q == ((1 - mix) * v + mix * c).q, so a
        # query reads one matrix, not two. Kept as int8 with a scale per row (sidecar.index.int8): at 384
        # dimensions a 600-turn user's is ~0.23 MB, read in full by each query (float32: ~0.9 MB).
        self.codes = np.zeros((self.cap, self.dim), np.int8)
        self.scales = np.zeros(self.cap, np.float32)
        self.name_words: tuple[str, ...] = ()  # the speakers' names, word by word (replaced, never mutated)
        self.tokens = np.zeros(self.cap, np.int32)
        self.timestamps = np.zeros(self.cap, np.int64)
        self.seqs = np.zeros(self.cap, np.int64)
        self.roles = np.zeros(self.cap, np.int8)
        self.speaker_of = np.full(self.cap, -1, np.int32)
        self.session_of = np.zeros(self.cap, np.int32)
        self.year_month = np.zeros(self.cap, np.int32)  # year * 100 + month of the session's first turn
        self.day_of = np.zeros(self.cap, np.int32)  # yyyymmdd of the turn
        self.position = np.zeros(self.cap, np.int32)  # the turn's index in its session
        self.doc_len = np.zeros(self.cap, np.float32)
        self.voice = np.zeros(self.cap, np.int8)  # +1 the turn speaks of the speaker, -1 of the listener
        self.proper = np.zeros(self.cap, bool)  # the turn names someone or something other than a speaker
        self.exact = np.zeros(self.cap, np.uint64)
        self.simhash = np.zeros(self.cap, np.uint64)
        # Row of the k-th neighbour in the same session (-1 none): columns -W..-1, +1..+W.
        self.nbr = np.full((self.cap, 2 * self.window), -1, np.int32)

    def __len__(self) -> int:
        return len(self.ids)

    def hide(self, message_ids: set[str]) -> None:
        self.hidden = self.hidden | (message_ids & self.known)  # replaced, never mutated: rank() may read it

    def without_hidden(self, score: np.ndarray) -> np.ndarray:
        if self.hidden:
            score[[row for row, mid in enumerate(self.ids) if mid in self.hidden]] = 0.0
        return score

    def _grow(self, need: int) -> None:
        if need <= self.cap:
            return
        cap = max(need, self.cap * 2)
        for name in (*_ROW_ARRAYS, "session_of", "nbr"):
            old = getattr(self, name)
            new = np.full((cap, *old.shape[1:]), -1 if name in ("nbr", "speaker_of") else 0, old.dtype)
            new[: self.cap] = old[: self.cap]
            setattr(self, name, new)
        self.cap = cap

    def add(self, messages: Sequence[Message], embedder: Embedder, stemmed: bool) -> int:
        fresh = [m for m in messages if m.role in INDEXED_ROLES and m.message_id not in self.known and m.text]
        if not fresh:
            return 0
        self._thaw()
        texts = [render_turn(m.speaker, m.role, m.text, m.timestamp_ms, dated=self.dated) for m in fresh]
        start = len(self.ids)
        self._grow(start + len(fresh))
        end = start + len(fresh)
        # Counted once here, for exactly the line that is packed: its text and the newline after it.
        self.tokens[start:end] = count_lines(texts)
        body = [m.text for m in fresh]
        own = embedder.embed(body)
        self.exact[start:end], self.simhash[start:end] = fastpath.text_keys(texts)
        session_ids = {sid: i for i, sid in enumerate(self.session_rows)}
        speakers = len(self.speakers)
        for j, (m, text) in enumerate(zip(fresh, texts, strict=True)):
            row = start + j
            self.ids.append(m.message_id)
            self.sources.append(f"message:{m.message_id}")
            self.bodies.append(None)
            self.known.add(m.message_id)
            self.sessions.append(m.session_id)
            self.texts.append(text)
            self.timestamps[row] = m.timestamp_ms
            day = day_number(m.timestamp_ms)
            self.day_of[row] = day
            if not self.dated and day not in self.day_items:
                self.day_items[day] = _day_item(day, m.timestamp_ms)
            self.seqs[row] = m.seq
            self.roles[row] = int(m.role)
            name = (m.speaker or m.role.label).lower()
            self.speaker_of[row] = self.speakers.setdefault(name, len(self.speakers))
            rows = self.session_rows.get(m.session_id)
            if rows is None:
                rows = self.session_rows[m.session_id] = []
                session_ids[m.session_id] = len(session_ids)
                day = dt.datetime.fromtimestamp(m.timestamp_ms / 1000, dt.UTC)
                self.year_month[row] = day.year * 100 + day.month
            else:
                self.year_month[row] = self.year_month[rows[0]]
            self.session_of[row] = session_ids[m.session_id]
            w = self.window
            for k in range(1, min(w, len(rows)) + 1):
                prev = rows[-k]
                self.nbr[row, w - k] = prev  # my k-th previous turn
                self.nbr[prev, w + k - 1] = row  # I am its k-th next turn
            self.position[row] = len(rows)
            rows.append(row)
            counts: dict[str, int] = {}
            words = terms(m.text, stemmed=stemmed)
            for t in words:
                counts[t] = counts.get(t, 0) + 1
            self.row_terms.append(tuple(counts))
            self.row_tfs.append(tuple(counts.values()))
            self._post(row)
            self.doc_len[row] = len(words)
            self.voice[row] = voice(m.text)
            self.row_caps.append(capitalised(m.text))
            self.total_len += len(words)
        # A new speaker's name (or a nickname it starts with: "Mel") is no proper noun in any turn.
        self._mark_proper(0 if len(self.speakers) > speakers else start)
        if len(self.speakers) > speakers:
            self.name_words = tuple(dict.fromkeys(w for name in self.speakers for w in name.split()))
        if self.context > 0 and self.context_mix > 0:
            ctx = []
            for row in range(start, end):
                prev = [int(self.nbr[row, self.window - k]) for k in range(min(self.context, self.window), 0, -1)]
                ctx.append("\n".join([*(self.texts[p][-self.context_chars:] for p in prev if p >= 0), texts[row - start]]))
            mix = np.float32(self.context_mix)
            own = (np.float32(1.0) - mix) * own + mix * embedder.embed(ctx)
        self.codes[start:end], self.scales[start:end] = quantize_rows(own)
        return len(fresh)

    def _mark_proper(self, first: int) -> None:
        names = [w for name in self.speakers for w in name.split()]
        for row in range(first, len(self.ids)):
            self.proper[row] = any(not any(name.startswith(c) for name in names) for c in self.row_caps[row])

    def item_bodies(self, rows: list[int]) -> list[bytes]:
        """The ContextItem bytes of these turns (made for those that have none yet)."""
        got = _pick(self.bodies, rows)
        if None in got:
            for j, row in enumerate(rows):
                if got[j] is None:
                    got[j] = self.bodies[row] = fastpath.encode_item(
                        self.sources[row], Category.MEMORIES, int(self.tokens[row]), self.texts[row],
                        int(self.roles[row]), int(self.timestamps[row]), (self.ids[row],))
        return got  # type: ignore[return-value]  # no None left

    def _post(self, row: int) -> None:
        """Add a row's term counts (row_terms, row_tfs) to the postings (rows in order)."""
        ids: list[int] = []
        for t, tf in zip(self.row_terms[row], self.row_tfs[row], strict=True):
            posting = self.postings.get(t)
            if posting is None:
                posting = self.postings[t] = ([], [])
                self.vocab[t] = len(self.words)
                self.words.append(t)
            posting[0].append(row)
            posting[1].append(tf)
            self.arrays.pop(t, None)
            ids.append(self.vocab[t])
        start = int(self.term_ptr[row])
        end = start + len(ids)
        if end > len(self.term_at):
            self.term_at = np.concatenate([self.term_at, np.zeros(max(end, len(self.term_at)), np.int32)])
        if row + 2 > len(self.term_ptr):
            self.term_ptr = np.concatenate([self.term_ptr, np.zeros(max(row + 2, len(self.term_ptr)), np.int64)])
        self.term_at[start:end] = ids
        self.term_ptr[row + 1] = end
        if len(self.words) > len(self.term_df):  # one turn may bring any number of new terms
            grown = np.zeros(max(len(self.words), 2 * len(self.term_df)), np.int32)
            grown[: len(self.term_df)] = self.term_df
            self.term_df = grown
        self.term_df[ids] += 1

    def compacted(self, start: int) -> _UserIndex:
        """The same index without rows before `start`, from what is already in memory (no rows read,
        no text parsed, embedded or counted again), so dropping a user's oldest turns costs
        milliseconds, not a rebuild. A kept turn keeps its place in its session (position and the
        session's month); a neighbour that was dropped is no neighbour any more."""
        self._thaw()
        n = len(self) - start
        out = _UserIndex(dim=self.dim, cap=max(n, 1), window=self.window, dated=self.dated, context=self.context,
                         context_chars=self.context_chars, context_mix=self.context_mix)
        for name in _ROW_ARRAYS:
            getattr(out, name)[:n] = getattr(self, name)[start:len(self)]
        nbr = self.nbr[start:len(self)] - start
        out.nbr[:n] = np.where(nbr < 0, -1, nbr)  # dropped rows (and "none") become -1
        out.ids, out.sessions, out.texts = self.ids[start:], self.sessions[start:], self.texts[start:]
        out.row_terms, out.row_tfs, out.row_caps = self.row_terms[start:], self.row_tfs[start:], self.row_caps[start:]
        out.known = set(out.ids)
        out.speakers, out.name_words = dict(self.speakers), self.name_words
        session_ids: dict[str, int] = {}
        for row, sid in enumerate(out.sessions):
            out.session_rows.setdefault(sid, []).append(row)
            out.session_of[row] = session_ids.setdefault(sid, len(session_ids))
        for row in range(n):
            out._post(row)
        out.total_len = float(out.doc_len[:n].sum())
        days = set(out.day_of[:n].tolist())
        out.day_items = {d: item for d, item in self.day_items.items() if d in days}
        out.sources, out.bodies = self.sources[start:], self.bodies[start:]
        out.hidden = self.hidden & out.known
        return out

    def freeze(self, meta: tuple) -> bytes:
        """The index as bytes (EpisodicSource's snapshots), mostly arrays so that restore() makes few
        objects; `meta` (what it was built with) must match for it to be restored. Left out: the
        hidden turns (read from the store on load), the items' bytes and lazy caches."""
        self._thaw()
        n, words = len(self.ids), self.words
        said = self._said()
        sizes = [len(self.postings[w][0]) for w in words]
        total = sum(sizes)
        state = {
            "meta": meta, "n": n, "ids": self.ids, "sessions": self.sessions, "texts": self.texts,
            "session_rows": self.session_rows, "speakers": self.speakers, "name_words": self.name_words,
            "day_items": self.day_items, "total_len": self.total_len, "words": "\n".join(words),
            "said": np.fromiter(said, np.int32, len(said)),
            "caps": "\x1e".join("\x1f".join(c) for c in self.row_caps),
            "term_tf": np.fromiter(itertools.chain.from_iterable(self.row_tfs), np.int32, int(self.term_ptr[n])),
            "post_ptr": np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]),
            "post_rows": np.fromiter(itertools.chain.from_iterable(self.postings[w][0] for w in words), np.int64, total),
            "post_tfs": np.fromiter(itertools.chain.from_iterable(self.postings[w][1] for w in words), np.int32, total),
            "term_df": self.term_df[:len(words)], "term_at": self.term_at[:int(self.term_ptr[n])],
            "term_ptr": self.term_ptr[:n + 1],
            **{name: getattr(self, name)[:n] for name in (*_ROW_ARRAYS, "session_of", "nbr")},
        }
        return pickle.dumps(state, protocol=5)

    @classmethod
    def restore(cls, blob: bytes, meta: tuple) -> _UserIndex | None:
        """An index saved by freeze() with this `meta`, else None."""
        state = pickle.loads(blob)  # noqa: S301  # written by this process's freeze(), in its own directory
        if state.get("meta") != meta:
            return None
        dim, window, dated, context, context_chars, context_mix = meta[1:7]
        n = state["n"]
        out = cls(dim=dim, cap=1, window=window, dated=dated, context=context, context_chars=context_chars,
                  context_mix=context_mix)
        out.cap = n
        for name in (*_ROW_ARRAYS, "session_of", "nbr", "term_df", "term_at", "term_ptr"):
            setattr(out, name, state[name])
        out.ids, out.sessions, out.texts = state["ids"], state["sessions"], state["texts"]
        out.session_rows, out.speakers, out.name_words = state["session_rows"], state["speakers"], state["name_words"]
        out.day_items, out.total_len = state["day_items"], state["total_len"]
        out.words = state["words"].split("\n") if state["words"] else []
        out.vocab = dict(zip(out.words, range(len(out.words)), strict=True))
        out.known = set(out.ids)
        out.sources = ["message:" + mid for mid in out.ids]
        out.bodies = [None] * n
        out._said_rows, out._said_upto = set(state["said"].tolist()), len(out.words)
        out._frozen = {k: state[k] for k in ("caps", "term_tf", "post_ptr", "post_rows", "post_tfs")}
        return out

    def _thaw(self) -> None:
        """Make the postings, per-turn terms and capitalised words of a restored index Python lists
        again, as add() and compacted() extend and read them."""
        f = self._frozen
        if f is None:
            return
        n, words = len(self.ids), self.words
        ptr, rows, tfs = f["post_ptr"].tolist(), f["post_rows"].tolist(), f["post_tfs"].tolist()
        self.postings = {w: (rows[ptr[i]:ptr[i + 1]], tfs[ptr[i]:ptr[i + 1]]) for i, w in enumerate(words)}
        at, tp, tf = self.term_at.tolist(), self.term_ptr.tolist(), f["term_tf"].tolist()
        self.row_terms = [tuple(words[i] for i in at[tp[r]:tp[r + 1]]) for r in range(n)]
        self.row_tfs = [tuple(tf[tp[r]:tp[r + 1]]) for r in range(n)]
        self.row_caps = [tuple(c.split("\x1f")) if c else () for c in f["caps"].split("\x1e")] if n else []
        self.arrays = {}
        self._frozen = None

    def bm25(self, query_terms: Sequence[str], k1: float = BM25_K1, b: float = BM25_B) -> np.ndarray:
        n = len(self.ids)
        acc = np.zeros(n + 1, np.float32)  # + 1: a zero sentinel that "no neighbour" (-1) points at
        avg_len = max(self.total_len / max(n, 1), 1.0)
        for t in set(query_terms):
            arrays = self._arrays(t)
            if arrays is None:
                continue
            rows, tfs = arrays
            df = len(rows)
            idf = math.log(1.0 + (n - df + 0.5) / (df + 0.5))
            norm = k1 * (1.0 - b + b * self.doc_len[rows] / avg_len)
            acc[rows] += idf * tfs * (k1 + 1.0) / (tfs + norm)  # rows are unique per term
        return acc

    def _arrays(self, t: str) -> tuple[np.ndarray, np.ndarray] | None:
        arrays = self.arrays.get(t)
        if arrays is None and self._frozen is not None:
            tid = self.vocab.get(t)
            if tid is None:
                return None
            f = self._frozen
            lo, hi = int(f["post_ptr"][tid]), int(f["post_ptr"][tid + 1])
            arrays = self.arrays[t] = (f["post_rows"][lo:hi], f["post_tfs"][lo:hi].astype(np.float32))
        elif arrays is None:
            posting = self.postings.get(t)
            if posting is None:
                return None
            arrays = self.arrays[t] = (np.asarray(posting[0], np.int64), np.asarray(posting[1], np.float32))
        return arrays

    def window_bm25(self, query_terms: Sequence[str], decay: np.ndarray, k1: float, b: float) -> np.ndarray:
        """BM25 of each turn's neighbourhood as one document: the decayed term counts of the window
        saturate per term, so a window that covers more of the query's terms wins."""
        return self.window_bm25_groups([query_terms], decay, k1, b)[0]

    def window_bm25_groups(self, groups: Sequence[Sequence[str]], decay: np.ndarray, k1: float, b: float
                           ) -> list[np.ndarray]:
        """window_bm25 of each group of terms, their window counts taken once (fastpath.window_bm25,
        compiled): each posting adds its count to its own row and, decayed, to its neighbours' rows,
        so the cost follows the postings rather than rows x terms. A term's counts do not depend on
        the other terms, so each group gets exactly what a call of its own would."""
        n = len(self.ids)
        slot: dict[str, int] = {}  # term -> its index in rows / tfs (-1: the user never says it)
        rows: list[np.ndarray] = []
        tfs: list[np.ndarray] = []
        at: list[list[int]] = []  # per group, its terms' indices
        for group in groups:
            mine = []
            for t in dict.fromkeys(group):
                s = slot.get(t)
                if s is None:
                    arrays = self._arrays(t)
                    s = slot[t] = -1 if arrays is None else len(rows)
                    if arrays is not None:
                        rows.append(arrays[0])
                        tfs.append(arrays[1])
                if s >= 0:
                    mine.append(s)
            at.append(mine)
        if not rows or not n:
            return [np.zeros(n, np.float32) for _ in groups]
        key = (n, b, decay.tobytes())
        if self._win_key != key:
            lens = np.zeros(n + 1, np.float32)
            lens[:n] = self.doc_len[:n]
            win_len = lens[:n] + lens[self._neighbour_rows()] @ decay
            self._win_norm = (1.0 - b + b * win_len / max(float(win_len.mean()), 1.0)).astype(np.float32)
            self._win_key = key
        sizes = np.fromiter(map(len, rows), np.float64, len(rows))
        idf = np.log1p((n - sizes + 0.5) / (sizes + 0.5)).astype(np.float32)
        return list(fastpath.window_bm25(rows, tfs, self.nbr[:n], decay, self._win_norm, idf, at, k1))

    def smooth(self, scores: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """scores[i] + sum_k weights[k] * scores[k-th neighbour of i]; scores carries a 0 sentinel at n."""
        return scores[:len(self.ids)] + scores[self._neighbour_rows()] @ weights

    def _neighbour_rows(self) -> np.ndarray:
        """nbr with "none" (-1) pointing at row n, the sentinel; kept until turns are added."""
        n = len(self.ids)
        if len(self._nbr_rows) != n:
            nbr = self.nbr[:n]
            self._nbr_rows = np.where(nbr < 0, n, nbr)
        return self._nbr_rows

    def rank(self, query: str, qvec: np.ndarray | None, exclude_session: str, r: Ranking) -> np.ndarray:
        """Fused score per row (-inf for rows of the excluded session)."""
        n = len(self.ids)
        w = self.window
        decay = _decay(r.prev_decay, r.next_decay, r.neighbours, w)
        q_terms = terms(query, stemmed=r.stem)
        words = {w.split("'")[0] for w in _WORD_RE.findall(query.lower())}  # "melanie's" names melanie
        named = [sid for name, sid in self.speakers.items() if name in words or name.split(" ")[0] in words]
        names = {stem(x) for name in self.speakers for x in name.split()}
        if r.drop_names:
            kept = [t for t in q_terms if t not in names]
            q_terms = kept or q_terms
        if r.question_stopwords:
            q_terms = [t for t in q_terms if t not in QUESTION_WORDS] or q_terms
        # The query's terms, their concept words and the terms said with them: window counts in one pass.
        have = set(q_terms)
        wider = [t for q in q_terms for t in CONCEPTS.get(q, ()) if t not in have] if r.concept_weight > 0 else []
        if r.concept_similar > 0 and r.concept_weight > 0:
            wider += self.concept_kin(q_terms, {*have, *wider, *names}, r)
        assoc = self.associated(q_terms, names, r) if r.assoc_terms > 0 and r.assoc_weight > 0 else []
        similar = self.similar(q_terms, names, r) if r.similar_terms > 0 and r.similar_weight > 0 else []
        win, wider_win, assoc_win, similar_win = self.window_bm25_groups(
            [q_terms if r.window_doc > 0 else [], wider, assoc, similar], decay, r.k1, r.b)
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
        days = named_days if r.day_boost else ()
        if days:
            # A day's events are told that day or in the days after ("yesterday", "last week").
            when = self.timestamps[:n] // 86_400_000
            near = np.zeros(n, bool)
            for d in days:
                lo = d.toordinal() - _EPOCH
                near |= (when >= lo - r.day_before) & (when <= lo + r.day_after)
            mult *= np.where(near, 1.0 + r.day_boost, 1.0)
        if exclude_session and exclude_session in self.session_rows:
            mult[self.session_rows[exclude_session]] = 0.0
        for extra, weight in ((wider_win, r.concept_weight), (assoc_win, r.assoc_weight), (similar_win, r.similar_weight)):
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

    def similar(self, query_terms: Sequence[str], names: set[str], r: Ranking) -> list[str]:
        """Per query term, the similar_terms terms of this user nearest it in the static word vectors
        (cosine at least similar_min); query terms, names and question words left out."""
        exclude = {*query_terms, *names}
        asked = [q for q in dict.fromkeys(query_terms) if q not in QUESTION_WORDS]
        out: dict[str, None] = {}
        for rows in similar_rows(asked, r.similar_min):
            out.update(dict.fromkeys(self._first_said(rows, r.similar_terms, exclude)))
        return list(out)

    def concept_kin(self, query_terms: Sequence[str], exclude: set[str], r: Ranking) -> list[str]:
        """Per query term with a CONCEPTS entry, up to concept_similar terms of this user nearest the
        concept's centroid (concept_rows), nearest first; those in `exclude` left out."""
        out: list[str] = []
        for q in dict.fromkeys(query_terms):
            if q in CONCEPTS:
                kin = self._first_said(concept_rows(q, r.concept_min), r.concept_similar, exclude)
                out += kin
                exclude.update(kin)
        return out

    def _first_said(self, rows: np.ndarray, k: int, exclude: set[str]) -> list[str]:
        """The first k stems of these table rows that this user says, those in `exclude` left out (a
        plain loop: the rows are a few dozen, and it stops at the k-th)."""
        if k <= 0 or not len(rows):
            return []
        keys = _stem_vectors()[1]
        said = self._said()
        out: list[str] = []
        for i in rows.tolist():
            if i in said and keys[i] not in exclude:
                out.append(keys[i])
                if len(out) == k:
                    break
        return out

    def _said(self) -> set[int]:
        """The table rows (_stem_vectors) of the stems this user says; brought up to date with the terms
        added since the last call (the vocabulary only grows; a compacted index starts its own)."""
        index = _stem_vectors()[0]
        for t in self.words[self._said_upto:]:
            row = index.get(t)
            if row is not None:
                self._said_rows.add(row)
        self._said_upto = len(self.words)
        return self._said_rows

    def associated(self, query_terms: Sequence[str], names: set[str], r: Ranking) -> list[str]:
        """The assoc_terms terms the user says most with the query's terms ("hike" -> trail, view):
        per query term, sum over the terms sharing at least assoc_min of its turns of their PMI
        (when positive) times the share of its turns they are in; query terms and names excluded."""
        n, size = len(self.ids), len(self.words)
        picked = [a[0] for q in dict.fromkeys(query_terms)
                  if q not in QUESTION_WORDS and (a := self._arrays(q)) is not None]
        if not picked:
            return []
        exclude = self._term_ids({*query_terms, *names})
        best, _ = fastpath.cooccurring_terms(picked, self.term_ptr[:n + 1], self.term_at[:int(self.term_ptr[n])],
                                             self.term_df[:size], n, r.assoc_min, exclude, r.assoc_terms)
        return [self.words[i] for i in best.tolist()]

    def _term_ids(self, wanted: set[str]) -> list[int]:
        """The ids of those of these terms this user says."""
        return [self.vocab[t] for t in wanted if t in self.vocab]

    def _feedback(self, score: np.ndarray, query_terms: Sequence[str], names: set[str], r: Ranking) -> list[str]:
        """The prf_terms terms most characteristic of the prf_docs best turns (fastpath.feedback_terms:
        each term's idf summed over those turns; terms of one turn only, the query's and the names left out)."""
        n = len(self.ids)
        best = np.argpartition(-score, r.prf_docs - 1)[: r.prf_docs]
        best = best[score[best] > 0]
        skip = self._term_ids({*query_terms, *names})
        ids, _ = fastpath.feedback_terms(best, self.term_ptr[:n + 1], self.term_at[:int(self.term_ptr[n])],
                                         self.term_df[:len(self.words)], n, 2, skip, r.prf_terms)
        return [self.words[i] for i in ids.tolist()]


MAX_SNAPSHOT_BYTES = 1 << 30  # users' saved indexes over all users (~1.5 MB for 500 long turns)


class EpisodicSource:
    """CandidateSource over every past turn of the user; the current session is MessageSource's."""

    name = "episodic"

    def __init__(self, store, embedder: Embedder | None = None, *, ranking: Ranking = DEFAULT_RANKING,
                 max_users: int = MAX_USERS, max_turns_per_user: int = MAX_TURNS_PER_USER,
                 max_total_turns: int = MAX_TOTAL_TURNS, max_snapshot_bytes: int = MAX_SNAPSHOT_BYTES) -> None:
        self.store = store
        # Static word vectors joined with hashed n-grams (no model); the app's model embedder in the
        # optional model profile (use_model), whose space a client's query_embedding is in.
        self.embedder: Embedder = embedder or StaticEmbedder()
        self.dim = self.embedder.dim
        self.takes_client_vectors = False
        self.ranking = ranking
        self.max_users = max_users
        self.max_turns_per_user = max(min(max_turns_per_user, max_total_turns), 4)
        self.max_total_turns = max(max_total_turns, self.max_turns_per_user)
        self._users: OrderedDict[tuple[str, str], _UserIndex] = OrderedDict()
        self._ranked = _RankedCache()
        self._lock = threading.RLock()
        self._closing = threading.Event()
        # Users' indexes saved when they leave memory (evicted, or the process closing) and restored
        # on their next call instead of rebuilt from rows; names of the files that are current.
        self.max_snapshot_bytes = max_snapshot_bytes
        self._snapshot_dir, self._snapshots = _open_snapshots(snapshot_dir(store) if max_snapshot_bytes else None)
        # The app's MemoryService.superseded_turns: turns a superseded memory was learnt from are
        # marked when recalled and never outrank the current memory's turns.
        self.superseded_turns: Callable[[Scope], dict[str, SupersededTurn]] | None = None

    def warm_up(self) -> None:
        """Build the per-stem word vectors (~0.3 s), the concepts' kin and every stem's similar stems
        (~1 s) at start-up rather than in the first queries."""
        r = self.ranking
        if r.similar_terms > 0 or r.concept_similar > 0:
            _stem_vectors()
        if r.concept_similar > 0:
            for concept in CONCEPTS:
                if self._closing.is_set():
                    return
                concept_rows(concept, r.concept_min)
        if r.similar_terms > 0 and r.similar_weight > 0:
            precompute_similar(r.similar_min, self._closing.is_set)

    def close(self) -> None:
        """Stop the warm-up (the app joins its thread before the process exits) and save the indexes
        of the users in memory (for at most SAVE_AT_CLOSE_S), so they are restored after a restart."""
        self._closing.set()
        if self._snapshot_dir is None:
            return
        deadline = time.monotonic() + SAVE_AT_CLOSE_S
        with self._lock:
            for key, state in reversed(self._users.items()):  # the most recently used first
                if time.monotonic() > deadline:
                    break
                self._save(key, state)
            try:
                (self._snapshot_dir / CLEAN_MARK).touch()
            except OSError:
                log.warning("episodic snapshots: could not mark them current; rebuilt from rows next start")

    def use_model(self, embedder: Embedder, ranking: Ranking = MODEL_RANKING) -> None:
        """Rank with a model embedder and the ranking tuned for one; indexes are rebuilt from rows."""
        with self._lock:
            self.embedder, self.dim, self.ranking = embedder, embedder.dim, ranking
            self.takes_client_vectors = True
            self._users.clear()
            self._ranked.clear()

    def set_ranking(self, ranking: Ranking) -> None:
        """Rank with other knobs (tuning, bench/recall.py --offline). The users' indexes are rebuilt
        from rows only when the knobs an index is built with differ (_index_knobs); a model profile's
        rebuild embeds every turn again."""
        with self._lock:
            if _index_knobs(ranking) != _index_knobs(self.ranking):
                self._users.clear()
            self._ranked.clear()
            self.ranking = ranking

    # ------------------------------------------------------------------ upkeep
    def on_append(self, scope: Scope, session_id: str, messages: list[Message]) -> None:
        """store.append_listeners hook: index new turns of a user already in memory, or load the
        user from rows (which already hold these turns) so the next BuildContext stays fast."""
        if not any(m.role in INDEXED_ROLES for m in messages):
            return
        view = self.store.session_view(scope, session_id)  # cached: the append just loaded it
        if view is None or view.session.parent_session_id:
            return  # a sub-agent's turns reach other sessions only as its result summary
        with self._lock:
            key = (scope.tenant_id, scope.user_id)
            state = self._users.get(key)
            try:
                if state is None:
                    self._discard(key)  # it lacks these turns
                    self._load(scope)
                    return
                added = state.add(messages, self.embedder, self.ranking.stem)
                if added:
                    self._discard(key)
                if added and len(state) > self.max_turns_per_user:
                    # Keep the newest three quarters, so the next compaction is a quarter of the cap away.
                    self._users[key] = state.compacted(len(state) - self.max_turns_per_user * 3 // 4)
                    self._ranked.drop(state)
            except Exception:
                # The rows are committed: the call must not fail, and a half-updated index must not be
                # searched. Drop it; the user's next search rebuilds it from rows.
                log.exception("episodic index update failed for a user; rebuilt from rows on next use")
                self.drop_user(scope)
                return
            self._bound(key)

    def generation(self, scope: Scope) -> tuple[int, int] | None:
        """Changes whenever the user's past turns are rebuilt or some leave recall (not when turns are
        added: a session's recalled turns come from other sessions)."""
        state = self._users.get((scope.tenant_id, scope.user_id))
        return (state.serial, len(state.hidden)) if state is not None else None

    def exclude(self, scope: Scope, message_ids: set[str]) -> None:
        """Stop recalling these turns of the user (their rows stay in their session's history)."""
        with self._lock:
            state = self._users.get((scope.tenant_id, scope.user_id))
            if state is not None:
                state.hide(message_ids)
                self._ranked.drop(state)

    def drop_user(self, scope: Scope) -> None:
        """Forget the user's in-memory index and its snapshot (rebuilt from rows when next needed)."""
        with self._lock:
            state = self._users.pop((scope.tenant_id, scope.user_id), None)
            if state is not None:
                self._ranked.drop(state)
            self._discard((scope.tenant_id, scope.user_id))

    def evict(self, scope: Scope) -> None:
        """Let the user's index go as the least recently used do (_bound): saved, their rows unchanged."""
        with self._lock:
            key = (scope.tenant_id, scope.user_id)
            state = self._users.pop(key, None)
            if state is not None:
                self._ranked.drop(state)
                self._save(key, state)

    def forget(self, scope: Scope) -> dict[str, int]:
        """ForgetUser hook: drop the user's index and its snapshot (their rows are deleted by the store)."""
        with self._lock:
            state = self._users.pop((scope.tenant_id, scope.user_id), None)
            if state is not None:
                self._ranked.drop(state)  # the rankings hold the user's questions
            self._discard((scope.tenant_id, scope.user_id))
            return {"episodic_index": len(state) if state else 0}

    def indexed(self, scope: Scope) -> int:
        with self._lock:
            state = self._users.get((scope.tenant_id, scope.user_id))
            return len(state) if state else 0

    def _load(self, scope: Scope) -> _UserIndex:
        key = (scope.tenant_id, scope.user_id)
        window, date_headers, context, context_chars, context_mix, stemmed = _index_knobs(self.ranking)
        state = self._restore(key)
        if state is None:
            state = _UserIndex(dim=self.dim, window=window, dated=not date_headers, context=context,
                               context_chars=context_chars, context_mix=context_mix)
            # Read no more than the cap allows (a long history must not make this slower over time); past
            # the cap keep the newest three quarters, so the next compaction is a quarter of the cap away.
            rows = self._rows(scope, self.max_turns_per_user + 1)
            if len(rows) > self.max_turns_per_user:
                rows = rows[-(self.max_turns_per_user * 3 // 4):]
            state.add(rows, self.embedder, stemmed)
        state.hide(self.store.recall_exclusions(scope))
        old = self._users.pop(key, None)
        if old is not None:
            self._ranked.drop(old)
        self._users[key] = state
        self._bound(key)
        return state

    def _bound(self, keep: tuple[str, str]) -> None:
        """Evict least recently used users past MAX_USERS or MAX_TOTAL_TURNS (never `keep`)."""
        total = sum(len(s) for s in self._users.values())
        while len(self._users) > 1 and (len(self._users) > self.max_users or total > self.max_total_turns):
            victim = next(iter(self._users))
            if victim == keep:
                self._users.move_to_end(victim)
                victim = next(iter(self._users))
            gone = self._users.pop(victim)
            self._ranked.drop(gone)
            self._save(victim, gone)
            total -= len(gone)

    # ------------------------------------------------------------------ snapshots
    def _meta(self) -> tuple:
        """What a saved index must have been built with to be restored (see _UserIndex.freeze)."""
        window, date_headers, context, context_chars, context_mix, stemmed = _index_knobs(self.ranking)
        return (SNAPSHOT_VERSION, self.dim, window, not date_headers, context, context_chars, context_mix,
                stemmed, self.embedder.name, self.max_turns_per_user)

    def _save(self, key: tuple[str, str], state: _UserIndex) -> None:
        """Save a user's index that leaves memory, unless its snapshot is current (held under the lock,
        like every change of _snapshots: a file is current exactly while its name is there)."""
        name = _snapshot_name(key)
        if self._snapshot_dir is None or name in self._snapshots or not len(state):
            return
        path = self._snapshot_dir / name
        try:
            tmp = path.with_suffix(".tmp")
            blob = state.freeze(self._meta())
            tmp.write_bytes(blob)
            os.replace(tmp, path)
        except Exception:
            log.exception("episodic snapshot not saved; the user is rebuilt from rows on next use")
            return
        self._snapshots[name] = len(blob)
        # Bounded like the in-memory index: the oldest saved go first (their users rebuild from rows).
        while sum(self._snapshots.values()) > self.max_snapshot_bytes and self._snapshots:
            old, _ = self._snapshots.popitem(last=False)
            (self._snapshot_dir / old).unlink(missing_ok=True)

    def _restore(self, key: tuple[str, str]) -> _UserIndex | None:
        name = _snapshot_name(key)
        if self._snapshot_dir is None or name not in self._snapshots:
            return None
        try:
            state = _UserIndex.restore((self._snapshot_dir / name).read_bytes(), self._meta())
        except Exception:
            log.exception("episodic snapshot unreadable; the user is rebuilt from rows")
            state = None
        if state is None:
            self._discard(key)
        return state

    def _discard(self, key: tuple[str, str]) -> None:
        """The user's rows changed (or are gone): their snapshot, if any, is deleted."""
        name = _snapshot_name(key)
        if self._snapshot_dir is None or name not in self._snapshots:
            return
        self._snapshots.pop(name, None)
        (self._snapshot_dir / name).unlink(missing_ok=True)

    def indexed_total(self) -> int:
        with self._lock:
            return sum(len(s) for s in self._users.values())

    def _rows(self, scope: Scope, newest: int) -> list[Message]:
        # Sessions in creation order, turns in sequence order, so neighbours are conversational.
        return self.store.list_user_messages(scope, [int(Role.USER), int(Role.ASSISTANT)], newest)

    # ------------------------------------------------------------------ hot path
    def search(self, scope: Scope, query: str, exclude_session: str, budget_tokens: int,
               query_embedding: np.ndarray | None = None) -> tuple[_UserIndex, np.ndarray, np.ndarray]:
        """(index, rows best first, their relevance in (0, 1]) worth about budget * candidate_factor tokens."""
        r = self.ranking
        given = self._given(query_embedding)
        key = (scope.tenant_id, scope.user_id)
        # The same question again (an agent's tool loop rebuilds the context for one user message; a
        # caller tries another budget) over the same turns ranks them alike: its ranking is kept.
        memo = (query, exclude_session, r, query_embedding.tobytes() if given else None)
        known = self._users.get(key)  # a peek without the lock, only to skip embedding for a kept ranking
        # The query vector (a model's: ~13 ms on one core) is taken outside the lock, so concurrent
        # calls for other users do not queue behind it; a model embedder keeps recent texts, so what the
        # builder embedded ahead (query_texts) or the memory source's embedding of the query is reused.
        text = self._query_text(key, query, given)
        qvec = None
        if text is not None and (known is None or self._ranked.get(known, memo) is None):
            qvec = self.embedder.embed([text])[0]
        with self._lock:
            state = self._users.get(key)
            if state is None:
                state = self._load(scope)
            else:
                self._users.move_to_end(key)
            empty = np.zeros(0, np.int64), np.zeros(0)
            own = len(state.session_rows.get(exclude_session, ()))
            if len(state) <= own or not query:  # nothing outside the current session to recall
                return state, *empty
            ranked = self._ranked.get(state, memo)
            if ranked is None:
                if given:
                    qvec = query_embedding
                elif qvec is None:  # a user's first call: loading the index costs far more
                    qvec = self.embedder.embed([_dense_query(query, state, r)])[0]
                ranked = _best_first(state.without_hidden(state.rank(query, qvec, exclude_session, r)),
                                     r.max_candidates)
                self._ranked.put(state, memo, ranked)
        order, best = ranked
        if not len(order):
            return state, *empty
        # Keep only as many turns as could be packed (with slack for dedup and other categories).
        cum = np.cumsum(state.tokens[order])
        keep = int(np.searchsorted(cum, max(budget_tokens, 1) * r.candidate_factor, side="right")) + 1
        return state, order[:keep], best[:keep] / best[0]

    def _given(self, query_embedding: np.ndarray | None) -> bool:
        """Whether the client's query vector is used (it is in a model's space, and of its size)."""
        return self.takes_client_vectors and client_vector_of(query_embedding, self.dim) is not None

    def _query_text(self, key: tuple[str, str], query: str, given: bool) -> str | None:
        """The text embedded for this query before the user's index is at hand: None when there is no
        query, the client's vector is used, or the speakers' names are to be left out of a user not
        loaded yet (then it is embedded once the index is loaded)."""
        r = self.ranking
        known = self._users.get(key)  # a peek without the lock: only its names (replaced whole) are read
        if not query or given or not (r.dense_query_names or known is not None):
            return None
        return _dense_query(query, known, r)

    def _searches(self, inp: BuildInput) -> bool:
        # A sub-session inherits only what was handed off, never the parent's (or any) history.
        return inp.budget.memories > 0 and bool(inp.query) and not inp.view.session.parent_session_id

    def query_texts(self, inp: BuildInput) -> list[str]:
        """What search() will embed for this call (see ContextBuilder.query_embedder)."""
        if not self._searches(inp):
            return []
        text = self._query_text((inp.scope.tenant_id, inp.scope.user_id), inp.query, self._given(inp.query_embedding))
        return [text] if text is not None else []

    def candidates(self, inp: BuildInput) -> list[CandidateBatch]:
        batch = CandidateBatch(category=SoftCategory.MEMORIES, section=Section.MEMORIES)
        budget = inp.budget.memories + (inp.budget.recent_messages if inp.budget.flow_unused else 0)
        if not self._searches(inp):
            return [batch]
        state, rows, relevance = self.search(inp.scope, inp.query, inp.view.session.session_id, budget,
                                             inp.query_embedding)
        if not len(rows):
            return [batch]
        row_list = rows.tolist()
        age = np.maximum(inp.now_ms - state.timestamps[rows], 0) / 1000.0
        # Packed turns read as a timeline: order by time, then by sequence inside a session.
        keys = state.timestamps[rows].astype(np.float64) * 1000.0 + state.seqs[rows] % 1000
        batch.texts = _pick(state.texts, row_list)
        batch.sources = _pick(state.sources, row_list)
        batch.bodies = state.item_bodies(row_list)
        batch.order = keys
        batch.tokens = state.tokens[rows]
        batch.relevance = relevance
        batch.age_s = age
        batch.exact_keys = state.exact[rows]
        batch.simhashes = state.simhash[rows]
        marks = self.superseded_turns(inp.scope) if self.superseded_turns is not None else {}
        if marks:
            _mark_superseded(state, batch, row_list, marks)
        headers: list[ItemMeta] = self._day_headers(state, batch, rows) if not state.dated else []
        batch.priority = np.zeros(len(batch.texts))
        batch.meta = partial(_turn_meta, state, row_list, headers, batch.order)
        if not inp.counter.stored:  # another tokenizer: every item (turn, marked turn, day) is a line counted in it
            batch.tokens = np.array([inp.counter.line(t) for t in batch.texts], np.int32)
            batch.bodies = None  # the builder encodes the packed ones with these counts
        return [batch]

    @staticmethod
    def _day_headers(state: _UserIndex, batch: CandidateBatch, rows: np.ndarray) -> list[ItemMeta]:
        """One "[8 May 2023]" item per day of the candidates, ahead of them: relevance and recency of
        the day's best turn (so it is packed before any of them) and an order key just before the
        day's first turn. A day's date costs its tokens once instead of on every turn. Returns the
        headers' item metadata."""
        days = state.day_of[rows]
        uniq, first, inverse = np.unique(days, return_index=True, return_inverse=True)
        min_age = np.full(len(uniq), np.inf)
        np.minimum.at(min_age, inverse, np.asarray(batch.age_s, np.float64))
        min_key = np.full(len(uniq), np.inf)
        np.minimum.at(min_key, inverse, batch.order)
        min_key -= 0.5
        texts, tokens, exact, simhash, sources, bodies, times = zip(*_pick(state.day_items, uniq.tolist()), strict=True)
        metas: list[ItemMeta] = [(0, t, k, ()) for t, k in zip(times, min_key.tolist(), strict=True)]
        batch.texts = [*texts, *batch.texts]
        batch.sources = [*sources, *batch.sources]
        batch.bodies = [*bodies, *batch.bodies]
        batch.order = np.concatenate([min_key, batch.order])
        batch.tokens = np.concatenate([np.array(tokens, np.int32), batch.tokens])
        batch.relevance = np.concatenate([np.asarray(batch.relevance, np.float64)[first], batch.relevance])
        batch.age_s = np.concatenate([min_age, batch.age_s])
        batch.exact_keys = np.concatenate([np.array(exact, np.uint64), batch.exact_keys])
        batch.simhashes = np.concatenate([np.array(simhash, np.uint64), batch.simhashes])
        return metas


def _mark_superseded(state: _UserIndex, batch: CandidateBatch, rows: list[int],
                     marks: dict[str, SupersededTurn]) -> None:
    """A recalled turn whose memory was superseded says so, with the date and what replaced it, and
    ranks at half its relevance and below every turn of the current memory among the candidates."""
    hit = [j for j, row in enumerate(rows) if state.ids[row] in marks]
    if not hit:
        return
    relevance = np.array(batch.relevance, np.float64)
    texts, bodies, toks = list(batch.texts), list(batch.bodies), np.array(batch.tokens, np.int32)
    for j in hit:
        row = rows[j]
        mark = marks[state.ids[row]]
        current = [relevance[k] for k, r in enumerate(rows) if state.ids[r] in mark.current_sources]
        relevance[j] = min([relevance[j] * 0.5, *(0.99 * c for c in current)])
        texts[j] = f"[superseded on {date_label(mark.at_ms)[1:-1]} by: {mark.by}] {state.texts[row]}"
        toks[j] = count_line(texts[j])
        bodies[j] = fastpath.encode_item(state.sources[row], Category.MEMORIES, int(toks[j]), texts[j],
                                         int(state.roles[row]), int(state.timestamps[row]), (state.ids[row],))
    batch.relevance, batch.texts, batch.bodies, batch.tokens = relevance, texts, bodies, toks


def _index_knobs(r: Ranking) -> tuple[int, bool, int, int, float, bool]:
    """What a user's index is built with (EpisodicSource._load): its neighbour window, date headers,
    contextual vectors and stemming; the other knobs only weigh what it holds."""
    return max(r.neighbours, r.embed_context, 1), r.date_headers, r.embed_context, r.embed_context_chars, r.context_mix, r.stem


def _best_first(score: np.ndarray, most: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, their scores): the at most `most` rows of positive finite score, best first (ties by row)."""
    live = np.where(np.isfinite(score) & (score > 0), score, -1.0)
    order = fastpath.ranking_order(live)[:min(int(np.count_nonzero(live > 0)), most)]
    return order, score[order]


SNAPSHOT_VERSION = 1
SAVE_AT_CLOSE_S = 10.0  # at close, users' indexes are saved for at most this long (the rest rebuild from rows)
CLEAN_MARK = "CLEAN"  # written at close once every saved snapshot is current


def snapshot_dir(store) -> Path | None:
    """Where users' indexes are saved: beside a DuckDB file. None for an in-memory database and a
    shared PostgreSQL store (another replica may change a user's rows: each rebuilds from rows)."""
    path = getattr(getattr(store, "backend", store), "path", None)
    if not isinstance(path, str) or not path or path == ":memory:":
        return None
    return Path(path).with_suffix(".episodic")


def _open_snapshots(directory: Path | None) -> tuple[Path | None, OrderedDict[str, int]]:
    """(the directory, or None where it cannot be used; the snapshots a clean close left current, oldest
    saved first, with their sizes). After a crash (no mark) none is trusted: all are deleted. The mark
    goes at once: it is written again only by the next clean close."""
    if directory is None:
        return None, OrderedDict()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        mark = directory / CLEAN_MARK
        clean = mark.exists()
        mark.unlink(missing_ok=True)
        kept = []
        for path in directory.iterdir():
            if clean and path.suffix == ".snap":
                stat = path.stat()
                kept.append((stat.st_mtime_ns, path.name, stat.st_size))
            elif path.is_file():
                path.unlink(missing_ok=True)
        return directory, OrderedDict((name, size) for _, name, size in sorted(kept))
    except OSError:
        log.exception("episodic snapshots unavailable in %s", directory)
        return None, OrderedDict()


def _snapshot_name(key: tuple[str, str]) -> str:
    return hashlib.sha256("\0".join(key).encode()).hexdigest()[:40] + ".snap"


class _RankedCache:
    """Recent rankings (_best_first of _UserIndex.rank), each valid for the index it was made on (by
    its serial: a compacted or reloaded index is another one) as long as that index has as many turns
    (an index only grows). Read and written under EpisodicSource's lock (get() also as an unlocked peek)."""

    SIZE = 256  # at most ~10 KB each (600 rows): ~2.5 MB

    def __init__(self) -> None:
        self._entries: OrderedDict[tuple, tuple[int, tuple[np.ndarray, np.ndarray]]] = OrderedDict()

    def get(self, state: _UserIndex, memo: tuple) -> tuple[np.ndarray, np.ndarray] | None:
        entry = self._entries.get((state.serial, memo))
        if entry is None or entry[0] != len(state):
            return None
        return entry[1]

    def drop(self, state: _UserIndex) -> None:
        """Forget the rankings made on this index (it left the source: forgotten, evicted, replaced)."""
        for key in [k for k in self._entries if k[0] == state.serial]:
            del self._entries[key]

    def clear(self) -> None:
        self._entries.clear()

    def put(self, state: _UserIndex, memo: tuple, ranked: tuple[np.ndarray, np.ndarray]) -> None:
        key = (state.serial, memo)
        self._entries.pop(key, None)
        self._entries[key] = (len(state), ranked)
        while len(self._entries) > self.SIZE:
            self._entries.popitem(last=False)


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


def _pick(values: list, rows: list[int]) -> list:
    """[values[r] for r in rows], in one C call."""
    if len(rows) > 1:
        return list(itemgetter(*rows)(values))
    return [values[rows[0]]] if rows else []


def _dense_query(query: str, state: _UserIndex | None, r: Ranking) -> str:
    """The query as embedded: without the speakers' names and their "'s" when r.dense_query_names is
    off ("What did Ann's dog eat?" -> "What did dog eat?"; the speaker boost has the names)."""
    if r.dense_query_names or state is None or not state.name_words:
        return query
    out = names_pattern(state.name_words).sub("", query).strip()
    return out if _WORD_RE.search(out.lower()) else query  # only names: the query as asked


@lru_cache(maxsize=256)
def names_pattern(names: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile(r"\b(?:" + "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
                      + r")(?:'s)?\b\s*", re.I)


def _turn_meta(state: _UserIndex, rows: list[int], headers: list[ItemMeta], order: np.ndarray, j: int) -> ItemMeta:
    """Item metadata of the j-th candidate (day headers first, then turns), made only when asked for."""
    if j < len(headers):
        return headers[j]
    row = rows[j - len(headers)]
    return int(state.roles[row]), int(state.timestamps[row]), float(order[j]), (state.ids[row],)
