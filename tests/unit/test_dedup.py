"""The Bloom-filter stage of dedup (worker/dedup.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from worker.dedup import DedupFilter

ids = st.binary(min_size=16, max_size=16)


@settings(max_examples=200)
@given(st.lists(st.lists(ids, max_size=80), max_size=12))
def test_no_false_negatives_across_rotations(batches: list[list[bytes]]) -> None:
    f = DedupFilter(capacity=50, error_rate=0.01, generations=2)
    seen: list[bytes] = []
    for batch in batches:
        f.add_all(batch)
        seen.extend(batch)
        missing = [rid for rid in seen if not f.may_contain(rid)]
        assert not missing, f"{len(missing)} of {len(seen)} ids forgotten"
        assert f.needs_rebuild() == (f.generations > 2)


def test_many_rotations_keep_every_id() -> None:
    f = DedupFilter(capacity=50, generations=2)
    added = [i.to_bytes(16, "big") for i in range(2000)]  # 40 rotations
    for start in range(0, len(added), 37):
        f.add_all(added[start:start + 37])
    assert all(f.may_contain(rid) for rid in added)
    assert f.generations == 40 and f.needs_rebuild()  # the tablet rebuilds it from disk ids


def test_empty_filter_has_no_hits() -> None:
    f = DedupFilter(capacity=50, generations=2)
    assert not f.may_contain(b"\0" * 16)
    f.add_all([])
    assert not f.may_contain(b"\0" * 16)


def test_false_positive_rate_is_roughly_as_configured() -> None:
    f = DedupFilter(capacity=10_000, error_rate=0.01, generations=2)
    f.add_all(i.to_bytes(16, "big") for i in range(10_000))
    hits = sum(f.may_contain(i.to_bytes(16, "big")) for i in range(10_000, 30_000))
    assert hits < 20_000 * 0.03
