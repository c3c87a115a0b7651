"""fastpath._textkeys (tokenize, FNV-1a, text keys, hash embedding, word-vector sums) agrees exactly
with fastpath.reference.textkeys, and both follow the spec."""

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


WORD_ALPHABET = st.sampled_from(list("abcdeXYZ' -,.\n1_éİ\u212a中"))  # \u212a (Kelvin) lowers to "k"
vocab_st = st.lists(st.text(st.sampled_from(list("abcdek'1é")), min_size=1, max_size=6), max_size=24, unique=True)


@FAST
@given(st.lists(st.text(WORD_ALPHABET, max_size=60), max_size=10), vocab_st, st.integers(1, 9), st.integers(0, 2**32 - 1))
def test_word_vector_sums_match_reference(texts, words, dim, seed):
    rng = np.random.default_rng(seed)
    # The texts' own space-separated words too, so apostrophes and case are met in matches, not only misses.
    words = list(dict.fromkeys([*words, *(w for t in texts for w in t.lower().split())]))
    index = {w: i for i, w in enumerate(words)}
    weighted = rng.standard_normal((len(words) + 1, dim)).astype(np.float32)
    got = fastpath.word_vector_sums(texts, fastpath.WordTable(index), weighted)
    assert same_floats(got, ref.word_vector_sums(texts, ref.WordTable(index), weighted))
    assert fastpath.WordTable(index).size == ref.WordTable(index).size


@IMPLS
def test_word_vector_sums_rules(impl):
    words = ["don't", "rock'n", "roll", "kelvin", "tea", "green", "ab1", "'ab", "ab'", "a''b", "é"]
    weighted = np.arange(len(words) * 3, dtype=np.float32).reshape(len(words), 3) + np.float32(0.1)
    table = impl.WordTable({w: i for i, w in enumerate(words)})
    assert table.size == 6  # words [a-z]+('[a-z]+)? can never match are left out
    out = impl.word_vector_sums(["Don't", "rock'n'roll", "\u212aELVIN", "Green TEA, green tea", "ab1 é 中文", ""],
                                table, weighted)
    assert out.shape == (6, 3) and out.dtype == np.float32
    assert same_floats(out[0], weighted[0]) and same_floats(out[2], weighted[3])
    assert same_floats(out[1], weighted[1] + weighted[2])  # "rock'n", then "roll"
    acc = np.zeros(3, np.float32)
    for row in (5, 4, 5, 4):  # in the order they occur, in float32
        acc += weighted[row]
    assert same_floats(out[3], acc)
    assert not out[4].any() and not out[5].any()
    with pytest.raises(ValueError, match="row number"):
        impl.WordTable({"tea": -1})
    with pytest.raises(ValueError, match="outside"):
        impl.word_vector_sums(["tea"], impl.WordTable({"tea": 70}), weighted)
    with pytest.raises(TypeError, match="float32"):
        impl.word_vector_sums(["tea"], table, weighted.astype(np.float64))
    with pytest.raises(TypeError):
        impl.word_vector_sums("tea", table, weighted)


def test_word_vector_sums_of_the_shipped_table_are_the_rows_numpy_sums():
    """On the shipped word vectors, each text's sum is bit for bit numpy's sum of its rows (what the
    static embedder computed before the compiled sums)."""
    import re

    from sidecar.index.word_vectors import default_vectors

    vectors = default_vectors()
    word = re.compile(r"[a-z]+(?:'[a-z]+)?")
    texts = ["I can't decide between the pottery class and the clarinet lessons this spring.",
             "Sure! Here are some tips for a road trip to Denver: check the tyres, pack snacks, plan stops. " * 5,
             "what did you recommend for my 5-year-old's birthday party?", "上下文 窗口", ""]
    got = fastpath.word_vector_sums(texts, vectors.table, vectors.weighted)
    for text, row in zip(texts, got, strict=True):
        found = [i for w in word.findall(text.lower()) if (i := vectors.index.get(w)) is not None]
        want = vectors.weighted[found].sum(axis=0) if found else np.zeros(vectors.dim, np.float32)
        assert same_floats(row, want)


TERM_ALPHABET = st.one_of(st.sampled_from(list("abcXYZ019''’ʼ -_.\n中ひカ\u3400\uf900\U00020001İÉßжЖ서울हूँกรุงເລ្ខ၁\u0301")),
                          st.characters(codec="utf-8"))


@FAST
@given(st.lists(st.text(TERM_ALPHABET, max_size=40), max_size=8))
def test_word_terms_match_reference(texts):
    def miss(word: str) -> str:  # every third word drops out, as a stopword does
        return "" if len(word) % 3 == 0 else word[::-1]

    fast_cache: dict[str, str] = {}
    ref_cache: dict[str, str] = {}
    for t in texts:
        assert fastpath.word_terms(t, fast_cache, miss) == ref.word_terms(t, ref_cache, miss)
    assert fast_cache == ref_cache


def test_word_terms_read_the_lexical_index_words():
    from fastpath.reference import scripts
    from sidecar.memory.episodic.terms import _WORD_RE

    assert scripts.term_word_re().pattern == _WORD_RE.pattern  # the index's own words


@IMPLS
def test_word_terms_rules(impl):
    cache = {"known": "K"}
    asked = []

    def miss(word: str) -> str:
        asked.append(word)
        return "" if word == "the" else word.upper()

    assert impl.word_terms("The known DON'T rock'n'roll x'1 中文 über", cache, miss) == [
        "K", "DON'T", "ROCK'N", "ROLL", "X", "1", "中", "文", "ÜBER"]
    assert "known" not in asked and cache["the"] == ""
    assert impl.word_terms("the THE", cache, miss) == [] and asked.count("the") == 1  # looked up once
    with pytest.raises(TypeError, match="text must be str"):
        impl.word_terms(b"bytes", {}, miss)
    with pytest.raises(TypeError, match="must return a str"):
        impl.word_terms("word", {}, lambda w: None)


@IMPLS
def test_word_terms_in_every_script(impl):
    """A word of a script with spaces is one term, accents and vowel signs in it; a CJK ideograph,
    kana or Hangul syllable is a term alone; a run of Thai (Lao, Myanmar, Khmer) gives its pairs."""
    def words(text: str) -> list[str]:
        return impl.word_terms(text, {}, lambda w: w)

    assert words("Meine Schwester wohnt in München, l'été à Paris") == [
        "meine", "schwester", "wohnt", "in", "münchen", "l'été", "à", "paris"]
    assert words("Сестра живёт в Новосибирске.") == ["сестра", "живёт", "в", "новосибирске"]
    assert words("Η αδελφή μου ζει στην Αθήνα") == ["η", "αδελφή", "μου", "ζει", "στην", "αθήνα"]
    assert words("أختي تعيش في القاهرة") == ["أختي", "تعيش", "في", "القاهرة"]
    assert words("मेरी बहन दिल्ली में रहती है।") == ["मेरी", "बहन", "दिल्ली", "में", "रहती", "है"]
    assert words("여동생은 부산에") == ["여", "동", "생", "은", "부", "산", "에"]
    assert words("กรุงเทพ ก") == ["กร", "รุ", "ุง", "งเ", "เท", "ทพ", "ก"]
    assert words("ok 😀 ¿qué? №5 ½") == ["ok", "qué", "5", "½"]
    # A typographic apostrophe inside a word is read as "'": "don’t" is the word "don't".
    assert words("I’m sure Ann’s dogs don’t bark, ‘she’ said") == ["i'm", "sure", "ann's", "dogs", "don't", "bark",
                                                                  "she", "said"]


@FAST
@given(st.text(st.sampled_from(list("aZ09+/_-=. \n:é")), max_size=60), st.integers(-1, 25))
def test_has_token_run_matches_reference(text, length):
    assert fastpath.has_token_run(text, length) == ref.has_token_run(text, length)


@IMPLS
def test_has_token_run_rules(impl):
    token = "aB3+/_-" * 3  # 21 token characters
    assert impl.has_token_run(token, 21) and not impl.has_token_run(token, 22)
    assert not impl.has_token_run(token[:10] + " " + token[:10], 11)
    assert not impl.has_token_run(token[:10] + "=" + token[:10], 11)  # "=" is padding, no token character
    assert not impl.has_token_run("é" * 30, 1) and impl.has_token_run("", 0)


NEEDLE_ALPHABET = st.sampled_from(list("abAB.:_-密码 \n"))


@FAST
@given(st.lists(st.text(NEEDLE_ALPHABET, min_size=1, max_size=5), max_size=12), st.lists(st.text(NEEDLE_ALPHABET, max_size=40) | st.text(max_size=20), max_size=6))
def test_needle_set_matches_reference(needles, texts):
    fast, plain = fastpath.NeedleSet(needles), ref.NeedleSet(needles)
    for t in texts:
        assert fast.found(t) == plain.found(t) == frozenset(n for n in needles if n in t)


@IMPLS
def test_needle_set_rules(impl):
    needles = impl.NeedleSet([".", "AKIA", "AK", "gh", "github_pat_", "密码", "ab"])
    assert needles.found("a github_pat_x. AKIA") == {".", "AKIA", "AK", "github_pat_"}
    assert needles.found("密码是 gh") == {"密码", "gh"} and needles.found("") == frozenset()
    assert needles.found("xxab") == {"ab"} and needles.found("a") == frozenset()  # at the very end; a part only
    with pytest.raises(TypeError, match="non-empty str"):
        impl.NeedleSet(["ok", ""])
    with pytest.raises(TypeError, match="text must be str"):
        needles.found(None)


def test_batches_longer_than_a_chunk_match_reference():
    # The compiled routines read a batch a chunk of characters at a time (the GIL let go for each):
    # texts across chunk ends, one text longer than a chunk, and empty ones come out as one at a time.
    rng = np.random.default_rng(7)
    words = ["tea", "green", "don't", "rock'n", "roll", "中文", "é", "kelvin", "x1", "The"]
    texts = [" ".join(rng.choice(words, size=int(rng.integers(0, 400)))) for _ in range(300)]
    texts += ["", " ".join(rng.choice(words, size=40_000)), "tea"]  # ~200k characters in one text
    assert sum(map(len, texts)) > 3 * 65_536
    for x, y in zip(fastpath.text_keys(texts), ref.text_keys(texts), strict=True):
        assert same(x, y)
    assert same_floats(fastpath.hash_embed(texts, 64), ref.hash_embed(texts, 64))
    table = {w: i for i, w in enumerate(["tea", "green", "don't", "rock'n", "roll", "kelvin", "the"])}
    weighted = rng.standard_normal((len(table), 5)).astype(np.float32)
    assert same_floats(fastpath.word_vector_sums(texts, fastpath.WordTable(table), weighted),
                       ref.word_vector_sums(texts, ref.WordTable(table), weighted))
    with pytest.raises(ValueError, match="outside"):  # a bad row met in a later chunk still raises
        fastpath.word_vector_sums([*texts, "roll"], fastpath.WordTable({"roll": 99}), weighted)
