import grpc

from sidecar.api import context_service_pb2 as pb
from tests.grpc_assert import expect_status


def test_create_get_list_close(stub, scope):
    a = stub.CreateSession(pb.CreateSessionRequest(scope=scope, title="payment 5xx", metadata={"team": "sre"}))
    b = stub.CreateSession(pb.CreateSessionRequest(scope=scope, session_id="s-explicit"))
    assert a.status == pb.SESSION_STATUS_OPEN and a.metadata["team"] == "sre"
    assert b.session_id == "s-explicit"
    got = stub.GetSession(pb.GetSessionRequest(scope=scope, session_id=a.session_id))
    assert got.title == "payment 5xx" and got.created_at_ms > 0
    listed = stub.ListSessions(pb.ListSessionsRequest(scope=scope))
    assert {s.session_id for s in listed.sessions} == {a.session_id, "s-explicit"}
    closed = stub.CloseSession(pb.CloseSessionRequest(scope=scope, session_id=a.session_id))
    assert closed.status == pb.SESSION_STATUS_CLOSED and closed.closed_at_ms > 0
    assert [s.session_id for s in stub.ListSessions(pb.ListSessionsRequest(scope=scope)).sessions] == ["s-explicit"]
    assert len(stub.ListSessions(pb.ListSessionsRequest(scope=scope, include_closed=True)).sessions) == 2
    expect_status(lambda: stub.AppendMessages(pb.AppendMessagesRequest(
        scope=scope, session_id=a.session_id, messages=[pb.NewMessage(role=pb.ROLE_USER, text="hi")])),
        grpc.StatusCode.FAILED_PRECONDITION, "closed")


def test_list_sessions_pages(stub, scope):
    ids = {stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id for _ in range(5)}
    seen, token = [], ""
    while True:
        page = stub.ListSessions(pb.ListSessionsRequest(scope=scope, page_size=2, page_token=token))
        seen += [s.session_id for s in page.sessions]
        token = page.next_page_token
        if not token:
            break
    assert sorted(seen) == sorted(ids)
    expect_status(lambda: stub.ListSessions(pb.ListSessionsRequest(scope=scope, page_token="zz")),
                  grpc.StatusCode.INVALID_ARGUMENT, "page_token")


def test_session_errors(stub, scope):
    expect_status(lambda: stub.GetSession(pb.GetSessionRequest(scope=scope, session_id="nope")),
                  grpc.StatusCode.NOT_FOUND, "session_id")
    expect_status(lambda: stub.GetSession(pb.GetSessionRequest(session_id="x")),
                  grpc.StatusCode.INVALID_ARGUMENT, "scope")
    expect_status(lambda: stub.GetSession(pb.GetSessionRequest(scope=pb.Scope(tenant_id="t"), session_id="x")),
                  grpc.StatusCode.INVALID_ARGUMENT, "scope.user_id")
    expect_status(lambda: stub.CreateSession(pb.CreateSessionRequest(scope=scope, session_id="x" * 129)),
                  grpc.StatusCode.INVALID_ARGUMENT, "session_id", "128")
    expect_status(lambda: stub.CreateSession(pb.CreateSessionRequest(scope=scope, session_id="bad id")),
                  grpc.StatusCode.INVALID_ARGUMENT, "session_id")
    expect_status(lambda: stub.CreateSession(pb.CreateSessionRequest(
        scope=pb.Scope(tenant_id="t/../x", user_id="u"))), grpc.StatusCode.INVALID_ARGUMENT, "scope.tenant_id")
    stub.CreateSession(pb.CreateSessionRequest(scope=scope, session_id="dup"))
    expect_status(lambda: stub.CreateSession(pb.CreateSessionRequest(scope=scope, session_id="dup")),
                  grpc.StatusCode.ALREADY_EXISTS, "dup")


def test_same_session_id_never_crosses_users_or_tenants(stub, scope):
    other_user = pb.Scope(tenant_id=scope.tenant_id, user_id="bob")
    other_tenant = pb.Scope(tenant_id=scope.tenant_id + "-other", user_id=scope.user_id)
    for s, text in ((scope, "alice secret plan"), (other_user, "bob notes"), (other_tenant, "other tenant")):
        stub.CreateSession(pb.CreateSessionRequest(scope=s, session_id="same"))
        stub.AppendMessages(pb.AppendMessagesRequest(scope=s, session_id="same",
                                                     messages=[pb.NewMessage(role=pb.ROLE_USER, text=text)]))
        stub.UpsertFacts(pb.UpsertFactsRequest(scope=s, session_id="same", facts=[
            pb.FactInput(key="env", value=text, provenance=pb.PROVENANCE_USER_CONFIRMED)]))
    for s, text in ((scope, "alice secret plan"), (other_user, "bob notes"), (other_tenant, "other tenant")):
        msgs = stub.ListMessages(pb.ListMessagesRequest(scope=s, session_id="same", newest=10)).messages
        assert [m.text for m in msgs] == [text]
        state = stub.GetSessionState(pb.GetSessionStateRequest(scope=s, session_id="same"))
        assert [f.value for f in state.confirmed] == [text]
    # A session of another user is NOT_FOUND, never its data.
    stub.CreateSession(pb.CreateSessionRequest(scope=scope, session_id="alice-only"))
    err = expect_status(lambda: stub.ListMessages(pb.ListMessagesRequest(scope=other_user, session_id="alice-only")),
                        grpc.StatusCode.NOT_FOUND)
    assert "alice" not in err.details().replace("alice-only", "")
