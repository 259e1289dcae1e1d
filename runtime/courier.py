"""The sending side of the Deliver protocol, without I/O: one core for every sender.

A :class:`Courier` takes events and returns actions; it has no sockets, threads, clocks or
tasks (the sans-I/O style of h11 and h2). A worker's sender (worker/sender.py) and an
injector (injectors/tablets.py) each drive one from a thin shell that performs the actions
and feeds back what happened:

- events: :meth:`Courier.send` (an owner's parcels), :meth:`Courier.routing_changed`,
  :meth:`Courier.answered` (what became of a delivery), :meth:`Courier.tick` (time passed);
- actions: :class:`Deliver` (put this delivery on the wire), :class:`Acked` (tell an owner
  its parcels are committed), :class:`Dropped` (no reader will ever commit them),
  :class:`~runtime.parcels.Rerouted` (they were cut into new parcels), :class:`FetchRouting`
  (a newer routing is needed), :class:`Refused` (a receiver refused a delivery for good);
  and :attr:`Courier.wake_at`, when to :meth:`~Courier.tick` next.

What it keeps (per destination tablet, a *lane*: runtime/lanes.py):

- a queue of parcels, each owner's in its order (runtime/parcels.py). Every parcel enters a
  lane through one door that checks the owner's order there and, if a parcel would follow
  a later one of its owner, re-arranges that owner's queued parcels: a producer's records
  never reach a tablet out of order (the data loss of 07476bf, shipments of two merged
  ranges queued one after the other, cannot be written again);
- deliveries in flight: parcels batched up to ``max_records`` / ``max_bytes``, at most
  ``window`` at once. With ``window`` 1 (a worker's sender) each follows nothing (``after``
  0: everything sent to the tablet before it is committed). With more (an injector's
  rounds), a delivery goes while others are in flight only if the tablet will hold it
  behind the last of them (an exactly-once reader, a producer in common) and names, per
  producer, the last sequence sent before it (``after``); a tablet commits it only once that
  one is committed (worker/dedup.py);
- retries: a failed delivery goes back to the front of its queue once nothing else is in
  flight to its tablet (the chain starts again at ``after`` 0). BUSY or OUT_OF_ORDER back
  off (5 ms, doubling to 0.5 s); NOT_OWNER, UNREACHABLE and a tablet without an owner wait
  for a newer routing (or a back-off doubling to 1 s, then try again);
- splits and merges: a lane whose range the routing no longer has is *retired*. Once its
  deliveries in flight are answered, what it holds is staged; once every retired lane of the
  computation is staged, all of it is re-routed at once by key to the ranges that replaced
  them (:func:`~runtime.parcels.arrange`), at the front of their queues: each producer's
  records in sequence, each key's in production order, ahead of anything made since. Until
  then the computation's other lanes wait;
- a computation the routing no longer routes this sender's records to (``reads``: a job
  cancelled, an input removed) will never commit what is queued for it: once its
  deliveries in flight are answered its parcels are dropped, and so is anything sent for it
  from then on (docs/lifecycle.md);
- an owner that is ``closing`` has left its parcels to its successor (which re-sends them
  from its checkpoints): they are skipped, and its deliveries in flight are not retried.
"""

from __future__ import annotations

import heapq
import logging
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic

from runtime.columns import Columns
from runtime.delivery import MAX_DELIVERY_BYTES, Orders, Outcome, Status
from runtime.keyspace import key_hashes
from runtime.lanes import MIN_BACKOFF_S, Dest, Flight, Lane
from runtime.parcels import UNKNOWN, OwnerT, ParcelT, PieceMaker, Rerouted, arrange, last_key, order_keys
from runtime.routing import RoutingTable

log = logging.getLogger(__name__)

BUSY_BACKOFF_MAX_S = 0.5     # BUSY, OUT_OF_ORDER
ROUTING_BACKOFF_MAX_S = 1.0  # NOT_OWNER, UNREACHABLE, no owner: the longest wait for a newer routing
JITTER = 0.2  # a BUSY back-off is its nominal length ± this fraction, at random (gRPC's own: ±20 %),
              # so the senders a BUSY tablet turned away do not all come back in the same instant


# ------------------------------------------------------------------- actions


@dataclass(frozen=True, slots=True)
class Deliver:
    """Put this delivery on the wire; tell :meth:`Courier.answered` what became of it."""

    id: int
    computation: str
    key_range: int
    address: str
    token: int
    cols: Columns
    orders: Orders


@dataclass(slots=True)
class Acked(Generic[ParcelT, OwnerT]):
    """The receiver committed ``parcels`` of ``owner`` (``outcome``: the delivery's answer,
    its receipt and the duplicates it dropped, counted for the whole delivery)."""

    owner: OwnerT
    parcels: list[ParcelT]
    outcome: Outcome


@dataclass(slots=True)
class Dropped(Generic[ParcelT, OwnerT]):
    """No reader will ever commit ``parcels`` of ``owner``: the routing no longer routes them
    to ``computation``. ``queued``: they were queued (else refused as they were sent)."""

    owner: OwnerT
    parcels: list[ParcelT]
    computation: str
    queued: bool


@dataclass(frozen=True, slots=True)
class FetchRouting:
    """A routing newer than ``newer_than`` is needed (a sender that is not pushed one asks)."""

    newer_than: int


@dataclass(frozen=True, slots=True)
class Refused:
    """A receiver refused a delivery to ``dest`` for good (``reason``); it is retried as if
    unreachable, and the owners of ``owners`` may want to give up."""

    dest: Dest
    reason: str
    owners: tuple[object, ...]


Action = Deliver | Acked[ParcelT, OwnerT] | Dropped[ParcelT, OwnerT] | Rerouted[ParcelT, OwnerT] | FetchRouting | Refused


def worker_reads(routing: RoutingTable, computation: str) -> bool:
    """Whether ``computation`` may still commit what is sent to it: the routing has it (a
    sender with no routing yet knows of no computation, and drops nothing)."""
    return computation in routing.computations or not routing.version


class Courier(Generic[ParcelT, OwnerT]):
    """Queues, batches, delivers, retries and re-routes parcels (see the module docstring).

    ``reads(routing, computation)``: whether that computation still takes this sender's
    records; ``piece``: makes a parcel of records cut from others (re-routing);
    ``window``: deliveries in flight per tablet at most (1: each follows nothing)."""

    def __init__(self, routing: RoutingTable, piece: PieceMaker[ParcelT], *, max_records: int = 1000,
                 max_bytes: int = MAX_DELIVERY_BYTES, window: int = 1,
                 reads: Callable[[RoutingTable, str], bool] = worker_reads,
                 jitter: Callable[[], float] = random.random) -> None:
        if window < 1 or max_records < 1:
            raise ValueError(f"window={window} and max_records={max_records} must be at least 1")
        self.routing = routing
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.window = window
        self._piece = piece
        self._reads = reads
        self._jitter = jitter  # uniform in [0, 1): where in its ± JITTER a BUSY back-off falls
        self._lanes: dict[Dest, Lane[ParcelT, OwnerT]] = {}
        self._flights: dict[int, Lane[ParcelT, OwnerT]] = {}
        self._retiring: dict[str, set[Dest]] = {}          # computation -> its retired lanes
        self._staged: dict[str, list[tuple[ParcelT, OwnerT, int]]] = {}  # ... and what they held (with their lane's number)
        self._stages = 0
        self._timers: list[tuple[float, Dest]] = []         # (when, lane): a heap
        self._last_id = 0
        self._out: list[Action[ParcelT, OwnerT]] = []
        self._fetch: int | None = None  # the newest FetchRouting this event asks for

    # ---------------------------------------------------------------- queries

    @property
    def wake_at(self) -> float | None:
        """When :meth:`tick` has something to do, or may have (None: nothing waits on time).
        A lane backing off keeps its time even while its queue is empty: a parcel sent to it
        meanwhile waits for that time, and nothing else would wake it."""
        timers = self._timers
        while timers:
            t, dest = timers[0]
            lane = self._lanes.get(dest)
            if lane is not None and lane.ready_at == t:
                return t
            heapq.heappop(timers)
        return None

    def pending(self) -> int:
        """Parcels queued, in flight or staged for a re-route."""
        return (sum(len(lane.queue) + sum(len(f.items) for f in lane.flights.values()) for lane in self._lanes.values())
                + sum(len(s) for s in self._staged.values()))

    def lanes(self) -> list[Dest]:
        return list(self._lanes)

    # ----------------------------------------------------------------- events

    def send(self, parcels: Sequence[ParcelT], owner: OwnerT, now: float) -> list[Action[ParcelT, OwnerT]]:
        """Queue ``owner``'s parcels (each for the range it names, in its owner's order).
        Parcels of one computation for ranges a split or merge replaced are re-routed
        together: their records interleave (one commit's for two merged ranges), and the
        merged range must get them as one ascending run."""
        routing = self.routing
        by_computation: dict[str, list[ParcelT]] = {}
        for p in parcels:
            by_computation.setdefault(p.computation, []).append(p)
        touched: list[Lane[ParcelT, OwnerT]] = []
        for comp, ps in by_computation.items():
            if not self._reads(routing, comp):
                self._out.append(Dropped(owner, ps, comp, False))
                continue
            if comp in routing.computations and any(not routing.has_range(comp, p.key_range) for p in ps):
                placed = self._reroute([(p, owner) for p in ps], comp)
                for r, items in placed.items():
                    touched.append(self._enter(self._lane((comp, r)), items))
                continue
            for p in ps:
                touched.append(self._enter(self._lane((comp, p.key_range)), [(p, owner)]))
        for lane in dict.fromkeys(touched):
            self._pump(lane, now)
        return self._done()

    def routing_changed(self, routing: RoutingTable, now: float) -> list[Action[ParcelT, OwnerT]]:
        """A new routing is in force (call before anything is sent with it): lanes of ranges it
        no longer has retire, lanes of computations it no longer routes to are dropped, lanes
        waiting for it go on."""
        self.routing = routing
        for dest, lane in list(self._lanes.items()):
            comp = dest[0]
            if not self._reads(routing, comp):
                lane.dropping = True
            elif comp in routing.computations and not routing.has_range(*dest) and not lane.retired:
                lane.retired = True
                self._retiring.setdefault(comp, set()).add(dest)
            if lane.after_version is not None and routing.version > lane.after_version:
                lane.after_version = None
                lane.ready_at = 0.0
        for lane in list(self._lanes.values()):
            if not lane.flights:
                self._settle(lane, now)
        for lane in list(self._lanes.values()):
            self._pump(lane, now)
        return self._done()

    def answered(self, delivery: int, outcome: Outcome, now: float) -> list[Action[ParcelT, OwnerT]]:
        """What became of delivery ``delivery`` (an unknown id is ignored)."""
        lane = self._flights.pop(delivery, None)
        if lane is None:
            return self._done()
        flight = lane.flights[delivery]
        if outcome.status == Status.OK:
            del lane.flights[delivery]
            by_owner: dict[int, tuple[OwnerT, list[ParcelT]]] = {}
            for p, o in flight.items:
                by_owner.setdefault(id(o), (o, []))[1].append(p)
            for o, ps in by_owner.values():
                self._out.append(Acked(o, ps, outcome))
            if not lane.broken:
                lane.backoff = MIN_BACKOFF_S
            if outcome.routing_version > self.routing.version:
                self._want_routing(self.routing.version)
        else:
            flight.outcome = outcome
            if outcome.refused is not None:
                self._out.append(Refused(lane.dest, outcome.refused, tuple({id(o): o for _, o in flight.items}.values())))
        if all(f.outcome is not None for f in lane.flights.values()):
            self._chain_ended(lane, now)
        if not lane.flights:
            self._settle(lane, now)
        if self._lanes.get(lane.dest) is lane:
            self._pump(lane, now)
        return self._done()

    def tick(self, now: float) -> list[Action[ParcelT, OwnerT]]:
        """Time passed: lanes whose back-off is over go on."""
        due = []
        while self._timers and self._timers[0][0] <= now:
            _, dest = heapq.heappop(self._timers)
            lane = self._lanes.get(dest)
            if lane is not None:
                due.append(lane)
        for lane in dict.fromkeys(due):
            self._pump(lane, now)
        return self._done()

    def withdraw(self, owner: OwnerT) -> None:
        """Let go of ``owner``'s queued and staged parcels (it is ``closing`` now: its
        successor sends their records again); its deliveries in flight end as they end."""
        for lane in self._lanes.values():
            if any(o is owner for _, o in lane.queue):
                lane.queue = deque(item for item in lane.queue if item[1] is not owner)
        for comp, staged in self._staged.items():
            self._staged[comp] = [item for item in staged if item[1] is not owner]

    # ------------------------------------------------------------ the lanes

    def _lane(self, dest: Dest) -> Lane[ParcelT, OwnerT]:
        lane = self._lanes.get(dest)
        if lane is None:
            lane = self._lanes[dest] = Lane(dest)
        return lane

    def _enter(self, lane: Lane[ParcelT, OwnerT], items: list[tuple[ParcelT, OwnerT]], front: bool = False
               ) -> Lane[ParcelT, OwnerT]:
        """``items`` through ``lane``'s door (runtime/lanes.py); owners found out of their order
        there are re-arranged."""
        for o in lane.enter(items, front):
            self._rearrange(lane, o)
        return lane

    def _rearrange(self, lane: Lane[ParcelT, OwnerT], owner: OwnerT) -> None:
        """``owner``'s queued parcels in ``lane`` in its order, where its first one was."""
        queue = list(lane.queue)
        at = next(i for i, (_, o) in enumerate(queue) if o is owner)
        mine = [item for item in queue if item[1] is owner]
        sent = [f for f in lane.flights.values() if any(o is owner for _, o in f.items)]
        if sent:
            done = max((last_key(p) for f in sent for p, o in f.items if o is owner), default=UNKNOWN)
            if min(k for p, _ in mine for k in order_keys(p)) < done:
                log.error("records of %s for %s/%d are older than some it has in flight there: they may "
                          "be taken for duplicates (a bug of the sender)", getattr(owner, "name", owner),
                          *lane.dest)
        r = lane.dest[1]
        placed, moves = arrange(mine, lane.dest[0], lambda keys: [r] * len(keys), self._piece)
        rest = [item for item in queue[at:] if item[1] is not owner]
        lane.queue = deque([*queue[:at], *placed.get(r, []), *rest])
        self._out.extend(moves)
        log.info("records of %s for %s/%d were queued out of their order; re-arranged %d parcels",
                    getattr(owner, "name", owner), *lane.dest, len(mine))

    def _reroute(self, items: list[tuple[ParcelT, OwnerT]], comp: str, streams: list[int] | None = None
                 ) -> dict[int, list[tuple[ParcelT, OwnerT]]]:
        routing = self.routing
        placed, moves = arrange(items, comp, lambda keys: routing.ranges_of(comp, key_hashes(keys)), self._piece,
                                streams)
        self._out.extend(moves)
        return placed

    def _settle(self, lane: Lane[ParcelT, OwnerT], now: float) -> None:
        """A lane with nothing in flight: dropped (its computation is gone) or staged (its
        range is gone); the last retired lane of a computation re-routes what they held."""
        dest = lane.dest
        comp = dest[0]
        if lane.dropping:
            del self._lanes[dest]
            items = [item for item in lane.queue if not item[1].closing]
            retiring = self._retiring.get(comp)
            if retiring is not None:
                retiring.discard(dest)
                if not retiring:
                    del self._retiring[comp]
                    items += [(p, o) for p, o, _ in self._staged.pop(comp, []) if not o.closing]
            self._drop(items, comp)
        elif lane.retired:
            del self._lanes[dest]
            self._stages += 1  # a lane's queue is in its owners' order: one stream to merge
            self._staged.setdefault(comp, []).extend((p, o, self._stages) for p, o in lane.queue if not o.closing)
            retiring = self._retiring[comp]
            retiring.discard(dest)
            if retiring:
                return
            del self._retiring[comp]
            staged = self._staged.pop(comp)
            if not self._reads(self.routing, comp):
                self._drop([(p, o) for p, o, _ in staged], comp)
                return
            placed = self._reroute([(p, o) for p, o, _ in staged], comp, [n for _, _, n in staged]) if staged else {}
            log.info("re-routed %d records of %d owners of %s to its new ranges",
                     sum(len(p.cols) for p, _, _ in staged), len({id(o) for _, o, _ in staged}), comp)
            for r, items in placed.items():
                self._enter(self._lane((comp, r)), items, front=True)
            for d, other in list(self._lanes.items()):
                if d[0] == comp:
                    self._pump(other, now)
        elif not lane.queue:
            lane.forget_owners()

    def _drop(self, items: list[tuple[ParcelT, OwnerT]], comp: str) -> None:
        by_owner: dict[int, tuple[OwnerT, list[ParcelT]]] = {}
        for p, o in items:
            by_owner.setdefault(id(o), (o, []))[1].append(p)
        for o, ps in by_owner.values():
            self._out.append(Dropped(o, ps, comp, True))

    def _chain_ended(self, lane: Lane[ParcelT, OwnerT], now: float) -> None:
        """Every delivery in flight to ``lane`` is answered: failed ones go back to the front
        of its queue, in the order they were sent, and the lane backs off."""
        failed = list(lane.flights.values())
        lane.flights.clear()
        lane.tail = {}
        if not failed:
            return
        back = [item for f in failed for item in f.items if not item[1].closing]
        lane.queue.extendleft(reversed(back))
        if any(f.outcome is not None and f.outcome.status in (Status.NOT_OWNER, Status.UNREACHABLE) for f in failed):
            self._hold_for_routing(lane, now)
        else:  # (only here: a wait for a newer routing ends for every lane when one comes)
            self._hold(lane, now, BUSY_BACKOFF_MAX_S, 1 + JITTER * (2 * self._jitter() - 1))

    def _hold(self, lane: Lane[ParcelT, OwnerT], now: float, cap: float, factor: float = 1.0) -> None:
        lane.ready_at = now + lane.backoff * factor
        lane.backoff = min(lane.backoff * 2, cap)
        heapq.heappush(self._timers, (lane.ready_at, lane.dest))

    def _hold_for_routing(self, lane: Lane[ParcelT, OwnerT], now: float) -> None:
        lane.after_version = self.routing.version
        self._hold(lane, now, ROUTING_BACKOFF_MAX_S)
        self._want_routing(self.routing.version)

    def _want_routing(self, newer_than: int) -> None:
        self._fetch = newer_than if self._fetch is None else max(self._fetch, newer_than)

    def _ready(self, lane: Lane[ParcelT, OwnerT], now: float) -> bool:
        if lane.ready_at <= now:
            lane.after_version = None
            return True
        return lane.after_version is not None and self.routing.version > lane.after_version

    def _pump(self, lane: Lane[ParcelT, OwnerT], now: float) -> None:
        """Put deliveries of ``lane`` on the wire while it may."""
        comp, r = lane.dest
        if (lane.dropping or lane.retired or comp in self._retiring or lane.broken or not lane.queue
                or not self._ready(lane, now)):
            return
        queue = lane.queue
        while queue and len(lane.flights) < self.window:
            taken, items = lane.batch(self.max_bytes, self.max_records)
            if not items:
                for _ in range(taken):
                    queue.popleft()  # only closing owners': their successors re-send them
                continue
            target = self.routing.destination(comp, r)
            if not target.address:
                self._hold_for_routing(lane, now)
                return
            producers = frozenset(p for item in items for p in item[0].producers)
            if lane.flights:
                route = self.routing.computations.get(comp)
                if not lane.chains(producers, route is not None and route.exactly_once):
                    return
            for _ in range(taken):
                queue.popleft()
            self._last_id += 1
            flight = Flight(self._last_id, items, producers)
            lane.flights[flight.id] = flight
            self._flights[flight.id] = lane
            self._out.append(Deliver(flight.id, comp, r, target.address, target.token,
                                     Columns.concat([p.cols for p, _ in items]), lane.orders(items, self.window > 1)))

    def _done(self) -> list[Action[ParcelT, OwnerT]]:
        out, self._out = self._out, []
        if self._fetch is not None:
            out.append(FetchRouting(self._fetch))
            self._fetch = None
        return out
