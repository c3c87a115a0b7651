import grpc

from sidecar import tokens
from sidecar.api import context_service_pb2 as pb
from tests.grpc_assert import expect_status


def _append(stub, scope, session_id, *texts, role=pb.ROLE_USER, **kw):
    return stub.AppendMessages(pb.AppendMessagesRequest(
        scope=scope, session_id=session_id, messages=[pb.NewMessage(role=role, text=t, **kw) for t in texts]))


def test_append_batch_with_token_counts(stub, scope, session_id):
    texts = ["查一下生产环境 payment-api 的错误日志", "Sure, checking the last 30 minutes.", "ok"]
    out = _append(stub, scope, session_id, *texts).messages
    assert [m.seq for m in out] == [1, 2, 3]
    assert [m.tokens for m in out] == [tokens.count_tokens(t) for t in texts]
    assert all(m.message_id and m.timestamp_ms > 0 for m in out)
    tool = stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=session_id, messages=[
        pb.NewMessage(role=pb.ROLE_TOOL, text="200 lines", tool_name="query_logs", tool_call_id="call-1",
                      client_timestamp_ms=1_700_000_000_000)])).messages[0]
    assert (tool.tool_name, tool.tool_call_id, tool.timestamp_ms, tool.seq) == (
        "query_logs", "call-1", 1_700_000_000_000, 4)


def test_list_newest_and_range(stub, scope, session_id):
    _append(stub, scope, session_id, *[f"m{i}" for i in range(1, 21)])
    newest = stub.ListMessages(pb.ListMessagesRequest(scope=scope, session_id=session_id, newest=3)).messages
    assert [m.text for m in newest] == ["m18", "m19", "m20"]
    rng = stub.ListMessages(pb.ListMessagesRequest(scope=scope, session_id=session_id, from_seq=5, to_seq=7)).messages
    assert [m.seq for m in rng] == [5, 6, 7]
    tail = stub.ListMessages(pb.ListMessagesRequest(scope=scope, session_id=session_id, from_seq=19)).messages
    assert [m.text for m in tail] == ["m19", "m20"]
    expect_status(lambda: stub.ListMessages(pb.ListMessagesRequest(scope=scope, session_id=session_id,
                                                                   from_seq=9, to_seq=3)),
                  grpc.StatusCode.INVALID_ARGUMENT, "from_seq")
    expect_status(lambda: stub.ListMessages(pb.ListMessagesRequest(scope=scope, session_id=session_id, newest=-1)),
                  grpc.StatusCode.INVALID_ARGUMENT, "newest")


def test_idempotency_key_stores_once(stub, scope, session_id):
    first = _append(stub, scope, session_id, "hello", idempotency_key="k1").messages[0]
    again = _append(stub, scope, session_id, "hello", idempotency_key="k1").messages[0]
    assert again.message_id == first.message_id
    assert len(stub.ListMessages(pb.ListMessagesRequest(scope=scope, session_id=session_id, newest=10)).messages) == 1


def test_bad_messages_are_rejected_atomically(stub, scope, session_id):
    _append(stub, scope, session_id, "kept")
    good = pb.NewMessage(role=pb.ROLE_USER, text="fine")
    cases = [
        (pb.NewMessage(role=pb.ROLE_UNSPECIFIED, text="x"), grpc.StatusCode.INVALID_ARGUMENT, "messages[1].role"),
        (pb.NewMessage(role=9, text="x"), grpc.StatusCode.INVALID_ARGUMENT, "messages[1].role"),
        (pb.NewMessage(role=pb.ROLE_USER, text="x" * (256 * 1024 + 1)), grpc.StatusCode.INVALID_ARGUMENT,
         "messages[1].text"),
        (pb.NewMessage(role=pb.ROLE_USER, text="x", tool_call_id="bad id"), grpc.StatusCode.INVALID_ARGUMENT,
         "messages[1].tool_call_id"),
        (pb.NewMessage(role=pb.ROLE_USER, text="x", client_timestamp_ms=-5), grpc.StatusCode.INVALID_ARGUMENT,
         "client_timestamp_ms"),
    ]
    for bad, code, fragment in cases:
        expect_status(lambda bad=bad: stub.AppendMessages(pb.AppendMessagesRequest(
            scope=scope, session_id=session_id, messages=[good, bad])), code, fragment)
    expect_status(lambda: stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=session_id)),
                  grpc.StatusCode.INVALID_ARGUMENT, "messages")
    expect_status(lambda: stub.AppendMessages(pb.AppendMessagesRequest(
        scope=scope, session_id=session_id, messages=[good] * 1001)), grpc.StatusCode.RESOURCE_EXHAUSTED, "1000")
    expect_status(lambda: stub.AppendMessages(pb.AppendMessagesRequest(
        scope=scope, session_id="missing", messages=[good])), grpc.StatusCode.NOT_FOUND, "session_id")
    # None of the rejected batches left anything behind.
    msgs = stub.ListMessages(pb.ListMessagesRequest(scope=scope, session_id=session_id, newest=100)).messages
    assert [m.text for m in msgs] == ["kept"]


def test_per_session_message_cap(shared_server, scope, session_id):
    sessions = shared_server.app.sessions
    old = sessions.max_session_messages
    sessions.max_session_messages = 5
    try:
        _append(shared_server.stub, scope, session_id, *["x"] * 4)
        expect_status(lambda: _append(shared_server.stub, scope, session_id, "a", "b"),
                      grpc.StatusCode.RESOURCE_EXHAUSTED, "cap is 5")
        _append(shared_server.stub, scope, session_id, "last one fits")
    finally:
        sessions.max_session_messages = old
