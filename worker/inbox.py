"""A tablet's queued input: deliveries waiting for a batch, bounded, in arrival order.

A delivery's sender waits on its future: OK once every one of its records is committed,
NOT_OWNER if the tablet lets go of it first. A batch may stop part-way through a delivery
(its time budget ran out, or it was cut smaller after a failure); the rest of that
delivery, and every delivery after it, goes back to the front of the queue in order.
Every record not yet committed holds the tablet's oldest work (hence the watermark).
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

from runtime.delivery import Status, record_bytes
from runtime.record import Record
from worker.progress import TimestampBag

OK, NOT_OWNER = Status.OK, Status.NOT_OWNER


@dataclass(slots=True)
class Delivery:
    """One sender's batch of records; ``done`` of them are committed already."""

    records: list[Record]
    fut: asyncio.Future[int]
    orders: dict[bytes, tuple[int, int]] | None = None  # producer -> (after, token)
    done: int = 0

    @property
    def remaining(self) -> int:
        return len(self.records) - self.done


class Inbox:
    """Deliveries in arrival order and the timestamps they hold."""

    def __init__(self) -> None:
        self._queue: deque[Delivery] = deque()
        self.records = 0  # records queued and not yet taken
        self.bytes = 0    # ... and about their size (queues are bounded in bytes too)
        self._ts = TimestampBag()

    def __bool__(self) -> bool:
        return bool(self._queue)

    def put(self, records: list[Record], fut: asyncio.Future[int],
            orders: dict[bytes, tuple[int, int]] | None = None) -> None:
        self._queue.append(Delivery(records, fut, orders))
        self.records += len(records)
        self.bytes += sum(record_bytes(r) for r in records)
        for r in records:
            self._ts.add(r.timestamp)

    def take(self, limit: int) -> list[Delivery]:
        """The oldest deliveries holding up to ``limit`` records (always at least one)."""
        out: list[Delivery] = []
        n = 0
        while self._queue and (not out or n + self._queue[0].remaining <= limit):
            d = self._queue.popleft()
            n += d.remaining
            self.bytes -= sum(record_bytes(r) for r in d.records[d.done:])
            out.append(d)
        self.records -= n
        return out

    def committed(self, taken: list[Delivery], consumed: list[int],
                  refused: dict[int, int] | None = None) -> None:
        """A batch committed ``consumed[i]`` more records of ``taken[i]``: release their
        timestamps, answer the finished deliveries, put the rest back in front in order.
        ``refused`` deliveries (index -> status) are answered with that status instead."""
        back: list[Delivery] = []
        for i, d in enumerate(taken):
            if refused and i in refused:
                self._release(d, refused[i])
                continue
            n = consumed[i] if i < len(consumed) else 0
            for r in d.records[d.done:d.done + n]:
                self._ts.remove(r.timestamp)
            d.done += n
            if d.done == len(d.records):
                if not d.fut.done():
                    d.fut.set_result(OK)
            else:
                back.append(d)
        for d in reversed(back):
            self._queue.appendleft(d)
            self.records += d.remaining
            self.bytes += sum(record_bytes(r) for r in d.records[d.done:])

    def failed(self, taken: list[Delivery]) -> None:
        """Nothing of a batch committed: its senders retry (here or elsewhere)."""
        for d in taken:
            self._release(d)

    def refuse_all(self) -> None:
        while self._queue:
            self._release(self._queue.popleft())
        self.records = self.bytes = 0

    def _release(self, d: Delivery, status: int = NOT_OWNER) -> None:
        for r in d.records[d.done:]:
            self._ts.remove(r.timestamp)
        if not d.fut.done():
            d.fut.set_result(status)

    def hold(self, ts: int) -> None:
        """Hold the oldest work at ``ts`` (a timer being fired) until :meth:`unhold`."""
        self._ts.add(ts)

    def unhold(self, ts: int) -> None:
        self._ts.remove(ts)

    def oldest(self) -> int | None:
        return self._ts.min()
