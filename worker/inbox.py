"""A tablet's queued input: deliveries waiting for a batch, bounded, in arrival order.

A delivery's sender waits on its future: OK once every one of its records is committed,
NOT_OWNER if the tablet lets go of it first. A batch may stop part-way through a delivery
(its time budget ran out, or it was cut smaller after a failure); the rest of that
delivery, and every delivery after it, goes back to the front of the queue in order.
Every record not yet committed holds the tablet's oldest work (hence the watermark).

A delivery's records are columns (runtime/columns.py). The oldest timestamp and the size of
what a delivery has left are kept per delivery, not per record: computed once when it
arrives (and again only when a batch stops inside it), each a call into C over a column.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

from runtime.columns import Columns
from runtime.delivery import Status
from runtime.receipts import TimestampBag

OK, NOT_OWNER = Status.OK, Status.NOT_OWNER


@dataclass(slots=True)
class Delivery:
    """One sender's batch of records; ``done`` of them are committed already."""

    cols: Columns
    fut: asyncio.Future[int]
    orders: dict[bytes, tuple[int, int]] | None = None  # producer -> (after, token)
    done: int = 0
    duplicates: int = 0        # records of it the committed batches dropped as duplicates
    oldest: int | None = None  # the lowest timestamp of records[done:]
    nbytes: int = 0            # about the size of records[done:]

    @property
    def remaining(self) -> int:
        return len(self.cols) - self.done

    def measure(self) -> None:
        self.oldest = self.cols.oldest(self.done)
        self.nbytes = self.cols.nbytes(self.done)


class Inbox:
    """Deliveries in arrival order, those a batch took and has not finished, and the
    timestamps they hold."""

    def __init__(self) -> None:
        self._queue: deque[Delivery] = deque()
        self._taken: dict[int, Delivery] = {}  # id -> delivery a batch holds now
        self.records = 0  # records queued and not yet taken
        self.bytes = 0    # ... and about their size (queues are bounded in bytes too)
        self._holds = TimestampBag()  # timers being fired

    def __bool__(self) -> bool:
        return bool(self._queue)

    def put(self, cols: Columns, fut: asyncio.Future[int],
            orders: dict[bytes, tuple[int, int]] | None = None) -> Delivery:
        d = Delivery(cols, fut, orders)
        d.measure()
        self._queue.append(d)
        self.records += len(cols)
        self.bytes += d.nbytes
        return d

    def take(self, limit: int) -> list[Delivery]:
        """The oldest deliveries holding up to ``limit`` records (always at least one)."""
        out: list[Delivery] = []
        n = 0
        while self._queue and (not out or n + self._queue[0].remaining <= limit):
            d = self._queue.popleft()
            n += d.remaining
            self.bytes -= d.nbytes
            self._taken[id(d)] = d
            out.append(d)
        self.records -= n
        return out

    def committed(self, taken: list[Delivery], consumed: list[int],
                  refused: dict[int, int] | None = None, duplicates: dict[int, int] | None = None) -> None:
        """A batch committed ``consumed[i]`` more records of ``taken[i]``: release their
        timestamps, answer the finished deliveries, put the rest back in front in order.
        ``refused`` deliveries (index -> status) are answered with that status instead;
        ``duplicates`` (index -> count) are how many of the consumed ones were duplicates."""
        back: list[Delivery] = []
        for i, d in enumerate(taken):
            if refused and i in refused:
                self._release(d, refused[i])
                continue
            n = consumed[i] if i < len(consumed) else 0
            d.done += n
            if duplicates:
                d.duplicates += duplicates.get(i, 0)
            self._taken.pop(id(d), None)
            if d.done == len(d.cols):
                if not d.fut.done():
                    d.fut.set_result(OK)
            else:
                if n:
                    d.measure()
                back.append(d)
        for d in reversed(back):
            self._queue.appendleft(d)
            self.records += d.remaining
            self.bytes += d.nbytes

    def failed(self, taken: list[Delivery]) -> None:
        """Nothing of a batch committed: its senders retry (here or elsewhere)."""
        for d in taken:
            self._release(d)

    def refuse_all(self) -> None:
        while self._queue:
            self._release(self._queue.popleft())
        self.records = self.bytes = 0

    def _release(self, d: Delivery, status: int = NOT_OWNER) -> None:
        self._taken.pop(id(d), None)
        if not d.fut.done():
            d.fut.set_result(status)

    def hold(self, ts: int) -> None:
        """Hold the oldest work at ``ts`` (a timer being fired) until :meth:`unhold`."""
        self._holds.add(ts)

    def unhold(self, *ts: int) -> None:
        for t in ts:
            self._holds.remove(t)

    def oldest(self) -> int | None:
        """The lowest timestamp of every record not committed yet (queued or in a batch) and
        of the timers being fired."""
        found = [d.oldest for d in (*self._queue, *self._taken.values()) if d.oldest is not None]
        held = self._holds.min()
        if held is not None:
            found.append(held)
        return min(found) if found else None
