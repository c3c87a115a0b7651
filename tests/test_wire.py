"""fastpath wire encoding: compiled and reference give the same bytes, and protobuf reads them as
the messages built the ordinary way."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastpath
from fastpath import reference as ref
from sidecar.api import context_service_pb2 as pb

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
int32 = st.integers(-(2**31), 2**31 - 1)
items_st = st.fixed_dictionaries({
    "source": st.text(max_size=40), "category": st.integers(0, 6) | int32, "tokens": int32,
    "text": st.text(max_size=300), "role": st.integers(0, 5) | int32,
    "timestamp_ms": st.integers(-(2**63), 2**63 - 1), "source_message_ids": st.lists(st.text(max_size=20), max_size=4),
})
scores_st = st.floats(allow_nan=False) | st.sampled_from([0.0, -0.0, 1e-46, 3.5e38, -1e300])


@FAST
@given(items_st)
def test_item_bytes_match_reference_and_protobuf(item):
    body = fastpath.encode_item(**item)
    assert body == ref.encode_item(**item)
    # Fields in number order, defaults left out: exactly what protobuf itself writes.
    assert body == pb.ContextItem(**item).SerializeToString()


@FAST
@given(st.lists(st.tuples(items_st, scores_st), max_size=12), st.integers(0, 10) | int32, int32)
def test_section_bytes_match_reference_and_parse_as_protobuf(entries, kind, tokens):
    bodies = [fastpath.encode_item(**item) for item, _ in entries]
    scores = np.array([score for _, score in entries], np.float64)
    wire = fastpath.encode_section(kind, bodies, scores, tokens)
    assert wire == ref.encode_section(kind, bodies, scores, tokens)
    expected = pb.BuildContextResponse(sections=[pb.Section(
        kind=kind, tokens=tokens, items=[pb.ContextItem(score=score, **item) for item, score in entries])])
    got = pb.BuildContextResponse.FromString(wire)
    # Compare through bytes: NaN-free, but -0.0 vs 0.0 and float32 rounding must match too.
    assert got.SerializeToString(deterministic=True) == expected.SerializeToString(deterministic=True)


dropped_st = st.fixed_dictionaries({
    "source": st.text(max_size=40), "category": st.integers(0, 6) | int32, "reason": st.integers(0, 8) | int32,
    "score": scores_st, "tokens": int32, "kept_source": st.text(max_size=40),
})


@FAST
@given(st.lists(dropped_st, max_size=12))
def test_dropped_bytes_match_reference_and_protobuf(entries):
    columns = {f: [e[f] for e in entries] for f in ("source", "category", "reason", "score", "tokens", "kept_source")}
    args = (columns["source"], np.array(columns["category"], np.int64), np.array(columns["reason"], np.int64),
            np.array(columns["score"], np.float64), np.array(columns["tokens"], np.int64), columns["kept_source"])
    wire = fastpath.encode_dropped(*args)
    assert wire == ref.encode_dropped(*args)
    expected = pb.BuildContextResponse(dropped=[pb.DroppedItem(**e) for e in entries])
    # Field order and float32 rounding as protobuf's own (bytes, so -0.0 vs 0.0 counts too).
    assert wire == expected.SerializeToString()


def test_sections_concatenate_after_the_other_fields():
    """The response is its small fields serialised by protobuf, then the sections' bytes."""
    head = pb.BuildContextResponse(total_tokens=7, stable_prefix_hash="abc").SerializeToString()
    body = fastpath.encode_item("message:1", 3, 2, "user: hi", 1, 5, ["m1"])
    wire = head + fastpath.encode_section(8, [body], [0.25], 2) + fastpath.encode_section(10, [], [], 0)
    resp = pb.BuildContextResponse.FromString(wire)
    assert resp.total_tokens == 7 and resp.stable_prefix_hash == "abc"
    assert [s.kind for s in resp.sections] == [8, 10]
    assert resp.sections[0].items[0].score == 0.25 and resp.sections[0].items[0].source_message_ids == ["m1"]


@pytest.mark.parametrize("impl", [fastpath, ref], ids=["compiled", "reference"])
def test_bad_input_is_refused(impl):
    with pytest.raises(ValueError, match="scores"):
        impl.encode_section(1, [b"", b""], [1.0], 0)
    with pytest.raises(TypeError):
        impl.encode_item("s", 1, 1, "t", 0, 0, [3])
    with pytest.raises(ValueError, match="kept_sources must have length 1"):
        impl.encode_dropped(["s"], [1], [1], [0.5], [3], [])
    with pytest.raises(TypeError, match=r"sources\[0\]"):
        impl.encode_dropped([b"s"], [1], [1], [0.5], [3], [""])
    assert math.isinf(pb.BuildContextResponse.FromString(
        impl.encode_section(1, [b""], [1e300], 0)).sections[0].items[0].score)
