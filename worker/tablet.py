"""A tablet: one computation over one key range, owned under one sequencer token.

The record path (DESIGN.md §4): fence, dedup, user code, one atomic commit,
acknowledge, then send productions, deleting each checkpoint once its
receiver acknowledges it.

Two threads share the work (docs/architecture.md, "Liveness"). The worker's event loop
queues deliveries, takes batches, resolves senders and sends productions; the tablet's
own thread (worker/runner.py) opens the storage, runs user code and writes each commit.
A batch is bounded in records and in the time its user code may use; what it did not
reach stays queued for the next one.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Callable
from typing import Any, Protocol

from runtime import metrics
from runtime.columns import Columns
from runtime.computation import Computation, TimeDomain
from runtime.delivery import Orders, Status
from runtime.engine import EngineOptions
from runtime.errors import MillstreamError
from runtime.flows import FLOW_CODES
from runtime.imports import CodePolicy, load
from runtime.record import producer_prefix, worker_producer
from runtime.routing import RoutingTable
from runtime.sinks import call_restore, is_sink
from runtime.topology import check_productions, dead_letter_stream, late_stream
from runtime.wire import millstream_pb2 as pb
from worker.batch import Batch, BatchProcessor, LeaseExpiredError
from worker.dedup import OpaqueIds
from worker.inbox import Inbox
from worker.outbox import Outbox
from worker.progress import KeySample
from worker.replication import ReplicationError, Replicator, Sending
from worker.reshard import Origin
from worker.runner import TabletThread
from worker.slowcalls import CallWatch
from worker.storage import Commit, Share, Shipment, TabletStore, Timer, production_key
from worker.timers import TimerIndex

log = logging.getLogger(__name__)

OK, NOT_OWNER, BUSY = Status.OK, Status.NOT_OWNER, Status.BUSY

# A delivery to a full tablet waits this long for room (holding its sender's stream credit)
# before it is answered BUSY, looking again at least every ROOM_CHECK_S (acks free room too).
ROOM_WAIT_S = 2.0
ROOM_CHECK_S = 0.05


class TabletHost(Protocol):
    """What a tablet needs from the worker hosting it."""

    routing: RoutingTable
    limits: Any
    code_policy: CodePolicy
    worker_id: str
    watermarks_known: bool  # false: no batch may run yet (the input watermarks are not known)
    waiting_bytes: int      # deliveries of all its tablets waiting for room (Tablet.deliver)

    def lease_valid(self) -> bool: ...
    def queued_bytes(self) -> int: ...
    def send(self, shipments: list[Shipment], owner: Tablet) -> None: ...
    def watermark(self, computation: str) -> int: ...


def _decade(n: int) -> bool:
    """1, 10, 100, ...: when a repeating failure is worth a full log line."""
    return str(n).rstrip("0") == "1"


class Tablet:
    """Processes batches for one (computation, key range) under one token."""

    def __init__(self, host: TabletHost, route: pb.ComputationRoute, key_range: int, token: int,
                 path: str, now_us: Callable[[], int] = lambda: time.time_ns() // 1000,
                 batch_limit: int | None = None, failures: int = 0,
                 replicator: Callable[[Tablet], Replicator] | None = None,
                 origin: Origin | None = None) -> None:
        self.host = host
        self.route = route
        self.computation = route.name
        self.key_range = key_range
        self.token = token
        self.path = path
        self.now_us = now_us
        self.name = f"{route.name}/{key_range}"
        self.exactly_once = route.exactly_once
        options = EngineOptions.of_route(route)  # ConfigError: the tablet does not open and reports why
        self.dedup_retention_s, self.sync, self.replication = (options.dedup_retention_s, options.fsync,
                                                               options.replication)
        self.outputs = frozenset([*route.outputs, dead_letter_stream(route.name), late_stream(route.name)])
        # Domain-separated from injectors' "injector/<name>" (a computation named "injector"
        # must not share ids with an injector named after its range: review E9).
        self.prefix = worker_producer(producer_prefix("tablet\x00" + self.name))
        self.inbox = Inbox()                # uncommitted input
        self.keys = KeySample()             # where its load divides evenly (for a split)
        self.outbox = Outbox()
        self.processed = 0
        self.running = 0   # records of the batch running now, plus 1 (0: no batch runs)
        self.weak = route.productions == "weak"
        # a weak batch's wait: shipments unacknowledged, set when none is, where each went
        self._weak_wait: tuple[set[int], asyncio.Event, dict[int, list[Shipment]]] | None = None
        self._restore_sink: Callable[[], None] | None = None  # a sink's restore, once its history won
        # Weak productions checkpointed by the commit being written, and those of them
        # acknowledged before it was: their checkpoints are deleted once it is written.
        self._unwritten: set[int] = set()
        self._acked_unwritten: list[bytes] = []
        self.open = False
        self.closing = False  # refuses new deliveries; set by close() or by a failed batch
        self.failed = False   # a batch failed: the next copy starts with smaller batches
        self._closed = False
        self._wake = asyncio.Event()
        self._room = asyncio.Event()  # set by each commit: a delivery waiting for room looks again
        self._task: asyncio.Task[None] | None = None
        self.timers = TimerIndex()
        self.metrics = metrics.tablet(self.computation)
        self._lag_labels: set[str] = set()  # followers whose replication lag this tablet exports
        limits = host.limits
        # A flow's stages take batches of flow_batch_records.
        self.max_batch = limits.flow_batch_records if route.code in FLOW_CODES else limits.max_batch_records
        self.batch_limit = max(1, min(batch_limit or self.max_batch, self.max_batch))
        self._good_batches = 0
        self.failures = failures  # batches of this tablet that failed on this worker, in a row
        self.calls = CallWatch(self.name, warn_after=limits.slow_call_s,
                               on_slow=lambda seconds: self.metrics.slow_calls.inc())
        self.thread: TabletThread | None = None
        self._stopped = False
        # Replicated (DESIGN.md §5): every commit waits for the in-sync followers. A tablet that
        # existed (token > 1) never opens an empty copy. replication=1 gets followers only to move.
        self._make_replicator = replicator
        self.replicator: Replicator | None = None
        # The commit the store handed over before writing it (set on the tablet's thread),
        # and its replication once started on the loop: see _ship.
        self._to_ship: tuple[int, bytes] | None = None
        self._sending: Sending | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.must_exist = token > 1
        self.origin = origin  # a range a split or merge made: built from its parents' storage

    @property
    def queued_records(self) -> int:
        return self.inbox.records

    @property
    def late(self) -> int:
        return self.proc.late if self.open else 0

    @property
    def dead_lettered(self) -> int:
        return self.proc.dead_lettered if self.open else 0

    # ------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Open storage (refusing a newer recorded token), rebuild memory, re-send productions,
        on the tablet's thread (loading user code may take long; its ``setup`` may not return)."""
        self.thread = TabletThread(self.name)
        opening = self.thread.run(self._open)
        try:
            pending = await asyncio.shield(opening)
        except BaseException:
            self._stop_thread()  # closes the storage once (if ever) the opening finishes
            raise
        self._loop = asyncio.get_running_loop()
        if self._make_replicator is not None and self.replication > 1:
            self._start_replicator()  # its followers catch up from here
        restore, self._restore_sink = self._restore_sink, None
        try:
            # (also a tablet reopened after a failed write: its followers may hold that commit)
            if self.replicator is not None and ((restore is not None and (self.must_exist or self.failures)) or pending):
                # Each in-sync follower holding another commit leaves the in-sync set first (no
                # commit is made: a savepoint's cut sees the tablet at rest; docs/replication.md).
                # Before a sink cuts its output back to this copy's commit (the copy taken over
                # from may come back with a fenced batch more, whose output the cut would
                # destroy), and before checkpointed productions go out again (their commit may
                # be on this copy only, and a follower promoted without it would make others).
                await self.replicator.confirm()
            if restore is not None:
                await self.thread.run(restore)
        except BaseException:
            if self.replicator is not None:
                await self.replicator.close()
            self._stop_thread()
            raise
        self.open = True
        if pending:
            log.info("tablet %s re-sends %d checkpointed productions", self.name, len(pending))
            self._sent(pending)
        self._task = asyncio.create_task(self._run(), name=f"tablet {self.name}")

    def _open(self) -> list[Shipment]:
        """On the tablet's thread: storage, memory and user code; the productions to re-send."""
        if self.origin is not None and not os.path.isdir(self.path):
            started = time.perf_counter()
            self.origin.build(self.path)
            log.info("tablet %s built from %s in %.3f s", self.name,
                     ", ".join(p.path for p in self.origin.parents), time.perf_counter() - started)
        store = TabletStore(self.path, self.token, sync=self.sync, must_exist=self.must_exist,
                            replicated=self._make_replicator is not None and self.replication > 1)
        try:
            # Dedup data is bounded (worker/dedup.py): a mark per producer, opaque ids of the retention.
            marks = store.marks() if self.exactly_once else {}
            opaque = OpaqueIds(int(self.dedup_retention_s * 1e6))
            if self.exactly_once:
                by_bucket: dict[int, list[bytes]] = {}
                for bucket, rid in store.opaque_ids(opaque.oldest_kept(self.now_us())):
                    by_bucket.setdefault(bucket, []).append(rid)
                for bucket, ids in by_bucket.items():
                    opaque.add(bucket, ids)
            for t in store.timers():
                self.timers.remember(t)
            cls = load(self.route.code, f"code of computation {self.computation!r}", self.host.code_policy)
            if not (isinstance(cls, type) and issubclass(cls, Computation)):
                raise MillstreamError(f"{self.route.code!r} is not a Computation subclass")
            check_productions(cls, self.route.productions, self.computation)  # (a topology named by path)
            comp = cls()
            if getattr(cls, "load_code", None) is not None:  # a flow's stage loads the code its plan names
                policy = self.host.code_policy
                comp.load_code = lambda path, what: load(path, what, policy)  # type: ignore[attr-defined]
            if getattr(cls, "dead_letter_timer", None) is not None:  # it dead-letters some of its work itself
                comp.max_attempts = self.host.limits.max_attempts  # type: ignore[attr-defined]
                comp.on_dead_letter = lambda key, error, n: self.proc.note_dead_letter(key, error, n)  # type: ignore[attr-defined,has-type]
            comp.setup(dict(self.route.params))
            recover = getattr(comp, "recover_timers", None)
            if recover is not None:
                # A flow's event-time operators keep one timer per due time, on one of its keys;
                # a range split off from the one holding that key gets its own here.
                for key, tag, due in recover(store.scan):
                    if self.timers.get((key, tag)) is None:
                        self.timers.remember(Timer(key, tag, TimeDomain.EVENT_TIME, due))
            if is_sink(comp, self.route.code):
                restore = getattr(comp, "restore", None)
                if restore is not None:
                    self._restore_sink = functools.partial(call_restore, restore, self.name, store.sink_meta(),
                                                           self.token, store.absorbed_sink_metas(),
                                                           store.uncommitted_sink_tablets())
            self.proc = BatchProcessor(self, store, comp, marks, opaque)
            self.proc.ctx.bind_tablet(self.name, self.token)
            pending = store.productions()
        except BaseException:
            store.close()
            raise
        self.store = store
        return pending

    async def close(self) -> None:
        """Finish the batch in flight, refuse the rest (senders retry elsewhere), close storage.

        The storage (and its lock, which the next owner waits for) is closed on the tablet's
        thread after whatever runs there now: never under a batch in flight, whenever the
        caller stops waiting.
        """
        if self._closed:
            return
        self._closed = True
        self.closing = True
        self._wake.set()
        try:
            if self._task is not None:
                # Shielded: a cancelled caller must not cut the batch in flight short.
                await asyncio.shield(asyncio.gather(self._task, return_exceptions=True))
            self.inbox.refuse_all()
            if self.replicator is not None:
                await self.replicator.close()
            if self.thread is not None and not self._stopped:
                await asyncio.shield(self._stop_thread())
        finally:
            self.inbox.refuse_all()
            self._stop_thread()
            metrics.forget_range(self.computation, self.key_range, self._lag_labels)
            log.info("tablet %s closed (token %d)", self.name, self.token)

    def _stop_thread(self) -> asyncio.Future[None]:
        """Queue the storage's close on the tablet's thread, then let the thread end."""
        if self.thread is None or self._stopped:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            fut.set_result(None)
            return fut
        self._stopped = True
        self.open = False
        done = self.thread.run(self._close_store)
        self.thread.stop()
        return done

    def _close_store(self) -> None:
        store = getattr(self, "store", None)
        if store is not None:
            store.close()

    # -------------------------------------------------------------- delivery

    async def deliver(self, cols: Columns, orders: Orders | None = None,
                      admitted: Callable[[], bool] | None = None) -> tuple[int, int]:
        """Queue a delivery's records; resolves to OK once committed, BUSY, OUT_OF_ORDER or NOT_OWNER
        otherwise, with how many of its records were dropped as duplicates (with OK).
        ``orders`` place its records in their producers' orders (see ``ProducerOrder`` in
        proto/millstream.proto and worker/dedup.py). ``admitted``, asked as the records go in
        (after any wait for room): whether an injector's may still (not if a drain closed it)."""
        if self.closing or not self.open:
            return NOT_OWNER, 0
        limits, host = self.host.limits, self.host
        deadline = None
        parked = 0  # its bytes, while it waits for room: bounded per worker, whatever the senders
        try:
            while (self.inbox.records >= limits.max_queued_records or self.inbox.bytes >= limits.max_queued_bytes
                   or self.outbox.unacked >= limits.max_unacked
                   or host.queued_bytes() >= limits.max_worker_queued_bytes):
                # Full: wait here for room, bounded, rather than send the sender into its back-off.
                now = asyncio.get_running_loop().time()
                if deadline is None:
                    deadline, parked = now + ROOM_WAIT_S, cols.nbytes()
                    if host.waiting_bytes + parked > limits.max_worker_waiting_bytes:
                        parked = 0
                        deadline = now
                    host.waiting_bytes += parked
                if now >= deadline:
                    self.metrics.busy.inc()
                    return BUSY, 0
                self._room.clear()
                try:
                    await asyncio.wait_for(self._room.wait(), min(ROOM_CHECK_S, deadline - now))
                except TimeoutError:
                    pass
                if self.closing or not self.open:
                    return NOT_OWNER, 0
        finally:
            host.waiting_bytes -= parked
        if admitted is not None and not admitted():
            return NOT_OWNER, 0
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.keys.add(cols.keys)
        d = self.inbox.put(cols, fut, orders or None)
        self._wake.set()
        status = await fut
        return status, d.duplicates

    def follow(self, assignment: pb.Assignment) -> None:
        """The routing changed: tell the replicator (one starts for a follower of a move)."""
        if self.replicator is None and assignment.followers and self._make_replicator is not None and self.open:
            self.store.replicated = True  # from its next commit on (a gap before is a snapshot)
            self._start_replicator()
        elif self.replicator is not None:
            self.replicator.configure(assignment)

    def _start_replicator(self) -> None:
        assert self._make_replicator is not None
        self.replicator = self._make_replicator(self)
        self.store.ship = self._ship

    def _ship(self, index: int, ops: bytes) -> None:
        """On the tablet's thread, right before the store writes commit ``index``: the loop sends
        it to the followers while the write and its fsync run (acks wait for both)."""
        assert self._loop is not None and self.thread is not None
        self._to_ship = (index, ops)
        self._loop.call_soon_threadsafe(self._start_sending)
        self.thread.release_loop()  # the loop must not wait for this write before sending

    def _start_sending(self) -> None:
        """On the loop: start replicating the commit :meth:`_ship` handed over, if not yet."""
        shipped, self._to_ship = self._to_ship, None
        if shipped is not None and self.replicator is not None:
            self._sending = self.replicator.send(*shipped)

    def _sent(self, shipments: list[Shipment]) -> None:
        self.outbox.sent(shipments)
        self.host.send(shipments, self)

    def release(self, reported: dict[str, int]) -> None:
        self._forget(self.outbox.release(reported))

    def _after_commit(self, batch: Batch) -> None:
        """On the loop, once the batch is durable: memory follows the commit, senders of the
        finished deliveries hear OK, what the batch did not reach goes back in the queue."""
        commit = batch.commit
        self.failures = 0
        self._unwritten = set()
        if self._acked_unwritten:  # acknowledged while their checkpoints were being written
            self.store.delete_productions(self._acked_unwritten)
            self._acked_unwritten = []
        self.metrics.records.inc(batch.new)
        self.processed += batch.new
        for t in commit.timers_deleted.values():
            self.timers.forget(t)
        for t in commit.timers_set.values():
            self.timers.remember(t)
        for t in batch.deferred:
            self.timers.remember(t)
        self.inbox.committed(batch.deliveries, batch.consumed, batch.refused, batch.duplicates)
        self._room.set()
        if batch.deferred or (batch.deliveries and self.inbox):
            self._wake.set()
        if self.batch_limit < self.max_batch:  # after a failure: grow back, slowly
            self._good_batches += 1
            if self._good_batches >= 4:
                self._good_batches = 0
                self.batch_limit = min(self.max_batch, self.batch_limit * 2)

    def acked(self, shipments: list[Shipment], receipt: tuple[str, int] | None = None) -> None:
        """The receiver committed these shipments.

        Their timestamps stay in this tablet's oldest work, and their checkpoints on disk,
        until the leader holds the receiver's report named by ``receipt`` (which reflects
        them): so no report sequence lets the watermark pass records in hand-over, also
        across a close of this tablet (worker/outbox.py).
        """
        self.metrics.sent.inc(sum(len(s.cols) for s in shipments))
        self._handed_over(shipments, receipt)

    def rerouted(self, old: list[Shipment], new: list[Shipment], parts: dict[int, list[Shipment]]) -> None:
        """The sender re-routed shipments ``old`` (their range was split or merged) as ``new``;
        ``parts``: old shipment -> the new ones holding its records."""
        self.outbox.replaced(old, new)
        if self._weak_wait is not None:  # a weak batch waits for its shipments: follow them
            waiting, _, pieces = self._weak_wait
            for shipment, now in pieces.items():
                pieces[shipment] = [q for p in now for q in parts.get(id(p), [p])]
            for s in old:
                if id(s) in waiting:
                    waiting.discard(id(s))
                    waiting.update(id(q) for q in parts.get(id(s), ()))
        gone = {id(s) for s in old}
        if self._unwritten & gone:
            self._unwritten = (self._unwritten - gone) | {id(q) for s in old if id(s) in self._unwritten
                                                          for q in parts.get(id(s), ())}

    def dropped(self, shipments: list[Shipment]) -> None:
        """No reader will ever commit these (the routing no longer has their computation):
        forget their checkpoints; they hold nothing (worker/sender.py)."""
        self._handed_over(shipments, None)

    def _handed_over(self, shipments: list[Shipment], receipt: tuple[str, int] | None) -> None:
        if self._weak_wait is not None:
            waiting, done, _ = self._weak_wait
            for s in shipments:
                waiting.discard(id(s))
            if not waiting:
                done.set()
        bound = self.host.limits.max_unacked
        full = self.outbox.unacked >= bound
        self._forget(self.outbox.acked(shipments, receipt))
        if full and self.outbox.unacked < bound:
            self._wake.set()  # due timers it held back (timers_wait) may fire now

    def _forget(self, shipments: list[Shipment]) -> None:
        """Delete the checkpoints of shipments let go of (a closing tablet leaves them to
        its successor, which re-sends them): one write per call, not per record."""
        if shipments and self.open and not self.closing:
            keys = []
            for s in shipments:
                if id(s) in self._unwritten:
                    self._acked_unwritten += s.let_go()
                else:
                    keys += s.let_go()
            if keys:
                self.store.delete_productions(keys)

    # ------------------------------------------------------------ processing

    def timers_wait(self) -> bool:
        """Whether due timers (wall-clock and event-time) wait: while a savepoint of the job is
        taken, so nothing moves while its tablets are copied one after another
        (docs/lifecycle.md); and while this tablet's unacknowledged productions are at
        ``max_unacked``, which holds back its deliveries too (a window stage over a stalled
        reader grew its outbox without bound). Held, a timer still holds the watermark."""
        route = self.host.routing.computations.get(self.computation)
        return (route is not None and route.input_paused) or self.outbox.unacked >= self.host.limits.max_unacked

    def wake(self) -> None:
        """The routing changed (timers a savepoint held may fire now), or the worker learnt
        its input watermarks (batches may run now)."""
        self._wake.set()

    async def _run(self) -> None:
        while not self.closing:
            if not self.host.watermarks_known:
                await self._wake.wait()  # WorkerCore.set_watermarks wakes it (or close())
                self._wake.clear()
                continue
            held = self.timers_wait()
            delay = None if held else self._next_wall_timer_delay()
            if not self.inbox and (held or not self._due_event_timers()):
                try:
                    await asyncio.wait_for(self._wake.wait(), delay)
                except TimeoutError:
                    pass
            self._wake.clear()
            if self.closing:
                break
            try:
                await self._process_once()
            except LeaseExpiredError:
                log.error("tablet %s: lease expired, refusing to commit", self.name)
                self.metrics.fenced.inc()
                self.failed = self.closing = True
                break
            except ReplicationError as e:
                # Written here, acknowledged nowhere: this copy is stale from now on and
                # catches up from the new primary (docs/replication.md).
                log.error("%s; closing the tablet, nothing of the batch was acknowledged", e)
                self.metrics.fenced.inc()
                self.failed = self.closing = True
                break
            except Exception:
                # Memory may no longer match disk: close; the worker reopens from disk. A
                # failure that repeats (a full disk) is logged in full at 1, 10, 100, ... times.
                self.failures += 1
                log.log(logging.ERROR if _decade(self.failures) else logging.DEBUG,
                        "tablet %s: batch failed (%d times); reopening from storage with batches of "
                        "at most %d records", self.name, self.failures, max(1, self.batch_limit // 2),
                        exc_info=True)
                self.failed = self.closing = True
                break
            else:
                await asyncio.sleep(0)  # let deliveries and acks in between batches
        self.inbox.refuse_all()

    async def _process_once(self) -> None:
        assert self.thread is not None
        limit = self.batch_limit
        items = self.inbox.take(limit)
        due = [] if self.timers_wait() else self.timers.pop_due(self.now_us(), self.host.watermark(self.computation),
                                                                 limit)
        if not items and not due:
            return
        self.running = 1 + sum(d.remaining for d in items)
        for t in due:
            self.inbox.hold(t.time)  # a timer being fired still holds the watermark
        commit = Commit(seq=self.store.seq)
        batch = Batch(items, due, commit, limit)
        started = time.perf_counter()
        weak_sent = False
        try:
            if self.weak:
                await self.thread.run(self.proc.compute, batch)
                if commit.productions:
                    weak_sent = True
                    await self._send_weak(commit)
                await self.thread.run(self.proc.write, batch)
            else:
                await self.thread.run(self.proc.compute_and_write, batch)
            # Written here; its followers have had it since before the write (_ship).
            self._start_sending()
            sending, self._sending = self._sending, None
            if sending is None and self.replicator is not None and batch.ops is not None:
                sending = self.replicator.send(batch.index, batch.ops)  # its replicator started meanwhile
            if self.replicator is not None and sending is not None:
                t0 = time.perf_counter()
                await self.replicator.wait(sending)
                metrics.REPLICATION_SECONDS.labels(self.computation).observe(time.perf_counter() - t0)
        except BaseException:
            # Nothing of it acknowledged: its senders retry. If its write failed here, its
            # followers may hold it: the tablet reopens under a new term, and they give it
            # up for a snapshot (worker/replica.py) unless promoted first (then it is theirs).
            self.inbox.failed(items)
            self._unwritten, self._acked_unwritten = set(), []
            self._to_ship = self._sending = None
            self.proc.hold = None
            self.running = 0
            self.inbox.unhold(*(t.time for t in due))
            raise
        self.metrics.batch_seconds.observe(time.perf_counter() - started)
        try:
            if self.proc.committed_hook is not None:  # (a sink's, runtime/sinks.py)
                await self.thread.run(self.proc.sink_committed)
            self._after_commit(batch)
            if commit.productions and not weak_sent:
                self._sent(commit.productions)
            self.proc.hold = None  # its timers are in the index, its productions in the outbox
        finally:  # running, and holding for its fired timers, until the index holds what they set
            self.running = 0
            self.inbox.unhold(*(t.time for t in due))

    # ------------------------------------------- weak productions, before the commit

    async def _send_weak(self, commit: Commit) -> None:
        """Weak productions: send before the commit; checkpoint only those not acknowledged
        within ``weak_ack_ms``, so a straggler does not hold this tablet's pipeline."""
        waiting = {id(s) for s in commit.productions}
        done = asyncio.Event()
        # Where each shipment's records are now: re-routing (a split or merge, also of a
        # shipment made under a routing that changed meanwhile) cuts it into new ones.
        pieces = {id(s): [s] for s in commit.productions}
        self._weak_wait = (waiting, done, pieces)
        self._sent(commit.productions)
        try:
            await asyncio.wait_for(done.wait(), self.host.limits.weak_ack_ms / 1000)
        except TimeoutError:
            pass
        finally:
            self._weak_wait = None
        assert commit.seq is not None
        slow = []
        self._unwritten = set()
        for s in commit.productions:
            pending = [p for p in pieces[id(s)] if id(p) in waiting]
            if not pending:
                continue
            # Still in the sender's queue: checkpoint the shipment with this commit. Cut by
            # re-routing, its unacknowledged pieces share that checkpoint.
            commit.seq += 1
            s.ckey = production_key(commit.seq, s.computation, s.key_range)
            if pending != [s]:
                share = Share(s.ckey, len(pending))
                for p in pending:
                    p.shares = (*p.shares, share)
            self._unwritten.update(id(p) for p in pending)
            slow.append(s)
        commit.productions = slow

    # ---------------------------------------------------------------- timers

    def _next_wall_timer_delay(self) -> float | None:
        t = self.timers.peek(TimeDomain.WALL_TIME)
        if t is None:
            return None
        return max(0.0, (t.time - self.now_us()) / 1e6)

    def _due_event_timers(self) -> bool:
        t = self.timers.peek(TimeDomain.EVENT_TIME)
        return t is not None and t.time <= self.host.watermark(self.computation)

    def oldest_work(self) -> int | None:
        """Oldest timestamp of uncommitted input, unacknowledged productions and pending
        event-time timers, and of what the batch in flight made earlier than its input
        (``None``: nothing pending)."""
        hold = self.proc.hold if self.open else None
        candidates = [t for t in (self.inbox.oldest(), self.outbox.oldest(), hold) if t is not None]
        t = self.timers.peek(TimeDomain.EVENT_TIME)
        if t is not None:
            candidates.append(t.time)
        return min(candidates) if candidates else None

    def progress(self) -> pb.HeldTablet:
        oldest = self.oldest_work()
        self.calls.check()
        if self.exactly_once:  # gauges: fresh at every report (20 a second), not every commit
            labels = (self.computation, str(self.key_range))
            metrics.DEDUP_FILTER_BYTES.labels(*labels).set(self.proc.opaque.memory_bytes())
            metrics.DEDUP_PRODUCERS.labels(*labels).set(len(self.proc.marks))
        if self.replicator is not None:
            lags = self.replicator.lag()
            for follower in self._lag_labels - lags.keys():  # no longer a follower
                metrics.REPLICATION_LAG.remove(self.computation, str(self.key_range), follower)
            self._lag_labels = set(lags)
            for follower, lag in lags.items():
                metrics.REPLICATION_LAG.labels(self.computation, str(self.key_range), follower).set(lag)
        return pb.HeldTablet(
            computation=self.computation, key_range=self.key_range, token=self.token,
            has_work=oldest is not None, oldest_work=oldest or 0, processed=self.processed,
            late=self.late, dead_lettered=self.dead_lettered, backlog=self.inbox.records,
            in_flight=self.inbox.records + self.running + self.outbox.unacked + self.outbox.held,
            commits=self.store.index,
            watermark=self.host.watermark(self.computation),
            slow=[pb.SlowCall(key=k, seconds=sec, running=run) for k, sec, run in self.calls.snapshot()],
            load_median=self.keys.median())

    def quiet(self) -> bool:
        """Nothing queued, in a batch (whose timers are out of the index already),
        unacknowledged, or due now by the watermark or the wall clock."""
        if self.running or self.inbox or self.outbox.unacked or self._due_event_timers():
            return False
        delay = self._next_wall_timer_delay()
        return delay is None or delay > 0

    def watermark_advanced(self) -> None:
        """Wake the run loop if an event-time timer may now be due."""
        if self._due_event_timers():
            self._wake.set()
