"""Stable key hashing and key ranges.

Keys hash to 64 bits with BLAKE2b (stable across processes and machines, unlike
Python's salted ``hash``; compiled where it could be built: runtime/kernels.py). A
computation's hash space ``[0, 2**64)`` is cut into ``n`` equal ranges; range ``i`` covers ``[ceil(i * 2**64 / n), ceil((i + 1) * 2**64 / n))``,
exactly the hashes :func:`range_of` maps to ``i``.
"""

from __future__ import annotations

from runtime.kernels import hash_prefix, key_hash, key_hashes

__all__ = ["HASH_SPACE", "first_cut", "from_wire_end", "hash_prefix", "key_hash", "key_hashes", "range_bounds",
           "range_of", "wire_end"]

HASH_SPACE = 1 << 64
# key_hash(key): the stable 64-bit hash of a key. key_hashes(keys): that of every key of a
# column, in order, without a call of ours per key (a column is hashed once, whatever number
# of readers then route it). hash_prefix(key): key_hash as 8 big-endian bytes, a key's place
# in hash order (storage keys start with it, so a range of hashes is a range of storage keys).


def range_of(key: bytes, n_ranges: int) -> int:
    """The index of the key range, out of ``n_ranges``, that holds ``key``."""
    return (key_hash(key) * n_ranges) >> 64


def range_bounds(index: int, n_ranges: int) -> tuple[int, int]:
    """The half-open hash interval ``[lo, hi)`` of range ``index``."""
    if not 0 <= index < n_ranges:
        raise ValueError(f"range index {index} is outside 0..{n_ranges - 1}")
    lo = -(-index * HASH_SPACE // n_ranges)
    hi = -(-(index + 1) * HASH_SPACE // n_ranges)
    return lo, hi


def wire_end(end: int) -> int:
    """A range's exclusive end as a uint64 field (2**64, the end of the space, is 0)."""
    return 0 if end == HASH_SPACE else end


def from_wire_end(end: int) -> int:
    return HASH_SPACE if end == 0 else end


def first_cut(n_ranges: int) -> dict[int, tuple[int, int]]:
    """The ranges a computation starts with (``key_ranges=n``): ids 0..n-1, equal widths."""
    return {i: range_bounds(i, n_ranges) for i in range(n_ranges)}


def check_split(lo: int, hi: int, at: int | None) -> int:
    """Where to cut ``[lo, hi)`` (the middle unless ``at``); raises ValueError if it cannot."""
    if hi - lo < 2:
        raise ValueError(f"range [{lo}, {hi}) holds a single hash; it cannot be split")
    cut = lo + (hi - lo) // 2 if at is None else at
    if not lo < cut < hi:
        raise ValueError(f"--at {cut} is not strictly inside the range [{lo}, {hi}); "
                         "pick a hash between its start + 1 and its end - 1")
    return cut
