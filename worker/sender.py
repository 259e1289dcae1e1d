"""Delivery of a worker's productions to their tablets: the asyncio shell around the
delivery core (runtime/courier.py, where queues, batching, retries, re-routing through
splits and merges, and dropping for computations gone are decided, without I/O).

What a sender queues are shipments (worker/storage.py): one commit's records for one
tablet, as columns. One delivery is in flight per destination tablet at a time, several
shipments to a delivery; each runs as a task calling ``deliver`` (a local tablet, or a peer
worker over its stream: worker/peers.py). A shipment leaves the sender when its receiver
has committed it (``Tablet.acked``), when no reader will ever commit it
(``Tablet.dropped``: docs/lifecycle.md), or when its producing tablet closes (its checkpoint
stays on disk and the next owner re-sends it).

A shipment re-routing made holds a share of each checkpoint its records came from
(:func:`piece`): the checkpoint is deleted once every shipment holding a share of it is let
go of.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from runtime.alarm import Alarm
from runtime.columns import Columns
from runtime.courier import Acked, Action, Courier, Deliver, Dropped
from runtime.delivery import Orders, Outcome, Receipt, Status
from runtime.parcels import Rerouted
from runtime.routing import RoutingTable
from worker.storage import Share, Shipment

if TYPE_CHECKING:
    from worker.tablet import Tablet

log = logging.getLogger(__name__)

OK, NOT_OWNER, BUSY, OUT_OF_ORDER, UNREACHABLE = (Status.OK, Status.NOT_OWNER, Status.BUSY,
                                                  Status.OUT_OF_ORDER, Status.UNREACHABLE)
DeliverFn = Callable[[str, str, int, int, Columns, Orders | None], Awaitable[tuple[int, Receipt | None]]]


def piece(sources: list[Shipment], computation: str, key_range: int, cols: Columns,
          producers: tuple[bytes, ...], order: list[int] | None) -> Shipment:
    """A shipment of records cut from ``sources`` (re-routing): it holds a share of each
    checkpoint they hold. A source's own checkpoint becomes a share it holds once (given
    back when the re-route is done, :meth:`Sender._rerouted`)."""
    held: dict[int, Share] = {}
    for m in sources:
        if m.ckey is not None and not m.shares:
            m.shares = (Share(m.ckey, 1),)
        for sh in m.shares:
            held[id(sh)] = sh
    for sh in held.values():
        sh.parts += 1
    return Shipment(computation, key_range, cols, producers, shares=tuple(held.values()), order=order)


class Sender:
    """Queues shipments per destination tablet and delivers them (``routing()``: the
    routing in force; call :meth:`routing_applied` in the step that installs a new one)."""

    def __init__(self, routing: Callable[[], RoutingTable], deliver: DeliverFn, max_batch: int = 1000) -> None:
        self._routing = routing
        self._deliver = deliver
        self.max_batch = max_batch
        self._courier: Courier[Shipment, Tablet] = Courier(routing(), piece, max_records=max_batch)
        self._tasks: set[asyncio.Task[None]] = set()
        self._alarm = Alarm(lambda: self._apply(self._courier.tick(self._sync())))
        self._closed = False

    def send(self, shipments: list[Shipment], owner: Tablet) -> None:
        now = self._sync()
        self._apply(self._courier.send(shipments, owner, now))

    def routing_applied(self) -> None:
        """A new routing is in force: lanes of ranges it no longer has retire (re-routed once
        their delivery in flight ends), those of computations it no longer has are dropped."""
        self._sync()

    def pending(self) -> int:
        return self._courier.pending()

    async def close(self) -> None:
        self._closed = True
        self._alarm.cancel()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # ------------------------------------------------------------------ the shell

    def _sync(self) -> float:
        """The loop's time, once the core has the routing in force."""
        now = asyncio.get_running_loop().time()
        routing = self._routing()
        if routing is not self._courier.routing:
            self._apply(self._courier.routing_changed(routing, now))
        return now

    def _apply(self, actions: list[Action[Shipment, Tablet]]) -> None:
        for a in actions:
            if isinstance(a, Deliver):
                task = asyncio.get_running_loop().create_task(self._run(a), name=f"deliver {a.computation}/{a.key_range}")
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            elif isinstance(a, Acked):
                a.owner.acked(a.parcels, a.outcome.receipt)
            elif isinstance(a, Dropped):
                _drop(a.parcels, a.owner, "queued" if a.queued else "sent")
            elif isinstance(a, Rerouted):
                self._rerouted(a)
            # FetchRouting: the leader pushes every new routing to workers; Refused: the peer
            # link logged it, and the delivery waits as an unreachable one does.
        self._arm()

    def _rerouted(self, a: Rerouted[Shipment, Tablet]) -> None:
        for s in a.old:  # the old shipments' hold on their shares goes with them
            for sh in s.shares:
                sh.parts -= 1
        a.owner.rerouted(a.old, a.new, a.parts)

    async def _run(self, d: Deliver) -> None:
        try:
            status, receipt = await self._deliver(d.address, d.computation, d.key_range, d.token, d.cols, d.orders)
            outcome = Outcome(Status(status), receipt)
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug: the delivery is retried as an unreachable one
            log.exception("delivery to %s/%d failed", d.computation, d.key_range)
            outcome = Outcome(UNREACHABLE)
        if not self._closed:
            self._apply(self._courier.answered(d.id, outcome, self._sync()))

    def _arm(self) -> None:
        """Wake the core when it waits on time."""
        if not self._closed:
            self._alarm.arm(self._courier.wake_at)


def _drop(shipments: list[Shipment], owner: Tablet, how: str) -> None:
    log.info("dropped %d productions %s for %s by tablet %s: the routing no longer has that computation "
             "(its job was cancelled, or an update removed it)", sum(len(s.cols) for s in shipments), how,
             ", ".join(sorted({s.computation for s in shipments})), owner.name)
    owner.dropped(shipments)
