"""Reference dense scores over int8 rows (episodic recall's turn vectors: a quarter of float32's memory)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fastpath.reference._common import _FLOAT_KINDS, _array, _f32

__all__ = ["QUERY_STEPS", "int8_dot"]

QUERY_STEPS = 32767


def int8_dot(codes: Any, scales: Any, query: Any) -> np.ndarray:
    """out[r] = f32(float(d_r) * scales[r] * qs), r over the rows of codes (int8, shape (n, dim)): the
    query (float32, finite) is scaled to int16, qs = max |query| / 32767 and qc[k] = round(query[k] /
    qs) (half to even, in double, clipped to +-32767), and d_r is the exact integer dot product of
    row r with qc (the two products in double, left to right). A zero query gives zeros. Returns
    float32 (n)."""
    q = _array("query", query, np.float32, _FLOAT_KINDS).tolist()
    dim = len(q)
    c = np.asarray(codes)
    if c.ndim != 2 or c.shape[1] != dim or c.dtype != np.int8:
        raise ValueError(f"codes must be an int8 array of shape (n, {dim}), got {c.dtype} {c.shape}")
    sc = _array("scales", scales, np.float32, _FLOAT_KINDS, c.shape[0]).tolist()
    if not all(math.isfinite(x) for x in q):
        raise ValueError("query must be finite")
    top = max((abs(x) for x in q), default=0.0)
    if top == 0.0:
        return np.zeros(len(sc), np.float32)
    qs = top / QUERY_STEPS
    qc = [max(-QUERY_STEPS, min(QUERY_STEPS, round(x / qs))) for x in q]
    out = [_f32(float(sum(a * b for a, b in zip(row, qc, strict=True))) * scale * qs)
           for row, scale in zip(c.tolist(), sc, strict=True)]
    return np.array(out, np.float32)
