"""A tablet: one computation over one key range, owned under one sequencer token.

The record path (DESIGN.md §4): fence, dedup, user code, one atomic commit,
acknowledge, then send productions, deleting each checkpoint once its
receiver acknowledges it.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from runtime import metrics
from runtime.computation import Computation, TimeDomain
from runtime.errors import MillstreamError
from runtime.imports import load
from runtime.record import Record, derived_id, producer_prefix, sequence_id
from runtime.routing import RoutingTable
from runtime.topology import dead_letter_stream
from runtime.wire import millstream_pb2 as pb
from worker.context import Effects, KeyContext
from worker.dedup import Collection, DedupFilter, rebuilt
from worker.outbox import Outbox
from worker.progress import TimestampBag
from worker.storage import Commit, Production, TabletStore, Timer, production_key
from worker.timers import TimerIndex

if TYPE_CHECKING:
    from collections.abc import Iterable

log = logging.getLogger(__name__)

OK, NOT_OWNER, BUSY = pb.DeliverResponse.OK, pb.DeliverResponse.NOT_OWNER, pb.DeliverResponse.BUSY


class LeaseExpired(MillstreamError):
    """The worker could not renew its lease: it must stop committing (self-fencing)."""


class TabletHost(Protocol):
    """What a tablet needs from the worker hosting it."""

    routing: RoutingTable
    limits: Any

    def lease_valid(self) -> bool: ...
    def send(self, productions: list[Production], owner: Tablet) -> None: ...
    def watermark(self, computation: str) -> int: ...


class Tablet:
    """Processes batches for one (computation, key range) under one token."""

    def __init__(self, host: TabletHost, route: pb.ComputationRoute, key_range: int, token: int,
                 path: str, now_us: Callable[[], int] = lambda: time.time_ns() // 1000) -> None:
        self.host = host
        self.route = route
        self.computation = route.name
        self.key_range = key_range
        self.token = token
        self.path = path
        self.now_us = now_us
        self.name = f"{route.name}/{key_range}"
        self.exactly_once = route.exactly_once
        fsync = route.params.get("millstream.fsync")
        self.sync = route.exactly_once if fsync is None else fsync == "1"
        self.outputs = frozenset([*route.outputs, dead_letter_stream(route.name)])
        self.prefix = producer_prefix(self.name)
        self.queue: deque[tuple[list[Record], asyncio.Future[int]]] = deque()
        self.queued_records = 0
        self._queued_ts = TimestampBag()    # uncommitted input
        self.outbox = Outbox()
        self.processed = self.late = self.dead_lettered = 0
        self.weak = route.productions == "weak"
        self._weak_wait: tuple[set[int], asyncio.Event] | None = None
        self._due_now: dict[tuple[bytes, str], Timer] = {}   # timers the current batch fires
        self._cancelled: set[tuple[bytes, str]] = set()     # ... that its records deleted or moved
        self.open = False
        self.closing = False  # refuses new deliveries; set by close() or by a failed batch
        self._closed = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.timers = TimerIndex()
        self._m = metrics.tablet(self.computation)

    # ------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Open storage (refusing a newer recorded token), rebuild memory, re-send productions."""
        self.store = await asyncio.to_thread(TabletStore, self.path, self.token, sync=self.sync)
        try:
            self.dedup = DedupFilter()
            if self.exactly_once:
                self.dedup.add_all(self.store.dedup_ids())
            for t in self.store.timers():
                self.timers.remember(t)
            self.collection = Collection(self.store.producer_tokens())
            cls = load(self.route.code, f"code of computation {self.computation!r}")
            comp = cls()
            if not isinstance(comp, Computation):
                raise MillstreamError(f"{self.route.code!r} is not a Computation subclass")
            comp.setup({k: v for k, v in self.route.params.items() if not k.startswith("millstream.")})
            restore = getattr(comp, "restore", None)
            if restore is not None:
                restore(self.name, self.store.sink_meta())
            self.comp = comp
        except BaseException:
            self.store.close()
            raise
        self.ctx = KeyContext(self.outputs, self._read_state,
                              lambda: self.host.watermark(self.computation), self.now_us)
        pending = self.store.productions()
        self.open = True
        if pending:
            log.info("tablet %s re-sends %d checkpointed productions", self.name, len(pending))
            self._sent(pending)
        self._task = asyncio.create_task(self._run(), name=f"tablet {self.name}")

    async def close(self) -> None:
        """Finish the batch in flight, refuse the rest (senders retry elsewhere), close storage."""
        if self._closed:
            return
        self._closed = True
        self.closing = True
        self._wake.set()
        try:
            if self._task is not None:
                # Shielded: a cancelled caller must not cut the batch in flight short.
                await asyncio.shield(asyncio.gather(self._task, return_exceptions=True))
        finally:
            # Batches run between awaits, so none is half-done here; the storage (and its
            # lock, which the next owner waits for) is released whatever happens.
            self._refuse_queued()
            if self.open:
                self.open = False
                self.store.close()
            log.info("tablet %s closed (token %d)", self.name, self.token)

    def _refuse_queued(self) -> None:
        while self.queue:
            records, fut = self.queue.popleft()
            for r in records:
                self._queued_ts.remove(r.timestamp)
            if not fut.done():
                fut.set_result(NOT_OWNER)
        self.queued_records = 0

    # -------------------------------------------------------------- delivery

    async def deliver(self, records: list[Record], floors: Iterable[tuple[bytes, int, int]] = ()) -> int:
        """Queue a batch; resolves to OK once committed, BUSY or NOT_OWNER otherwise.

        ``floors`` are its producers' promises: (id prefix, lowest sequence still resent,
        the producer's token). A producer older than one already heard from is refused:
        ids it might resend may have been collected on its successor's word.
        """
        if self.closing or not self.open:
            return NOT_OWNER
        newer = self.collection.accept(list(floors))
        if newer is not None:
            metrics.STALE.labels("producer").inc()
            log.warning("tablet %s refused a delivery from a stale producer (a token below %d)",
                        self.name, newer)
            return NOT_OWNER
        limits = self.host.limits
        if self.queued_records >= limits.max_queued_records or self.outbox.unacked >= limits.max_unacked:
            self._m.busy.inc()
            return BUSY
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.queue.append((records, fut))
        self.queued_records += len(records)
        for r in records:
            self._queued_ts.add(r.timestamp)
        self._wake.set()
        return await fut

    def _sent(self, productions: list[Production]) -> None:
        self.outbox.sent(productions)
        self.host.send(productions, self)

    def release(self, reported: dict[str, int]) -> None:
        self.outbox.release(reported)

    def resend_floor(self) -> int:
        """The lowest sequence this tablet may still resend (ids below it are never sent again)."""
        return self.outbox.resend_floor(self.store.seq)

    def _after_commit(self, commit: Commit) -> None:
        """Bookkeeping that the commit made durable: checkpoint deletes, dedup GC."""
        self.outbox.committed()
        self.collection.committed(commit.dedup_gc)
        if self.exactly_once and self.dedup.needs_rebuild():
            self.dedup = rebuilt(self.dedup.capacity, self.store.dedup_ids())
            log.info("tablet %s: rebuilt its dedup filter (%d generations)", self.name,
                     self.dedup.generations)

    def acked(self, productions: list[Production], receipt: tuple[str, int] | None = None) -> None:
        """The receiver committed these productions: forget their checkpoints.

        Their timestamps stay in this tablet's oldest work until the leader holds the
        receiver's report named by ``receipt`` (which reflects them): so no report
        sequence lets the watermark pass records in hand-over.
        """
        if self._weak_wait is not None:
            waiting, done = self._weak_wait
            for p in productions:
                waiting.discard(id(p))
            if not waiting:
                done.set()
        self._m.sent.inc(len(productions))
        self.outbox.acked(productions, receipt)
        if self.open and not self.closing:
            keys = [p.ckey for p in productions if p.ckey]
            if keys:
                self.store.delete_productions(keys)

    # ------------------------------------------------------------ processing

    async def _run(self) -> None:
        while not self.closing:
            delay = self._next_wall_timer_delay()
            if not self.queue and not self._due_event_timers():
                try:
                    await asyncio.wait_for(self._wake.wait(), delay)
                except TimeoutError:
                    pass
            self._wake.clear()
            if self.closing:
                break
            try:
                await self._process_once()
            except LeaseExpired:
                log.error("tablet %s: lease expired, refusing to commit", self.name)
                self._m.fenced.inc()
                self.closing = True
                self._refuse_queued()
                break
            except Exception:
                # Memory may no longer match disk: close; the worker reopens from disk.
                log.exception("tablet %s: batch failed; reopening from storage", self.name)
                self.closing = True
                self._refuse_queued()
                break
            else:
                await asyncio.sleep(0)  # let deliveries and acks in between batches

    def _take(self) -> list[tuple[list[Record], asyncio.Future[int]]]:
        items = []
        n = 0
        limit = self.host.limits.max_batch_records
        while self.queue and (n == 0 or n + len(self.queue[0][0]) <= limit):
            records, fut = self.queue.popleft()
            n += len(records)
            items.append((records, fut))
        self.queued_records -= n
        return items

    async def _process_once(self) -> None:
        items = self._take()
        due = self.timers.pop_due(self.now_us(), self.host.watermark(self.computation))
        if not items and not due:
            return
        self._due_now = {(t.key, t.tag): t for t in due}
        self._cancelled = set()
        for t in due:
            self._queued_ts.add(t.time)  # a timer being fired still holds the watermark
        try:
            await self._process(items, due)
        except BaseException:
            # Nothing of this batch committed: its senders must retry (here or elsewhere).
            for _, fut in items:
                if not fut.done():
                    fut.set_result(NOT_OWNER)
            raise
        finally:
            # The batch's input held the watermark until it committed (or failed).
            for records, _ in items:
                for r in records:
                    self._queued_ts.remove(r.timestamp)
            for t in due:
                self._queued_ts.remove(t.time)
            self._due_now = {}

    async def _process(self, items: list[tuple[list[Record], asyncio.Future[int]]], due: list[Timer]) -> None:
        commit = Commit(seq=self.store.seq)
        self._commit = commit
        if self.exactly_once:
            commit.dedup_gc, commit.producer_tokens = self.collection.plan()
        seen: set[bytes] = set()
        n_new = 0
        wm = self.host.watermark(self.computation)
        for records, _ in items:
            for r in records:
                if self.exactly_once:
                    if r.id in seen or (self.dedup.may_contain(r.id) and self.store.has_id(r.id)):
                        self._m.duplicates.inc()
                        continue
                    seen.add(r.id)
                    commit.ids.append(r.id)
                if r.timestamp < wm:
                    self.late += 1
                    self._m.late.inc()
                    if self.route.late_records == "drop":
                        continue
                n_new += 1
                self._run_user(commit, r.key, r.timestamp, r.value, r.id,
                               functools.partial(self._record_fn, r))
        for t in due:
            k = (t.key, t.tag)
            commit.timers_deleted[k] = t  # its index entry goes, whatever happens next
            if k in self._cancelled:
                continue  # a record of this batch deleted or moved it: it does not fire
            if commit.timers_set.get(k) == t:
                del commit.timers_set[k]  # set again earlier in this batch, unchanged: it fires now
            source = derived_id(b"timer", t.key, t.tag.encode(), t.time.to_bytes(8, "big", signed=True))
            self._run_user(commit, t.key, t.time, b"", source, functools.partial(self._timer_fn, t))
        weak_sent = self.weak and bool(commit.productions)
        if weak_sent:
            await self._send_weak(commit)
        prepare = getattr(self.comp, "prepare_commit", None)
        if prepare is not None:
            commit.sink = prepare()
        if not self.host.lease_valid():
            raise LeaseExpired(f"tablet {self.name}")
        t0 = time.perf_counter()
        self.store.commit(commit)
        self._m.commit_seconds.observe(time.perf_counter() - t0)
        self._after_commit(commit)
        self._m.records.inc(n_new)
        self.processed += n_new
        if self.exactly_once:
            self.dedup.add_all(commit.ids)
        for t in commit.timers_deleted.values():
            self.timers.forget(t)
        for t in commit.timers_set.values():
            self.timers.remember(t)
        for _, fut in items:
            if not fut.done():
                fut.set_result(OK)
        if commit.productions and not weak_sent:
            self._sent(commit.productions)

    async def _send_weak(self, commit: Commit) -> None:
        """Weak productions: send before the commit; checkpoint only those not acknowledged
        within ``weak_ack_ms``, so a straggler does not hold this tablet's pipeline."""
        waiting = {id(p) for p in commit.productions}
        done = asyncio.Event()
        self._weak_wait = (waiting, done)
        self._sent(commit.productions)
        try:
            await asyncio.wait_for(done.wait(), self.host.limits.weak_ack_ms / 1000)
        except TimeoutError:
            pass
        finally:
            self._weak_wait = None
        slow = [p for p in commit.productions if id(p) in waiting]
        assert commit.seq is not None
        for p in slow:  # still in the sender's queue: checkpoint them with this commit
            commit.seq += 1
            p.ckey = production_key(commit.seq, p.computation, p.key_range)
        commit.productions = slow

    def _record_fn(self, record: Record, ctx: KeyContext) -> None:
        self.comp.process_record(ctx, record)

    def _timer_fn(self, timer: Timer, ctx: KeyContext) -> None:
        self.comp.process_timer(ctx, timer.tag, timer.time)

    def _read_state(self, key: bytes) -> bytes | None:
        st = self._commit.state
        if key in st:
            return st[key]
        return self.store.get_state(key)

    def _run_user(self, commit: Commit, key: bytes, ts: int, value: bytes, source_id: bytes,
                  fn: Callable[[KeyContext], None]) -> None:
        """Run user code for one record or timer, retrying, then dead-lettering it."""
        attempts = self.host.limits.max_attempts
        error: BaseException | None = None
        for _ in range(attempts):
            eff = Effects()
            self.ctx.bind(key, ts, eff)
            try:
                fn(self.ctx)
                routed = self._route(eff)  # key extractors are user code too
            except Exception as e:  # user code: anything may happen
                error = e
                continue
            self._merge(commit, eff, routed, source_id)
            return
        assert error is not None
        self.dead_lettered += 1
        self._m.dead_lettered.inc()
        log.warning("tablet %s: dead-lettering a record of key %r after %d failures: %r",
                    self.name, key, attempts, error)
        doc = {"error": f"{type(error).__name__}: {error}", "computation": self.computation,
               "value": base64.b64encode(value).decode()}
        eff = Effects()
        eff.produced.append((dead_letter_stream(self.computation), key, json.dumps(doc).encode(), ts))
        try:
            routed = self._route(eff)
        except Exception:  # a dead-letter reader's key extractor failed: keep the count, log it
            log.exception("tablet %s: cannot route a dead letter", self.name)
            routed = []
        self._merge(commit, eff, routed, source_id + b"dead-letter")

    def _route(self, eff: Effects) -> list[tuple[str, int, bytes, Record]]:
        """``(computation, range, key, record)`` for each production; ids are filled in by _merge."""
        routing = self.host.routing
        out = []
        for stream, key, value, ts in eff.produced:
            rec = Record(key, value, ts, b"")
            for comp, r, k in routing.route(stream, rec):
                out.append((comp, r, k, rec))
        return out

    def _merge(self, commit: Commit, eff: Effects, routed: list[tuple[str, int, bytes, Record]],
               source_id: bytes) -> None:
        commit.state.update(eff.state)
        for k in eff.timers_deleted:
            commit.timers_set.pop(k, None)
            old = self.timers.get(k)
            if old is not None:
                commit.timers_deleted[k] = old
            if k in self._due_now:
                self._cancelled.add(k)
        for k, t in eff.timers_set.items():
            old = self.timers.get(k)
            if old is not None and old != t:
                commit.timers_deleted[k] = old
            elif old == t:
                commit.timers_deleted.pop(k, None)
            commit.timers_set[k] = t
            due = self._due_now.get(k)
            if due is not None:  # this batch fires it: moved, it waits for its new time
                if t != due:
                    self._cancelled.add(k)
                else:
                    self._cancelled.discard(k)
        assert commit.seq is not None
        last: Record | None = None
        index = 0
        rid = b""
        for comp, r, rkey, rec in routed:
            if rec is not last:  # one id per produced record, shared by its readers
                last = rec
                index += 1
                if self.weak:  # sent before the commit: a retry must mint the same ids
                    rid = derived_id(self.prefix, source_id, index.to_bytes(4, "big"))
                else:
                    commit.seq += 1
                    rid = sequence_id(self.prefix, commit.seq)
            ckey = None if self.weak else production_key(commit.seq, comp, r)
            commit.productions.append(Production(comp, r, Record(rkey, rec.value, rec.timestamp, rid), ckey))

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
        event-time timers (``None``: nothing pending). Batches run between awaits, so no
        record is half-processed when this is read."""
        candidates = [t for t in (self._queued_ts.min(), self.outbox.oldest()) if t is not None]
        t = self.timers.peek(TimeDomain.EVENT_TIME)
        if t is not None:
            candidates.append(t.time)
        return min(candidates) if candidates else None

    def progress(self) -> pb.HeldTablet:
        oldest = self.oldest_work()
        return pb.HeldTablet(
            computation=self.computation, key_range=self.key_range, token=self.token,
            has_work=oldest is not None, oldest_work=oldest or 0, processed=self.processed,
            late=self.late, dead_lettered=self.dead_lettered, backlog=self.queued_records,
            watermark=self.host.watermark(self.computation))

    def watermark_advanced(self) -> None:
        """Wake the run loop if an event-time timer may now be due."""
        if self._due_event_timers():
            self._wake.set()
