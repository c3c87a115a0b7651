"""BuildContext on the event loop reads a session's cached view while AppendMessages and
UpsertFacts, on pool threads, change it: every read must see whole lists and dicts, never ones
half-changed (once an INTERNAL in a 30-minute soak: "exact_key must have length 66, got 63")."""

from __future__ import annotations

import sys
import threading

from sidecar.api import context_service_pb2 as pb


def test_build_context_during_writes_sees_whole_views(fresh_server):
    stub, scope = fresh_server.stub, pb.Scope(tenant_id="t", user_id="u")
    sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
    texts: dict[str, str] = {}
    stop = threading.Event()
    failures: list[BaseException] = []

    def writer() -> None:
        i = 0
        try:
            while not stop.is_set():
                out = stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=[
                    pb.NewMessage(role=pb.ROLE_USER, text=f"turn {i} about the payment service " * (1 + i % 5))
                    for _ in range(3)]))
                texts.update({f"message:{m.message_id}": m.text for m in out.messages})
                i += 1
        except BaseException as e:  # noqa: BLE001 - reported by the test below
            failures.append(e)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: a torn read shows up quickly
    def facts() -> None:
        i = 0
        try:
            while not stop.is_set():  # new keys grow the confirmed dict that BuildContext iterates
                stub.UpsertFacts(pb.UpsertFactsRequest(scope=scope, session_id=sid, facts=[
                    pb.FactInput(key=f"service{i}", value="payment-api", provenance=pb.PROVENANCE_USER_CONFIRMED)]))
                i += 1
        except BaseException as e:  # noqa: BLE001 - reported by the test below
            failures.append(e)

    threads = [threading.Thread(target=writer) for _ in range(2)] + [threading.Thread(target=facts)]
    try:
        for t in threads:
            t.start()
        for _ in range(300):
            resp = stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=sid, query="payment",
                                                            budget=pb.Budget(session_state=20_000, max_input=60_000)))
            items = next((s.items for s in resp.sections if s.kind == pb.SECTION_KIND_RECENT_MESSAGES), [])
            for it in items:  # each item is the message its source names
                assert it.source not in texts or it.text.endswith(texts[it.source]), (it.source, it.text)
    finally:
        stop.set()
        for t in threads:
            t.join()
        sys.setswitchinterval(old)
    assert not failures, failures[:1]
