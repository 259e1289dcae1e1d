"""The per-record kernels of routing, compiled where a compiler was there at install time.

A key's stable hash, a column of keys' hashes, their key ranges, the records of each range
and a column's items at some indexes: steps every record takes on the injector and in every
stage that produces, which the profiles showed as Python loops (a BLAKE2b object, its
digest and an ``int.from_bytes`` per key cost ~0.5-0.9 µs). ``runtime/_kernels.c`` has the
same functions in C; ``pip install -e .`` builds it when it can (``setup.py``: optional, a
machine without a C compiler or Python's headers installs without it).

This module's own functions are the reference: what the compiled ones must return, and what
runs when they are not there or when ``MILLSTREAM_PURE_PYTHON=1`` is set in the environment
(read at import: set it before a process starts). ``tests/unit/test_kernels.py`` checks both
against each other on random inputs, and the hash against ``hashlib``.
"""

from __future__ import annotations

import bisect
import hashlib
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def key_hash_py(key: bytes) -> int:
    """The stable 64-bit hash of a key: BLAKE2b with an 8-byte digest, read big-endian."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")


def hash_prefix_py(key: bytes) -> bytes:
    """:func:`key_hash` as 8 big-endian bytes (the digest itself)."""
    return hashlib.blake2b(key, digest_size=8).digest()


def prefixed_keys_py(prefix: bytes, keys: Iterable[bytes]) -> list[bytes]:
    """``prefix + hash_prefix(key) + key`` of every key, in order (a storage key in hash order)."""
    blake2b = hashlib.blake2b
    return [prefix + blake2b(k, digest_size=8).digest() + bytes(k) for k in keys]


def count_into_py(counts: list[int], bounds: tuple[float, ...], values: list[float]) -> float:
    """``counts[bisect_left(bounds, v)] += 1`` for each value (``bounds`` rise, ``counts`` has
    one more item); returns the sum of the values: a histogram's update by a batch."""
    left = bisect.bisect_left
    for v in values:
        counts[left(bounds, v)] += 1
    return float(sum(values))


def columns_of_py(rows: list[tuple[Any, ...]], width: int) -> tuple[list[Any], ...]:
    """Rows (tuples of ``width`` items) as ``width`` lists, in order."""
    rows = list(rows)
    for i, row in enumerate(rows):
        if type(row) is not tuple or len(row) != width:
            raise ValueError(f"columns_of: row {i} is not a tuple of {width} items")
    return tuple([row[c] for row in rows] for c in range(width))


def total_len_py(items: Sequence[Any], start: int) -> int:
    """``sum(len(x) for x in items[start:])``."""
    return sum(map(len, items[start:]))


def key_hashes_py(keys: Sequence[bytes]) -> list[int]:
    """:func:`key_hash` of every key, in order."""
    blake2b, from_bytes = hashlib.blake2b, int.from_bytes
    return [from_bytes(blake2b(k, digest_size=8).digest(), "big") for k in keys]


def ranges_of_py(hashes: Sequence[int], starts: Sequence[int], ids: Sequence[T]) -> list[T]:
    """``ids[j]`` for each hash, ``starts[j]`` the highest start at or below it (``starts``
    rise; a hash below the first has no range: LookupError)."""
    if hashes and (not starts or min(hashes) < starts[0]):
        raise LookupError("the routing has no range at the start of the hash space")
    right = bisect.bisect_right
    return [ids[right(starts, h) - 1] for h in hashes]


def group_py(values: Sequence[T]) -> dict[T, list[int]]:
    """The indexes of ``values`` by value, each list rising, the values in the order they first
    occur: which records go to which range."""
    groups: dict[T, list[int]] = {r: [] for r in dict.fromkeys(values)}
    adds = {r: ix.append for r, ix in groups.items()}
    for i, r in enumerate(values):
        adds[r](i)
    return groups


def take_py(column: Sequence[T], indexes: Sequence[int]) -> list[T]:
    """``[column[i] for i in indexes]``."""
    return [column[i] for i in indexes]


_compiled: Any = None
if os.environ.get("MILLSTREAM_PURE_PYTHON", "") in ("", "0"):
    try:
        import runtime._kernels as _compiled  # type: ignore[import-not-found, no-redef]
    except ImportError:  # not built: no compiler at install time, or a checkout never installed
        _compiled = None

COMPILED: bool = _compiled is not None
"""Whether the compiled kernels are in use (the bench report says, beside its figures)."""

key_hash: Callable[[bytes], int]
hash_prefix: Callable[[bytes], bytes]
key_hashes: Callable[[Sequence[bytes]], list[int]]
prefixed_keys: Callable[[bytes, Iterable[bytes]], list[bytes]]
count_into: Callable[[list[int], tuple[float, ...], list[float]], float]
columns_of: Callable[[list[tuple[Any, ...]], int], tuple[list[Any], ...]]
total_len: Callable[[Sequence[Any], int], int]
ranges_of: Callable[[Sequence[int], Sequence[int], Sequence[Any]], list[Any]]
group: Callable[[Sequence[Any]], dict[Any, list[int]]]
take: Callable[[Sequence[Any], Sequence[int]], list[Any]]
if _compiled is not None:
    key_hash = _compiled.key_hash
    hash_prefix = _compiled.hash_prefix
    key_hashes = _compiled.key_hashes
    prefixed_keys = _compiled.prefixed_keys
    count_into = _compiled.count_into
    columns_of = _compiled.columns_of
    total_len = _compiled.total_len
    ranges_of = _compiled.ranges_of
    group = _compiled.group
    take = _compiled.take
else:
    key_hash = key_hash_py
    hash_prefix = hash_prefix_py
    key_hashes = key_hashes_py
    prefixed_keys = prefixed_keys_py
    count_into = count_into_py
    columns_of = columns_of_py
    total_len = total_len_py
    ranges_of = ranges_of_py
    group = group_py
    take = take_py
