"""Shared by the fastpath agreement tests (tests/test_fastpath_*.py): both implementations as a
parameter, the hypothesis profile, and exact array comparisons."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

import fastpath
from fastpath import reference as ref

IMPLS = pytest.mark.parametrize("impl", [fastpath, ref], ids=["compiled", "reference"])
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def same_floats(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit-identical (so 0.0 != -0.0), same shape and dtype."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bool(np.array_equal(a.view(np.uint8), b.view(np.uint8)))


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b))
