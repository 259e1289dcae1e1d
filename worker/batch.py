"""One batch of a tablet, on the tablet's thread (worker/runner.py): dedup, user code for
each record and due timer (retried, then dead-lettered), every call's effects merged into
the batch's one :class:`~worker.storage.Commit` (its productions through
:class:`~worker.outgoing.Outgoing`), and the commit written.

A batch is bounded twice: it does at most ``limit`` records and timers, and it stops taking
more once its user code has used the time budget (``WorkerLimits.batch_budget_ms``), except
that up to a quarter of ``limit`` due timers fire within a quarter of the budget however
full its records made it (TTL timers last, as they are taken). What it did not reach stays queued or pending for the
next batch; the event loop side of this is in worker/tablet.py."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from runtime.columns import Columns
from runtime.computation import Computation, TimeDomain, record_fn
from runtime.delivery import Status
from runtime.errors import MillstreamError
from runtime.flows.stage import readable_states
from runtime.record import Record, derived_id
from runtime.sinks import committed_hook, is_sink, sink_batch_fn
from runtime.state import TTL_TAG
from runtime.status import show_key
from runtime.topology import dead_letter, dead_letter_stream
from worker.context import Effects, KeyContext
from worker.dedup import SEQUENCED_ID_PREFIX, Mark, MarkView, OpaqueIds, ascending, first_new
from worker.inbox import Delivery
from worker.outgoing import Outgoing
from worker.pending import Pending, merged
from worker.recordloop import run_records
from worker.storage import Commit, TabletStore, Timer
from worker.timers import earliest_set, fire_ttl, pending_timer

if TYPE_CHECKING:
    from worker.tablet import Tablet

log = logging.getLogger(__name__)
_T = TypeVar("_T")
OK, NOT_OWNER, OUT_OF_ORDER = Status.OK, Status.NOT_OWNER, Status.OUT_OF_ORDER


class LeaseExpiredError(MillstreamError):
    """The worker could not renew its lease: it must stop committing (self-fencing)."""


@dataclass
class Batch:
    """One batch: what the event loop took for it, and what the tablet's thread did of it."""

    deliveries: list[Delivery]
    due: list[Timer]
    commit: Commit
    limit: int                                             # at most this many records + timers
    consumed: list[int] = field(default_factory=list)     # records done, per delivery
    deferred: list[Timer] = field(default_factory=list)   # due timers it did not reach
    new: int = 0                                           # new (not duplicate) input records
    duplicates: dict[int, int] = field(default_factory=dict)  # delivery index -> duplicates dropped
    refused: dict[int, int] = field(default_factory=dict)  # delivery index -> status to answer
    ops: bytes | None = None  # the commit's writes, for the followers (replicated tablets)
    index: int = 0            # the commit's number in its tablet


class BatchProcessor:
    """The thread side of one tablet: everything here runs on the tablet's thread only."""

    def __init__(self, tablet: Tablet, store: TabletStore, comp: Computation,
                 marks: dict[bytes, Mark], opaque: OpaqueIds) -> None:
        self.host = tablet.host
        self.name = tablet.name
        self.computation = tablet.computation
        self.late_records = tablet.route.late_records
        self.exactly_once = tablet.exactly_once
        self.weak = tablet.weak
        self.prefix = tablet.prefix
        self.timers = tablet.timers      # read only here; the event loop owns it
        self.calls = tablet.calls
        self.metrics = tablet.metrics
        self.store = store
        # Committed state and cells this thread read lately (worker/readcache.py):
        # a hit is a subscript, no call; a miss reads RocksDB through the cache.
        self._cached, self._read = store.cache.values, store.cache.get
        self.comp = comp
        self._ttl_domains: dict[str, TimeDomain] | None = None  # typed state's name -> its TTL's clock
        self._one = record_fn(comp)  # a record on its own (a batch whose one call raised)
        self.sink = is_sink(comp, tablet.route.code)
        self.committed_hook = committed_hook(comp) if self.sink else None  # (sink_committed)
        # A computation that takes a batch of records in one call (a Dataflow's stage): not for
        # weak productions, whose ids derive from the record that made them.
        self.batch_fn: Callable[[KeyContext, list[Record]], None] | None = (
            None if tablet.weak else sink_batch_fn(comp) if self.sink else getattr(comp, "process_batch", None))
        # ... or in columns (keys, values, timestamps, streams), with no Record per record.
        self.columns_fn: Callable[..., None] | None = None if tablet.weak else getattr(comp, "process_columns", None)
        if self.columns_fn is not None and self.batch_fn is None:
            self.batch_fn = comp.process_batch  # type: ignore[attr-defined]  # the fallback's shape
        # What the batch collected for that call: (columns, start, stop, indexes taken or None
        # for all of start:stop, the one record's place in its producer's order or None).
        self._collected: list[tuple[Columns, int, int, list[int] | None, tuple[bytes, int] | None]] = []
        self._run = self._run_records  # or _collect_records (batch_fn): chosen per batch
        self.marks = marks      # producer -> committed mark (this thread's, after each commit)
        self.lower = store.lower_marks()  # producer -> lower marks a merge left (worker/dedup.py)
        self.opaque = opaque
        self.now_us = tablet.now_us
        self.producer_expiry_us = int(self.host.limits.producer_expiry_s * 1e6)
        self._expiry_checked_us = 0
        self._closed_for: tuple[int, int] | None = None  # (opened at, how long it was closed before): not silence
        self._expired_below: int | None = None
        self.ctx = KeyContext(tablet.outputs, store.state_cache.get, lambda: self.host.watermark(self.computation),
                              tablet.now_us, self.read_cell, self.scan_cells,
                              lambda k: pending_timer(k, self._commit, self._due_now, self._cancelled, self.timers),
                              store.state_cache.values)
        self.late = self.dead_lettered = 0
        self._commit = Commit()
        self._pending = Pending(self._commit.cells)  # its typed-state writes, indexed for scans (the batch's own)
        self._due_now: dict[tuple[bytes, str], Timer] = {}   # timers the current batch fires
        self._cancelled: set[tuple[bytes, str]] = set()     # ... that its records deleted or moved
        self._limit = 0         # the batch's bound on records and timers
        self._budget = 0.0      # ... and on its user code's time (seconds)
        self._started = 0.0
        self._work = 0          # records and timers that ran user code
        self._taken = 0         # everything looked at, duplicates included
        self._stop = False      # the batch is full
        self._wm = 0            # the input watermark the batch judges lateness by
        self._durations: list[float] = []  # of its calls of user code (one histogram update per batch)
        self._reads, self._misses, self._last, self._fetched = 0, 0, 1, 0  # (_run_records' prefetch)
        self.outgoing = Outgoing(tablet.name, tablet.computation, tablet.prefix, tablet.weak, self.host.routing)
        # The oldest event-time timer or production made earlier than the record (or timer) it
        # came from: it holds the watermark (progress reports) until the batch's effects are in
        # the timer index and the outbox (worker/tablet.py clears it then). None: no such effect.
        self.hold: int | None = None

    def compute_and_write(self, batch: Batch) -> None:
        self.compute(batch)
        self.write(batch)

    def compute(self, batch: Batch) -> None:
        """Dedup and user code for the batch's records, then its due timers, until the batch
        has done ``limit`` of them or its user code has used the time budget."""
        commit = batch.commit
        self._commit, self._pending = commit, Pending(commit.cells)
        self._due_now = {(t.key, t.tag): t for t in batch.due}
        self._cancelled = set()
        self.ctx.start_batch(commit.state)
        self.outgoing.start(self.host.routing)
        self._limit = batch.limit
        self._budget = self.host.limits.batch_budget_ms / 1000
        self._started = time.perf_counter()
        self._work = 0   # records and timers that ran user code (the count ``limit`` bounds)
        self._taken = 0  # everything looked at, duplicates included (the time budget bounds it)
        self._stop = False
        self._wm = self.host.watermark(self.computation)
        now = self.now_us()
        view = MarkView(self.marks, self.lower)
        run = self._run = self._collect_records if self.batch_fn is not None else self._run_records
        if self.exactly_once:
            self._plan_dedup(commit, now)
        seen: set[bytes] = set()
        for index, d in enumerate(batch.deliveries):
            start = d.done
            cols = d.cols
            orders = d.orders
            if self.exactly_once and orders and start == 0:
                refused = view.admit(orders, now, self.name)
                if refused is not None:
                    _, token, marked = refused
                    if token < marked:
                        self.metrics.stale_producers.inc()
                        log.warning("tablet %s refused a delivery from a stale producer (token %d < %d)",
                                    self.name, token, marked)
                    else:
                        self.metrics.out_of_order.inc()
                    batch.refused[index] = NOT_OWNER if token < marked else OUT_OF_ORDER
                    batch.consumed.append(0)
                    continue
            producer = cols.producer
            order = orders.get(producer) if orders and producer is not None else None
            if not self.exactly_once:
                end = run(batch, cols, start, None)
                dups = 0
            elif (order is not None and producer is not None and cols.seqs is not None
                  and not view.has_lower(producer) and ascending(cols.seqs)):
                # One producer's records in order: one range check against its mark.
                fresh = first_new(cols.seqs, start, view.top(producer))
                dups = fresh - start
                end = run(batch, cols, fresh, producer)
                if end > fresh:
                    view.advance(producer, cols.seqs[end - 1], order[1], now)
            else:
                end, dups = self._dedup_each(batch, cols, start, orders, view, seen, now)
            batch.consumed.append(end - start)
            if dups:
                self.metrics.duplicates.inc(dups)
                batch.duplicates[index] = dups
            if self._stop:
                break
        if self._collected:
            self._run_batch(commit)
        self._set_before: tuple[dict[bytes, int], int] | None = None  # (_earliest_set)
        fired, floor, t0 = 0, max(1, self._limit // 4), time.perf_counter()  # (module doc)
        for t in batch.due:
            k = (t.key, t.tag)
            if (self._stop or self._full()) and not (fired < floor and time.perf_counter() - t0 < self._budget / 4):
                self._stop = True
                self._defer(batch, t)
                continue
            fired += 1
            self._work += 1
            self._taken += 1
            commit.timers_deleted[k] = t  # its index entry goes, whatever happens next
            if k in self._cancelled:
                continue  # a record of this batch deleted or moved it: it does not fire
            if commit.timers_set.get(k) == t:
                del commit.timers_set[k]  # set again earlier in this batch, unchanged: it fires now
            parts = [b"timer", t.key, t.tag.encode(), t.time.to_bytes(8, "big", signed=True)]
            timer_id = derived_id(*parts, t.nonce) if t.nonce else derived_id(*parts)
            self._run_user(commit, t.key, t.time, b"", timer_id, self._timer_fn, t)
        if not self.weak:
            self.outgoing.add_batch(commit, self.ctx.out)  # routed once, as columns
        commit.productions = self.outgoing.shipments()
        self.metrics.user_seconds.observe_many(self._durations)
        self._durations.clear()
        if self.exactly_once:
            commit.marks.update(view.changed)
            commit.lower.update(view.lower_changed)

    def _full(self) -> bool:
        """Whether the batch has done its ``limit`` or used its time budget."""
        return self._work >= self._limit or (
            self._taken > 0 and time.perf_counter() - self._started >= self._budget)

    def _run_records(self, batch: Batch, cols: Columns, i: int, producer: bytes | None,
                     stop: int | None = None, source: tuple[bytes, int] | None = None) -> int:
        """User code for records ``i:`` of ``cols`` (new ones: dedup is done) until the batch is
        full, or for records ``i:stop`` whatever the batch holds; returns the index it reached
        (worker/recordloop.py: compiled where it was built). While user code reads ctx.state
        for most records and misses the read cache, a delivery's keys are read together first."""
        cache, ctx = self.store.state_cache, self.ctx
        if (ctx.reads - self._reads) * 2 >= self._last and (self._fetched or cache.misses != self._misses):
            self._fetched = cache.prefetch(cols.keys[i:stop])
        else:
            self._fetched = 0
        self._reads, self._misses, self._last = ctx.reads, cache.misses, (len(cols) if stop is None else stop) - i
        return run_records(self, batch, cols, i, producer, stop, source)

    def _collect_records(self, batch: Batch, cols: Columns, i: int, producer: bytes | None,
                         stop: int | None = None, source: tuple[bytes, int] | None = None) -> int:
        """:meth:`_run_records` for a computation that takes the batch in one call: the new
        records ``i:`` (up to the batch's limit; ``i:stop`` whatever it holds) are collected as
        a slice of the columns (late ones counted, or dropped), and run by :meth:`_run_batch`
        once every delivery of the batch is deduplicated."""
        n = len(cols)
        if stop is not None:
            n = stop
        elif n - i > self._limit - self._work:
            n = i + max(0, self._limit - self._work)
            self._stop = True
        if i >= n:
            return i
        tss = cols.timestamps
        taken: list[int] | None = None  # None: all of i:n
        wm = self._wm
        if min(tss[i:n]) < wm:  # some are late: counted (and dropped, with late_records="drop")
            late = [j for j in range(i, n) if tss[j] < wm]
            self.late += len(late)
            self.metrics.late.inc(len(late))
            if self.late_records == "drop":
                taken = [j for j in range(i, n) if tss[j] >= wm]
        count = n - i if taken is None else len(taken)
        self._taken += n - i
        batch.new += count
        self._work += count
        if count:
            self._collected.append((cols, i, n, taken, source))
        return n

    def _run_batch(self, commit: Commit) -> None:
        """The collected records in one call (``process_columns`` with the columns, else
        ``process_batch`` with Records); if it raises, one call per record instead (each
        retried, then dead-lettered, as any call of user code)."""
        parts, self._collected = self._collected, []
        keys: list[bytes] = []
        values: list[bytes] = []
        stamps: list[int] = []
        streams: list[str] = []
        one_stream: str | None = parts[0][0].streams if type(parts[0][0].streams) is str else None
        for cols, i, n, taken, _ in parts:
            if taken is None:
                keys += cols.keys[i:n]
                values += cols.values[i:n]
                stamps += cols.timestamps[i:n]
            else:
                keys += [cols.keys[j] for j in taken]
                values += [cols.values[j] for j in taken]
                stamps += [cols.timestamps[j] for j in taken]
            if one_stream is not None and cols.streams != one_stream:
                one_stream = None
        if one_stream is None:
            for cols, i, n, taken, _ in parts:
                column = cols.stream_column()
                streams += column[i:n] if taken is None else [column[j] for j in taken]
        ctx = self.ctx
        calls = self.calls
        mark = len(ctx.out)
        written = dict(ctx.writes)  # ctx.state of any key: an undone call leaves them as they were
        low = min(stamps)
        ctx.begin(b"", low)
        t0 = calls.clock()
        calls.running_call = (keys[0], t0)
        try:
            if self.columns_fn is not None:
                self.columns_fn(ctx, keys, values, stamps, one_stream if one_stream is not None else streams)
            else:
                assert self.batch_fn is not None
                self.batch_fn(ctx, self._records(parts))
        except BaseException as e:  # user code: anything may happen, sys.exit() included
            ctx.undo(mark)
            ctx.writes.clear()
            ctx.writes.update(written)
            calls.ended(calls.clock())
            log.info("tablet %s: a batch of %d records failed in one call (%s: %s); running them one by one",
                     self.name, len(keys), type(e).__name__, e)
            for (_, _, _, _, source), record in zip(self._sources(parts), self._records(parts), strict=True):
                self._run_user(commit, record.key, record.timestamp, record.value, record.id, self._record_fn,
                               record, source)
            return
        t1 = calls.clock()
        calls.running_call = None
        self._durations.append(t1 - t0)
        if t1 - t0 >= calls.record_above:
            calls.slow(keys[0], t1 - t0, t1)
        first = parts[0]
        self._after_call(commit, ctx.eff, mark, low, first[0].id(first[1] if first[3] is None else first[3][0]), None)

    @staticmethod
    def _records(parts: list[tuple[Columns, int, int, list[int] | None, tuple[bytes, int] | None]]) -> list[Record]:
        return [cols.record(j) for cols, i, n, taken, _ in parts for j in (range(i, n) if taken is None else taken)]

    @staticmethod
    def _sources(parts: list[tuple[Columns, int, int, list[int] | None, tuple[bytes, int] | None]]
                 ) -> list[tuple[Columns, int, int, list[int] | None, tuple[bytes, int] | None]]:
        return [part for part in parts for _ in (range(part[1], part[2]) if part[3] is None else part[3])]

    def _dedup_each(self, batch: Batch, cols: Columns, i: int, orders: dict[bytes, tuple[int, int]] | None,
                    view: MarkView, seen: set[bytes], now: int) -> tuple[int, int]:
        """Records ``i:`` of ``cols`` deduplicated one by one (opaque ids, several producers in
        one delivery, a producer with lower marks after a merge, or out of order) and the new
        ones run. Returns the index reached and the duplicates dropped."""
        # Each producer's mark moves once per delivery, to its highest sequence the batch took;
        # within the delivery, a record at or below that is a duplicate (a re-sent checkpoint,
        # a round put back), as against a mark moved record by record.
        tops: dict[bytes, tuple[int, int]] = {}
        dups = 0
        n = len(cols)
        while i < n:
            if self._full():
                self._stop = True
                break
            rid = cols.id(i)
            producer = rid[:SEQUENCED_ID_PREFIX]
            order = orders.get(producer) if orders else None
            source: tuple[bytes, int] | None = None
            if order is not None:
                seq = int.from_bytes(rid[SEQUENCED_ID_PREFIX:], "big")
                top = tops.get(producer)
                if top is not None and seq <= top[0]:
                    dups += 1
                    self._taken += 1
                    i += 1
                    continue
                if view.seen(producer, seq, cols.keys[i]):
                    view.passed(producer, seq)
                    dups += 1
                    self._taken += 1
                    i += 1
                    continue
                tops[producer] = (seq, order[1])
                source = (producer, seq)
            else:
                if rid in seen or self._opaque_seen(rid):
                    dups += 1
                    self._taken += 1
                    i += 1
                    continue
                seen.add(rid)
                self._commit.opaque_ids.append(rid)
            self._run(batch, cols, i, None, i + 1, source)
            i += 1
        for producer, (seq, token) in tops.items():
            view.advance(producer, seq, token, now)
        return i, dups

    def _opaque_seen(self, rid: bytes) -> bool:
        buckets = self.opaque.candidates(rid)
        return bool(buckets) and self.store.has_opaque(rid, buckets)

    def _plan_dedup(self, commit: Commit, now: int) -> None:
        """What this batch's commit adds and drops of dedup data besides its records' ids:
        opaque ids of buckets past the retention, and marks of producers silent too long."""
        commit.opaque_bucket = self.opaque.bucket(now)
        oldest = self.opaque.oldest_kept(now)
        if oldest != self._expired_below:  # once per bucket (and once after opening)
            commit.opaque_expire_below = oldest
        if now - self._expiry_checked_us >= 60_000_000:  # a scan of the marks: once a minute
            self._expiry_checked_us = now
            # Silence counts while open (a restore weeks later keeps its marks for a replay);
            # it was closed from its newest mark to its opening (docs/exactly-once.md).
            if self._closed_for is None:
                newest = max((m.seen_us for m in self.marks.values()), default=now)
                self._closed_for = (now, max(0, now - newest))
            opened, closed_for = self._closed_for
            commit.marks_expired = [p for p, m in self.marks.items() if now - m.seen_us - (
                closed_for if m.seen_us <= opened else 0) > self.producer_expiry_us]

    def _defer(self, batch: Batch, t: Timer) -> None:
        """A due timer the batch did not reach: it stays pending (unless a record of the
        batch deleted or moved it, which the commit then makes durable)."""
        k = (t.key, t.tag)
        if k in self._cancelled:
            batch.commit.timers_deleted[k] = t
            return
        if batch.commit.timers_set.get(k) == t:
            del batch.commit.timers_set[k]  # set again unchanged: it is still on disk as it was
        batch.deferred.append(t)

    def write(self, batch: Batch) -> None:
        """The batch's one atomic commit (after the sink's hook), then the dedup filter."""
        commit = batch.commit
        prepare = getattr(self.comp, "prepare_commit", None) if self.sink else None
        if prepare is not None:
            # A sink writes its output outside the store: never after our lease ran out (a
            # worker paused past its lease, then resumed, would append to output its tablet's
            # new owner already writes; the chaos suite saw torn lines). Checked right before.
            if not self.host.lease_valid():
                raise LeaseExpiredError(f"tablet {self.name}")
            commit.sink = prepare()
        if not self.host.lease_valid():
            raise LeaseExpiredError(f"tablet {self.name}")
        commit.marks_expired = [p for p in commit.marks_expired if p not in commit.marks]
        commit.lower.update({p: [] for p in commit.marks_expired if p in self.lower})
        t0 = time.perf_counter()
        batch.ops = self.store.commit(commit)
        batch.index = self.store.index
        self.metrics.commit_seconds.observe(time.perf_counter() - t0)
        if self.exactly_once:  # memory follows the commit
            self.marks.update(commit.marks)
            for producer in commit.marks_expired:
                self.marks.pop(producer, None)
            for producer, lows in commit.lower.items():
                if lows:
                    self.lower[producer] = lows
                else:
                    self.lower.pop(producer, None)
            if commit.opaque_expire_below is not None:
                self.opaque.expire(commit.opaque_expire_below)
                self._expired_below = commit.opaque_expire_below
            self.opaque.add(commit.opaque_bucket, commit.opaque_ids)

    def sink_committed(self) -> None:
        """The sink's ``committed()``: the last commit is durable and replicated."""
        try:
            self.committed_hook()  # type: ignore[misc]
        except BaseException:  # user code: sys.exit() included; the commit stands whatever it does
            log.exception("tablet %s: its sink's committed() raised (ignored: the commit stands)", self.name)

    def _record_fn(self, ctx: KeyContext, record: Record) -> None:
        self._one(ctx, record)

    def _timer_fn(self, ctx: KeyContext, timer: Timer) -> None:
        if timer.tag.startswith(TTL_TAG):
            if self._ttl_domains is None:  # (each typed state's clock, as the code declares it now)
                self._ttl_domains = {s.name: s.ttl_domain for s in readable_states(self.comp).values()}
            fire_ttl(timer, ctx, self._ttl_domains.get(timer.tag[len(TTL_TAG):], timer.domain), self._earliest_set)
        else:
            ctx.timer_domain = timer.domain  # (a flow's process step asks: runtime/flows/steps.py)
            self.comp.process_timer(ctx, timer.tag, timer.time)

    def _earliest_set(self) -> tuple[dict[bytes, int], int]:
        self._set_before = self._set_before or earliest_set(self._commit)  # at the first TTL timer: they come last
        return self._set_before

    def read_cell(self, skey: bytes) -> bytes | None:
        """Typed state as of this batch so far: its writes over the store."""
        c = self._commit
        if skey in c.cells:
            return c.cells[skey]
        if c.cleared and skey.startswith(tuple(c.cleared)):
            return None
        try:
            return self._cached[skey]
        except KeyError:
            return self._read(skey)

    def scan_cells(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        return merged(self.store.scan(prefix), self._pending.under(prefix), self._commit.cleared, prefix)

    def _run_user(self, commit: Commit, key: bytes, ts: int, value: bytes, source_id: bytes,
                  fn: Callable[[KeyContext, _T], None], arg: _T,
                  source: tuple[bytes, int] | None = None, failed: BaseException | None = None) -> None:
        """Run user code (``fn(ctx, arg)``) for one record or timer, retrying, then
        dead-lettering it. ``failed``: what its first attempt raised (one attempt is used)."""
        attempts = self.host.limits.max_attempts - (failed is not None)
        error = failed
        calls = self.calls
        user_seconds = self.metrics.user_seconds
        ctx = self.ctx
        mark = len(ctx.out)
        for _ in range(attempts):
            ctx.begin(key, ts)
            calls.begin(key)
            try:
                fn(ctx, arg)
            except BaseException as e:  # user code: anything may happen, sys.exit() included
                error = e
                ctx.undo(mark)
                continue
            finally:
                user_seconds.observe(calls.end())
            self._after_call(commit, ctx.eff, mark, ts, source_id, source)
            return
        assert error is not None
        if isinstance(arg, Timer) and self._given_up(commit, arg, error, mark, source_id):
            return
        self.note_dead_letter(key, error, self.host.limits.max_attempts)
        ctx.begin(key, ts)
        ctx.out.append((dead_letter_stream(self.computation), key, dead_letter(error, self.computation, value), ts))
        self._after_call(commit, None, mark, ts, source_id + b"dead-letter", None)

    def _given_up(self, commit: Commit, timer: Timer, error: BaseException, mark: int, source_id: bytes) -> bool:
        """A timer call that raised on every try: a computation that knows what the call held
        may send it to the dead letters itself (``dead_letter_timer``: a window step's firing,
        each window with its result and its state cleaned up; runtime/flows/stage.py). True
        when it did; otherwise (or when that raised too) the worker dead-letters the call."""
        hook = getattr(self.comp, "dead_letter_timer", None)
        if hook is None:
            return False
        ctx = self.ctx
        ctx.begin(timer.key, timer.time)
        try:
            done = hook(ctx, timer.tag, timer.time, error)
        except BaseException as e:  # user code again (a dead-letter callback), or a state write
            log.warning("tablet %s: a timer's call could not send what it held to the dead letters either: %r",
                        self.name, e)
            done = False
        if not done:
            ctx.undo(mark)
            return False
        self._after_call(commit, ctx.eff, mark, timer.time, source_id + b"dead-letter", None)
        return True

    def note_dead_letter(self, key: bytes, error: BaseException, failures: int) -> None:
        """Count and log a record dead-lettered after ``failures`` failures (here, or by a
        flow's fused sink: runtime/flows/sinkstep.py)."""
        self.dead_lettered += 1
        self.metrics.dead_lettered.inc()
        log.warning("tablet %s: dead-lettering a record of key %r after %d failures: %r",
                    self.name, show_key(key), failures, error)

    def _after_call(self, commit: Commit, eff: Effects | None, mark: int, ts: int, source_id: bytes,
                    source: tuple[bytes, int] | None, n: int | None = None) -> None:
        """Merge what a call that returned did (its timers and typed state; a weak tablet's
        productions ``ctx.out[mark:n]``, routed; ``n`` None: to its end; a strong tablet's are
        routed when the batch is done) into the batch, and hold the watermark at any of it
        earlier than the call's timestamp ``ts`` (which the inbox holds already) from now on,
        not only once committed (review N22)."""
        low = ts
        if eff is not None:
            for prefix in eff.cleared:  # (a large clear: a range delete, before the batch's writes)
                commit.cells.update(dict.fromkeys(self._pending.under(prefix)))
                commit.cleared.append(prefix)
            if eff.cells:
                commit.cells.update(eff.cells)
            if eff.timers_deleted or eff.timers_set:
                self._merge_timers(commit, eff, source_id)
                for t in eff.timers_set.values():
                    if t.time < low and t.domain is TimeDomain.EVENT_TIME:
                        low = t.time
        out = self.ctx.out
        if n is None:
            n = len(out)
        if n > mark:
            if self.weak:
                low = self.outgoing.add(commit, out, mark, n, low, source_id, source)
            else:  # routed when the batch is done (Outgoing.add_batch); the hold is now
                for i in range(mark, n):
                    if out[i][3] < low:
                        low = out[i][3]
        if low < ts and (self.hold is None or low < self.hold):
            self.hold = low

    def _merge_timers(self, commit: Commit, eff: Effects, source_id: bytes) -> None:
        for k in eff.timers_deleted:
            commit.timers_set.pop(k, None)
            old = self.timers.get(k)
            if old is not None:
                commit.timers_deleted[k] = old
            if k in self._due_now:
                self._cancelled.add(k)
        for k, t in eff.timers_set.items():
            t = Timer(t.key, t.tag, t.domain, t.time, source_id)  # this setting's nonce
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
