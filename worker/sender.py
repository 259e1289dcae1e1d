"""Delivery of productions to their tablets, retried until acknowledged.

What a sender queues are shipments (worker/storage.py): one commit's records for one
tablet, as columns. One task per destination tablet drains that tablet's queue, several
shipments to a delivery. NOT_OWNER
or an unreachable worker waits for the next routing version; BUSY backs off
exponentially. A production leaves the queue only when its receiver has
committed it, or when its producing tablet closes (its checkpoint stays on
disk and the next owner re-sends it).

A range that a split or merge replaced is *retired*: once its delivery in flight ends,
what its queue still holds is re-routed by key to the ranges that replaced it, ahead of
anything produced for them since: record by record, each producer's in sequence
(worker/dedup.py), and each key's in the order its producer made them (DESIGN.md §2: a key's
records were all in one retired queue, in that order; records with opaque ids keep their
queue's order). Until every retired queue of a computation is re-routed, its other queues
wait. A re-routed shipment holds a share of the checkpoints its records came from.

A computation the routing no longer has (its job was cancelled, with or without its state
kept, or an update removed it) will never commit what is queued for it: once a delivery in
flight to it ends, its queues are dropped, their checkpoints deleted and their producers let
go of them (they hold nothing). So is anything sent for it from then on. That is the rule
of the injector too (injectors/tablets.py, ``_follow_readers``); docs/lifecycle.md says what it
means for a job cancelled with its state kept.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from runtime.columns import Columns
from runtime.delivery import MAX_DELIVERY_BYTES, Orders, Receipt, Status
from runtime.routing import RoutingTable
from worker.storage import Share, Shipment

if TYPE_CHECKING:
    from worker.tablet import Tablet

log = logging.getLogger(__name__)

OK, NOT_OWNER, BUSY, OUT_OF_ORDER, UNREACHABLE = (Status.OK, Status.NOT_OWNER, Status.BUSY,
                                                  Status.OUT_OF_ORDER, Status.UNREACHABLE)
DeliverFn = Callable[[str, str, int, int, Columns, Orders | None], Awaitable[tuple[int, Receipt | None]]]


class Sender:
    """Queues shipments per destination tablet and delivers them."""

    def __init__(self, routing: Callable[[], RoutingTable], deliver: DeliverFn,
                 routing_changed: Callable[[int, float], Awaitable[None]],
                 max_batch: int = 1000) -> None:
        self._routing = routing
        self._deliver = deliver
        self._routing_changed = routing_changed
        self.max_batch = max_batch
        self._queues: dict[tuple[str, int], deque[tuple[Shipment, Tablet]]] = {}
        self._wakeups: dict[tuple[str, int], asyncio.Event] = {}
        self._tasks: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._retiring: dict[str, set[tuple[str, int]]] = {}  # computation -> queues of gone ranges
        self._staged: dict[str, list[tuple[Shipment, Tablet]]] = {}  # ... and what they held

    def send(self, shipments: list[Shipment], owner: Tablet) -> None:
        routing = self._routing()
        unread = [s for s in shipments if not _reads(routing, s.computation)]
        if unread:
            _drop(unread, owner, "sent")
            shipments = [s for s in shipments if _reads(routing, s.computation)]
        # Shipments made before a split or merge (a batch computed under the old routing, or
        # checkpoints re-sent at open) are re-routed together, per computation: one commit's
        # shipments to two merged ranges interleave their sequences, and the merged range
        # must get them as one ascending run (its dedup reads a lower sequence after a higher
        # one of the same producer as a duplicate).
        # Checkpoints of several commits may mix old and current ranges: then all of that
        # computation's shipments go through the re-route, which orders them by sequence.
        by_computation: dict[str, list[tuple[Shipment, Tablet]]] = {}
        for s in shipments:
            by_computation.setdefault(s.computation, []).append((s, owner))
        parts: dict[tuple[str, int], list[tuple[Shipment, Tablet]]] = {}
        for comp, items in by_computation.items():
            if comp in routing.computations and any(not routing.has_range(comp, s.key_range) for s, _ in items):
                for dest, moved in _reroute(items, routing).items():
                    parts.setdefault(dest, []).extend(moved)
                continue
            for item in items:
                parts.setdefault((comp, item[0].key_range), []).append(item)
        for dest, items in parts.items():
            self._queue(dest).extend(items)
            self._wakeups[dest].set()

    def _queue(self, dest: tuple[str, int]) -> deque[tuple[Shipment, Tablet]]:
        q = self._queues.get(dest)
        if q is None:
            q = self._queues[dest] = deque()
            self._wakeups[dest] = asyncio.Event()
            self._tasks[dest] = asyncio.create_task(self._drain(dest), name=f"send {dest}")
        return q

    def routing_applied(self) -> None:
        """A new routing is in force: retire the queues of ranges it no longer has. Called in
        the same step of the event loop that installed it, before anything is sent with it."""
        routing = self._routing()
        for dest in self._queues:
            if not _reads(routing, dest[0]):
                self._wakeups[dest].set()  # its task drops the queue (_abandon)
            elif not routing.has_range(*dest):
                self._retiring.setdefault(dest[0], set()).add(dest)
                self._wakeups[dest].set()

    def pending(self) -> int:
        return sum(len(q) for q in self._queues.values()) + sum(len(s) for s in self._staged.values())

    def _retire(self, dest: tuple[str, int]) -> None:
        """Hand what a retired queue holds to the ranges that replaced it (once the last retired
        queue of its computation is done, all at once, each producer's records in order)."""
        c = dest[0]
        staged = self._staged.setdefault(c, [])
        staged.extend(item for item in self._queues.pop(dest) if not item[1].closing)
        del self._wakeups[dest], self._tasks[dest]
        retiring = self._retiring[c]
        retiring.discard(dest)
        if retiring:
            return
        del self._retiring[c]
        del self._staged[c]
        moved = _reroute(staged, self._routing())
        for new, items in moved.items():
            self._queue(new).extendleft(reversed(items))
        log.info("re-routed %d records of %d tablets of %s to its new ranges", sum(len(s.cols) for s, _ in staged),
                 len({id(o) for _, o in staged}), c)
        for d, wake in self._wakeups.items():
            if d[0] == c:
                wake.set()

    def _abandon(self, dest: tuple[str, int]) -> None:
        """Drop a queue of a computation the routing no longer has (with what a retired range of
        it staged, once the last of its retired queues is gone)."""
        c = dest[0]
        items = [item for item in self._queues.pop(dest) if not item[1].closing]
        del self._wakeups[dest], self._tasks[dest]
        retiring = self._retiring.get(c)
        if retiring is not None:
            retiring.discard(dest)
            if not retiring:
                del self._retiring[c]
                items += [item for item in self._staged.pop(c, []) if not item[1].closing]
        by_owner: dict[int, tuple[Tablet, list[Shipment]]] = {}
        for s, owner in items:
            by_owner.setdefault(id(owner), (owner, []))[1].append(s)
        for owner, ss in by_owner.values():
            _drop(ss, owner, "queued")

    async def close(self) -> None:
        for t in self._tasks.values():
            t.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    async def _drain(self, dest: tuple[str, int]) -> None:
        q = self._queues[dest]
        wake = self._wakeups[dest]
        backoff = 0.005
        while True:
            if not _reads(self._routing(), dest[0]):
                self._abandon(dest)
                return
            retiring = self._retiring.get(dest[0])
            if retiring and dest in retiring:
                self._retire(dest)
                return
            if retiring:  # a replaced range's productions go first
                wake.clear()
                await wake.wait()
                continue
            while q and q[0][1].closing:
                q.popleft()  # its owner closed; the next owner re-sends from the checkpoint
            if not q:
                wake.clear()
                await wake.wait()
                continue
            batch: list[tuple[Shipment, Tablet]] = []
            size = count = 0
            for s, owner in q:
                if not owner.closing:
                    size += s.cols.nbytes()
                    count += len(s.cols)
                    if batch and (size > MAX_DELIVERY_BYTES or count > self.max_batch):
                        break  # bounded in bytes too: large values never exceed a message
                    batch.append((s, owner))
            routing = self._routing()
            target = routing.destination(*dest)
            status: int = UNREACHABLE
            receipt: Receipt | None = None
            if target.address:
                # One delivery in flight per destination, in the queue's order: each
                # producer's records arrive in sequence and everything it sent here before
                # is committed (after=0). Productions with opaque ids list no producer.
                orders = {p: (0, o.token) for s, o in batch for p in s.producers}
                status, receipt = await self._deliver(target.address, dest[0], dest[1], target.token,
                                                      Columns.concat([s.cols for s, _ in batch]), orders)
            if status == OK:
                backoff = 0.005
                done = {id(s) for s, _ in batch}
                acked: dict[int, tuple[Tablet, list[Shipment]]] = {}
                for s, owner in batch:
                    acked.setdefault(id(owner), (owner, []))[1].append(s)
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


def _reads(routing: RoutingTable, computation: str) -> bool:
    """Whether ``computation`` may still commit what is sent to it (a worker that has no
    routing yet knows of no computation, and drops nothing)."""
    return computation in routing.computations or not routing.version


def _drop(shipments: list[Shipment], owner: Tablet, how: str) -> None:
    log.info("dropped %d productions %s for %s by tablet %s: the routing no longer has that computation "
             "(its job was cancelled, or an update removed it)", sum(len(s.cols) for s in shipments), how,
             ", ".join(sorted({s.computation for s in shipments})), owner.name)
    owner.dropped(shipments)


def _reroute(items: list[tuple[Shipment, Tablet]], routing: RoutingTable
             ) -> dict[tuple[str, int], list[tuple[Shipment, Tablet]]]:
    """Shipments of one computation cut by key into shipments to the ranges ``routing`` has
    now: per owner and new range, one shipment with the records in the order their owner made
    them (by sequence, or by a weak tablet's production order; records whose order is not
    known, re-sent from a checkpoint, keep their queue order), so each producer's records
    stay in sequence and each key's in order. It holds a share of each checkpoint its records
    came from. Each owner is told which shipments replace which (``Tablet.rerouted``).
    Records whose order is not known (re-sent from checkpoints at open) go first."""
    out: dict[tuple[str, int], list[tuple[Shipment, Tablet]]] = {}
    by_owner: dict[int, list[tuple[Shipment, Tablet]]] = {}
    for item in items:
        by_owner.setdefault(id(item[1]), []).append(item)
    for group in by_owner.values():
        owner = group[0][1]
        comp = group[0][0].computation
        rows: list[tuple[tuple[int, ...], Shipment, int]] = []
        for pos, (s, _) in enumerate(group):
            cols = s.cols
            for i in range(len(cols)):
                # Records whose order is not known (re-sent from a checkpoint at open, weak or
                # written before columns) are older than any made since: they go first.
                if s.order is not None and s.order[i] >= 0:
                    order: tuple[int, ...] = (1, s.order[i])
                elif cols.seqs is not None:
                    order = (1, cols.seqs[i])
                else:
                    order = (0, pos, i)
                rows.append((order, s, i))
        rows.sort(key=lambda row: row[0])
        parts: dict[int, list[Shipment]] = {}  # old shipment -> the new ones holding its records
        own = {id(s): Share(s.ckey, 0) for s, _ in group if s.ckey is not None and not s.shares}
        picked: dict[int, list[tuple[Shipment, int]]] = {}
        for _, s, i in rows:
            picked.setdefault(routing.range_for(comp, s.cols.keys[i]), []).append((s, i))
        for r, members in picked.items():
            sources = {id(m): m for m, _ in members}
            held: dict[int, Share] = {}
            for m in sources.values():
                for sh in m.shares or ((own[id(m)],) if id(m) in own else ()):
                    held[id(sh)] = sh
            for sh in held.values():
                sh.parts += 1
            cols = Columns.concat([m.cols.select([i]) for m, i in members])
            producers = tuple({p: None for m in sources.values() for p in m.producers})
            kept = ([m.order[i] if m.order is not None else -1 for m, i in members]  # -1: not known
                    if any(m.order is not None for m in sources.values()) else None)
            made = Shipment(comp, r, cols, producers, shares=tuple(held.values()), order=kept)
            out.setdefault((comp, r), []).append((made, owner))
            for m in sources.values():
                parts.setdefault(id(m), []).append(made)
        for s, _ in group:  # the old shipments' hold on their shares goes with them
            for sh in s.shares:
                sh.parts -= 1
        owner.rerouted([s for s, _ in group], [s for items in out.values() for s, o in items if o is owner], parts)
    return out
