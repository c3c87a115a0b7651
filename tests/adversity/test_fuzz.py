"""Fuzzed input: hypothesis requests for EVERY RPC (empty, huge, odd unicode, NUL, RTL, zero-width,
any bytes, negative and enormous numbers, unknown enum values, other tenants' ids, long repeated
fields) and raw garbage on the port. The server must stay up and healthy, never answer INTERNAL,
and a seeded tenant's data may change only when a call that may change it succeeded."""

from __future__ import annotations

import random

import pytest

from .harness import METHODS, Fuzzer, Server, raw_garbage, raw_protobuf_garbage


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(str(tmp_path_factory.mktemp("fuzz") / "fuzz.duckdb"))
    yield s
    s.stop()


def test_fuzzed_requests_for_every_rpc(server):
    f = Fuzzer(server, seed=11)
    f.every_rpc_once()
    f.run_hypothesis(2000, per_example=8)
    report = f.report()
    print(report)
    assert set(f.by_method) == set(METHODS), "every RPC was fuzzed"
    assert report["fuzz_requests"] >= 2000
    assert server.alive() and server.healthy(), list(server.log)[-20:]
    assert report["fuzz_internal"] == 0, f.internal[:10]
    assert not server.internal_logs, server.internal_logs[:5]
    assert report["fuzz_changed_by_rejected"] == 0, f.changed_by_rejected[:3]
    assert report["fuzz_batches_checked"] > 100
    # Calls got past validation too, not only INVALID_ARGUMENT.
    assert report["fuzz_statuses"].get("OK", 0) > 50 and report["fuzz_statuses"].get("NOT_FOUND", 0) > 10


def test_raw_garbage_on_the_port(server):
    report = raw_garbage(server.address, random.Random(1), rounds=4)
    print(report)
    assert report["garbage_healthy_while_half_open"] == 1
    assert server.alive() and server.healthy()
    # The server still answers real calls after the garbage.
    Fuzzer(server, seed=12).every_rpc_once()
    assert server.alive() and server.healthy()


def test_undecodable_request_bytes_do_not_hurt_the_server(server):
    report = raw_protobuf_garbage(server.address, random.Random(2), per_method=2)
    print(report)
    assert set(report["protobuf_garbage_statuses"]) <= {"INVALID_ARGUMENT"}, report
    assert server.alive() and server.healthy()


def test_undecodable_request_bytes_answer_invalid_argument(server):
    report = raw_protobuf_garbage(server.address, random.Random(3), per_method=0)
    assert report["protobuf_garbage_internal"] == 0, report["protobuf_garbage_examples"]
