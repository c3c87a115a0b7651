"""Reference wire encoding: ContextItem, Section and DroppedItem entries straight to protobuf bytes.

BuildContext answers with ~150 items per call; building them as protobuf objects costs more than
choosing them. So items are encoded straight to protobuf wire bytes (proto3 rules: a field equal
to its default is left out; varints little-endian base 128; a negative int is its 64-bit two's
complement, 10 bytes). Field numbers are those of context_service.proto:

* ``encode_item``: a ``ContextItem`` without its score, fields in number order: source (1,
  string), category (2), tokens (4), text (5), role (6), timestamp_ms (7), each source message
  id (8, repeated string).
* ``encode_section``: one ``sections`` entry (field 1) of ``BuildContextResponse``: the tag, the
  length, then the ``Section``: kind (1), each item (2) as its body followed by its score (3,
  float32, rounded to nearest, left out when its bits are all zero), tokens (3).
* ``encode_dropped``: ``dropped`` entries (field 7) of ``BuildContextResponse``, each a
  ``DroppedItem``: source (1), category (2), reason (3), score (4, float32 as above), tokens (5),
  kept_source (6).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from fastpath.reference._common import _FLOAT_KINDS, _INT_KINDS, MASK64, _array, _texts

__all__ = ["encode_item", "encode_section", "encode_dropped"]


def _varint(value: int) -> bytes:
    value &= MASK64  # negative ints are sent as their 64-bit two's complement
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _int_field(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value) if value else b""


def _str_field(number: int, value: str) -> bytes:
    return _len_field(number, value.encode("utf-8")) if value else b""


def _float_field(number: int, value: float) -> bytes:
    """A float32 field: rounded to nearest, left out when its bits are all zero."""
    try:
        packed = struct.pack("<f", value)
    except OverflowError:  # beyond float32: C's cast gives infinity, so does this
        packed = struct.pack("<f", math.copysign(math.inf, value))
    return _varint(number << 3 | 5) + packed if packed != bytes(4) else b""


def encode_item(source: str, category: int, tokens: int, text: str, role: int, timestamp_ms: int,
                source_message_ids: Sequence[str]) -> bytes:
    """Wire bytes of a ContextItem without its score (see the module docstring)."""
    for mid in source_message_ids:
        if not isinstance(mid, str):
            raise TypeError(f"source_message_ids holds a {type(mid).__name__}, not str")
    return b"".join([
        _str_field(1, source), _int_field(2, category), _int_field(4, tokens), _str_field(5, text),
        _int_field(6, role), _int_field(7, timestamp_ms),
        *(_len_field(8, mid.encode("utf-8")) for mid in source_message_ids),
    ])


def encode_section(kind: int, bodies: Sequence[bytes], scores: Any, tokens: int) -> bytes:
    """Wire bytes of one BuildContextResponse.sections entry: tag, length, Section."""
    score_list = _array("scores", scores, np.float64, _FLOAT_KINDS, len(bodies)).tolist()
    parts = [_int_field(1, kind)]
    for body, score in zip(bodies, score_list, strict=True):
        parts.append(_len_field(2, bytes(body) + _float_field(3, score)))
    parts.append(_int_field(3, tokens))
    return _len_field(1, b"".join(parts))


def encode_dropped(sources: Sequence[str], categories: Any, reasons: Any, scores: Any, tokens: Any,
                   kept_sources: Sequence[str]) -> bytes:
    """Wire bytes of BuildContextResponse.dropped entries, one per index (see the module docstring)."""
    src, kept = _texts(sources, "sources"), _texts(kept_sources, "kept_sources")
    n = len(src)
    if len(kept) != n:
        raise ValueError(f"kept_sources must have length {n}, got {len(kept)}")
    cat = _array("categories", categories, np.int64, _INT_KINDS, n).tolist()
    rea = _array("reasons", reasons, np.int64, _INT_KINDS, n).tolist()
    tok = _array("tokens", tokens, np.int64, _INT_KINDS, n).tolist()
    sc = _array("scores", scores, np.float64, _FLOAT_KINDS, n).tolist()
    return b"".join(_len_field(7, b"".join([_str_field(1, src[k]), _int_field(2, cat[k]), _int_field(3, rea[k]),
                                            _float_field(4, sc[k]), _int_field(5, tok[k]), _str_field(6, kept[k])]))
                    for k in range(n))
