"""Bounded dedup data (worker/dedup.py): producer marks and opaque ids by time bucket."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.record import producer_prefix, sequence_id
from worker.dedup import Mark, MarkView, OpaqueIds, split_sequenced

ids = st.binary(min_size=16, max_size=16)


@settings(max_examples=100)
@given(st.lists(st.lists(ids, max_size=80), max_size=12))
def test_no_false_negatives_as_filters_grow(batches: list[list[bytes]]) -> None:
    f = OpaqueIds(retention_us=60_000_000, capacity=50)
    seen: list[bytes] = []
    for i, batch in enumerate(batches):
        f.add(i % 3, batch)
        seen.extend(batch)
        missing = [rid for rid in seen if not f.candidates(rid)]
        assert not missing, f"{len(missing)} of {len(seen)} ids forgotten"


def test_a_bucket_past_the_retention_is_dropped_whole() -> None:
    f = OpaqueIds(retention_us=400_000_000)  # buckets of 100 s, five kept
    assert f.bucket_us == 100_000_000
    now = 1_000 * 100_000_000 + 5
    assert f.oldest_kept(now) == 996
    f.add(995, [b"a" * 16])
    f.add(996, [b"b" * 16])
    f.expire(f.oldest_kept(now))
    assert f.candidates(b"a" * 16) == [] and f.candidates(b"b" * 16) == [996]
    assert f.buckets == 1


def test_memory_grows_with_the_ids_of_the_retention_only() -> None:
    f = OpaqueIds(retention_us=400_000_000, capacity=1000)
    for b in range(20):
        f.add(b, (i.to_bytes(16, "big") for i in range(b * 3000, (b + 1) * 3000)))
        f.expire(b - 4)
    assert f.buckets == 5
    assert f.memory_bytes() == 5 * (1000 + 2000) * 12 // 10


def test_marks_advance_only_forward_and_keep_the_newest_token() -> None:
    p = producer_prefix("x")
    view = MarkView({p: Mark(10, 3, 0)})
    view.advance(p, 7, 2, 50)
    assert view.get(p) == Mark(10, 3, 50)
    view.advance(p, 12, 4, 60)
    assert view.get(p) == Mark(12, 4, 60)
    assert view.committed[p] == Mark(10, 3, 0)  # until the commit
    assert Mark.unpack(Mark(12, 4, -1).pack()) == Mark(12, 4, -1)


def test_sequenced_ids_split_into_producer_and_sequence() -> None:
    p = producer_prefix("injector/a")
    assert split_sequenced(sequence_id(p, 2**40 + 3)) == (p, 2**40 + 3)


def test_a_delivery_from_outside_must_have_well_formed_ids() -> None:
    from worker.dedup import delivery_problem

    good = [sequence_id(b"producer", 1), sequence_id(b"producer", 2), bytes(16)]
    assert delivery_problem(good, {b"producer": (0, 0)}) is None
    assert "record 1 has an id of 3 bytes" in str(delivery_problem([bytes(16), b"abc"], None))
    assert "is 3 bytes long" in str(delivery_problem(good, {b"abc": (0, 0)}))
