"""Delivery of productions to their tablets, retried until acknowledged.

One task per destination tablet drains that tablet's queue in batches. NOT_OWNER
or an unreachable worker waits for the next routing version; BUSY backs off
exponentially. A production leaves the queue only when its receiver has
committed it, or when its producing tablet closes (its checkpoint stays on
disk and the next owner re-sends it).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from runtime.record import Record
from runtime.routing import RoutingTable
from runtime.wire import MAX_DELIVERY_BYTES, record_bytes
from worker.storage import Production

if TYPE_CHECKING:
    from worker.tablet import Tablet

log = logging.getLogger(__name__)

OK, NOT_OWNER, BUSY, OUT_OF_ORDER, UNREACHABLE = 0, 1, 2, 3, -1
DeliverFn = Callable[[str, str, int, int, list[Record], dict[bytes, tuple[int, int]] | None],
                    Awaitable[tuple[int, tuple[str, int] | None]]]


class Sender:
    """Queues productions per destination tablet and delivers them."""

    def __init__(self, routing: Callable[[], RoutingTable], deliver: DeliverFn,
                 routing_changed: Callable[[int, float], Awaitable[None]],
                 max_batch: int = 1000) -> None:
        self._routing = routing
        self._deliver = deliver
        self._routing_changed = routing_changed
        self.max_batch = max_batch
        self._queues: dict[tuple[str, int], deque[tuple[Production, Tablet]]] = {}
        self._wakeups: dict[tuple[str, int], asyncio.Event] = {}
        self._tasks: dict[tuple[str, int], asyncio.Task[None]] = {}

    def send(self, productions: list[Production], owner: Tablet) -> None:
        for p in productions:
            dest = (p.computation, p.key_range)
            q = self._queues.get(dest)
            if q is None:
                q = self._queues[dest] = deque()
                self._wakeups[dest] = asyncio.Event()
                self._tasks[dest] = asyncio.create_task(self._drain(dest), name=f"send {dest}")
            q.append((p, owner))
            self._wakeups[dest].set()

    def pending(self) -> int:
        return sum(len(q) for q in self._queues.values())

    async def close(self) -> None:
        for t in self._tasks.values():
            t.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    async def _drain(self, dest: tuple[str, int]) -> None:
        q = self._queues[dest]
        wake = self._wakeups[dest]
        backoff = 0.005
        while True:
            while q and q[0][1].closing:
                q.popleft()  # its owner closed; the next owner re-sends from the checkpoint
            if not q:
                wake.clear()
                await wake.wait()
                continue
            batch: list[tuple[Production, Tablet]] = []
            size = 0
            for p, owner in q:
                if not owner.closing:
                    size += record_bytes(p.record)
                    if batch and size > MAX_DELIVERY_BYTES:
                        break  # bounded in bytes too: large values never exceed a message
                    batch.append((p, owner))
                if len(batch) >= self.max_batch:
                    break
            routing = self._routing()
            target = routing.destination(*dest)
            status, receipt = UNREACHABLE, None
            if target.address:
                # One delivery in flight per destination, in the queue's order: each
                # producer's records arrive in sequence and everything it sent here before
                # is committed (after=0). Productions with opaque ids list no producer.
                orders = {p.producer: (0, o.token) for p, o in batch if p.producer is not None}
                status, receipt = await self._deliver(target.address, dest[0], dest[1], target.token,
                                                      [p.record for p, _ in batch], orders)
            if status == OK:
                backoff = 0.005
                done = {id(p) for p, _ in batch}
                acked: dict[int, tuple[Tablet, list[Production]]] = {}
                for p, owner in batch:
                    acked.setdefault(id(owner), (owner, []))[1].append(p)
                while q and (id(q[0][0]) in done or q[0][1].closing):
                    q.popleft()
                for owner, keys in acked.values():
                    owner.acked(keys, receipt)
            elif status in (BUSY, OUT_OF_ORDER):
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 0.5)
            else:
                # Not the owner (or unreachable): wait for the next routing version.
                await self._routing_changed(routing.version, backoff)
                backoff = min(backoff * 2, 1.0)
