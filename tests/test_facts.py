import grpc

from sidecar.api import context_service_pb2 as pb
from tests.grpc_assert import expect_status


def _upsert(stub, scope, session_id, *facts):
    return stub.UpsertFacts(pb.UpsertFactsRequest(scope=scope, session_id=session_id, facts=[
        pb.FactInput(key=k, value=v, provenance=p, source=s) for k, v, p, s in facts])).facts


def _state(stub, scope, session_id):
    return stub.GetSessionState(pb.GetSessionStateRequest(scope=scope, session_id=session_id))


def test_inferred_fact_is_a_candidate_until_confirmed(stub, scope, session_id):
    _upsert(stub, scope, session_id, ("env", "production", pb.PROVENANCE_USER_CONFIRMED, "msg-1"),
            ("service", "payment-api", pb.PROVENANCE_MODEL_INFERRED, "msg-2"))
    state = _state(stub, scope, session_id)
    assert {f.key: f.value for f in state.confirmed} == {"env": "production"}
    assert [(f.key, f.status) for f in state.candidates] == [("service", pb.FACT_STATUS_CANDIDATE)]
    before = state.state_hash

    confirmed = stub.ConfirmFact(pb.ConfirmFactRequest(scope=scope, session_id=session_id, key="service",
                                                       confirmed_by=pb.PROVENANCE_USER_CONFIRMED, source="msg-3"))
    assert confirmed.status == pb.FACT_STATUS_CONFIRMED and confirmed.source == "msg-3"
    state = _state(stub, scope, session_id)
    assert {f.key: f.value for f in state.confirmed} == {"env": "production", "service": "payment-api"}
    assert not state.candidates and state.state_hash != before

    history = stub.GetFactHistory(pb.GetFactHistoryRequest(scope=scope, session_id=session_id, key="service"))
    assert [(c.action, c.fact.status, c.fact.provenance) for c in history.changes] == [
        ("upsert", pb.FACT_STATUS_CANDIDATE, pb.PROVENANCE_MODEL_INFERRED),
        ("confirm", pb.FACT_STATUS_CONFIRMED, pb.PROVENANCE_USER_CONFIRMED)]


def test_inferred_guess_never_replaces_confirmed_value(stub, scope, session_id):
    _upsert(stub, scope, session_id, ("service", "payment-api", pb.PROVENANCE_TOOL_VERIFIED, "tool-1"))
    _upsert(stub, scope, session_id, ("service", "order-api", pb.PROVENANCE_MODEL_INFERRED, "msg-9"))
    state = _state(stub, scope, session_id)
    assert [f.value for f in state.confirmed] == ["payment-api"]
    assert [f.value for f in state.candidates] == ["order-api"]
    stub.RejectFact(pb.RejectFactRequest(scope=scope, session_id=session_id, key="service", reason="wrong guess"))
    state = _state(stub, scope, session_id)
    assert [f.value for f in state.confirmed] == ["payment-api"] and not state.candidates
    changes = stub.GetFactHistory(pb.GetFactHistoryRequest(scope=scope, session_id=session_id, key="service")).changes
    assert [c.action for c in changes] == ["upsert", "upsert", "reject"]
    assert changes[-1].reason == "wrong guess" and changes[-1].fact.status == pb.FACT_STATUS_REJECTED


def test_changing_a_fact_keeps_history(stub, scope, session_id):
    for value in ("staging", "production"):
        _upsert(stub, scope, session_id, ("env", value, pb.PROVENANCE_USER_CONFIRMED, ""))
    state = _state(stub, scope, session_id)
    assert [(f.value, f.version) for f in state.confirmed] == [("production", 2)]
    changes = stub.GetFactHistory(pb.GetFactHistoryRequest(scope=scope, session_id=session_id, key="env")).changes
    assert [c.fact.value for c in changes] == ["staging", "production"]


def test_fact_errors(stub, scope, session_id):
    expect_status(lambda: _upsert(stub, scope, session_id, ("env", "x", pb.PROVENANCE_UNSPECIFIED, "")),
                  grpc.StatusCode.INVALID_ARGUMENT, "facts[0].provenance")
    expect_status(lambda: _upsert(stub, scope, session_id, ("", "x", pb.PROVENANCE_USER_CONFIRMED, "")),
                  grpc.StatusCode.INVALID_ARGUMENT, "facts[0].key")
    expect_status(lambda: _upsert(stub, scope, session_id, ("k", "v" * 9000, pb.PROVENANCE_USER_CONFIRMED, "")),
                  grpc.StatusCode.INVALID_ARGUMENT, "facts[0].value")
    expect_status(lambda: stub.ConfirmFact(pb.ConfirmFactRequest(
        scope=scope, session_id=session_id, key="nope", confirmed_by=pb.PROVENANCE_USER_CONFIRMED)),
        grpc.StatusCode.NOT_FOUND, "nope")
    expect_status(lambda: stub.ConfirmFact(pb.ConfirmFactRequest(
        scope=scope, session_id=session_id, key="k", confirmed_by=pb.PROVENANCE_MODEL_INFERRED)),
        grpc.StatusCode.INVALID_ARGUMENT, "confirmed_by")
    expect_status(lambda: stub.GetFactHistory(pb.GetFactHistoryRequest(scope=scope, session_id=session_id, key="q")),
                  grpc.StatusCode.NOT_FOUND, "q")
    assert not _state(stub, scope, session_id).confirmed
