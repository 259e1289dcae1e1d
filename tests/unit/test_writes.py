"""A follower's log of its primary's commits, applied coalesced (worker/writes.py), on a real
RocksDB: it leaves the copy as the commits applied one by one would, whether it is applied
as it fills, when the copy closes, or by whoever opens the copy after a crash."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rocksdict import Rdict

from runtime.errors import MillstreamError
from worker import writes as writes_module
from worker.replicastore import ReplicaStore
from worker.storage import M_INDEX, TabletStore, _open, state_key
from worker.writes import (
    APPLY_EVERY_COMMITS,
    DELETE,
    DELETE_RANGE,
    LOG,
    PUT,
    Coalesced,
    Writes,
    decode_ops,
    encode_ops,
    read_log,
)

_KEYS = st.binary(min_size=1, max_size=2)
_WRITE = st.one_of(
    st.tuples(st.just(PUT), _KEYS, st.binary(max_size=3)),
    st.tuples(st.just(DELETE), _KEYS, st.just(b"")),
    st.tuples(st.just(DELETE_RANGE), _KEYS, _KEYS).filter(lambda w: w[1] < w[2]))
_COMMITS = st.lists(st.lists(_WRITE, max_size=12), min_size=1, max_size=8)


def _primary_writes(writes: list[tuple[int, bytes, bytes]]) -> Writes:
    """``writes`` as a primary's commit makes them (recorded for its followers)."""
    out = Writes(record=True)
    for kind, k, v in writes:
        if kind == PUT:
            out.put(k, v)
        elif kind == DELETE:
            out.delete(k)
        else:
            out.delete_range(k, v)
    return out


def _contents(db: Rdict) -> dict[bytes, bytes]:
    return dict(db.items())


@settings(max_examples=80, deadline=None)
@given(st.dictionaries(_KEYS, st.binary(max_size=3), max_size=12), _COMMITS, st.integers(1, 5), st.data())
def test_commits_coalesced_leave_a_copy_as_the_commits_one_by_one_do(
        before: dict[bytes, bytes], commits: list[list[tuple[int, bytes, bytes]]], size: int,
        data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as d:
        dbs = [_open(os.path.join(d, side)) for side in ("one-by-one", "coalesced")]
        try:
            for db in dbs:
                for k, v in before.items():
                    db[k] = v
            pending = Coalesced()
            for writes in commits:
                primary = _primary_writes(writes)
                dbs[0].write(primary.wb)  # the primary's own write, commit by commit
                pending.take(*decode_ops(encode_ops(primary.ops or [])))
            # In pieces of at most ``size`` keys, in order; a crash after the first ``crashed``
            # pieces, and the whole again (as a replayed log is): the same copy.
            crashed = data.draw(st.integers(0, max(1, -(-len(pending.last) // size))))
            assert len(list(pending.batches(size))) == max(1, -(-len(pending.last) // size))
            for wb in [*list(pending.batches(size))[:crashed], *pending.batches(size)]:
                dbs[1].write(wb)
            assert _contents(dbs[1]) == _contents(dbs[0])
        finally:
            for db in dbs:
                db.close()


def _commit(index: int, writes: list[tuple[int, bytes, bytes]]) -> tuple[int, bytes]:
    return index, encode_ops(writes)


def _puts(i: int) -> list[tuple[int, bytes, bytes]]:
    """Commit ``i``'s writes: it rewrites two keys every commit, writes one of its own, and
    deletes the one of the commit before it."""
    return [(PUT, state_key(b"hot"), b"%d" % i), (PUT, state_key(b"warm"), b"%d" % (i * 2)),
            (PUT, state_key(b"own%d" % i), b"x"), (DELETE, state_key(b"own%d" % (i - 1)), b"")]


def _expected(n: int) -> dict[bytes, bytes]:
    return {state_key(b"hot"): b"%d" % n, state_key(b"warm"): b"%d" % (n * 2), state_key(b"own%d" % n): b"x"}


def _logged(db: Rdict) -> list[bytes]:
    """The keys of the commits logged and not yet applied."""
    return [k for k, _ in db.items() if k.startswith(LOG)]


def _state(db: Rdict) -> dict[bytes, bytes]:
    return {k: v for k, v in db.items() if k.startswith(b"S")}


def test_a_copy_logs_each_commit_whole_and_applies_the_log_as_it_fills(tmp_path: Any) -> None:
    path = str(tmp_path / "copy")
    copy = ReplicaStore(path, token=1)
    n = APPLY_EVERY_COMMITS + 3
    try:
        for i in range(1, n + 1):
            copy.apply(1, 7, [_commit(i, _puts(i))], sync=False)
            logged = _logged(copy.db)
            # Each commit is held as soon as apply returns: its index recorded, its writes logged
            # (or, once the log filled, applied with the others).
            assert copy.db.get(M_INDEX) == b"%d" % i and copy.index == i
            assert len(logged) == i % APPLY_EVERY_COMMITS
            if not logged:
                assert _state(copy.db) == _expected(i)
        assert _state(copy.db) == _expected(APPLY_EVERY_COMMITS)  # the last 3 are only logged
    finally:
        copy.close()
    raw = Rdict(path)  # opened without applying a log: the close applied it
    try:
        assert _state(raw) == _expected(n) and not _logged(raw)
    finally:
        raw.close()
    reopened = ReplicaStore(path)
    try:
        assert reopened.index == n and reopened.term == 7
    finally:
        reopened.close()


def _crashed_copy(path: str, commits: int) -> None:
    """A copy that logged ``commits`` commits and stopped without applying them (a crash:
    its RocksDB is closed, its memory lost)."""
    copy = ReplicaStore(path, token=1)
    copy.apply(1, 7, [_commit(i, _puts(i)) for i in range(1, commits + 1)], sync=True)
    copy._pending.clear()  # what a crash loses: the log is all there is
    copy.db.close()


def test_a_copy_that_crashed_with_a_log_opens_with_it_applied_as_a_follower(tmp_path: Any) -> None:
    path = str(tmp_path / "copy")
    _crashed_copy(path, 5)
    raw = Rdict(path)  # what is on disk: the commits logged, not applied
    try:
        assert not _state(raw) and len(_logged(raw)) == 5
    finally:
        raw.close()
    copy = ReplicaStore(path)
    try:
        assert _state(copy.db) == _expected(5) and copy.index == 5
        assert not _logged(copy.db)
    finally:
        copy.close()


def test_a_copy_that_crashed_part_way_through_applying_its_log_opens_with_it_applied(tmp_path: Any) -> None:
    """The log is applied in several writes (``APPLY_CHUNK`` keys each) and deleted by the
    last: a crash between them leaves part applied and the whole log there, applied again."""
    path = str(tmp_path / "copy")
    _crashed_copy(path, 6)  # its log coalesced: 9 keys (hot, warm, own0-own6), in 5 pieces of 2
    raw = Rdict(path)
    try:
        pending, _ = read_log(raw)
        first, *rest = pending.batches(2)
        assert rest
        raw.write(first)  # the first piece, and then the crash
        assert _state(raw) and _state(raw) != _expected(6)
    finally:
        raw.close()
    copy = ReplicaStore(path)
    try:
        assert _state(copy.db) == _expected(6) and copy.index == 6
        assert not _logged(copy.db)
    finally:
        copy.close()


def test_a_copy_that_crashed_with_a_log_is_promoted_with_it_applied(tmp_path: Any) -> None:
    path = str(tmp_path / "copy")
    _crashed_copy(path, 4)
    store = TabletStore(path, 2, sync=False, must_exist=True)
    try:
        assert store.index == 4
        assert store.get_state(b"hot") == b"4" and store.get_state(b"own4") == b"x"
        assert store.get_state(b"own3") is None
        assert not _logged(store.db)
    finally:
        store.close()


def test_a_split_built_from_a_copy_with_a_log_builds_from_it_applied(tmp_path: Any) -> None:
    from worker.reshard import _open as open_parent

    path = str(tmp_path / "copy")
    _crashed_copy(path, 3)
    db = open_parent(path)
    try:
        assert _state(db) == _expected(3) and not _logged(db)
    finally:
        db.close()


_SKEYS = st.binary(min_size=0, max_size=2).map(lambda k: b"S" + k)  # user state: never L or M
_COPY_WRITE = st.one_of(
    st.tuples(st.just(PUT), _SKEYS, st.binary(max_size=3)),
    st.tuples(st.just(DELETE), _SKEYS, st.just(b"")),
    st.tuples(st.just(DELETE_RANGE), _SKEYS, _SKEYS).filter(lambda w: w[1] <= w[2]))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.lists(_COPY_WRITE, max_size=10), st.integers(1, 5)), min_size=1, max_size=12),
       st.integers(1, 3))
def test_a_copy_holds_what_the_commits_one_by_one_leave_with_range_deletes_among_them(
        requests: list[tuple[list[tuple[int, bytes, bytes]], int]], chunk: int) -> None:
    """Requests of 1-5 commits, some deleting ranges (not logged: the commits before them
    held, the log applied, then they), the rest logged, the log applied in pieces of
    ``chunk`` keys: after each request the copy holds its last commit, and what it leaves
    once closed is what the commits left on a RocksDB that wrote them one by one."""
    with tempfile.TemporaryDirectory() as d, pytest.MonkeyPatch.context() as mp:
        mp.setattr(writes_module, "APPLY_CHUNK", chunk)
        reference = _open(os.path.join(d, "one-by-one"))
        copy = ReplicaStore(os.path.join(d, "copy"), token=1)
        index = 0
        try:
            for writes, commits in requests:
                entries = []
                for part in range(commits):
                    primary = _primary_writes(writes[part::commits])
                    reference.write(primary.wb)
                    index += 1
                    entries.append((index, encode_ops(primary.ops or [])))
                copy.apply(1, 1, entries, sync=False)
                assert copy.index == index and copy.db.get(M_INDEX) == b"%d" % index
        finally:
            copy.close()
        raw = Rdict(os.path.join(d, "copy"))
        try:
            assert _state(raw) == _state(reference) and not _logged(raw)
        finally:
            raw.close()
            reference.close()


def test_commits_before_a_range_delete_are_held_before_the_log_they_are_in_is_applied(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A request of two logged commits and then one that deletes a range: the log is applied
    (not atomically) only once the two are held, their index on disk; else a crash between
    its pieces would leave writes of commits the copy never held."""
    import worker.replicastore as replicastore

    seen: list[tuple[bytes | None, int]] = []
    real = replicastore.apply_log

    def spy(db: Rdict, pending: Coalesced) -> None:
        seen.append((db.get(M_INDEX), pending.commits))
        real(db, pending)

    monkeypatch.setattr(replicastore, "apply_log", spy)
    copy = ReplicaStore(str(tmp_path / "copy"), token=1)
    try:
        copy.apply(1, 7, [_commit(1, _puts(1)), _commit(2, _puts(2)), _commit(3, [(DELETE_RANGE, b"Z0", b"Z1")])],
                   sync=True)
        assert seen == [(b"2", 2)]
        assert copy.index == 3 and copy.db.get(M_INDEX) == b"3" and _state(copy.db) == _expected(2)
        assert not _logged(copy.db)
    finally:
        copy.close()


def test_a_range_whose_end_comes_before_its_start_is_refused_before_it_is_held(tmp_path: Any) -> None:
    copy = ReplicaStore(str(tmp_path / "copy"), token=1)
    try:
        with pytest.raises(MillstreamError, match="end b'Sa' comes before its start b'Sb'"):
            copy.apply(1, 7, [_commit(1, [(DELETE_RANGE, b"Sb", b"Sa")])], sync=False)
        assert copy.index == 0
    finally:
        copy.close()


def test_a_commit_whose_writes_do_not_decode_is_refused_and_nothing_is_written(tmp_path: Any) -> None:
    copy = ReplicaStore(str(tmp_path / "copy"), token=1)
    try:
        copy.apply(1, 7, [_commit(1, _puts(1))], sync=False)
        with pytest.raises(MillstreamError, match="do not decode"):
            copy.apply(1, 7, [_commit(2, _puts(2)), (3, b"\xff\xff\xff")], sync=False)
        assert copy.index == 1 and copy.db.get(LOG + (2).to_bytes(8, "big")) is None
        copy.apply(1, 7, [_commit(2, _puts(2))], sync=False)
    finally:
        copy.close()
    reopened = ReplicaStore(str(tmp_path / "copy"))
    try:
        assert _state(reopened.db) == _expected(2)
    finally:
        reopened.close()
