"""Secret and forget canaries over a served sidecar, on DuckDB and on PostgreSQL: random secrets in
random sessions and tool outputs of random users are found in no BuildContext, memory, table, log
line or metric; deleted memories, messages and sessions are recalled nowhere; no call is INTERNAL."""

from __future__ import annotations

import pytest

from .canaries import canaries_on


@pytest.mark.parametrize("backend", ["duckdb", "postgres"])
def test_canaries(tmp_path, backend):
    if backend == "postgres":
        from tests.pg import pg_admin

        pg_admin().close()  # a loud skip when PostgreSQL is unreachable
    out = canaries_on(backend, tmp_path, secrets=120, items=12, seed=5)
    print(out)
    assert out["secret_canaries"] >= 100 and out["secret_contexts_checked"] > 50, out
    assert out["forget_canaries"] == 12, out
    for key in ("secret_leaks", "secret_in_own_session", "forget_leaks", "internal_errors", "secret_table_hits",
                "secret_log_hits", "secret_metric_hits"):
        assert out[key] == 0, (key, out)
