"""Stable key hashing and key ranges.

Keys hash to 64 bits with BLAKE2b (stable across processes and machines, unlike
Python's salted ``hash``). A computation's hash space ``[0, 2**64)`` is cut into
``n`` equal ranges; range ``i`` covers ``[ceil(i * 2**64 / n), ceil((i + 1) * 2**64 / n))``,
exactly the hashes :func:`range_of` maps to ``i``.
"""

from __future__ import annotations

import hashlib

HASH_SPACE = 1 << 64


def key_hash(key: bytes) -> int:
    """The stable 64-bit hash of a key."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")


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
