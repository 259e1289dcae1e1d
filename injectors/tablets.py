"""An injector's side of the delivery protocol: the shell around the delivery core
(runtime/courier.py) its rounds go through (their records routed by injectors/routes.py).

The core decides: a queue per tablet, chains of deliveries in flight to one tablet (up to
``max_in_flight``), retries, re-routing through splits and merges, dropping what goes to
readers gone. This shell runs it on an asyncio loop of its own (one thread per injector),
with one delivery stream per worker (runtime/links.py), and fetches the routing from the
master when the core asks for a newer one; then it also sends the rounds in flight to
readers of the stream the routing added. The injector's threads hand it rounds in the order
they take them (:meth:`Tablets.enqueue`) and block until each is committed
(:meth:`Tablets.deliver`); committed deliveries hold the injector's watermark until the
leader holds their receivers' reports (``committed``: injectors/watermark.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from injectors.rounds import Chunk, Round, Sending
from injectors.routes import Routes
from runtime import delivery
from runtime.alarm import Alarm
from runtime.client import Client
from runtime.columns import Columns
from runtime.courier import Acked, Action, Courier, Deliver, Dropped, FetchRouting, Refused
from runtime.delivery import Outcome, Receipt, Status
from runtime.errors import InjectionError, MillstreamError, StreamClosedError, UnknownStreamError
from runtime.imports import CodePolicy
from runtime.links import Channels, DeliveryLinks
from runtime.parcels import Rerouted
from runtime.routing import RoutingTable
from runtime.security import Security
from runtime.serving import new_loop
from runtime.streams import FRAME_TIMEOUT_S
from runtime.wire import millstream_pb2 as pb

log = logging.getLogger(__name__)


class Links(Protocol):
    """How deliveries reach workers (runtime/links.py ``DeliveryLinks``; a test's fake)."""

    def post(self, address: str, request: pb.DeliverRequest) -> asyncio.Future[Outcome]: ...
    def close(self) -> Awaitable[None]: ...


class Tablets:
    """The tablets reading one stream, as one injector sends to them."""

    def __init__(self, name: str, stream: str, client: Client, security: Security,
                 sequenced: dict[bytes, int], closed: threading.Event, *,
                 committed: Callable[[int, Receipt], None], code_policy: CodePolicy = CodePolicy(),
                 window: int = 4, links: Callable[[], Links] | None = None,
                 unread: Callable[[], None] = lambda: None) -> None:
        self.name = name
        self.stream = stream
        self._client = client
        self._security = security
        self._sequenced = sequenced    # the injector's producers (their records are ordered)
        self._closed = closed
        self._committed = committed    # (oldest timestamp, receipt) of each committed delivery
        self._unread = unread          # called when a round finds no computation reading the stream
        self._window = window
        # Its channels are its own, closed with it (left open, gRPC handed their later events to
        # its closed loop: "Event loop is closed" tracebacks printed by another injector's loop).
        self._make_links = links or (lambda: DeliveryLinks(Channels(security), owns_channels=True))
        self.routes = Routes(name, stream, code_policy)
        self.routing = self.fetch()
        # Records the receivers committed (accepted) and dropped as already committed under
        # their ids (duplicates), one count per reader a record reached; see Injector.
        self.accepted = self.duplicates = 0
        self._counts_lock = threading.Lock()
        self._judged = False  # whether the first committed deliveries were looked at
        # The loop and what only it touches.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._loop_lock = threading.Lock()
        self._courier: Courier[Chunk, Sending] | None = None
        self._linked: Links | None = None
        self._owner = Sending(name)
        self._waiting: list[Round] = []      # handed over, in take order, not started yet
        self._rounds: list[Round] = []       # started, not finished, in take order
        self._parcels: dict[int, tuple[Chunk, list[Round]]] = {}  # id(chunk) -> it, rounds waiting on it
        self._deadlines: dict[int, asyncio.TimerHandle] = {}
        self._fetching = False
        self._fetch_again = False
        self._blocked = False  # the first round waiting is waiting for a routing fetch
        # Rounds in flight failed with this; each handed over until the injector has queued their
        # records again fails with it too (sent now, it would pass them: lost as duplicates).
        self._failed: MillstreamError | None = None
        self._alarm = Alarm(self._tick)

    def fetch(self) -> RoutingTable:
        return self.routes.table(self._client.routing())

    # ------------------------------------------------------------ the caller's side

    def enqueue(self, rnd: Round) -> None:
        """Hand over a round just taken (under the injector's lock, so rounds arrive in take
        order); it is sent once its thread :meth:`deliver`\\ s it (or dropped: :meth:`abandon`)."""
        loop = self._ensure_loop()
        try:
            loop.call_soon_threadsafe(self._hand, rnd)
        except RuntimeError:  # the loop is closed: the injector is closing
            rnd.error = InjectionError(f"injector {self.name!r} closed with records unsent")
            rnd.finished.set()

    def deliver(self, rnd: Round, timeout: float) -> None:
        """Send a round handed over by :meth:`enqueue` and block until every record of it is
        committed (raises :class:`~runtime.errors.InjectionError` if it cannot be within
        ``timeout``; then every round in flight fails with it)."""
        self._call(self._release, rnd, timeout)
        if not rnd.finished.wait(timeout + FRAME_TIMEOUT_S + 5):
            raise InjectionError(f"injector {self.name!r}: its delivery loop did not finish a round within "
                                 f"{timeout:.0f}s; the records are still queued")
        if rnd.error is not None:
            raise rnd.error

    def resume(self) -> None:
        """The records of the rounds that failed are queued again (under the injector's lock,
        before any round taken after them is handed over): rounds go out again."""
        with contextlib.suppress(InjectionError):  # (closed: nothing goes out again)
            self._call(self._resume)

    def abandon(self, rnd: Round, error: MillstreamError) -> None:
        """A round handed over that its thread will not deliver: it fails (with every round in
        flight: their records go back to the queue together)."""
        self._call(self._abandon, rnd, error)

    def close(self) -> None:
        """Fail what is in flight (the injector is closed) and stop the loop."""
        with self._loop_lock:
            loop, self._loop = self._loop, None
        if loop is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(10)
        except Exception as e:  # noqa: BLE001 - closing anyway
            log.debug("injector %s: closing its delivery loop: %s", self.name, e)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(5)
        if not loop.is_running():
            loop.close()

    def _call(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._ensure_loop()
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            raise InjectionError(f"injector {self.name!r} closed with records unsent") from None

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is not None:
            return loop
        with self._loop_lock:
            if self._loop is None:
                if self._closed.is_set():
                    raise InjectionError(f"injector {self.name!r} is closed")
                loop = new_loop()
                self._thread = threading.Thread(target=self._run_loop, args=(loop,), daemon=True,
                                                name=f"injector {self.name} deliveries")
                self._thread.start()
                self._loop = loop
            return self._loop

    @staticmethod
    def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        loop.run_forever()

    # ---------------------------------------------------------------- on the loop

    def _core(self) -> Courier[Chunk, Sending]:
        if self._courier is None:
            self._courier = Courier(self.routing, _chunk, max_records=1 << 30, window=self._window,
                                    reads=self.routes.reads)
            self._linked = self._make_links()
        return self._courier

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def _hand(self, rnd: Round) -> None:
        if rnd.error is None and self._failed is not None:  # taken before the injector heard of it
            rnd.error = self._failed
        if rnd.error is not None:  # failed with the rounds in flight before it was handed over
            rnd.finished.set()
            return
        self._waiting.append(rnd)

    def _resume(self) -> None:
        self._failed = None

    def _release(self, rnd: Round, timeout: float) -> None:
        if rnd.finished.is_set():
            return
        rnd.released = True
        self._deadlines[id(rnd)] = asyncio.get_running_loop().call_later(timeout, self._expire, rnd, timeout)
        self._start_waiting()

    def _abandon(self, rnd: Round, error: MillstreamError) -> None:
        if not rnd.finished.is_set():
            self._fail(error)

    def _start_waiting(self) -> None:
        """Start the rounds handed over, in take order, as far as their threads released them."""
        while self._waiting and self._waiting[0].released and not self._blocked:
            rnd = self._waiting[0]
            routing = self._core().routing
            if not routing.has_subscribers(self.stream) or routing.proto.closed_streams.get(self.stream):
                # No reader, or a closed stream: under a newer routing, perhaps. The rounds after
                # it wait (they must reach the tablets after this one).
                self._blocked = True
                asyncio.get_running_loop().create_task(self._start_after_fetch(rnd))
                return
            self._waiting.pop(0)
            self._rounds.append(rnd)
            self._send(rnd, routing)

    async def _start_after_fetch(self, rnd: Round) -> None:
        try:
            self._install(await asyncio.get_running_loop().run_in_executor(None, self.fetch))
        except MillstreamError as e:
            self._blocked = False
            self._fail(InjectionError(f"injector {self.name!r}: cannot fetch the routing: {e} (the records are "
                                      "still queued)"))
            return
        self._blocked = False
        if rnd.finished.is_set():
            self._start_waiting()
            return
        routing = self._core().routing
        closed = routing.proto.closed_streams.get(self.stream)
        if closed:
            self._fail(StreamClosedError(f"injector {self.name!r}: {closed} (nothing was sent)"))
        elif not routing.has_subscribers(self.stream):
            self._unread()
            self._fail(UnknownStreamError(
                f"stream {self.stream!r} is unknown: no running computation reads it; submit a topology with "
                "it among its inputs first (nothing was sent)"))
        else:
            self._waiting.remove(rnd)
            self._rounds.append(rnd)
            self._send(rnd, routing)
            self._start_waiting()

    def _send(self, rnd: Round, routing: RoutingTable, only: set[str] | None = None) -> None:
        """Hand ``rnd``'s records for its readers (or those of ``only``) to the core."""
        chunks = self._chunks(rnd, routing, only)
        rnd.readers |= routing.readers(self.stream) if only is None else only
        for c in chunks:
            self._parcels[id(c)] = (c, [rnd])
            rnd.outstanding[id(c)] = c
        if chunks:
            self._apply(self._core().send(chunks, self._owner, self._now()))
        if not rnd.outstanding:
            self._complete(rnd)

    def _chunks(self, rnd: Round, routing: RoutingTable, only: set[str] | None) -> list[Chunk]:
        """A round's records by tablet, cut into deliveries, each record with its place."""
        reach = None if only is None else self.routes.reached(routing, only)
        out = []
        first = rnd.first
        for (comp, r), (cols, where) in self.routes.route_indexed(rnd.records, routing).items():
            if reach is not None and comp not in reach:
                continue
            start = 0
            for part in delivery.cut_columns(cols):
                n = len(part)
                order = (list(range(first + start, first + start + n)) if isinstance(where, range) and where.start == 0
                         else [first + i for i in where[start:start + n]])
                out.append(Chunk(comp, r, part, self._producers_in(part), order))
                start += n
        return out

    def _producers_in(self, cols: Columns) -> tuple[bytes, ...]:
        """The injector's producers among ``cols``' records (what their delivery lists)."""
        if cols.producer is not None:
            return (cols.producer,) if cols.producer in self._sequenced else ()
        sequenced = self._sequenced
        return tuple(dict.fromkeys(p for p in (rid[:8] for rid in cols.all_ids()) if p in sequenced))

    def _apply(self, actions: list[Action[Chunk, Sending]]) -> None:
        for a in actions:
            if isinstance(a, Deliver):
                self._post(a)
            elif isinstance(a, Acked):
                self._acked(a)
            elif isinstance(a, Dropped):
                log.info("injector %s: %s no longer reads %r; %d records for it are dropped", self.name,
                         a.computation, self.stream, sum(len(p.cols) for p in a.parcels))
                for p in a.parcels:
                    self._settle(p)
            elif isinstance(a, Rerouted):
                self._rerouted(a)
            elif isinstance(a, FetchRouting):
                self._refresh()
            elif isinstance(a, Refused):
                self._fail(InjectionError(f"injector {self.name!r}: {a.reason} (the records are still queued, "
                                          "nothing was lost)"))
        self._arm()

    def _post(self, d: Deliver) -> None:
        assert self._linked is not None
        req = delivery.columns_request(d.computation, d.key_range, d.token, d.cols, d.orders,
                                       sender="injector/" + self.name)
        self._linked.post(d.address, req).add_done_callback(functools.partial(self._answered, d.id))

    def _answered(self, delivery_id: int, fut: asyncio.Future[Outcome]) -> None:
        if self._courier is None or fut.cancelled():
            return
        out = fut.result() if fut.exception() is None else Outcome(Status.UNREACHABLE)
        self._apply(self._courier.answered(delivery_id, out, self._now()))

    def _acked(self, a: Acked[Chunk, Sending]) -> None:
        out = a.outcome
        if out.routing_version > self._core().routing.version:
            # The receiver has a newer routing (the core asks for it): an update may have added
            # a reader of the stream, which these rounds must reach too before they are done.
            for p in a.parcels:
                for rnd in self._parcels.get(id(p), (p, []))[1]:
                    rnd.needs_version = max(rnd.needs_version, out.routing_version)
        records = sum(len(p.cols) for p in a.parcels)
        self._count(records - out.duplicates, out.duplicates)
        if out.receipt is not None and out.receipt[0]:
            # Committed: its timestamps hold the injector's watermark until the leader holds the
            # receiver's report that reflects them.
            oldest = min(min(p.cols.timestamps) for p in a.parcels)
            self._committed(oldest, out.receipt)
        for p in a.parcels:
            self._settle(p)

    def _settle(self, p: Chunk) -> None:
        """``p`` is committed (or no reader will ever commit it)."""
        _, rounds = self._parcels.pop(id(p), (p, []))
        for rnd in rounds:
            rnd.outstanding.pop(id(p), None)
            if not rnd.outstanding:
                self._complete(rnd)

    def _complete(self, rnd: Round) -> None:
        """Everything of ``rnd`` is committed: it is done, unless a receiver's newer routing
        is still to be fetched (it may add a reader of the stream)."""
        if rnd.needs_version <= self._core().routing.version:
            self._finish(rnd)

    def _rerouted(self, a: Rerouted[Chunk, Sending]) -> None:
        for old in a.old:
            _, rounds = self._parcels.pop(id(old), (old, []))
            for rnd in rounds:
                rnd.outstanding.pop(id(old), None)
                for new in a.parts.get(id(old), []):
                    rnd.outstanding[id(new)] = new
                    entry = self._parcels.setdefault(id(new), (new, []))
                    if rnd not in entry[1]:
                        entry[1].append(rnd)

    def _finish(self, rnd: Round, error: MillstreamError | None = None) -> None:
        if rnd.finished.is_set():
            return
        rnd.error = error
        handle = self._deadlines.pop(id(rnd), None)
        if handle is not None:
            handle.cancel()
        if rnd in self._rounds:
            self._rounds.remove(rnd)
        rnd.finished.set()

    def _expire(self, rnd: Round, timeout: float) -> None:
        self._deadlines.pop(id(rnd), None)
        if rnd.finished.is_set():
            return
        n = sum(len(p.cols) for p in rnd.outstanding.values())
        dests = sorted({(p.computation, p.key_range) for p in rnd.outstanding.values()})
        self._fail(InjectionError(
            f"injector {self.name!r}: {n} records to {self.stream!r} were not acknowledged within {timeout:.0f}s "
            f"(tablets {dests} busy or unowned); they are still queued: call flush() again once the cluster has "
            "capacity"))

    def _fail(self, error: MillstreamError) -> None:
        """Every round handed over and not finished fails with ``error``: what was queued for
        them is let go of (their records go back to the injector's queue, in order; a delivery
        in flight ends as it ends, and its records are sent again under the same ids)."""
        old, self._owner = self._owner, Sending(self.name)
        old.closing = True
        if self._rounds or self._waiting:  # (their records go back: none may pass them meanwhile)
            self._failed = error
        for rnd in [*self._rounds, *self._waiting]:
            self._finish(rnd, error)
        self._waiting = []
        self._rounds = []
        self._parcels = {}
        if self._courier is not None:
            self._courier.withdraw(old)
        self._arm()

    # ------------------------------------------------------------- the routing

    def _refresh(self) -> None:
        """Fetch the routing from the master (one fetch at a time; again after it if asked)."""
        if self._fetching:
            self._fetch_again = True
            return
        self._fetching = True
        asyncio.get_running_loop().create_task(self._fetch_routing())

    async def _fetch_routing(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                self._fetch_again = False
                try:
                    routing = await loop.run_in_executor(None, self.fetch)
                except MillstreamError as e:
                    log.debug("injector %s: cannot fetch the routing: %s", self.name, e)
                    await asyncio.sleep(0.1)  # the master moving: the core asks again after its back-off
                    continue
                self._install(routing)
                behind = any(r.needs_version > self._core().routing.version for r in self._rounds)
                if behind:
                    # A receiver knows a newer routing than the master gave us (a new leader
                    # catching up): ask again soon; the rounds waiting for it time out if not.
                    await asyncio.sleep(0.02)
                elif not self._fetch_again:
                    return
        finally:
            self._fetching = False

    def _install(self, routing: RoutingTable) -> None:
        """A routing fetched: in force if newer; the rounds in flight then also go to readers
        of the stream it added (in take order, before any round routed with it)."""
        core = self._core()
        if routing.version <= core.routing.version:
            return
        self.routing = routing
        self._apply(core.routing_changed(routing, self._now()))
        readers = routing.readers(self.stream)
        for rnd in list(self._rounds):
            gone = rnd.readers - self.routes.reached(routing, readers)
            rnd.readers -= gone
            added = readers - rnd.readers
            if added and not rnd.finished.is_set():
                log.info("injector %s: stream %r has new readers %s; this round goes to them too", self.name,
                         self.stream, sorted(added))
                self._send(rnd, routing, added)
            elif not rnd.outstanding:
                self._complete(rnd)

    def _arm(self) -> None:
        self._alarm.arm(self._courier.wake_at if self._courier is not None else None)

    def _tick(self) -> None:
        if self._courier is not None:
            self._apply(self._courier.tick(self._now()))

    async def _shutdown(self) -> None:
        self._fail(InjectionError(f"injector {self.name!r} closed with records unsent"))
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for handle in self._deadlines.values():
            handle.cancel()
        self._deadlines.clear()
        self._alarm.cancel()
        if self._linked is not None:
            await self._linked.close()
        self._courier = None

    def _count(self, accepted: int, duplicates: int) -> None:
        """Add a committed delivery to the counts; the first to commit any decides whether to
        warn that they were all duplicates (E3 of review 3: a new injector under a name
        already used for other data has everything it sends dropped, which looks the same
        from here as the exactly-once re-run of a crashed one)."""
        with self._counts_lock:
            self.accepted += accepted
            self.duplicates += duplicates
            if self._judged or not (accepted or duplicates):
                return
            self._judged = True
        if not accepted:
            log.warning("injector %r on stream %r: the first %d records this process sent were all already "
                        "committed under this name (duplicates, dropped). If this is a re-run of the same "
                        "input, that is exactly-once at work; if it is new data, give the injector a new name.",
                        self.name, self.stream, duplicates)


def _chunk(sources: list[Chunk], computation: str, key_range: int, cols: Columns, producers: tuple[bytes, ...],
           order: list[int] | None) -> Chunk:
    return Chunk(computation, key_range, cols, producers, order)
