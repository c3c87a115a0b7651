"""Vectors kept as int8 rows with a scale (sidecar.index.int8): each component within half a step,
zero rows stay zero, and a cosine read through fastpath.int8_dot is the float one within ~1e-3."""

from __future__ import annotations

import numpy as np
import pytest

import fastpath
from sidecar.index.int8 import quantize_rows


def test_rows_come_back_within_half_a_step():
    rng = np.random.default_rng(7)
    rows = rng.standard_normal((50, 384)).astype(np.float32)
    rows[3] = 0.0
    rows /= np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-9)
    codes, scales = quantize_rows(rows)
    assert codes.dtype == np.int8 and scales.dtype == np.float32 and codes.shape == rows.shape
    assert np.abs(codes).max() == 127 and not codes[3].any() and scales[3] == 0.0
    assert np.all(np.abs(codes * scales[:, None] - rows) <= scales[:, None] / 2 + 1e-7)
    q = rows[0]
    assert np.allclose(fastpath.int8_dot(codes, scales, q), rows @ q, atol=2e-3)
    assert quantize_rows(np.zeros((0, 8), np.float32))[0].shape == (0, 8)
    with pytest.raises(ValueError, match="rows must be 2-D"):
        quantize_rows(np.zeros(8, np.float32))
