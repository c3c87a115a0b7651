"""Soak (2 minutes here, as the issue asks; `bench/adversity.py --soak-seconds 1800` runs the 30-minute
one): a steady mixed load against a sidecar
subprocess. Every call succeeds, RSS growth is bounded, p99 is stable (first vs last third) and
neither file descriptors nor threads grow."""

from __future__ import annotations

from .harness import Server, soak

SOAK_SECONDS = 120.0


def test_soak_is_steady(tmp_path):
    server = Server(str(tmp_path / "soak.duckdb"))
    try:
        r = soak(server, SOAK_SECONDS, rate=40.0)
        print(r)
        assert server.alive() and server.healthy()
    finally:
        server.stop()
    assert r["soak_codes"].get("OK", 0) == r["soak_requests"], r["soak_errors"]
    assert r["soak_rate_achieved"] > 30
    assert r["soak_rss_end_mb"] - r["soak_rss_start_mb"] < 150, r
    assert r["soak_fds_end"] <= r["soak_fds_start"] + 8, r
    assert r["soak_threads_end"] <= r["soak_threads_start"] + 4, r
    assert r["soak_p99_last_ms"] <= max(3 * r["soak_p99_first_ms"], r["soak_p99_first_ms"] + 100), r
