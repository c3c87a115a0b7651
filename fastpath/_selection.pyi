# Type stub of the compiled fastpath._selection (Cython); semantics in fastpath.reference.selection.
from collections.abc import Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

from fastpath.reference.selection import Selection as Selection

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
