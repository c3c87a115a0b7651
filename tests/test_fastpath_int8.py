"""fastpath._int8 (int8_dot) agrees exactly with fastpath.reference.int8, and both follow the spec."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fastpath
from fastpath import reference as ref
from tests.fastpath_checks import FAST, IMPLS, same_floats


@FAST
@given(st.data())
def test_int8_dot_matches_reference(data):
    """Rows of any int8 values (-128 too), a dimension below, at and above a chunk, zero or tiny
    queries: compiled and reference agree bit for bit, and both are the float dot product within
    the int16 rounding of the query."""
    n = data.draw(st.integers(0, 6))
    dim = data.draw(st.sampled_from([1, 7, 16, 255, 256, 300]))
    codes = np.array(data.draw(st.lists(st.integers(-128, 127), min_size=n * dim, max_size=n * dim)),
                     np.int8).reshape(n, dim)
    scales = np.array(data.draw(st.lists(st.floats(0, 2, width=32), min_size=n, max_size=n)), np.float32)
    query = np.array(data.draw(st.lists(st.floats(-1e3, 1e3, width=32), min_size=dim, max_size=dim)), np.float32)
    got, want = fastpath.int8_dot(codes, scales, query), ref.int8_dot(codes, scales, query)
    assert same_floats(got, want) and got.dtype == np.float32 and got.shape == (n,)
    exact = (codes.astype(np.float64) @ query.astype(np.float64)) * scales
    bound = 128 * dim * float(np.abs(query).max(initial=0.0)) / 32767 * scales  # half a step per component
    assert np.all(np.abs(got - exact) <= bound + 1e-5 * np.abs(exact) + 1e-30)


@IMPLS
def test_int8_dot_rules(impl):
    codes, scales = np.array([[1, -2, 3], [0, 0, 0]], np.int8), np.array([0.5, 1.0], np.float32)
    assert impl.int8_dot(codes, scales, np.array([1.0, -1.0, -1.0], np.float32)).tolist() == [0.0, 0.0]
    # The query is scaled to int16 (1.0 -> 16384 of 32767 steps, a step ~6e-5): 2 - 2 comes out near 0.
    assert abs(impl.int8_dot(codes, scales, np.array([2.0, 1.0, 0.0], np.float32))[0]) < 1e-4
    assert impl.int8_dot(codes, scales, np.array([1.0, 1.0, 1.0], np.float32)).tolist() == [1.0, 0.0]
    assert impl.int8_dot(codes, scales, np.zeros(3, np.float32)).tolist() == [0.0, 0.0]
    assert impl.int8_dot(codes[:0], scales[:0], np.ones(3, np.float32)).shape == (0,)
    with pytest.raises(ValueError, match=r"codes must be an int8 array of shape \(n, 3\)"):
        impl.int8_dot(codes.astype(np.int16), scales, np.ones(3, np.float32))
    with pytest.raises(ValueError, match=r"shape \(n, 2\)"):
        impl.int8_dot(codes, scales, np.ones(2, np.float32))
    with pytest.raises(ValueError, match="scales must have length 2"):
        impl.int8_dot(codes, scales[:1], np.ones(3, np.float32))
    with pytest.raises(ValueError, match="query must be finite"):
        impl.int8_dot(codes, scales, np.array([1.0, np.nan, 0.0], np.float32))
