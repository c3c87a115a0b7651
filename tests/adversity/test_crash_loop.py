"""Crash loops: writes with idempotency keys against a sidecar subprocess that is kill -9'd at
random moments, 3 cycles (bench/adversity.py runs 20). After every restart each acknowledged
write is present exactly once, no batch is torn, the memory and knowledge indexes agree with the
rows, and every queued job finishes."""

from __future__ import annotations

from .harness import CrashLoop


def test_kill9_loop_keeps_every_acknowledged_write_exactly_once(tmp_path):
    report = CrashLoop(str(tmp_path / "crash.duckdb"), seed=7, threads=4, up_s=(0.5, 1.2),
                       early_kill_p=0.3).run(3)
    print({k: v for k, v in report.items() if k != "problems"})
    assert report["crash_cycles"] == 3
    assert report["acked_writes"] > 50, report  # the load really ran
    assert report["found_writes"] == report["acked_writes"], report["problems"]
    assert report["lost_writes"] == 0, report["problems"]
    assert report["duplicate_writes"] == 0, report["problems"]
    assert report["torn_batches"] == 0, report["problems"]
    assert report["memory_index_misses"] == 0, report["problems"]
    assert report["kb_index_misses"] == 0, report["problems"]
    assert report.get("jobs_unfinished", 0) == 0, report["problems"]
    assert report["jobs_failed"] == 0, report["problems"]
    assert not report["problems"], report["problems"]
