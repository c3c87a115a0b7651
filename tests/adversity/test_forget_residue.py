"""Forget-user residue: after ForgetUser nothing of the user is left in any table of USER_TABLES,
in any text column of any table (job payloads, summaries, history), in the memory index, in any
in-process structure reachable from the app (caches, episodic index), or in the index files; the
other users (same tenant, and the same user id in another tenant) are unchanged."""

from __future__ import annotations

from tests.conftest import Running

from .harness import forget_residue


def test_forget_user_leaves_no_residue(tmp_path):
    # Its own server: the check reads the index files after a clean stop.
    report = forget_residue(Running(str(tmp_path / "forget.duckdb")))
    print(report)
    assert report["forget_victim_rows_before"] > 50  # there was a lot to forget
    assert report["forget_summaries_before"] >= 1, "the long session got a rolling summary"
    assert report["forget_residue"] == 0, report["forget_residue_examples"]
    assert report["forget_other_users_changed"] == 0
    deleted = report["forget_deleted"]
    assert deleted.get("messages", 0) >= 33 and deleted.get("memories", 0) >= 3
