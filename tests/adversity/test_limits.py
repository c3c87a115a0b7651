"""Limits: per-request size limits, the per-session message cap, per-tenant rate limiting under a
flood (another tenant unaffected) and deadlines (a 1 ms BuildContext ends DEADLINE_EXCEEDED and the
server stays healthy)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from sidecar.api import context_service_pb2 as pb
from sidecar.services import limits
from tests.grpc_assert import expect_status

from .harness import CHANNEL_OPTIONS, Server, all_messages, code_of, health_ok


def _session(stub, scope) -> str:
    return stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id


def test_message_text_limit_is_256_kib_of_utf8(stub, scope):
    sid = _session(stub, scope)
    at_limit = "a" * limits.MAX_MESSAGE_TEXT
    stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=[
        pb.NewMessage(role=pb.ROLE_USER, text=at_limit)]))
    for text in ("a" * (limits.MAX_MESSAGE_TEXT + 1), "\u00e9" * (limits.MAX_MESSAGE_TEXT // 2 + 1)):
        expect_status(lambda text=text: stub.AppendMessages(pb.AppendMessagesRequest(
            scope=scope, session_id=sid, messages=[pb.NewMessage(role=pb.ROLE_USER, text="ok"),
                                                   pb.NewMessage(role=pb.ROLE_USER, text=text)])),
            grpc.StatusCode.INVALID_ARGUMENT, "messages[1].text", str(limits.MAX_MESSAGE_TEXT))
    # A batch over the item limit is RESOURCE_EXHAUSTED; neither rejected batch stored anything.
    expect_status(lambda: stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=[
        pb.NewMessage(role=pb.ROLE_USER, text="x")] * (limits.MAX_BATCH_MESSAGES + 1))),
        grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert len(all_messages(stub, scope, sid)) == 1


def test_a_40_mib_frame_is_refused_by_grpc(shared_server, scope):
    with grpc.insecure_channel(shared_server.address, options=CHANNEL_OPTIONS) as ch:
        from sidecar.api import context_service_pb2_grpc as pb_grpc

        big = pb_grpc.ContextServiceStub(ch)
        expect_status(lambda: big.IngestDocument(pb.IngestDocumentRequest(
            scope=pb.Scope(tenant_id=scope.tenant_id), doc_id="huge", text="x" * (40 * 1024 * 1024))),
            grpc.StatusCode.RESOURCE_EXHAUSTED)
        # The connection and the server are fine afterwards.
        assert not big.ListDocuments(pb.ListDocumentsRequest(scope=pb.Scope(tenant_id=scope.tenant_id))).documents
    assert health_ok(shared_server.address)


@pytest.mark.xfail(not hasattr(limits, "MAX_SESSION_MESSAGES"), strict=True,
                   reason="no per-session message cap: sidecar/services/limits.py has no MAX_SESSION_MESSAGES")
def test_per_session_message_cap(fresh_server):
    cap = getattr(limits, "MAX_SESSION_MESSAGES", None)
    assert cap is not None, "no MAX_SESSION_MESSAGES"
    app, stub = fresh_server.app, fresh_server.stub
    assert app.sessions.max_session_messages == cap, "the server runs with the documented cap"
    app.sessions.max_session_messages = cap = 1500  # the same check, at a size a fast test can fill
    scope = pb.Scope(tenant_id="cap", user_id="u")
    sid = _session(stub, scope)
    for n in (1000, cap - 1000 - 1):
        stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=[
            pb.NewMessage(role=pb.ROLE_USER, text="m")] * n))
    # A batch that would cross the cap is refused whole ...
    expect_status(lambda: stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=[
        pb.NewMessage(role=pb.ROLE_USER, text="a"), pb.NewMessage(role=pb.ROLE_USER, text="b")])),
        grpc.StatusCode.RESOURCE_EXHAUSTED, str(cap))
    assert stub.GetSession(pb.GetSessionRequest(scope=scope, session_id=sid)).message_count == cap - 1
    # ... one that reaches it exactly is fine, and then nothing more goes in.
    stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=[
        pb.NewMessage(role=pb.ROLE_USER, text="last")]))
    expect_status(lambda: stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=[
        pb.NewMessage(role=pb.ROLE_USER, text="one too many")])), grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert stub.GetSession(pb.GetSessionRequest(scope=scope, session_id=sid)).message_count == cap
    # Another session of the same user is not affected.
    stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=_session(stub, scope), messages=[
        pb.NewMessage(role=pb.ROLE_USER, text="fine")]))


def test_flooding_tenant_gets_resource_exhausted_and_others_are_unaffected(tmp_path):
    server = Server(str(tmp_path / "rate.duckdb"), extra=["--rate-per-tenant", "10"])
    try:
        flood, calm = pb.Scope(tenant_id="flood", user_id="u"), pb.Scope(tenant_id="calm", user_id="u")
        stubs = [server.new_stub() for _ in range(8)]
        codes: dict[str, int] = {}
        calm_codes: dict[str, int] = {}
        lock = threading.Lock()
        calm_done = threading.Event()
        start = time.monotonic()

        def hammer(i: int) -> None:
            # The flood lasts at least 2 s and until the calm tenant has made all its calls, so a slow
            # machine cannot end the flood before the calm tenant had its turn.
            while time.monotonic() < start + 2.0 or not calm_done.is_set():
                try:
                    stubs[i].ListSessions(pb.ListSessionsRequest(scope=flood), timeout=10)
                    code = "OK"
                except grpc.RpcError as e:
                    code = code_of(e)
                with lock:
                    codes[code] = codes.get(code, 0) + 1

        def steady() -> None:
            stub = server.new_stub()
            try:
                for _ in range(5):
                    try:
                        stub.ListSessions(pb.ListSessionsRequest(scope=calm), timeout=10)
                        code = "OK"
                    except grpc.RpcError as e:
                        code = code_of(e)
                    calm_codes[code] = calm_codes.get(code, 0) + 1
                    time.sleep(0.2)  # 5/s, well under the limit
            finally:
                calm_done.set()

        with ThreadPoolExecutor(9) as ex:
            futures = [ex.submit(hammer, i) for i in range(8)] + [ex.submit(steady)]
            for f in futures:
                f.result()
        elapsed = time.monotonic() - start
        print("flood", codes, "calm", calm_codes, f"{elapsed:.2f} s")
        assert codes.get("RESOURCE_EXHAUSTED", 0) > 0 and codes.get("OK", 0) > 0, codes
        assert set(codes) <= {"OK", "RESOURCE_EXHAUSTED"}, codes
        # 10/s over the flood plus a burst of 20: the limiter let through about what it promises. (A low
        # rate, so even a slow, busy machine floods past it.)
        assert codes["OK"] <= 10 * elapsed + 20 + 10, (codes, elapsed)
        assert calm_codes == {"OK": 5}, calm_codes
        assert server.alive() and server.healthy()
    finally:
        server.stop()


def test_1ms_deadline_ends_cleanly_and_the_server_stays_healthy(shared_server, scope):
    stub = shared_server.stub
    sid = _session(stub, scope)
    stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=[
        pb.NewMessage(role=pb.ROLE_USER if i % 2 == 0 else pb.ROLE_ASSISTANT,
                      text=f"restart the payment api {i} " * 40) for i in range(400)]))
    req = pb.BuildContextRequest(scope=scope, session_id=sid, query="payment api restart", render=pb.RENDER_MODE_TEXT,
                                 debug=True)
    codes: dict[str, int] = {}
    for i in range(30):
        req.query = f"payment api restart number {i}"
        try:
            stub.BuildContext(req, timeout=0.001)
            code = "OK"  # it may genuinely finish within 1 ms
        except grpc.RpcError as e:
            code = code_of(e)
        codes[code] = codes.get(code, 0) + 1
    assert set(codes) <= {"OK", "DEADLINE_EXCEEDED"} and codes.get("DEADLINE_EXCEEDED", 0) >= 1, codes
    assert stub.BuildContext(req, timeout=10).total_tokens > 0
    assert health_ok(shared_server.address)
