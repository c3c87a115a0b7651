"""Static word vectors: word-level meaning for the default profile without a model at run time.

A table of the ~21.7k whole English words in all-MiniLM-L6-v2's vocabulary, each embedded once on
its own through the model, centred (the shared direction every word has in common says nothing),
projected on its 128 principal axes and stored as int8 (sidecar/index/word_vectors.npz, 2.7 MB,
shipped with the package and rebuilt by `python -m sidecar.index.word_vectors` with the `model`
extra installed). The vocabulary is in the model's frequency order, so a word's rank gives its
weight in a text (log(1 + rank): "the" counts little, "pottery" much).

Two uses, both in episodic recall: a text's vector (the weighted sum of its words' vectors) in
StaticEmbedder, and the words of a user's own vocabulary nearest a query's words ("married" ->
husband, wife, wedding), which widen the lexical query where the user said it in other words.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

import fastpath

TABLE = Path(__file__).resolve().with_suffix(".npz")  # next to this module, shipped with the package
DIM = 128


def _to_unit_rows(out: np.ndarray) -> np.ndarray:
    """Scale each non-zero row to length 1, in place (an all-zero row stays zero)."""
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    np.divide(out, norms, out=out, where=norms > 0)
    return out


class WordVectors:
    def __init__(self, words: Sequence[str], vectors: np.ndarray) -> None:
        vecs = vectors.astype(np.float32)
        vecs /= np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-9)
        self.words = list(words)
        self.index = {w: i for i, w in enumerate(self.words)}
        self.vectors = vecs  # unit rows, in the model's frequency order
        self.weight = np.log1p(np.arange(1, len(words) + 1, dtype=np.float32))  # by frequency rank
        self.weighted = vecs * self.weight[:, None]  # each row times its weight: a text's vector is a sum of these
        self.table = fastpath.WordTable(self.index)
        self.dim = vecs.shape[1]

    @classmethod
    def load(cls, path: Path = TABLE) -> WordVectors:
        with np.load(path) as z:
            return cls(str(z["words"]).split("\n"), z["vectors"])

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """float32[n, dim]: each text's known words ([a-z]+('[a-z]+)? of the lowercased text: "don't" is
        one word, not in the table), weighted by rank, summed and normalised (zero when it has none: a
        text in another script or of unknown words only)."""
        if len(texts) == 1:  # a query: the batch path's numpy calls cost more than the sum
            return self.embed_one(texts[0])[None, :]
        return _to_unit_rows(fastpath.word_vector_sums(texts, self.table, self.weighted))

    def embed_one(self, text: str) -> np.ndarray:
        """float32[dim]: embed([text])[0], in two numpy calls."""
        v = fastpath.word_vector_sums([text], self.table, self.weighted)[0]
        norm = float(np.sqrt(v @ v))
        return v / np.float32(norm) if norm > 0 else v

    def by_stem(self, stem) -> tuple[dict[str, int], np.ndarray]:
        """(stem -> row, unit rows): each stem's words averaged ("paint", "painting", "painted" ->
        one row), so terms as the lexical index keeps them can be compared."""
        groups: dict[str, list[int]] = {}
        for i, word in enumerate(self.words):
            groups.setdefault(stem(word), []).append(i)
        keys = list(groups)
        mat = np.stack([self.vectors[groups[k]].mean(axis=0) for k in keys])
        mat /= np.maximum(np.linalg.norm(mat, axis=1, keepdims=True), 1e-9)
        return {k: i for i, k in enumerate(keys)}, mat.astype(np.float32)


@functools.cache
def default_vectors() -> WordVectors:
    return WordVectors.load()


class StaticEmbedder:
    """The default profile's embedder of past turns: the static word vectors (meaning) joined with
    the hashed n-grams (spelling, and any script the word table lacks), their cosines summed with
    weights STATIC_SHARE and 1 - STATIC_SHARE. Tens of microseconds per text, no model."""

    name = "static-words-128+hash-256"
    STATIC_SHARE = 0.7
    HASH_DIM = 256

    def __init__(self, vectors: WordVectors | None = None) -> None:
        self.vectors = vectors or default_vectors()
        self.dim = self.vectors.dim + self.HASH_DIM

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        if len(texts) == 1:  # a query (see WordVectors.embed)
            return self._embed_one(texts[0])
        words = self.vectors.embed(texts) * np.float32(self.STATIC_SHARE ** 0.5)
        hashed = fastpath.hash_embed(list(texts), self.HASH_DIM) * np.float32((1.0 - self.STATIC_SHARE) ** 0.5)
        return _to_unit_rows(np.concatenate([words, hashed], axis=1))  # no known word: the hash alone

    def _embed_one(self, text: str) -> np.ndarray:
        """embed([text]): both parts are unit (or zero) rows, so the joined row's length is known."""
        out = np.empty((1, self.dim), np.float32)
        d = self.vectors.dim
        share = self.STATIC_SHARE
        words = self.vectors.embed_one(text)
        hashed = fastpath.hash_embed([text], self.HASH_DIM)[0]
        has_words, has_hash = bool(words.any()), bool(hashed.any())
        norm = ((share if has_words else 0.0) + ((1.0 - share) if has_hash else 0.0)) ** 0.5
        if norm == 0:
            out[:] = 0.0
            return out
        np.multiply(words, np.float32(share ** 0.5 / norm), out=out[0, :d])
        np.multiply(hashed, np.float32((1.0 - share) ** 0.5 / norm), out=out[0, d:])
        return out


def distill(path: Path = TABLE, dim: int = DIM) -> int:
    """Rebuild the table from the local model (the `model` extra); returns the number of words."""
    from sidecar.index.embedders import MiniLMEmbedder

    model = MiniLMEmbedder(threads=os.cpu_count())._model
    vocab = model.tokenizer.get_vocab()
    words = sorted((w for w in vocab if re.fullmatch(r"[a-z]{2,}", w)), key=vocab.__getitem__)
    vecs = np.asarray(model.encode(words, batch_size=512, normalize_embeddings=False, show_progress_bar=False,
                                   convert_to_numpy=True), np.float64)
    vecs -= vecs.mean(axis=0)
    _, _, axes = np.linalg.svd(vecs, full_matrices=False)
    vecs = vecs @ axes[:dim].T
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    quantised = np.round(vecs * (127.0 / np.abs(vecs).max(axis=1, keepdims=True))).astype(np.int8)
    np.savez_compressed(path, words=np.array("\n".join(words)), vectors=quantised)
    return len(words)


if __name__ == "__main__":
    print(f"{distill()} words written to {TABLE}")
