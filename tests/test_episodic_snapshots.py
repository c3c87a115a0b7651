"""Episodic snapshots: a user's index saved when it leaves memory is restored, instead of rebuilt from
rows, exactly as it was (same rankings, same growth), and only while it is current: new turns, a
deletion, forgetting, other knobs or a crash leave nothing stale behind."""

from __future__ import annotations

import pickle
from dataclasses import replace
from pathlib import Path

import numpy as np

import fastpath
from sidecar.domain import Message, Role, Scope
from sidecar.index.embedders import HashEmbedder
from sidecar.memory.episodic import CLEAN_MARK, DEFAULT_RANKING, EpisodicSource
from sidecar.memory.episodic.columns import StrColumn, StrLookup
from sidecar.memory.episodic.index import _UserIndex
from sidecar.memory.episodic.snapshots import LOCK_FILE, pack, unpack

SCOPE = Scope("t", "u")
QUERIES = ("What did Ann paint by the lake in May 2023?", "guitar concert", "When did Bob go hiking?",
           "What activities does Ann like?")


def _turns(n_sessions: int, per_session: int, first: int = 0) -> list[Message]:
    words = "camping lake bakery shift guitar turtle painting soccer recipe garden hiking concert".split()
    out = []
    for s in range(first, first + n_sessions):
        for k in range(per_session):
            i = s * per_session + k
            day = 1_683_504_000_000 + s * 86_400_000 * 3
            text = f"I took my {words[i % 12]} to Paris and {words[(i * 5) % 12]} with you, note{i % 7}."
            out.append(Message(f"m{i}", f"s{s}", k + 1, Role.USER if k % 2 == 0 else Role.ASSISTANT, text, "", "",
                               day + k * 60_000, day, 0, 0, speaker="Ann" if k % 2 == 0 else "Bob"))
    return out


def _meta() -> tuple:
    return ("test", 64, 4, False, 1, 400, 0.5)


def _index(turns: list[Message]) -> _UserIndex:
    state = _UserIndex(dim=64, window=4, dated=False, context=1)
    state.add(turns, HashEmbedder(64), True)
    return state


def _ranks(state: _UserIndex, r=DEFAULT_RANKING) -> list[np.ndarray]:
    return [state.rank(q, fastpath.hash_embed([q], 64)[0], "s1", r) for q in QUERIES]


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_a_restored_index_ranks_and_grows_exactly_like_the_saved_one():
    turns = _turns(5, 8)
    saved = _index(turns)
    _ranks(saved)  # its lazy caches filled: they go with it
    restored = _UserIndex.restore(saved.freeze(_meta()), _meta())
    assert restored is not None and restored.serial != saved.serial
    other = replace(DEFAULT_RANKING, proper_boost=0.6, opener_boost=0.0, self_boost=0.5)
    assert _same(_ranks(restored), _ranks(saved)) and _same(_ranks(restored, other), _ranks(saved, other))
    rows = list(range(len(saved)))
    assert restored.item_bodies(rows) == saved.item_bodies(rows) and restored.sources == saved.sources
    # Growing it makes its postings and per-turn terms lists again: then it is the index built from all rows.
    more = _turns(2, 8, first=5)
    restored.add(more, HashEmbedder(64), True)
    fresh = _index(turns + more)
    assert restored.posting_lists() == fresh.posting_lists() and restored.row_terms == fresh.row_terms
    assert restored.row_tfs == fresh.row_tfs and restored.row_caps == fresh.row_caps
    assert _same(_ranks(restored), _ranks(fresh))
    # And so is a compaction of a restored index.
    again = _UserIndex.restore(fresh.freeze(_meta()), _meta())
    assert _same(_ranks(again.compacted(16)), _ranks(fresh.compacted(16)))


def test_a_restored_index_is_a_view_of_its_snapshot_until_it_grows():
    """Restored, the arrays are read-only views of the snapshot and the texts and terms are decoded only
    when read; the ranking caches made at freeze for the ranking come with it; growing it makes its own."""
    saved = _index(_turns(4, 6))
    blob = saved.freeze(_meta(), DEFAULT_RANKING)
    restored = _UserIndex.restore(blob, _meta())
    assert isinstance(restored.texts, StrColumn) and not restored.codes.flags.writeable
    assert restored._prior_key == saved._prior_key and np.array_equal(restored._win_norm, saved._win_norm)
    assert list(restored.texts) == saved.texts and list(restored.words) == saved.words
    assert restored._term_ids(set(saved.words[:5]) | {"nowhere"}) == saved._term_ids(set(saved.words[:5]) | {"nowhere"})
    twice = _UserIndex.restore(restored.freeze(_meta()), _meta())  # saved again as it was restored
    assert _same(_ranks(twice), _ranks(saved))
    restored.add(_turns(1, 6, first=4), HashEmbedder(64), True)
    assert isinstance(restored.texts, list) and restored.codes.flags.writeable and restored.term_df.flags.writeable


def test_string_columns_and_their_lookup_agree_with_a_list_and_a_dict():
    words = ["", "a", "b", "ab", "ba", "café", "日本", "a\x00b", *(f"w{i}" for i in range(300))]
    column = StrColumn.of(words)
    assert list(column) == words and column.tolist() == words and len(column) == len(words)
    assert [column[i] for i in range(len(words))] == words and column[-1] == words[-1] and column[2:5] == words[2:5]
    assert column.pick([5, 0, 5, 7]) == [words[5], words[0], words[5], words[7]] and column.pick([]) == []
    for empty in (StrColumn.of([]), StrColumn.of(["x"])[1:]):
        assert len(empty) == 0 and list(empty) == []
    lookup = StrLookup.of(column)
    assert all(lookup.get(w) == i for i, w in enumerate(words))
    assert all(lookup.get(w) is None for w in ("c", "w300", "cafe", "日", "a\x00"))
    again = unpack(pack({"words": lookup}))["words"]
    assert all(again.get(w) == i for i, w in enumerate(words)) and again.column == words
    assert StrLookup.of(StrColumn.of([])).get("a") is None


def test_a_snapshot_of_other_knobs_is_not_restored():
    blob = _index(_turns(2, 4)).freeze(_meta())
    assert _UserIndex.restore(blob, (*_meta()[:-1], 0.7)) is None


class _FileStore:
    """The store calls EpisodicSource makes, over a list of turns, with a database file's path."""

    def __init__(self, turns: list[Message], path: Path) -> None:
        self.turns, self.path, self.reads = turns, str(path), 0
        self.excluded: set[str] = set()
        self.exclusion_reads = 0

    def list_user_messages(self, scope, roles, newest):
        self.reads += 1
        return self.turns[-newest:]

    def recall_exclusions(self, scope):
        self.exclusion_reads += 1
        return set(self.excluded)

    def session_view(self, scope, session_id):
        from types import SimpleNamespace

        return SimpleNamespace(session=SimpleNamespace(parent_session_id=""))


def _files(store: _FileStore) -> list[str]:
    """The snapshot directory's files but its lock file."""
    return sorted(p.name for p in Path(store.path).with_suffix(".episodic").iterdir() if p.name != LOCK_FILE)


def test_snapshots_are_saved_on_eviction_and_close_and_dropped_when_the_rows_change(tmp_path):
    turns = _turns(4, 6)
    store = _FileStore(turns[:18], tmp_path / "db.duckdb")
    source = EpisodicSource(store, HashEmbedder(64))
    query = "guitar by the lake"
    _, rows, rel = source.search(SCOPE, query, "", 4000)
    assert store.reads == 1 and _files(store) == []
    source.evict(SCOPE)
    assert len(_files(store)) == 1
    _, again, rel_again = source.search(SCOPE, query, "", 4000)
    assert store.reads == 1 and np.array_equal(again, rows) and np.array_equal(rel_again, rel)  # restored
    # New turns: the snapshot lacks them, so it goes (also for a user not in memory).
    store.turns = turns
    source.on_append(SCOPE, "s3", turns[18:])
    assert _files(store) == []
    source.evict(SCOPE)
    assert len(_files(store)) == 1
    store.turns = turns + _turns(1, 6, first=4)
    # The user is not in memory: their saved index is restored and gains the new turns, as it would in
    # memory (a returning user's first message reads no rows), and it ranks as one built from rows.
    source.on_append(SCOPE, "s4", store.turns[24:])
    assert _files(store) == [] and store.reads == 1 and source.indexed(SCOPE) == 30
    from_rows = EpisodicSource(_FileStore(store.turns, tmp_path / "rows.duckdb"), HashEmbedder(64))
    for q in QUERIES:
        grown, built = source.search(SCOPE, q, "", 4000), from_rows.search(SCOPE, q, "", 4000)
        assert list(grown[0].ids) == list(built[0].ids)
        assert np.array_equal(grown[1], built[1]) and np.allclose(grown[2], built[2])
    for gone in (source.drop_user, source.forget):  # a deletion, ForgetUser
        source.search(SCOPE, query, "", 4000)
        source.evict(SCOPE)
        assert len(_files(store)) == 1
        source.search(SCOPE, query, "", 4000)
        gone(SCOPE)
        assert _files(store) == []
    # A clean close saves the users in memory; the next process restores them without reading rows.
    _, rows, _ = source.search(SCOPE, query, "", 4000)
    source.close()
    assert CLEAN_MARK in _files(store)
    reads = store.reads
    reopened = EpisodicSource(store, HashEmbedder(64))
    assert CLEAN_MARK not in _files(store)
    assert np.array_equal(reopened.search(SCOPE, query, "", 4000)[1], rows) and store.reads == reads
    # While it runs, another process given the same directory keeps no snapshot there and deletes none.
    reopened.evict(SCOPE)
    assert len(_files(store)) == 1
    beside = EpisodicSource(store, HashEmbedder(64))
    assert beside._snapshot_dir is None and len(_files(store)) == 1
    beside.evict(SCOPE)
    assert len(_files(store)) == 1
    # After a crash (no clean close; the process and its lock are gone) no snapshot is trusted.
    reopened._snapshot_lock.close()
    crashed = EpisodicSource(store, HashEmbedder(64))
    assert _files(store) == []
    assert np.array_equal(crashed.search(SCOPE, query, "", 4000)[1], rows) and store.reads == reads + 1


def test_a_snapshot_keeps_the_hidden_turns_and_a_new_exclusion_deletes_it(tmp_path):
    """A restored index hides what the saved one hid without reading the exclusions again; turns that
    leave recall while the user is saved (a memory deleted) delete the snapshot, so they are never
    recalled from it."""
    turns = _turns(4, 6)
    store = _FileStore(turns, tmp_path / "db.duckdb")
    source = EpisodicSource(store, HashEmbedder(64))
    query = "guitar by the lake"
    _, rows, _ = source.search(SCOPE, query, "", 4000)
    first, second = (turns[r].message_id for r in rows[:2].tolist())
    store.excluded.add(first)
    source.exclude(SCOPE, {first})
    source.evict(SCOPE)
    _, restored, _ = source.search(SCOPE, query, "", 4000)
    assert store.reads == 1 and store.exclusion_reads == 1  # restored, the hidden turns with it
    assert first not in {turns[r].message_id for r in restored.tolist()}
    source.evict(SCOPE)
    assert len(_files(store)) == 1
    store.excluded.add(second)
    source.exclude(SCOPE, {second})  # the user is not in memory: the snapshot goes
    assert _files(store) == []
    _, rebuilt, _ = source.search(SCOPE, query, "", 4000)
    assert store.reads == 2 and store.exclusion_reads == 2
    assert not {first, second} & {turns[r].message_id for r in rebuilt.tolist()}


def test_a_snapshot_of_an_older_format_or_cut_short_is_rebuilt_from_rows(tmp_path):
    """A file another version wrote (a plain pickle) or one cut short is no index: the user is rebuilt
    from rows and the file deleted."""
    turns = _turns(3, 6)
    store = _FileStore(turns, tmp_path / "db.duckdb")
    source = EpisodicSource(store, HashEmbedder(64))
    _, rows, _ = source.search(SCOPE, "guitar by the lake", "", 4000)
    for spoil in (lambda blob: pickle.dumps({"meta": source._meta()}), lambda blob: blob[:len(blob) // 2]):
        source.evict(SCOPE)
        (path,) = Path(store.path).with_suffix(".episodic").glob("*.snap")
        path.write_bytes(spoil(path.read_bytes()))
        reads = store.reads
        _, again, _ = source.search(SCOPE, "guitar by the lake", "", 4000)
        assert store.reads == reads + 1 and np.array_equal(again, rows) and _files(store) == []


def test_no_snapshots_without_a_database_file():
    store = _FileStore(_turns(2, 4), Path(":memory:"))
    store.path = ":memory:"
    source = EpisodicSource(store, HashEmbedder(64))
    source.search(SCOPE, "guitar", "", 4000)
    source.evict(SCOPE)
    source.search(SCOPE, "guitar", "", 4000)
    assert store.reads == 2 and source._snapshot_dir is None


def test_snapshots_are_bounded_oldest_saved_first(tmp_path):
    """Saved indexes take at most max_snapshot_bytes together; the oldest saved go first (their users
    rebuild from rows), also across a restart; 0 saves none."""
    store = _FileStore(_turns(4, 6), tmp_path / "db.duckdb")
    one = len(_index(store.turns).freeze(("x",)))  # about one user's snapshot
    source = EpisodicSource(store, HashEmbedder(64), max_snapshot_bytes=int(one * 2.5))
    users = [Scope("t", f"u{i}") for i in range(4)]
    for scope in users:
        source.search(scope, "guitar", "", 4000)
        source.evict(scope)
    directory = Path(store.path).with_suffix(".episodic")
    sizes = {p.name: p.stat().st_size for p in directory.iterdir() if p.suffix == ".snap"}
    assert len(sizes) == 2 and sum(sizes.values()) <= one * 2.5
    source.close()
    reads = store.reads
    reopened = EpisodicSource(store, HashEmbedder(64), max_snapshot_bytes=int(one * 2.5))
    for scope in users[2:]:  # the newest two were kept and are restored
        reopened.search(scope, "guitar", "", 4000)
    assert store.reads == reads
    reopened.search(users[0], "guitar", "", 4000)  # the oldest was deleted: rebuilt from rows
    assert store.reads == reads + 1
    none = EpisodicSource(_FileStore(store.turns, tmp_path / "other.duckdb"), HashEmbedder(64), max_snapshot_bytes=0)
    none.search(SCOPE, "guitar", "", 4000)
    none.evict(SCOPE)
    assert not (tmp_path / "other.episodic").exists()
