# Type stub of the compiled fastpath._ranking (Cython); semantics in fastpath.reference.ranking.
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

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
def newer_first(
    postings: Sequence[npt.ArrayLike],
    n_rows: int,
    rows: npt.ArrayLike,
    when: npt.ArrayLike,
    who: npt.ArrayLike,
    scores: npt.ArrayLike,
    cover_min: float,
    score_min: float,
) -> npt.NDArray[np.float64]: ...
