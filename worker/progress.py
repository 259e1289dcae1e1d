"""Tracking a tablet's oldest pending timestamp cheaply (for its low-watermark report)."""

from __future__ import annotations

import heapq


class TimestampBag:
    """A multiset of timestamps with O(log n) add/remove and O(1) amortised minimum."""

    def __init__(self) -> None:
        self._count: dict[int, int] = {}
        self._heap: list[int] = []
        self.size = 0

    def add(self, ts: int) -> None:
        n = self._count.get(ts, 0)
        if n == 0:
            heapq.heappush(self._heap, ts)
        self._count[ts] = n + 1
        self.size += 1

    def remove(self, ts: int) -> None:
        n = self._count[ts]
        if n == 1:
            del self._count[ts]
            if len(self._heap) > 2 * len(self._count) + 64:
                # Removed timestamps leave the heap lazily, from the top; one old timestamp
                # that stays would pin every later one. Rebuild from the live ones instead.
                self._heap = list(self._count)
                heapq.heapify(self._heap)
        else:
            self._count[ts] = n - 1
        self.size -= 1

    def min(self) -> int | None:
        heap = self._heap
        while heap and heap[0] not in self._count:
            heapq.heappop(heap)  # lazily drop timestamps whose count reached zero
        return heap[0] if heap else None
