# Type stub of the compiled fastpath._core (Cython); semantics in fastpath.reference.
from collections.abc import Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

from fastpath.reference import Selection as Selection

SELECTED: Final[int]
OVER_BUDGET: Final[int]
DUPLICATE: Final[int]
LOW_SCORE: Final[int]

def fuse_scores(
    relevance: npt.ArrayLike,
    age_s: npt.ArrayLike,
    priority: npt.ArrayLike,
    w_relevance: float,
    w_recency: float,
    w_priority: float,
    half_life_s: float,
) -> npt.NDArray[np.float64]: ...
def ranking_order(scores: npt.ArrayLike) -> npt.NDArray[np.int64]: ...
def dedup(
    order: npt.ArrayLike,
    exact_key: npt.ArrayLike,
    simhash: npt.ArrayLike,
    eligible: npt.ArrayLike,
    max_hamming: int,
) -> npt.NDArray[np.int64]: ...
def greedy_pack(
    order: npt.ArrayLike,
    tokens: npt.ArrayLike,
    category: npt.ArrayLike,
    eligible: npt.ArrayLike,
    cat_budget: npt.ArrayLike,
    total_budget: int,
    flow_unused: bool,
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]: ...
def select(
    relevance: npt.ArrayLike,
    age_s: npt.ArrayLike,
    priority: npt.ArrayLike,
    tokens: npt.ArrayLike,
    category: npt.ArrayLike,
    exact_key: npt.ArrayLike,
    simhash: npt.ArrayLike,
    cat_budget: npt.ArrayLike,
    total_budget: int,
    *,
    w_relevance: float = 1.0,
    w_recency: float = 1.0,
    w_priority: float = 1.0,
    half_life_s: float = 3600.0,
    max_hamming: int = 3,
    min_score: float = ...,
    flow_unused: bool = True,
) -> Selection: ...
def tokenize(text: str) -> list[str]: ...
def fnv1a64(data: bytes | bytearray | memoryview) -> int: ...
def text_keys(texts: Sequence[str]) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]: ...
def hash_embed(texts: Sequence[str], dim: int) -> npt.NDArray[np.float32]: ...
def encode_item(
    source: str,
    category: int,
    tokens: int,
    text: str,
    role: int,
    timestamp_ms: int,
    source_message_ids: Sequence[str],
) -> bytes: ...
def encode_section(kind: int, bodies: Sequence[bytes], scores: npt.ArrayLike, tokens: int) -> bytes: ...
def overlap_counts(a_sets: Sequence[npt.ArrayLike], b_sets: Sequence[npt.ArrayLike]) -> npt.NDArray[np.int32]: ...
def best_matches(
    cos: npt.ArrayLike,
    a_sets: Sequence[npt.ArrayLike],
    b_sets: Sequence[npt.ArrayLike],
    floor: float,
    min_shared: int,
    share_scale: float,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64], npt.NDArray[np.float64]]: ...
def fused_top_k(
    dense: npt.ArrayLike,
    lexical: npt.ArrayLike,
    prior: npt.ArrayLike,
    alive: npt.ArrayLike,
    w: float,
    half: float,
    k: int,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32], npt.NDArray[np.float32]]: ...
def hybrid_top_k(
    term_rows: Sequence[npt.ArrayLike],
    term_weights: Sequence[npt.ArrayLike],
    dense_rows: npt.ArrayLike,
    vectors: npt.ArrayLike,
    query: npt.ArrayLike | None,
    prior: npt.ArrayLike,
    alive: npt.ArrayLike,
    w: float,
    half: float,
    k: int,
    lexical_k: int,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32], npt.NDArray[np.float32], npt.NDArray[np.float32]]: ...
def window_bm25(
    term_rows: Sequence[npt.ArrayLike],
    term_tfs: Sequence[npt.ArrayLike],
    nbr: npt.ArrayLike,
    decay: npt.ArrayLike,
    norm: npt.ArrayLike,
    idf: npt.ArrayLike,
    groups: Sequence[npt.ArrayLike],
    k1: float,
) -> npt.NDArray[np.float32]: ...
def cooccurring_terms(
    term_rows: Sequence[npt.ArrayLike],
    term_ptr: npt.ArrayLike,
    term_at: npt.ArrayLike,
    term_df: npt.ArrayLike,
    n_rows: float,
    min_count: int,
    exclude: npt.ArrayLike,
    k: int,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]: ...
def feedback_terms(
    rows: npt.ArrayLike,
    term_ptr: npt.ArrayLike,
    term_at: npt.ArrayLike,
    term_df: npt.ArrayLike,
    n_rows: float,
    min_df: int,
    exclude: npt.ArrayLike,
    k: int,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]: ...
def arrange(
    picked: npt.ArrayLike,
    starts: npt.ArrayLike,
    slots: npt.ArrayLike,
    orders: Sequence[npt.ArrayLike | None],
    scores: npt.ArrayLike,
    tokens: npt.ArrayLike,
    n_slots: int,
) -> tuple[
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.float64],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
]: ...
def encode_dropped(
    sources: Sequence[str],
    categories: npt.ArrayLike,
    reasons: npt.ArrayLike,
    scores: npt.ArrayLike,
    tokens: npt.ArrayLike,
    kept_sources: Sequence[str],
) -> bytes: ...
def int8_dot(
    codes: npt.ArrayLike,
    scales: npt.ArrayLike,
    query: npt.ArrayLike,
) -> npt.NDArray[np.float32]: ...
