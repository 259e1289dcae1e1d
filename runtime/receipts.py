"""Receipts held: what a sender keeps of its committed deliveries until the leader holds the
progress report of the receiver that reflects them (docs/time.md, "Hand-over receipts").

A receiver answers a committed delivery with a *receipt*, (its worker id, the sequence of its
progress report that will reflect the commit). Until the leader holds that report, its view
of the receiving tablet may not reflect the records, so the sender's watermark must not pass
them: a tablet's outbox (worker/outbox.py) and an injector's watermark
(injectors/watermark.py) hold the oldest timestamp of each such delivery, and let go of it
once the leader says it holds the report (or does not know the worker: its reports count
for nothing then). One rule, one place.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from typing import Generic, TypeVar

from runtime.delivery import Receipt

T = TypeVar("T")


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


def confirmed(receipt: Receipt, reported: Mapping[str, int]) -> bool:
    """Whether the leader holds the report ``receipt`` names (``reported``: the report
    sequence it holds per worker), or does not know its worker."""
    return reported.get(receipt[0], receipt[1]) >= receipt[1]


class HeldReceipts(Generic[T]):
    """Items (shipments, deliveries) held by their receipts, each with its oldest timestamp."""

    def __init__(self) -> None:
        self._held: dict[Receipt, list[tuple[int, T]]] = {}
        self._ts = TimestampBag()

    def __len__(self) -> int:
        return self._ts.size

    def hold(self, receipt: Receipt, oldest: int, item: T) -> None:
        self._held.setdefault(receipt, []).append((oldest, item))
        self._ts.add(oldest)

    def release(self, reported: Mapping[str, int]) -> list[T]:
        """Let go of what the leader's reports (``reported``) confirm; returns it."""
        out: list[T] = []
        for receipt in [r for r in self._held if confirmed(r, reported)]:
            for oldest, item in self._held.pop(receipt):
                self._ts.remove(oldest)
                out.append(item)
        return out

    def oldest(self) -> int | None:
        """The oldest timestamp held (None: nothing is)."""
        return self._ts.min()

    def items(self) -> list[T]:
        return [item for held in self._held.values() for _, item in held]
