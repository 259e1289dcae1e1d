"""Event-time operators of a flow's stage: what they share (a due index, one timer per due
time, firing in slices) and ``window``; the joins are in runtime/flows/joins.py.

**No timer per key.** Each operator keeps, in memory, which keys have state due at which
event time (:class:`DueIndex`), and one timer per distinct due time per tablet (on the first
key that needed it). When the watermark reaches that time the timer fires once, and the
operator emits every key's result due by then in one pass: a second boundary of tumbling
windows over 3,000 keys is one user-code call, not 3,000. The timer also holds the
tablet's watermark there, as any pending event-time timer does. The index is rebuilt from
the stored cells when a tablet opens (after a split, the half without the timer's key gets
a timer of its own then).

**State** is the key's typed-state cells under ``flow/<step>`` (runtime/state.py), so it
commits with the batch, replicates, and splits and merges with its key. Within one call of
the stage a (key, window) is read once and written once.
"""

from __future__ import annotations

import copy
import struct
from collections.abc import Callable, Iterator
from time import perf_counter, thread_time
from typing import Any

from runtime import metrics
from runtime.computation import Context, TimeDomain
from runtime.errors import MillstreamError
from runtime.flows.assigners import Session, Tumbling, WindowResult, _Windows
from runtime.flows.due import DueIndex
from runtime.flows.ops import Item, Op, judged_at
from runtime.flows.values import AUTO, VALUES
from runtime.record import MIN_TIME
from runtime.state import ENTRY, cell, payload
from runtime.topology import dead_letter

_I64 = struct.Struct(">q")
_U64 = struct.Struct(">Q")
_OFFSET = -MIN_TIME  # signed event time onto unsigned, order kept
FIRE_SLICE_S = 0.001  # a timer's firing stops taking more after this long (issue 30: <= 20 ms per tablet;
# 5 ms left 2-7 firings per W2 run over 20 ms of wall time, 1 ms none in six runs of seven:
# docs/performance.md)
FIRE_CHUNK = 16       # entries taken at a time within it


def encode_time(t: int) -> bytes:
    """Event time as 8 bytes that sort as the times do."""
    return _U64.pack(t + _OFFSET)


def decode_time(b: bytes) -> int:
    return int(_U64.unpack(b)[0]) - _OFFSET


class FiringClock:
    """The due time an event-time step of a stage is firing (None: none is). What it fires
    is stamped at that time: a window or join after it in the same stage judges those
    results against it, not against the input's watermark, which may be far past it (a
    jump, a backlog, ``finish``). Shared by a stage's event-time steps (runtime/flows/stage.py)."""

    __slots__ = ("at",)

    def __init__(self) -> None:
        self.at: int | None = None


class EventTimeOp(Op):
    """What the event-time operators share: a due index and one timer per due time."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.index = DueIndex()
        self.clock = FiringClock()
        self.upstream: list[EventTimeOp] = []  # event-time steps before it in its stage (runtime/flows/stage.py)
        # This timer call's: its start (wall, and the tablet thread's CPU), windows fired.
        self.firing: tuple[float, float, float | None, int] | None = None
        self._meters: tuple[Any, Any, Any, Any] | None = None  # its firings' metrics (timer_done)
        # A firing that raised (a step after this one failed on some key's result): the
        # firings after it take one window per call, so the worker's retries and its giving
        # up reach that window alone (see on_timer). Set by the stage (runtime/flows/stage.py).
        self.attempts = 3
        self.dead_letters = ""
        self.on_dead_letter: Callable[[bytes, BaseException, int], None] | None = None
        self._error: BaseException | None = None
        self._isolating = False
        self._failed_at: int | None = None  # the latest due time a firing that raised was for
        self._calling: int | None = None    # the due time of the timer call running
        self._left = False        # windows are left due by then (or by _failed_at): isolation goes on
        self._took = 0            # entries this timer call took so far (a call given up takes as many)
        self._giving_up = False   # this call fires what a call the worker gave up on took (give_up)
        self.owner = ""           # what its dead letters name (default: the step)
        # Set while a call given up fires: a window whose aggregator's result() raises is
        # noted here (and fired no further) instead of failing the call (_fire_to_dead_letters).
        self.unfinished: list[tuple[bytes, int, str, Exception]] | None = None

    def watermark(self, ctx: Context) -> int:
        """Where this step's late check stands: the input's watermark, or while a step before
        it in the stage fires, that firing's time; and never past what a step before it still
        has due (its results, stamped then, are yet to come: a record of another input of
        this step is judged as in a stage of its own, whose input watermark they would hold)."""
        return judged_at(ctx, self.clock.at, self.upstream)

    def due_at(self, ctx: Context, time: int, key: bytes, sub: int) -> None:
        self.index.add(time, key, sub)
        if self.index.needs_timer(time):
            ctx.rebind(key, time)  # type: ignore[attr-defined]
            ctx.set_timer(self.timer_tag(f"@{time}"), time, TimeDomain.EVENT_TIME)

    def on_timer(self, ctx: Context, what: str, time: int) -> None:
        """Fire what is due by ``time``, for at most :data:`FIRE_SLICE_S`: what is left is
        due again at once, on a timer set again, and fires in the tablet's next batch, after
        the records that came meanwhile (a second boundary over thousands of keys no longer
        stalls the tablet for the whole of it).

        After a firing raised, one window per call (the worker retries a call that raises,
        then gives up on it: a firing of every key's window would lose them all for one),
        until what was due by then is done. A window whose firing raised on every try is
        then fired with its results kept from the steps after it (:meth:`give_up`)."""
        if not what.startswith("@"):
            return
        giving_up, took, self._took = self._giving_up, self._took, 0
        self._calling = time
        before = [(u, pend) for u in self.upstream if (pend := u.index.pending(time)) is not None]
        if before:
            # A step before it in the stage has not fired all it has due by then (a firing in
            # slices, or one window per call): what it still fires may fall in what is due
            # here. Nothing fires now; its timer is set again, for the next batch, and so is
            # theirs (one they lost with a call dead-lettered whole would hold this one for ever).
            for u, (key, due_time) in before:
                ctx.rebind(key, due_time)  # type: ignore[attr-defined]
                ctx.set_timer(u.timer_tag(f"@{due_time}"), due_time, TimeDomain.EVENT_TIME)
            self._again(ctx, time)
            return
        queued0 = metrics.queued_seconds()
        t0, cpu0 = perf_counter(), thread_time()
        fired = 0
        isolating = self._isolating and not giving_up
        clock, outer = self.clock, self.clock.at
        clock.at = time if outer is None else min(outer, time)
        try:
            while True:
                due = self.index.take(time, (took or FIRE_CHUNK) if giving_up else 1 if isolating else FIRE_CHUNK)
                if not due:
                    break
                self._took += len(due)
                if giving_up:
                    self._fire_to_dead_letters(ctx, due)
                else:
                    self.fire(ctx, due)
                fired += len(due)
                if giving_up or isolating or perf_counter() - t0 >= FIRE_SLICE_S:
                    break
        finally:
            clock.at = outer
        self._again(ctx, time)
        self.firing = (t0, cpu0, queued0, fired)

    @property
    def took(self) -> int:
        """How many entries the step's last timer call that failed took (0: none, or it ended well)."""
        return self._took

    def give_up(self, ctx: Context, what: str, time: int, error: BaseException) -> None:
        """The worker gave up on the timer call that fired ``what`` (each of its tries raised,
        the last with ``error``; worker/batch.py): what that call took (:attr:`took`, the same
        windows: an undone take puts them back in front) is fired with its results kept from
        the steps after it and sent to the dead letters with ``error``, and its windows'
        state cleaned up. What is left due by ``time`` fires on the timer, set again, as after
        any slice."""
        self._error = error
        self._giving_up = True
        try:
            self.on_timer(ctx, what, time)
        finally:
            self._giving_up = False

    def given_up(self) -> None:
        """The worker is done with a call it gave up on, whether :meth:`give_up` ended well or
        raised too (one window per call goes on while what was due is left)."""
        self._error, self._took, self._calling = None, 0, None

    def _again(self, ctx: Context, time: int) -> None:
        """What is still due by ``time`` fires on this step's timer, set again (the next batch)."""
        left = self.index.pending(time)
        failed = self._failed_at  # a later due time's firing raised: what it took may still be due
        self._left = left is not None or (failed is not None and failed > time
                                          and self.index.pending(failed) is not None)
        if left is not None:
            ctx.rebind(left[0], time)  # type: ignore[attr-defined]
            ctx.set_timer(self.timer_tag(f"@{time}"), time, TimeDomain.EVENT_TIME)
            self.index.timed_again(time)

    def _fire_to_dead_letters(self, ctx: Context, due: list[tuple[int, bytes, int]]) -> None:
        kept: list[Item] = []
        unfinished: list[tuple[bytes, int, str, Exception]] = []
        self.muted, self.unfinished = kept, unfinished
        try:
            self.fire(ctx, due)
        finally:
            self.muted = self.unfinished = None
        for key, t, what, e in unfinished:  # its aggregator's result() raised: the window is gone all the same
            self._dead_letter(ctx, key, f"{self.name}: {what}", t, e)
        error = self._error if self._error is not None else MillstreamError("a firing failed")
        for key, value, t in kept:
            self._dead_letter(ctx, key, value, t, error)

    def _dead_letter(self, ctx: Context, key: bytes, value: Any, t: int, error: BaseException) -> None:
        try:
            shown = VALUES.encode(value)
        except Exception:  # what could not travel on: its repr
            shown = repr(value).encode(errors="replace")
        ctx.out.append((self.dead_letters, key, dead_letter(error, self.owner or self.name, shown), t))  # type: ignore[attr-defined]
        if self.on_dead_letter is not None:
            self.on_dead_letter(key, error, self.attempts)

    def timer_failed(self, error: BaseException) -> None:
        """The stage's timer call that ran :meth:`on_timer` raised (the worker undoes it and
        tries again, or gives it up after its last: :meth:`give_up`)."""
        self._error = error
        self._isolating = True
        if self._calling is not None and (self._failed_at is None or self._calling > self._failed_at):
            self._failed_at = self._calling

    def timer_done(self) -> None:
        """The stage's timer call that fired (:meth:`on_timer`) ended, its ``finish`` included
        (state writes, and a fused sink writing what fired): how long it held the tablet."""
        self._error, self._took, self._calling = None, 0, None
        if not self._left:
            self._isolating, self._failed_at = False, None
        if self.firing is not None:
            t0, cpu0, queued0, fired = self.firing
            self.firing = None
            if self._meters is None:
                self._meters = (metrics.WINDOW_FIRE_SECONDS.labels(self.name),
                                metrics.WINDOW_FIRE_CPU_SECONDS.labels(self.name),
                                metrics.WINDOW_FIRE_QUEUED_SECONDS.labels(self.name),
                                metrics.WINDOWS_FIRED.labels(self.name))
            wall, cpu, waited, count = self._meters
            wall.observe(perf_counter() - t0)
            cpu.observe(thread_time() - cpu0)
            queued = metrics.queued_seconds()
            if queued is not None and queued0 is not None:
                waited.observe(queued - queued0)
            count.inc(fired)

    def fire(self, ctx: Context, due: list[tuple[int, bytes, int]]) -> None:
        raise NotImplementedError

    def commit(self) -> None:
        self.index.commit()

    def abort(self) -> None:
        self.index.rollback()
        self.firing = None

    def recover_timers(self) -> list[tuple[bytes, str, int]]:
        return [(key, self.timer_tag(f"@{time}"), time) for key, time in self.index.timers()]


# ------------------------------------------------------------------------- windows

class Window(EventTimeOp):
    """Aggregates each key's values per window; emits ``WindowResult`` when the watermark
    passes the window's end plus the allowed lateness. State: one cell per (key, window)
    ``<start>`` -> ``[end, acc]``.

    The open windows' accumulators are also kept in memory (at most :attr:`CACHED` of them;
    Flink's heap window buffer, with RocksDB underneath): a batch reads none of them back, and
    writes each it changed once. The due index says which windows exist, so a new window is
    never looked for in storage either. A call the worker undoes drops the cache (an
    aggregator may change its accumulator in place); it fills again from storage."""

    CACHED = 1_000_000
    SKEYS_CACHED = 1 << 17

    def __init__(self, name: str, windows: _Windows, agg: Any, late: str, emit: str = "final",
                 results: bool = True) -> None:  # results=False: fires accumulators (WindowedComputation)
        super().__init__(name)
        self.windows = windows
        self.agg = agg
        self.late = late
        self.updates = emit == "updates"  # each push emits the windows it changed, then each its result
        self._touched: dict[tuple[bytes, int], None] = {}  # (key, start) changed by this push, in order
        self._retracted: dict[tuple[bytes, int, int], None] = {}  # (key, start, end): sessions merged away by it
        self._born: set[tuple[bytes, int, int]] = set()  # ... and made by it (never emitted: no tombstone)
        self.lateness = windows.lateness
        self.session = isinstance(windows, Session)
        self.size = windows.size if isinstance(windows, Tumbling) else 0
        self._result = getattr(agg, "result", None) if results else None
        self._accs: dict[tuple[bytes, int], list[Any]] = {}          # (key, start) -> [end, acc], open windows
        self._dirty: dict[tuple[bytes, int], list[Any] | None] = {}  # changed this call (None: gone)
        self._sessions: dict[bytes, dict[int, list[Any]]] = {}        # key -> its sessions, this call
        self._skeys: dict[tuple[bytes, int], bytes] = {}              # (key, start) -> its cell's storage key

    def _skey(self, key: bytes, start: int) -> bytes:
        """The storage key of window ``(key, start)``'s cell; kept while the window is open (a
        window is written by each batch that adds to it, then deleted: on W2 that made this
        5 % of a worker's time holding the interpreter lock)."""
        k = (key, start)
        skey = self._skeys.get(k)
        if skey is None:
            skey = cell(key, self.state_name) + ENTRY + encode_time(start)
            if len(self._skeys) < self.SKEYS_CACHED:
                self._skeys[k] = skey
        return skey

    def _window(self, ctx: Context, key: bytes, start: int) -> list[Any] | None:
        """The open window ``(key, start)``: ``[end, acc]``, or None if there is none."""
        k = (key, start)
        w = self._dirty.get(k, _MISSING)
        if w is not _MISSING:
            return w  # type: ignore[return-value]
        w = self._accs.get(k)
        if w is None and k in self.index.where:  # open, not cached: read it
            stored = ctx.cell_get(self._skey(key, start))  # type: ignore[attr-defined]
            if stored is not None:
                w = VALUES.decode(payload(stored))
                if len(self._accs) < self.CACHED:
                    self._accs[k] = w
        return w

    def push(self, ctx: Context, items: list[Item], side: int = 0) -> None:
        wm = self.watermark(ctx)
        lateness, agg = self.lateness, self.agg
        add, create = agg.add, agg.create
        late = []
        if self.session:
            for key, value, ts in items:
                e = ts + self.windows.gap  # type: ignore[attr-defined]
                if e + lateness > wm:
                    self._add_session(ctx, key, ts, e, add(create(), value), wm)
                else:
                    late.append((key, value, ts))
        else:
            size, assign = self.size, self.windows.assign
            dirty, accs, where, updates, touched = self._dirty, self._accs, self.index.where, self.updates, self._touched
            for key, value, ts in items:
                if size:  # tumbling: one window, inline
                    s = ts - ts % size
                    spans: tuple[tuple[int, int], ...] = ((s, s + size),) if s + size + lateness > wm else ()
                else:
                    spans = tuple((s, e) for s, e in assign(ts) if e + lateness > wm)
                if not spans:
                    late.append((key, value, ts))
                    continue
                for s, e in spans:
                    k = (key, s)
                    w = dirty.get(k) or accs.get(k)
                    if w is None:
                        w = self._window(ctx, key, s) if k in where else None
                        if w is None:
                            w = [e, create()]
                            self.due_at(ctx, e + lateness, key, s)
                            if len(accs) < self.CACHED:
                                accs[k] = w
                    w[1] = add(w[1], value)
                    dirty[k] = w
                    if updates:
                        touched[k] = None
        for key, value, ts in late:
            ctx.produce(self.late, AUTO.encode(value), key=key, timestamp=ts)
        if self.updates:
            self._emit_updates(ctx, wm)

    def _emit_updates(self, ctx: Context, wm: int) -> None:
        """``emit="updates"``: each window this push changed, its value so far (a copy: the
        accumulator may change in place after), stamped at its last instant (``end - 1``, as
        Flink stamps a window's results) or at the watermark if that is later (an update in
        the allowed lateness is not late after it); a session merged into another, with the
        value None (as Kafka Streams sends a tombstone for it; one emitted before this push)."""
        result, out, dirty = self._result, [], self._dirty
        for key, start, end in self._retracted:
            w = dirty.get((key, start))
            if w is None or w[0] != end:  # (not the session it became)
                out.append((key, WindowResult(start, end, None), max(end - 1, wm)))
        for k in self._touched:
            w = dirty.get(k)
            if w is None:
                continue  # merged away since
            value = w[1] if result is None else result(w[1])
            if type(value) not in _SCALARS:
                try:
                    value = copy.deepcopy(value)
                except Exception:  # a result that cannot be copied goes on as it is; an accumulator is storable
                    value = VALUES.decode(VALUES.encode(value)) if result is None else value
            out.append((k[0], WindowResult(k[1], w[0], value), max(w[0] - 1, wm)))
        self._touched, self._retracted, self._born = {}, {}, set()
        self.emit(ctx, out)

    def _add_session(self, ctx: Context, key: bytes, s: int, e: int, acc: Any, wm: int) -> None:
        """A record's session ``[s, e)`` joins every open session it overlaps (a record can
        bridge two), out of order too. A session the watermark closed (its end plus the
        lateness passed) is final even before its timer fired: it fires as it is, and the
        record starts a session of its own (the same whether or not that timer ran first)."""
        sessions = self._sessions.get(key)
        if sessions is None:
            prefix = cell(key, self.state_name) + ENTRY
            sessions = self._sessions[key] = {}
            for k, v in ctx.cell_scan(prefix):  # type: ignore[attr-defined]
                start = decode_time(k[len(prefix):])
                w = self._window(ctx, key, start)  # this call's or the cache's, if newer
                if w is None and (key, start) not in self._dirty:
                    w = VALUES.decode(payload(v))
                if w is not None:
                    sessions[start] = w
        merged = True
        while merged:
            merged = False
            for start, w in sorted(sessions.items()):  # in event-time order, however they were batched
                end = w[0]
                if start < e and s < end and end + self.lateness > wm:
                    acc = self.agg.merge(w[1], acc) if start < s else self.agg.merge(acc, w[1])
                    s, e = min(s, start), max(e, end)
                    del sessions[start]
                    self._gone(key, start)
                    if self.updates:
                        if (key, start, end) in self._born:
                            self._born.discard((key, start, end))
                        else:
                            self._retracted[(key, start, end)] = None
                    self.index.discard(end + self.lateness, key, start)
                    merged = True
        w = [e, acc]
        sessions[s] = self._dirty[(key, s)] = w
        if self.updates:
            self._touched[(key, s)] = None
            self._born.add((key, s, e))
        if len(self._accs) < self.CACHED:
            self._accs[(key, s)] = w
        self.due_at(ctx, e + self.lateness, key, s)

    def _gone(self, key: bytes, start: int) -> None:
        self._dirty[(key, start)] = None
        self._accs.pop((key, start), None)

    def fire(self, ctx: Context, due: list[tuple[int, bytes, int]]) -> None:
        result, out = self._result, []
        for time, key, start in due:
            k = (key, start)
            if k in self._dirty and self._dirty[k] is None:
                continue  # fired or merged away earlier in this call: its stored cell is stale
            w = self._dirty.get(k) or self._accs.get(k)
            if w is None:
                stored = ctx.cell_get(self._skey(key, start))  # type: ignore[attr-defined]
                if stored is None:
                    continue
                w = VALUES.decode(payload(stored))
            self._gone(key, start)
            sessions = self._sessions.get(key)
            if sessions is not None:
                sessions.pop(start, None)
            value = w[1]
            if result is not None:
                try:
                    value = result(value)
                except Exception as e:
                    if self.unfinished is None:
                        raise  # retried: the worker undoes the call
                    self.unfinished.append((key, time, f"window [{start}, {w[0]}): result() raised", e))
                    continue
            out.append((key, WindowResult(start, w[0], value), time))
        self.emit(ctx, out)

    def finish(self, ctx: Context) -> None:
        """The call's changed windows written, each once, in one merge (on W2 a batch writes
        most of the windows it touched: a call per write was a tenth of a worker's time)."""
        dirty = self._dirty
        if dirty:
            skeys, skey = self._skeys, self._skey
            where = [skeys.get(k) or skey(*k) for k in dirty]
            ctx.cell_write(dict(zip(where, VALUES.kept_lists(dirty.values()), strict=True)))  # type: ignore[attr-defined]
            for k in [k for k, w in dirty.items() if w is None]:
                skeys.pop(k, None)
            dirty.clear()
        self._sessions.clear()

    def abort(self) -> None:
        self._dirty.clear()
        self._touched.clear()
        self._retracted.clear()
        self._born.clear()
        self._sessions.clear()
        self._accs.clear()  # an aggregator may have changed an accumulator in place
        super().abort()

    def recover(self, cells: Iterator[tuple[bytes, bytes, bytes]]) -> list[tuple[bytes, str, int]]:
        for key, rest, stored in cells:
            if rest[:1] == ENTRY:
                start = decode_time(rest[1:9])
                w = VALUES.decode(payload(stored))
                self.index.add(w[0] + self.lateness, key, start)
                if len(self._accs) < self.CACHED:
                    self._accs[(key, start)] = w
        self.index.commit()
        return self.recover_timers()


_MISSING = object()
_SCALARS = (int, float, str, bytes, bool, type(None))
