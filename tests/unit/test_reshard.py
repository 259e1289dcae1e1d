"""Building split and merged ranges' storage (worker/reshard.py) on real RocksDB, and the
lower marks a merge leaves (worker/dedup.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from master.ranges import Ranges
from runtime.columns import Columns
from runtime.computation import TimeDomain
from runtime.errors import MillstreamError
from runtime.keyspace import HASH_SPACE, key_hash
from runtime.record import Record, sequence_id
from worker.dedup import Mark, MarkView
from worker.reshard import Origin, Parent
from worker.storage import Commit, Shipment, TabletStore, Timer, production_key

P = b"producer"  # an 8-byte producer prefix
KEYS = [f"key{i}".encode() for i in range(200)]


def _parent(path: str, token: int = 3) -> None:
    s = TabletStore(path, token, sync=False)
    timers = {(k, "t"): Timer(k, "t", TimeDomain.EVENT_TIME, i) for i, k in enumerate(KEYS)}
    prods = [Shipment("down", 0, Columns.of_records([Record(b"x", b"v", 0, sequence_id(b"me______", 1))], b"me______"),
                      (b"me______",), ckey=production_key(1, "down", 0))]
    s.commit(Commit(state={k: k + b"!" for k in KEYS}, timers_set=timers, productions=prods,
                    marks={P: Mark(50, 2, 1)}, seq=1))
    s.close()


def _open(path: str, token: int = 4) -> TabletStore:
    return TabletStore(path, token, sync=False, must_exist=True)


def test_a_split_gives_each_half_its_keys_timers_and_the_marks(tmp_path: Path) -> None:
    parent = str(tmp_path / "c" / "0")
    _parent(parent)
    ranges = Ranges.first(1).split("c", 0, None)
    halves = []
    for rid in (1, 2):
        kr = ranges.ranges[rid]
        Origin([Parent(parent, 0, HASH_SPACE)], kr.start, kr.end, first=kr.end == kr.cut).build(
            str(tmp_path / "c" / str(rid)))
        halves.append((kr, _open(str(tmp_path / "c" / str(rid)))))
    for kr, s in halves:
        mine = [k for k in KEYS if kr.start <= key_hash(k) < kr.end]
        assert 0 < len(mine) < len(KEYS)
        assert all(s.get_state(k) == k + b"!" for k in mine)
        assert all(s.get_state(k) is None for k in KEYS if k not in mine)
        assert sorted(t.key for t in s.timers()) == sorted(mine)
        assert s.marks() == {P: Mark(50, 2, 1)}  # whatever the parent committed, each half has
    (left_kr, left), (_, right) = halves
    assert [p.cols.id(0) for p in left.productions()] == [sequence_id(b"me______", 1)]
    assert right.productions() == []  # the first half alone re-sends the parent's productions
    for _, s in halves:
        s.close()


def test_a_merge_keeps_the_lower_mark_of_the_side_that_saw_less(tmp_path: Path) -> None:
    parent = str(tmp_path / "c" / "0")
    _parent(parent)
    ranges = Ranges.first(1).split("c", 0, None)
    for rid in (1, 2):
        kr = ranges.ranges[rid]
        Origin([Parent(parent, 0, HASH_SPACE)], kr.start, kr.end, first=rid == 1).build(str(tmp_path / "c" / str(rid)))
    # The right half commits records of P up to 80; the left stays at 50.
    right = _open(str(tmp_path / "c" / "2"))
    right.commit(Commit(marks={P: Mark(80, 2, 5)}, state={b"new": b"1"}))
    right.close()
    merged = ranges.merge("c", 1, 2)
    kr = merged.ranges[3]
    lo, hi = ranges.ranges[1], ranges.ranges[2]
    Origin([Parent(str(tmp_path / "c" / "1"), lo.start, lo.end), Parent(str(tmp_path / "c" / "2"), hi.start, hi.end)],
           kr.start, kr.end, first=False).build(str(tmp_path / "c" / "3"))
    s = _open(str(tmp_path / "c" / "3"), 5)
    assert all(s.get_state(k) == k + b"!" for k in KEYS) and s.get_state(b"new") == b"1"
    assert len(s.timers()) == len(KEYS)
    assert s.marks()[P].seq == 80
    left_key = next(k for k in KEYS if key_hash(k) < lo.end)
    right_key = next(k for k in KEYS if key_hash(k) >= lo.end)
    view = MarkView(s.marks(), s.lower_marks())
    assert not view.seen(P, 60, left_key)   # the left side never committed 60: not a duplicate
    assert view.seen(P, 60, right_key)      # the right side did
    assert view.seen(P, 50, left_key) and view.floor(P) == 50
    view.advance(P, 81, 2, 6)  # a newer record: nothing older can follow, the lower mark goes
    assert view.lower_changed[P] == [] and view.seen(P, 60, left_key)
    assert len(s.productions()) == 1  # the left half's (the parent's) production, once
    s.close()


def test_a_build_without_its_parents_storage_refuses(tmp_path: Path) -> None:
    with pytest.raises(MillstreamError, match="only the worker that held them"):
        Origin([Parent(str(tmp_path / "gone"), 0, HASH_SPACE)], 0, 1 << 63, True).build(str(tmp_path / "c" / "1"))
    assert not os.path.exists(tmp_path / "c" / "1")


def test_ranges_refuse_bad_cuts_and_non_adjacent_merges() -> None:
    r = Ranges.first(2)
    with pytest.raises(MillstreamError, match="not strictly inside"):
        r.split("c", 0, 0)
    with pytest.raises(MillstreamError, match="not adjacent"):
        r.merge("c", 1, 0)
    with pytest.raises(MillstreamError, match="has no range 7"):
        r.split("c", 7, None)
    s = r.split("c", 0, None)
    assert sorted(s.ranges) == [1, 2, 3] and s.next_id == 4
    assert Ranges.from_doc(s.to_doc()) == s


def test_a_key_sample_finds_where_the_load_divides_evenly() -> None:
    from worker.progress import KeySample

    sample = KeySample(every=4, keep=1000, refresh_s=0)
    low = [k for k in (b"k%d" % i for i in range(20_000)) if key_hash(k) < HASH_SPACE // 8][:2000]
    assert sample.median() == 0  # too few samples yet
    sample.add(low)
    m = sample.median()
    assert 0 < m < HASH_SPACE // 8
    below = sum(1 for k in low if key_hash(k) < m)
    assert abs(below - len(low) // 2) < len(low) // 10


def test_a_duplicate_raises_the_lower_marks_too() -> None:
    from worker.dedup import Lower

    view = MarkView({P: Mark(100, 1, 0)}, {P: [Lower(0, HALF, 40)]})
    left = next(k for k in KEYS if key_hash(k) < HALF)
    assert view.floor(P) == 40
    view.passed(P, 60)  # a duplicate of 60 (committed on the other side) came by
    assert view.floor(P) == 60 and not view.seen(P, 61, left)
    view.passed(P, 100)
    assert view.lower_changed[P] == [] and view.floor(P) == 100


HALF = HASH_SPACE // 2


def test_a_lower_mark_stays_with_its_keys_through_a_split_and_a_merge_back(tmp_path: Path) -> None:
    """Review of the delivery core: a split half kept its parent's lower marks whole, over
    keys of the other half. Merged back after the other half's mark rose (and dropped its
    lower marks), the stale lower mark stood for those keys again: a record the other half
    had committed was taken as new."""
    def build(rid: int, parents: list[tuple[int, int, int]], kr: Any, first: bool = False) -> None:
        Origin([Parent(str(tmp_path / "c" / str(p)), lo, hi) for p, lo, hi in parents], kr.start, kr.end,
               first=first).build(str(tmp_path / "c" / str(rid)))

    _parent(str(tmp_path / "c" / "0"))  # P's mark 50
    ranges = Ranges.first(1).split("c", 0, None)
    r1, r2 = ranges.ranges[1], ranges.ranges[2]
    build(1, [(0, 0, HASH_SPACE)], r1, first=True)
    build(2, [(0, 0, HASH_SPACE)], r2)
    right = _open(str(tmp_path / "c" / "2"))
    right.commit(Commit(marks={P: Mark(80, 2, 5)}))
    right.close()
    ranges = ranges.merge("c", 1, 2)  # 3: mark 80, a lower mark of 50 over 1's keys
    build(3, [(1, r1.start, r1.end), (2, r2.start, r2.end)], ranges.ranges[3])
    cut = r2.start + (HASH_SPACE - r2.start) // 2  # in what was 2: the lower mark goes with 4
    ranges = ranges.split("c", 3, cut)
    r4, r5 = ranges.ranges[4], ranges.ranges[5]
    build(4, [(3, 0, HASH_SPACE)], r4, first=True)
    build(5, [(3, 0, HASH_SPACE)], r5)
    four = _open(str(tmp_path / "c" / "4"), 6)
    view = MarkView(four.marks(), four.lower_marks())
    view.advance(P, 90, 2, 7)  # 4 commits P's records up to 90: its lower marks go
    four.commit(Commit(marks={P: Mark(90, 2, 7)}, lower=view.lower_changed))
    four.close()
    ranges = ranges.merge("c", 4, 5)
    build(6, [(4, r4.start, r4.end), (5, r5.start, r5.end)], ranges.ranges[6])
    merged = _open(str(tmp_path / "c" / "6"), 7)
    view = MarkView(merged.marks(), merged.lower_marks())
    key_of_1 = next(k for k in KEYS if key_hash(k) < r1.end)
    key_of_5 = next(k for k in KEYS if key_hash(k) >= cut)
    assert view.seen(P, 85, key_of_1), "a record range 4 committed taken as new after the merge"
    assert not view.seen(P, 85, key_of_5)  # 5 never went past 80
    merged.close()


def test_a_parent_that_never_committed_a_sink_meta_is_handed_to_the_range_that_goes_on(tmp_path: Path) -> None:
    """Review: a sink range's first batch written, its commit failed, split before it opened
    again: the first half goes on with the parent's output, but there was no meta to go on
    with, so the parent's uncommitted lines stayed (read twice). The range that goes on is now
    told the parent's name and last token, and its sink takes that output back when it opens,
    until it commits a meta of its own."""
    from runtime.outputfiles import CommittedFile
    from runtime.sinks import FileSink, call_restore

    out = str(tmp_path / "out")
    parent = str(tmp_path / "c" / "0")
    _parent(parent)  # committed state under token 3, never a sink meta
    lost = CommittedFile(out, "c/0", ".jsonl", None, token=3)
    lost.append(b'{"key": "k", "value": "lost", "timestamp": 1}\n')
    ranges = Ranges.first(1).split("c", 0, None)
    for rid in (1, 2):
        kr = ranges.ranges[rid]
        Origin([Parent(parent, 0, HASH_SPACE)], kr.start, kr.end, first=rid == 1).build(str(tmp_path / "c" / str(rid)))
    left, right = _open(str(tmp_path / "c" / "1")), _open(str(tmp_path / "c" / "2"))
    assert left.uncommitted_sink_tablets() == {"c/0": 3} and right.uncommitted_sink_tablets() == {}
    sink = FileSink()
    sink.setup({"path": out})
    # What the tablet's open calls (worker/tablet.py), from what the storage holds.
    call_restore(sink.restore, "c/1", left.sink_meta(), 4, left.absorbed_sink_metas(), left.uncommitted_sink_tablets())
    assert not os.path.exists(lost.path)
    left.close()
    # c/1 (token 4, no meta yet) split again: its first half is told of both, the second of none.
    again = ranges.split("c", 1, None)
    for rid in (3, 4):
        kr = again.ranges[rid]
        Origin([Parent(str(tmp_path / "c" / "1"), ranges.ranges[1].start, ranges.ranges[1].end)], kr.start, kr.end,
               first=rid == 3).build(str(tmp_path / "c" / str(rid)))
        s = _open(str(tmp_path / "c" / str(rid)), 5)
        assert s.uncommitted_sink_tablets() == ({"c/0": 3, "c/1": 4} if rid == 3 else {})
        s.close()
    # Merged: c/2 (right, no meta) is handed on with what it inherited; so is c/4 (left, none).
    merged = again.merge("c", 4, 2)
    kr, lo, hi = merged.ranges[5], again.ranges[4], again.ranges[2]
    right.close()
    Origin([Parent(str(tmp_path / "c" / "4"), lo.start, lo.end), Parent(str(tmp_path / "c" / "2"), hi.start, hi.end)],
           kr.start, kr.end, first=False).build(str(tmp_path / "c" / "5"))
    s = _open(str(tmp_path / "c" / "5"), 6)
    assert s.uncommitted_sink_tablets() == {"c/2": 4, "c/4": 5} and s.absorbed_sink_metas() == []
    # Its first meta forgets them: taken back at the open, never again.
    s.commit(Commit(sink=b"5 c-5.jsonl run"))
    s.close()
    s = _open(str(tmp_path / "c" / "5"), 7)
    assert s.uncommitted_sink_tablets() == {} and s.sink_meta() == b"5 c-5.jsonl run"
    s.close()
    # A parent that committed a meta hands the meta on, and no name.
    done = str(tmp_path / "d" / "0")
    _parent(done)
    p = _open(done, 4)
    p.commit(Commit(sink=b"3 d-0.jsonl run"))
    p.close()
    Origin([Parent(done, 0, HASH_SPACE)], 0, 1 << 62, first=True).build(str(tmp_path / "d" / "1"))
    half = _open(str(tmp_path / "d" / "1"), 5)
    assert half.uncommitted_sink_tablets() == {} and half.sink_meta() == b"3 d-0.jsonl run"
    half.close()
