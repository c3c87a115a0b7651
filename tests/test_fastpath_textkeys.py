"""fastpath._textkeys (tokenize, FNV-1a, text keys, hash embedding) agrees exactly with
fastpath.reference.textkeys, and both follow the spec."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fastpath
from fastpath import reference as ref
from tests.fastpath_checks import FAST, IMPLS, same, same_floats

TEXT_ALPHABET = st.one_of(
    st.sampled_from(list("abcXYZ019_ -,.!?\t\n'\"")),
    st.sampled_from(list("中文测试一下我们的上下文ひらがなカタカナーＡ１éÉßİΣσς\u0307\u00b2\u2167😀\U00020001\uf900\u3000")),
    st.characters(codec="utf-8"),
)
texts_st = st.lists(st.text(TEXT_ALPHABET, max_size=40), max_size=12)


@FAST
@given(texts_st)
def test_text_keys_match_reference(texts):
    for x, y in zip(fastpath.text_keys(texts), ref.text_keys(texts), strict=True):
        assert same(x, y)
    for t in texts:
        assert fastpath.tokenize(t) == ref.tokenize(t)


@FAST
@given(texts_st, st.sampled_from([1, 2, 7, 64, 256]))
def test_hash_embed_matches_reference(texts, dim):
    assert same_floats(fastpath.hash_embed(texts, dim), ref.hash_embed(texts, dim))


@FAST
@given(st.binary(max_size=64))
def test_fnv_matches_reference(data):
    assert fastpath.fnv1a64(data) == ref.fnv1a64(data)


@IMPLS
def test_tokenize_rules(impl):
    assert impl.tokenize("Hello, World_1 中文テスト") == ["hello", "world_1", "中", "文", "テ", "ス", "ト"]
    assert impl.tokenize("ab中cd  x²-ΑΣ") == ["ab", "中", "cd", "x²", "ας"]
    assert impl.tokenize("") == [] and impl.tokenize(" ,.! ") == []
    with pytest.raises(TypeError):
        impl.text_keys("not a list")


@IMPLS
def test_text_keys_rules(impl):
    exact, sim = impl.text_keys(["", "  Hello  WORLD ", "hello world", "solo", "a b c"])
    assert exact[0] == 0 and sim[0] == 0
    assert exact[1] == exact[2] == ref.fnv1a64(b"hello world")
    assert sim[1] == sim[2] == ref.fnv1a64(b"hello world")  # one bigram: simhash = its hash
    assert sim[3] == ref.fnv1a64(b"solo")  # single token: the token itself is the feature
    assert exact[4] == ref.fnv1a64(b"a b c")
    assert ref.fnv1a64(b"") == 0xCBF29CE484222325 and ref.fnv1a64(b"a") == 0xAF63DC4C8601EC8C


@IMPLS
def test_hash_embed_rules(impl):
    out = impl.hash_embed(["", "The quick brown fox", "上下文 窗口", "the QUICK brown fox!"], 64)
    assert out.shape == (4, 64) and out.dtype == np.float32
    assert not out[0].any()
    assert np.allclose(np.linalg.norm(out[1:], axis=1), 1.0, atol=1e-6)
    assert np.array_equal(out[1], out[3])  # case and punctuation do not matter
    with pytest.raises(ValueError, match="dim"):
        impl.hash_embed(["x"], 0)
