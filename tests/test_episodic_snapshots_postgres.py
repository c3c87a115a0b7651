"""Episodic snapshots on a shared PostgreSQL store, in a directory of the replica's own: a user's index
saved when it leaves memory is restored without reading rows, and never when another replica changed
the user, whether that happened while this replica ran (its change feed deletes the snapshot) or while
it was stopped (its next start finds the change in change_log)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.app import Settings, Sidecar
from sidecar.domain import NewMessage, Role, Scope
from sidecar.memory.episodic.snapshots import CLEAN_MARK, _snapshot_name
from sidecar.services.imports import PastSession
from sidecar.store.postgres_store import PostgresStore
from tests.pg import pg_admin, pg_create_schema, pg_drop_schema, pg_throwaway_schema, pg_url

ANN, BOB, CAT = Scope("t", "ann"), Scope("t", "bob"), Scope("t", "cat")
NEW_WORD = "quokka"  # only in the turn another replica adds


@pytest.fixture
def pg_schema() -> Iterator[str]:
    with pg_throwaway_schema("t_epi_snap") as name:
        yield name


class _Replica:
    """A Sidecar on the schema whose row reads for recall are counted."""

    def __init__(self, schema: str, snapshots: Path | None) -> None:
        settings = Settings(job_poll_s=0.05, feed_poll_ms=20, episodic_snapshot_dir=str(snapshots or ""))
        self.app = Sidecar(pg_url(schema), settings)
        self.reads: list[Scope] = []
        store = self.app.episodic.store
        list_user_messages = store.list_user_messages

        def counted(scope, roles, newest):
            self.reads.append(scope)
            return list_user_messages(scope, roles, newest)

        store.list_user_messages = counted

    def recalled(self, scope: Scope, query: str) -> list[str]:
        """The texts of the user's past turns recall ranks for `query`, best first."""
        index, rows, _ = self.app.episodic.search(scope, query, "", 4000)
        return [index.texts[r] for r in rows.tolist()]

    def close(self) -> None:
        self.app.close()


def _history(scope: Scope, app: Sidecar, topic: str, first: int = 0) -> None:
    sessions = [PastSession(messages=[
        NewMessage(role=Role.USER if k % 2 == 0 else Role.ASSISTANT,
                   text=f"{scope.user_id} talked about {topic} and the lake cabin, turn {s}-{k}.",
                   client_timestamp_ms=1_700_000_000_000 + s * 86_400_000 + k * 60_000) for k in range(6)],
        session_id=f"s{s}", closed=True) for s in range(first, first + 3)]
    app.imports.import_sessions(scope, sessions)


def _snapshots(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir() if p.suffix == ".snap"}


def _until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the change did not arrive in time"
        time.sleep(0.02)


def test_a_snapshot_is_restored_until_another_replica_changes_the_user(pg_schema, tmp_path):
    a, b = _Replica(pg_schema, tmp_path / "a"), _Replica(pg_schema, None)
    try:
        _history(ANN, a.app, "pottery")
        before = a.recalled(ANN, "pottery by the lake")
        assert a.reads == [] and before  # the import indexed its own turns: no rows read back
        a.app.episodic.evict(ANN)
        assert _snapshots(tmp_path / "a") == {_snapshot_name(("t", "ann"))}
        assert a.recalled(ANN, "pottery by the lake") == before and a.reads == []  # restored, no rows read
        a.app.episodic.evict(ANN)
        _history(ANN, b.app, f"a {NEW_WORD} at the zoo", first=10)  # on the other replica
        _until(lambda: not _snapshots(tmp_path / "a"))  # a's change feed deleted the stale snapshot
        found = a.recalled(ANN, NEW_WORD)
        assert len(a.reads) == 1 and found and NEW_WORD in found[0]
        # ForgetUser on the other replica: the saved index goes too, and nothing of the user is recalled.
        a.app.episodic.evict(ANN)
        assert _snapshots(tmp_path / "a")
        b.app.memories.forget_user(ANN)
        _until(lambda: not _snapshots(tmp_path / "a"))
        assert a.recalled(ANN, NEW_WORD) == [] and len(a.reads) == 2
        assert not (tmp_path / "a").joinpath(CLEAN_MARK).exists()
    finally:
        a.close()
        b.close()


def test_a_restart_keeps_only_the_snapshots_of_users_no_one_changed_meanwhile(pg_schema, tmp_path, monkeypatch):
    directory = tmp_path / "a"
    a = _Replica(pg_schema, directory)
    for scope, topic in ((ANN, "pottery"), (BOB, "clarinet"), (CAT, "rowing")):
        _history(scope, a.app, topic)
        assert a.recalled(scope, topic)
    bob = a.recalled(BOB, "clarinet")
    a.close()  # saves all three, marks them current as of its change feed's position
    assert _snapshots(directory) == {_snapshot_name(("t", u.user_id)) for u in (ANN, BOB, CAT)}
    b = _Replica(pg_schema, None)
    try:
        _history(ANN, b.app, f"a {NEW_WORD} at the zoo", first=10)  # while a is stopped
        checked = PostgresStore.users_changed_since

        def then_cat_changes(store, seq):
            got = checked(store, seq)
            _history(CAT, b.app, f"a {NEW_WORD} on the river", first=10)  # after the check, before the feed
            return got

        monkeypatch.setattr(PostgresStore, "users_changed_since", then_cat_changes)
        again = _Replica(pg_schema, directory)
        monkeypatch.undo()
        try:
            assert _snapshot_name(("t", "ann")) not in _snapshots(directory)
            # The feed starts where the check ended, so CAT's change reaches it too.
            _until(lambda: _snapshots(directory) == {_snapshot_name(("t", "bob"))})
            assert again.recalled(BOB, "clarinet") == bob and again.reads == []  # restored
            assert NEW_WORD in again.recalled(ANN, NEW_WORD)[0] and NEW_WORD in again.recalled(CAT, NEW_WORD)[0]
            assert again.reads == [ANN, CAT]
        finally:
            again.close()
    finally:
        b.close()


def test_without_a_clean_stop_or_from_another_schema_no_snapshot_is_kept(pg_schema, tmp_path):
    directory = tmp_path / "a"
    a = _Replica(pg_schema, directory)
    _history(ANN, a.app, "pottery")
    a.recalled(ANN, "pottery")
    a.close()
    mark = json.loads((directory / CLEAN_MARK).read_text())
    assert mark["change_seq"] > 0 and f"schema={pg_schema}&" in mark["store"]
    # Another schema (its own change log) is another database: nothing is restored from this one's.
    admin = pg_admin()
    other = pg_create_schema(admin, "t_epi_other")
    try:
        writer = _Replica(other, None)  # its log runs past the mark's seq: only its identity tells them apart
        while writer.app.store.backend.current_change_seq() <= mark["change_seq"]:
            _history(Scope("t", "dan"), writer.app, "chess", first=writer.app.store.backend.current_change_seq())
        writer.close()
        elsewhere = _Replica(other, directory)
        try:
            assert _snapshots(directory) == set() and elsewhere.recalled(ANN, "pottery") == []
        finally:
            elsewhere.close()
    finally:
        pg_drop_schema(admin, other)
        admin.close()
    # A crash: snapshots saved, no mark.
    a = _Replica(pg_schema, directory)
    assert a.recalled(ANN, "pottery") and a.reads == [ANN]
    a.close()
    assert _snapshots(directory)
    (directory / CLEAN_MARK).unlink()
    crashed = _Replica(pg_schema, directory)
    try:
        assert _snapshots(directory) == set() and crashed.recalled(ANN, "pottery") and crashed.reads == [ANN]
    finally:
        crashed.close()
