"""Input validation shared by the reference twins (mirrors the checks of the compiled wrappers;
not part of the algorithms), and the float32 rounding step of the float32 kernels."""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

MASK64 = (1 << 64) - 1

_FLOAT_KINDS = "biuf"
_INT_KINDS = "biu"


def _array(name: str, x: Any, dtype: type, kinds: str, n: int | None = None) -> np.ndarray:
    """Return ``x`` as a contiguous 1-D array of ``dtype``, or raise ValueError naming ``name``."""
    a = np.asarray(x)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
    if n is not None and a.shape[0] != n:
        raise ValueError(f"{name} must have length {n}, got {a.shape[0]}")
    if a.dtype.kind not in kinds and a.size:  # an empty list arrives as float64; let it through
        raise ValueError(f"{name} has unsupported dtype {a.dtype}")
    target = np.dtype(dtype)
    if a.dtype != target:
        # Narrowing integer casts would wrap silently; refuse values that do not fit.
        if target.kind == "i" and a.size and not np.can_cast(a.dtype, target):
            info = np.iinfo(target)
            if a.min() < info.min or a.max() > info.max:
                raise ValueError(f"{name} has values outside the range of {target}")
        a = a.astype(target)
    return np.ascontiguousarray(a)


def _int(name: str, x: Any) -> int:
    try:
        return int(x.__index__())
    except (AttributeError, TypeError):
        raise ValueError(f"{name} must be an integer, got {x!r}") from None


def _texts(texts: Sequence[str], name: str = "texts") -> list[str]:
    if isinstance(texts, str):
        raise TypeError(f"{name} must be a sequence of str, not a single str")
    out = list(texts)
    for k, t in enumerate(out):
        if not isinstance(t, str):
            raise TypeError(f"{name}[{k}] must be str, got {type(t).__name__}")
    return out


def _rows(name: str, x: Any, n: int) -> list[int]:
    rows = _array(name, x, np.int64, _INT_KINDS).tolist()
    for r in rows:
        if not 0 <= r < n:
            raise ValueError(f"{name} holds row {r}, outside 0-{n - 1}")
    return rows


def _f32(x: float) -> float:
    """x rounded to the nearest float32. One IEEE float32 operation is exactly the double result
    rounded once to float32 (double has more than 2 * 24 + 2 bits), so chains of _f32 steps give
    what compiled float32 code gives."""
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:  # struct rounds first and refuses only what rounds to infinity
        return math.copysign(math.inf, x)
