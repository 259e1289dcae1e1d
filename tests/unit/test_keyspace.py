"""Stable key hashing and key ranges (runtime/keyspace.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.keyspace import HASH_SPACE, key_hash, range_bounds, range_of

n_ranges = st.integers(1, 1024)


def test_key_hash_is_pinned() -> None:
    # Values computed once; a change here re-routes every key of every running topology.
    assert key_hash(b"a") == 4681665781835383343
    assert key_hash(b"") == 16476032584258269876
    assert key_hash(b"hello") == 12085107955937391741


@given(st.binary())
def test_key_hash_is_64_bits(key: bytes) -> None:
    assert 0 <= key_hash(key) < HASH_SPACE


@given(st.binary(), n_ranges)
def test_range_of_is_a_valid_index(key: bytes, n: int) -> None:
    assert 0 <= range_of(key, n) < n


def test_range_bounds_partition_the_hash_space() -> None:
    for n in range(1, 1025):
        expected_lo = 0
        for i in range(n):
            lo, hi = range_bounds(i, n)
            assert lo == expected_lo, f"gap or overlap before range {i} of {n}"
            assert lo < hi, f"range {i} of {n} is empty"
            expected_lo = hi
        assert expected_lo == HASH_SPACE, f"ranges of {n} stop at {expected_lo}"


@given(st.binary(), n_ranges)
def test_key_lies_within_the_bounds_of_its_range(key: bytes, n: int) -> None:
    lo, hi = range_bounds(range_of(key, n), n)
    assert lo <= key_hash(key) < hi


def test_range_bounds_agree_with_range_of_at_a_non_exact_boundary() -> None:
    # 2**64 / 3 is not whole: the boundary hash floor(2**64/3) still belongs to range 0
    # (floor(h * 3 / 2**64) == 0), so range 1 starts one above it (a ceiling).
    lo, _ = range_bounds(1, 3)
    assert lo == HASH_SPACE // 3 + 1
    assert (HASH_SPACE // 3 * 3) >> 64 == 0


@pytest.mark.parametrize("index,n", [(-1, 4), (4, 4), (0, 0)])
def test_range_bounds_rejects_bad_index(index: int, n: int) -> None:
    with pytest.raises(ValueError, match="outside"):
        range_bounds(index, n)


@given(st.binary(), st.integers(1, 64))
def test_more_ranges_refine_fewer(key: bytes, n: int) -> None:
    """Doubling the ranges splits each range in two: key ranges can be split in place."""
    assert range_of(key, 2 * n) // 2 == range_of(key, n)
