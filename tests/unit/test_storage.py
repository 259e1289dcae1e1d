"""One tablet's RocksDB (worker/storage.py), on a real RocksDB in tmp_path."""

from __future__ import annotations

import os
import struct
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rocksdict import DbClosedError, Rdict, WriteBatch

from runtime.columns import Columns
from runtime.computation import TimeDomain
from runtime.errors import MillstreamError, StaleTokenError
from runtime.record import Record
from runtime.wire import millstream_pb2 as pb
from worker.replicastore import ReplicaStore
from worker.storage import (
    CK_SEQUENCED_ROW,
    DELETE,
    Commit,
    CommitState,
    Shipment,
    TabletStore,
    Timer,
    _open,
    apply_ops,
    encode_ops,
    production_key,
)
from worker.writes import DELETE_RANGE, PUT, Writes


@pytest.fixture
def db_path(tmp_path: Path) -> str:
    return str(tmp_path / "tablet")


@pytest.fixture
def store(db_path: str) -> Iterator[TabletStore]:
    s = TabletStore(db_path, 1, sync=False)
    yield s
    # Tests that reopen close this instance themselves (close() is not idempotent).
    try:
        s.close()
    except DbClosedError:
        pass


def reopen(store: TabletStore, token: int | None = None) -> TabletStore:
    store.close()
    return TabletStore(store.path, store.token if token is None else token, sync=False)


def timer(key: bytes, tag: str, time: int, domain: TimeDomain = TimeDomain.EVENT_TIME) -> Timer:
    return Timer(key, tag, domain, time)


def commit_timers(store: TabletStore, *, set_: list[Timer] = (), deleted: list[Timer] = ()) -> None:  # type: ignore[assignment]
    store.commit(Commit(timers_set={(t.key, t.tag): t for t in set_},
                        timers_deleted={(t.key, t.tag): t for t in deleted}))


# ------------------------------------------------------------- state, ids


def test_state_put_and_delete_roundtrip(store: TabletStore) -> None:
    store.commit(Commit(state={b"a": b"1", b"b": b"2", b"": b"empty key"}))
    assert store.get_state(b"a") == b"1"
    assert store.get_state(b"") == b"empty key"
    store.commit(Commit(state={b"a": None, b"b": b"3"}))
    store = reopen(store)
    assert store.get_state(b"a") is None
    assert store.get_state(b"b") == b"3"
    assert store.get_state(b"missing") is None
    store.close()


def test_dedup_data_roundtrip(store: TabletStore) -> None:
    from worker.dedup import Mark

    ids = [bytes([i]) * 16 for i in range(5)]
    store.commit(Commit(opaque_ids=ids[:3], opaque_bucket=7, marks={b"p" * 8: Mark(5, 2, 99)}))
    store = reopen(store)
    assert all(store.has_opaque(i, [7]) for i in ids[:3])
    assert not any(store.has_opaque(i, [6, 7, 8]) for i in ids[3:])
    assert not store.has_opaque(ids[0], [6])
    assert sorted(store.opaque_ids(7)) == sorted((7, i) for i in ids[:3])
    assert list(store.opaque_ids(8)) == []
    assert store.marks() == {b"p" * 8: Mark(5, 2, 99)}
    assert store.dedup_bytes() == 3 * (1 + 8 + 16) + (1 + 8 + 24)
    store.close()


def test_expired_buckets_and_silent_producers_are_dropped(store: TabletStore) -> None:
    from worker.dedup import Mark

    store.commit(Commit(opaque_ids=[b"a" * 16], opaque_bucket=3, marks={b"p" * 8: Mark(5, 0, 1)}))
    store.commit(Commit(opaque_ids=[b"b" * 16], opaque_bucket=4, marks={b"q" * 8: Mark(1, 0, 2)}))
    store.commit(Commit(opaque_expire_below=4, marks_expired=[b"p" * 8]))
    assert list(store.opaque_ids(0)) == [(4, b"b" * 16)]
    assert list(store.marks()) == [b"q" * 8]


def test_state_and_ids_do_not_collide(store: TabletStore) -> None:
    rid = b"x" * 16
    store.commit(Commit(state={rid: b"v"}))
    assert not store.has_opaque(rid, [0])
    assert list(store.opaque_ids(0)) == []


# ------------------------------------------------------------------ timers


def test_timers_set_moved_and_deleted(store: TabletStore) -> None:
    a = timer(b"k1", "flush", 100)
    b = timer(b"k1", "gc", -5, TimeDomain.WALL_TIME)
    c = timer(b"k2", "flush", 2**62)
    commit_timers(store, set_=[a, b, c])
    assert set(store.timers()) == {a, b, c}

    moved = timer(b"k1", "flush", 200)
    commit_timers(store, set_=[moved], deleted=[a])
    assert set(store.timers()) == {moved, b, c}

    commit_timers(store, deleted=[c])
    store = reopen(store)
    assert set(store.timers()) == {moved, b}
    store.close()


def test_timer_keys_and_tags_do_not_run_together(store: TabletStore) -> None:
    ts = [timer(b"a", "bc", 1), timer(b"ab", "c", 2), timer(b"", "abc", 3), timer(b"abc", "", 4)]
    commit_timers(store, set_=ts)
    assert set(store.timers()) == set(ts)


times = st.integers(-(2**63), 2**63 - 1)
timer_ids = st.tuples(st.binary(max_size=4), st.sampled_from(["t", "u", "tu", ""]))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.tuples(timer_ids, st.none() | st.tuples(times, st.sampled_from(TimeDomain))),
                         max_size=6), max_size=5))
def test_timers_match_a_model(batches) -> None:
    """Commits built like the tablet builds them (delete the old timer when moving it)."""
    model: dict[tuple[bytes, str], Timer] = {}
    with tempfile.TemporaryDirectory() as d:
        store = TabletStore(d, 1, sync=False)
        try:
            for batch in batches:
                committed = dict(model)  # what the tablet's in-memory index holds
                c = Commit()
                for k, change in batch:
                    old = committed.get(k)
                    c.timers_set.pop(k, None)
                    if old is not None:
                        c.timers_deleted[k] = old
                    if change is None:
                        model.pop(k, None)
                    else:
                        model[k] = c.timers_set[k] = Timer(k[0], k[1], change[1], change[0])
                store.commit(c)
                assert sorted(store.timers(), key=repr) == sorted(model.values(), key=repr)
        finally:
            store.close()


# ------------------------------------------------------------- productions


def production(seq: int, comp: str, key_range: int, value: bytes = b"v", ts: int = 7) -> Shipment:
    rid = seq.to_bytes(16, "big")
    return Shipment(comp, key_range, Columns([b"k"], [value], [ts], ids=[rid]), ckey=production_key(seq, comp, key_range))


def _view(shipments: list[Shipment]) -> list[tuple[object, ...]]:
    return [(s.computation, s.key_range, s.ckey, s.cols, s.producers) for s in shipments]


def test_productions_roundtrip_in_sequence_order(store: TabletStore) -> None:
    ps = [production(256, "count", 3), production(2, "split.x-y", 0, ts=-1), production(10, "count", 1023)]
    store.commit(Commit(productions=ps, seq=256))
    store = reopen(store)
    got = store.productions()
    assert _view(got) == _view(sorted(ps, key=lambda p: p.ckey or b""))
    assert [p.cols.id(0)[-1] for p in got] == [2, 10, 0]  # seq 2, 10, 256 (256 ends in 0x00)
    store.close()


def test_a_shipment_is_one_checkpoint_of_its_columns(store: TabletStore) -> None:
    cols = Columns([b"a", b"b", b"c"], [b"1", b"2", b"3"], [5, 3, 9], b"producer", [7, 8, 9])
    store.commit(Commit(productions=[Shipment("c", 0, cols, (b"producer",), ckey=production_key(7, "c", 0))], seq=9))
    store = reopen(store)
    assert sum(1 for _ in store.scan(b"P")) == 1
    (got,) = store.productions()
    assert (got.cols, got.producers, got.oldest) == (cols, (b"producer",), 3)
    store.close()


def test_row_checkpoints_written_before_columns_are_re_sent(store: TabletStore) -> None:
    """A tablet checkpointed one Record per production before issue 29: an upgraded worker
    reads them as one-record shipments."""
    rid = b"producer" + (4).to_bytes(8, "big")
    ckey = production_key(4, "c", 1, CK_SEQUENCED_ROW)
    store.db[ckey] = pb.Record(key=b"k", value=b"v", timestamp=11, id=rid).SerializeToString()
    (got,) = store.productions()
    assert (got.computation, got.key_range, got.cols.records(), got.producers, got.ckey) == (
        "c", 1, [Record(b"k", b"v", 11, rid)], (b"producer",), ckey)


def test_uncheckpointed_productions_are_not_stored(store: TabletStore) -> None:
    p = production(1, "c", 0)
    p.ckey = None
    store.commit(Commit(productions=[p]))
    assert store.productions() == []


def test_delete_productions(store: TabletStore) -> None:
    ps = [production(i, "c", i % 2) for i in range(1, 6)]
    store.commit(Commit(productions=ps))
    store.delete_productions([ps[1].ckey, ps[3].ckey, production_key(99, "c", 0)])  # type: ignore[list-item]
    store = reopen(store)
    assert _view(store.productions()) == _view([ps[0], ps[2], ps[4]])
    store.close()


# ---------------------------------------------------------- seq, sink meta


def test_producer_seq_persists_across_reopen(store: TabletStore) -> None:
    assert store.seq == 0
    store.commit(Commit(seq=41))
    assert store.seq == 41
    store.commit(Commit(seq=41))  # unchanged is fine
    store.commit(Commit())  # no seq: left alone
    store = reopen(store)
    assert store.seq == 41
    store.close()


def test_seq_moving_backwards_is_refused_and_nothing_is_written(store: TabletStore) -> None:
    store.commit(Commit(seq=10))
    c = Commit(seq=9, state={b"k": b"v"}, opaque_ids=[b"i" * 16])
    with pytest.raises(AssertionError, match="producer sequence moved backwards: 9 < 10"):
        store.commit(c)
    assert c.status is CommitState.FAILED
    assert store.seq == 10
    assert store.get_state(b"k") is None
    assert not store.has_opaque(b"i" * 16, [0])


def test_sink_meta_roundtrip(store: TabletStore) -> None:
    assert store.sink_meta() is None
    store.commit(Commit(sink=b"file-0007"))
    store.commit(Commit())  # no sink: left alone
    store = reopen(store)
    assert store.sink_meta() == b"file-0007"
    store.close()


# ------------------------------------------------------------------ tokens


def test_reopen_with_older_token_is_refused(db_path: str) -> None:
    TabletStore(db_path, 5, sync=False).close()
    with pytest.raises(StaleTokenError, match="last opened under token 5, newer than ours \\(4\\)"):
        TabletStore(db_path, 4, sync=False)
    # The refusal closed the database: the rightful owner can open it.
    TabletStore(db_path, 5, sync=False).close()


def test_reopen_with_same_or_newer_token_works_and_fences_older(db_path: str) -> None:
    s = TabletStore(db_path, 3, sync=True)
    s.commit(Commit(state={b"k": b"v"}))
    s.close()
    s = TabletStore(db_path, 3, sync=False)
    s.close()
    s = TabletStore(db_path, 9, sync=False)
    assert s.get_state(b"k") == b"v"
    s.close()
    with pytest.raises(StaleTokenError):
        TabletStore(db_path, 8, sync=False)


def test_a_tablet_that_existed_never_opens_from_an_empty_or_foreign_directory(tmp_path: Path) -> None:
    """Review 3 N8: must_exist asked only for a directory; an empty one (a savepoint's tablet
    copied without its files), SSTs without CURRENT, or a RocksDB no tablet wrote opened as
    an empty tablet under any token."""
    missing = str(tmp_path / "missing")
    with pytest.raises(MillstreamError, match="is missing"):
        TabletStore(missing, 2, sync=False, must_exist=True)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(MillstreamError, match="no RocksDB CURRENT file.*refusing to open it empty"):
        TabletStore(str(empty), 1_048_581, sync=False, must_exist=True)
    assert os.listdir(empty) == []  # nothing was created there
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "000012.sst").write_bytes(b"x" * 64)
    with pytest.raises(MillstreamError, match="no RocksDB CURRENT file"):
        TabletStore(str(partial), 3, sync=False, must_exist=True)
    foreign = str(tmp_path / "foreign")
    Rdict(foreign).close()  # a RocksDB, but not one a tablet wrote
    with pytest.raises(MillstreamError, match="no token, no commit recorded"):
        TabletStore(foreign, 3, sync=False, must_exist=True)
    # A real copy opens: one opened once (its token recorded), one a follower made empty.
    real = str(tmp_path / "real")
    TabletStore(real, 1, sync=False).close()
    TabletStore(real, 2, sync=False, must_exist=True).close()
    follower = str(tmp_path / "follower")
    ReplicaStore(follower, token=1).close()
    s = TabletStore(follower, 2, sync=False, must_exist=True)
    assert s.seq == 0 and s.index == 0
    s.close()


def test_second_open_while_open_is_refused(store: TabletStore) -> None:
    with pytest.raises(MillstreamError, match="cannot open tablet storage"):
        TabletStore(store.path, 2, sync=False)


# ------------------------------------------------------------ commit object


def test_commit_lifecycle(store: TabletStore) -> None:
    c = Commit(state={b"k": b"1"})
    assert c.status is CommitState.STARTED
    store.commit(c)
    assert c.status is CommitState.COMMITTED
    c.state[b"k"] = b"2"
    with pytest.raises(AssertionError, match="commit is committed"):
        store.commit(c)
    assert store.get_state(b"k") == b"1"


def test_failed_commit_cannot_be_retried(store: TabletStore) -> None:
    store.commit(Commit(seq=5))
    c = Commit(seq=1)
    with pytest.raises(AssertionError):
        store.commit(c)
    with pytest.raises(AssertionError, match="commit is failed"):
        store.commit(c)


def test_out_of_range_timer_fails_the_whole_commit(store: TabletStore) -> None:
    """Why the context must reject such times (see test_context.py): here it is too late."""
    c = Commit(state={b"k": b"v"}, timers_set={(b"k", "t"): timer(b"k", "t", 2**63)})
    with pytest.raises(struct.error):
        store.commit(c)
    assert c.status is CommitState.FAILED
    assert store.get_state(b"k") is None


def test_int64_extremes_roundtrip(store: TabletStore) -> None:
    ts = [timer(b"lo", "t", -(2**63)), timer(b"hi", "t", 2**63 - 1)]
    p = production(1, "c", 0, ts=2**63 - 1)
    q = production(2, "c", 0, ts=-(2**63))
    store.commit(Commit(timers_set={(t.key, t.tag): t for t in ts}, productions=[p, q]))
    assert set(store.timers()) == set(ts)
    assert _view(store.productions()) == _view([p, q])




def test_a_synced_commit_lets_other_threads_run_during_its_fsync(db_path: str) -> None:
    """rocksdict holds the GIL through ``WriteOptions.sync`` writes, fsync included: with them
    a worker's event loop and its other tablets stood still for every commit (a spinning
    thread advanced during a third of them). Commits sync with ``flush_wal``, which lets go
    of the GIL: another thread advances during (nearly) every one. The threshold is far from
    both sides (about 33 % before, 100 % after, on this project's machines)."""
    s = TabletStore(db_path, 1, sync=True)
    counter = [0]
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            counter[0] += 1

    spinner = threading.Thread(target=spin)
    spinner.start()
    advanced = 0
    try:
        for i in range(100):
            c = Commit()
            c.state[b"k%d" % i] = b"v" * 100
            before = counter[0]
            s.commit(c)
            advanced += counter[0] != before
    finally:
        stop.set()
        spinner.join()
        s.close()
    assert advanced >= 70, f"another thread ran during only {advanced} of 100 synced commits"
    reopened = TabletStore(db_path, 1, sync=True)
    try:
        assert reopened.get_state(b"k99") == b"v" * 100
    finally:
        reopened.close()


_CELLS = [b"Y" + bytes([i]) * 9 + bytes([j]) for i in range(3) for j in range(3)]
_STATE = [b"k%d" % i for i in range(4)]
_write = st.one_of(st.none(), st.binary(min_size=0, max_size=3))


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([3, 8, 1 << 14]), st.lists(st.tuples(
    st.dictionaries(st.sampled_from(_STATE), _write, max_size=3),
    st.dictionaries(st.sampled_from(_CELLS), _write, max_size=4),
    st.lists(st.sampled_from([c[:10] for c in _CELLS]), max_size=1),
    st.booleans(),  # the commit fails (its sequence moves backwards)
    st.lists(st.sampled_from(_CELLS + [b"S" + k for k in _STATE]), max_size=4),  # read between commits
), max_size=12))
def test_the_read_cache_always_holds_what_is_committed(entries: int, batches: list) -> None:  # type: ignore[type-arg]
    """What the tablet thread's read cache holds (worker/readcache.py) equals RocksDB after
    every commit: puts, deletes, cleared prefixes, a failed commit, a young generation that
    turns old, keys read together."""
    from worker.readcache import ReadCache

    with tempfile.TemporaryDirectory() as d:
        store = TabletStore(os.path.join(d, "t"), 1, sync=False)
        store.cache = ReadCache(store.db.get, entries=entries)  # typed state, by storage key
        store.state_cache = ReadCache(store.get_state, entries=entries)  # ctx.state, by the user's key
        try:
            for state, cells, cleared, fails, reads in batches:
                for skey in reads:
                    if skey.startswith(b"S"):
                        store.state_cache.get(skey[1:])
                    else:
                        store.cache.get(skey)
                if len(reads) % 2:  # keys read together, as a batch of new keys is (worker/batch.py)
                    store.state_cache.prefetch([skey[1:] for skey in reads if skey.startswith(b"S")] + _STATE[:2])
                c = Commit(state=dict(state), cells=dict(cells), cleared=list(cleared),
                           seq=store.seq - 1 if fails and store.seq > 0 else store.seq + 1)
                if fails and store.seq > 0:
                    with pytest.raises(AssertionError):
                        store.commit(c)
                else:
                    store.commit(c)
                held = store.cache.held()
                assert held == {k: store.db.get(k) for k in held}
                held = store.state_cache.held()
                assert held == {k: store.get_state(k) for k in held}
            assert {k: store.cache.get(k) for k in _CELLS} == {k: store.db.get(k) for k in _CELLS}
            assert {k: store.state_cache.get(k) for k in _STATE} == {k: store.get_state(k) for k in _STATE}
        finally:
            store.close()


def test_the_read_cache_holds_what_is_read_not_what_is_only_written() -> None:
    """A commit updates the keys the cache holds (read before, in either generation) and
    leaves out those only written: a window's accumulators, which its operator keeps in
    memory, no longer push a step's state that is read out of it (on W2 a batch wrote
    thousands of them)."""
    from worker.readcache import ReadCache

    stored = {b"read": b"0", b"old": b"0"}
    reads: list[bytes] = []
    cache = ReadCache(lambda k: (reads.append(k), stored.get(k))[1], entries=2)
    assert cache.get(b"old") == b"0"
    cache.get(b"x")
    cache.get(b"y")  # over 2 entries: "old", "x" and "y" turn old
    assert cache.get(b"read") == b"0"
    writes = {b"read": b"1", b"old": b"1", b"written": b"1", b"gone": None}
    stored.update({k: v for k, v in writes.items() if v is not None})
    cache.committed(writes)
    assert b"written" not in cache.held() and b"gone" not in cache.held()
    reads.clear()
    assert (cache.get(b"read"), cache.get(b"old")) == (b"1", b"1") and reads == [], "held keys follow the commit"
    assert cache.get(b"written") == b"1" and reads == [b"written"]


# ------------------------------------------------------------- a commit's writes, shipped

_WRITE_KEYS = st.binary(min_size=1, max_size=3)
_WRITES = st.lists(st.one_of(
    st.tuples(st.just(PUT), _WRITE_KEYS, st.binary(max_size=4)),
    st.tuples(st.just(DELETE), _WRITE_KEYS, st.just(b"")),
    st.tuples(st.just(DELETE_RANGE), _WRITE_KEYS, _WRITE_KEYS).filter(lambda w: w[1] < w[2])), max_size=30)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(_WRITE_KEYS, st.binary(max_size=4), max_size=10), _WRITES)
def test_a_commits_writes_apply_at_a_follower_as_they_did_at_the_primary(
        before: dict[bytes, bytes], writes: list[tuple[int, bytes, bytes]]) -> None:
    """What a follower applies (``apply_ops`` of ``encode_ops``) leaves its RocksDB as the
    primary's writes, in their order, left the primary's: puts, deletes and range deletes."""
    with tempfile.TemporaryDirectory() as d:
        dbs = [_open(os.path.join(d, side)) for side in ("primary", "follower")]
        try:
            for db in dbs:
                for k, v in before.items():
                    db[k] = v
            primary, follower = (Writes(record=True), WriteBatch(raw_mode=True))
            for kind, k, v in writes:
                (primary.put if kind == PUT else primary.delete_range if kind == DELETE_RANGE
                 else lambda k, _v: primary.delete(k))(k, v)
            apply_ops(follower, encode_ops(primary.ops or []))
            dbs[0].write(primary.wb)
            dbs[1].write(follower)
            assert [dict(db.items()) for db in dbs][1] == dict(dbs[0].items())
        finally:
            for db in dbs:
                db.close()


def test_writes_a_follower_cannot_decode_are_refused_with_what_was_wrong() -> None:
    with pytest.raises(MillstreamError, match="do not decode"):
        apply_ops(WriteBatch(raw_mode=True), b"\xff\xff\xff")
    with pytest.raises(MillstreamError, match="must line up"):
        apply_ops(WriteBatch(raw_mode=True), pb.Writes(kinds=b"\x00\x00", keys=[b"k"], values=[b"v"]).SerializeToString())
    with pytest.raises(MillstreamError, match="unknown write kind 7"):
        apply_ops(WriteBatch(raw_mode=True), pb.Writes(kinds=b"\x07", keys=[b"k"], values=[b""]).SerializeToString())
