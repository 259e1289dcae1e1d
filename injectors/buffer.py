"""The injector's queue of records waiting for a round: first in, first out, with the oldest
timestamp it holds (what the injector's effective watermark may not pass) at O(1) per record.

Recomputing that minimum over what stays queued after each round cost O(queue) per round:
with 100,000 records queued (the default bound) and rounds of 1,000, a fast sender spent a
scan of the whole queue per round, under the lock its ``send`` calls wait for. Here the
minimum is kept the way a sliding-window minimum is: a deque of the records that are the
oldest of everything queued after them, so appending pops what it makes irrelevant and
taking a round drops what left with it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from runtime.record import Record

END_OF_TIME = (1 << 63) - 1
_COMPACT_AT = 4096  # taken records kept in the list before it is compacted


class Buffer:
    """Records in arrival order; :attr:`min_timestamp` is the lowest timestamp among them."""

    def __init__(self) -> None:
        self._items: list[Record] = []
        self._head = 0          # index in _items of the first record still queued
        self._taken = 0         # records ever taken: _items[i] has absolute position _taken - _head + i
        self._mins: deque[tuple[int, int]] = deque()  # (timestamp, absolute position), rising both
        self.size = 0           # records queued: len(), read without a call on the send path

    def __len__(self) -> int:
        return self.size

    def __bool__(self) -> bool:
        return self.size > 0

    def __iter__(self) -> Iterator[Record]:
        return iter(self._items[self._head:])

    @property
    def min_timestamp(self) -> int:
        return self._mins[0][0] if self._mins else END_OF_TIME

    def append(self, record: Record) -> int:
        """Queue ``record``; returns how many are queued now."""
        ts = record.timestamp
        mins = self._mins
        while mins and mins[-1][0] >= ts:
            mins.pop()
        n = self.size
        mins.append((ts, self._taken + n))
        self._items.append(record)
        self.size = n + 1
        return n + 1

    def take(self, n: int) -> list[Record]:
        """The (up to) ``n`` oldest records, removed."""
        out = self._items[self._head:self._head + n]
        self._head += len(out)
        self._taken += len(out)
        self.size -= len(out)
        mins = self._mins
        while mins and mins[0][1] < self._taken:
            mins.popleft()
        if self._head >= _COMPACT_AT and self._head * 2 >= len(self._items):
            del self._items[:self._head]
            self._head = 0
        return out

    def put_back(self, records: list[Record]) -> None:
        """Queue ``records`` again ahead of everything (a round that failed)."""
        rest = self._items[self._head:]
        self._items, self._head, self._mins, self.size = [], 0, deque(), 0
        self._taken -= len(records)
        for r in [*records, *rest]:
            self.append(r)
