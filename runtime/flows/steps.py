"""User code as steps of a flow's stage (runtime/flows/stage.py): ``process`` runs a
:class:`~runtime.Computation` per key, with its own state and timers inside the stage;
``sink`` runs a :class:`~runtime.Sink` fused into the stage before it.

A ``process`` step's ``ctx.state`` is held per key for the length of the stage's call and
written once when it ends (``finish``), as ``reduce`` holds its running values
(runtime/flows/ops.py). A sink gets the call's records only in ``finish``, once everything
else in the call succeeded, and never raises from there: a record it fails on is tried,
then dead-lettered, each failed try's state and timers taken back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from runtime.codecs import Codec
from runtime.computation import Computation, Context, State, TimeDomain, record_fn
from runtime.errors import UsageError
from runtime.flows.ops import Item, Op
from runtime.record import MAX_VALUE_BYTES, Record, Timestamp, check_time
from runtime.sinks import sink_batch_fn
from runtime.state import TTL_TAG, VALUE, ValueState, bind, cell, declared, kept, payload
from runtime.topology import dead_letter

log = logging.getLogger(__name__)


class _StepState(State):
    """``ctx.state`` of a computation run as a flow step: bytes in a state of its own (the
    cells of ``ValueState("flow/<step>/state")``, read and written straight, without a typed
    handle per call: the state never expires and its codec is the identity)."""

    def __init__(self, step: StepContext) -> None:
        self._step = step
        self._name = step.op.raw.name

    def _cell(self) -> bytes:
        return cell(self._step.key, self._name) + VALUE

    def get(self) -> bytes | None:
        stored = self._step.ctx.cell_get(self._cell())  # type: ignore[attr-defined]
        return None if stored is None else payload(stored)

    def set(self, value: bytes) -> None:
        self._step.ctx.cell_put(self._cell(), kept(_as_bytes(value)))  # type: ignore[attr-defined]

    def clear(self) -> None:
        self._step.ctx.cell_delete(self._cell())  # type: ignore[attr-defined]

    def flush(self, ctx: Context) -> None:
        """The call ends: write what it held back (nothing: it writes straight)."""

    def forget(self) -> None:
        """The call raised: forget what it held back."""


def _as_bytes(value: Any) -> bytes:
    if type(value) is not bytes:
        if not isinstance(value, (bytearray, memoryview)):
            raise UsageError(f"state must be bytes, not {type(value).__name__}; encode it first (or use ValueState)")
        value = bytes(value)
    return value  # type: ignore[no-any-return]


MAX_HELD_BYTES = MAX_VALUE_BYTES - len(kept(b""))  # a held value, stored with its expiry


class _HeldState(_StepState):
    """A ``process`` step's ``ctx.state``, held per key for the length of the stage's call:
    read from its cell the first time the call asks for a key, written to it once, when the
    call ends (:meth:`flush`, from the step's ``finish``), as ``reduce`` does. A step called
    for many records of a key in one batch reads and writes its cell once, not per record."""

    def __init__(self, step: StepContext) -> None:
        super().__init__(step)
        self._held: dict[bytes, bytes | None] = {}  # this call: key -> its value (None: none)
        self._dirty: set[bytes] = set()

    def get(self) -> bytes | None:
        key = self._step.key
        held = self._held
        if key in held:
            return held[key]
        stored = self._step.ctx.cell_get(cell(key, self._name) + VALUE)  # type: ignore[attr-defined]
        value = held[key] = None if stored is None else payload(stored)
        return value

    def set(self, value: bytes) -> None:
        key = self._step.key
        value = value if type(value) is bytes else _as_bytes(value)
        if len(value) > MAX_HELD_BYTES:  # refused at the set, as ctx.state refuses it (worker/context.py)
            raise UsageError(f"state value of {len(value):,} bytes is over the limit of {MAX_HELD_BYTES:,} "
                             "bytes; store large objects elsewhere and pass a reference")
        self._held[key] = value
        self._dirty.add(key)

    def clear(self) -> None:
        key = self._step.key
        self._held[key] = None
        self._dirty.add(key)

    def flush(self, ctx: Context) -> None:
        held, name = self._held, self._name
        for key in self._dirty:
            value = held[key]
            if value is None:
                ctx.cell_delete(cell(key, name) + VALUE)  # type: ignore[attr-defined]
            else:
                ctx.cell_put(cell(key, name) + VALUE, kept(value))  # type: ignore[attr-defined]
        self.forget()

    def forget(self) -> None:
        self._held.clear()
        self._dirty.clear()


class StepContext(Context):
    """What a :class:`~runtime.Computation` run as a ``process`` step sees: its own state and
    timers (named apart from every other step's), and ``produce`` handing values on."""

    key: bytes = b""  # the item's, set with ``timestamp`` per item (a plain attribute: read per state call)

    def __init__(self, op: Process) -> None:
        self.op = op
        self.ctx: Context = None  # type: ignore[assignment]  # the stage's, bound per call
        self.timestamp = 0
        self._state: _StepState = (_StepState if isinstance(op, SinkStep) else _HeldState)(self)

    @property
    def state(self) -> State:
        return self._state

    @property
    def low_watermark(self) -> int:
        return self.ctx.low_watermark

    @property
    def tablet(self) -> str:
        return self.ctx.tablet

    @property
    def sequencer_token(self) -> int:
        return self.ctx.sequencer_token

    def produce(self, stream: str, value: Any, *, key: bytes | None = None, timestamp: Timestamp | None = None) -> None:
        here = self.key
        if key is None and timestamp is None:  # the common call: no checks
            self.op.out.append((here, value, self.timestamp))
            return
        if key is not None and key != here:
            raise UsageError(f"step {self.op.name!r}: produce(key={key!r:.40}) in a flow must keep the current key "
                             f"({here!r:.40}); re-key with key_by after the step")
        if timestamp is not None and (isinstance(timestamp, bool) or not isinstance(timestamp, int)):
            timestamp = check_time(timestamp, "produce() timestamp")
        self.op.out.append((here, value, self.timestamp if timestamp is None else timestamp))

    def set_timer(self, tag: str, time: Timestamp, domain: TimeDomain = TimeDomain.EVENT_TIME) -> None:
        self.ctx.set_timer(self.op.timer_tag(":" + tag), time, domain)

    def delete_timer(self, tag: str) -> None:
        self.ctx.delete_timer(self.op.timer_tag(":" + tag))

    def now(self) -> int:
        return self.ctx.now()

    def state_of(self, spec: Any) -> Any:
        return self.ctx.state_of(self.op.renamed(spec))


class Process(Op):
    """A user :class:`~runtime.Computation` per key: each item is a record for its
    ``process_record``; what it produces goes on."""

    def __init__(self, name: str, comp: Computation) -> None:
        super().__init__(name)
        self.comp = comp
        self._one = record_fn(comp)  # its process_record (or process_batch of one record)
        self.out: list[Item] = []
        self.raw = ValueState(f"{self.state_name}/state", _RAW)
        self.step_ctx = StepContext(self)
        # The stage's (runtime/flows/stage.py): its firing clock, and the windows and joins
        # before this step, whose results an event-time timer of this step waits for.
        self.clock: Any = None
        self.upstream: list[Any] = []
        self._renamed: dict[tuple[type, str], tuple[Any, Any]] = {}  # (kind, name) -> (spec, its copy)
        for spec in declared(type(comp)).values():  # declared on the class: refused at submit, not per record
            self.renamed(spec)

    def renamed(self, spec: Any) -> Any:
        """The step's own copy of a typed state ``spec`` (its name prefixed by the step's).
        Kept per (kind, name) with the spec it copies, so a spec made in a call and freed
        cannot pass for another one that comes to live at its address."""
        if not hasattr(spec, "name") or not hasattr(spec, "kind"):
            return spec  # not a state spec: ctx.state_of says what is wrong with it
        hit = self._renamed.get((type(spec), spec.name))
        if hit is not None and hit[0] is spec:
            return hit[1]
        if spec.name == "state":
            raise UsageError(f"step {self.name!r}: a typed state may not be named 'state' in a flow's "
                             "process step (that is its ctx.state); give it another name")
        name = f"{self.state_name}/{spec.name}"
        if len(name.encode()) > 255:
            raise UsageError(f"step {self.name!r}: its typed state {spec.name!r} is stored as {name!r}, "
                             f"{len(name.encode())} bytes, over the 255 a state name may have; shorten the "
                             "step's name or the state's")
        copy = renamed(spec, self.state_name)
        self._renamed[(type(spec), spec.name)] = (spec, copy)
        return copy

    def push(self, ctx: Context, items: list[Item], side: int = 0) -> None:
        sc = self.step_ctx
        sc.ctx = ctx
        fn = self._one
        rebind = ctx.rebind  # type: ignore[attr-defined]
        self.out = []
        for k, v, t in items:
            rebind(k, t)
            sc.key = k
            sc.timestamp = t
            fn(sc, Record(k, v, t, b""))
        out, self.out = self.out, []
        self.emit(ctx, out)

    def on_timer(self, ctx: Context, what: str, time: int) -> None:
        """An event-time timer fires as it would in a computation of its own after the steps
        before it: once the windows and joins before it in the stage fired what they have due
        by then (until they have, it is set again, for the next batch), and what it produces
        is judged by the steps after it at its time, not at the stage's input watermark."""
        if not what.startswith(":"):
            return
        event_time = getattr(ctx, "timer_domain", TimeDomain.EVENT_TIME) is TimeDomain.EVENT_TIME
        if event_time and self._wait_for_upstream(ctx, what, time):
            return
        sc = self.step_ctx
        sc.ctx = ctx
        sc.key = ctx.key
        sc.timestamp = time
        self.out = []
        clock = self.clock
        outer = None if clock is None else clock.at
        if event_time and clock is not None:
            clock.at = time if outer is None else min(outer, time)
        try:
            self.comp.process_timer(sc, what[1:], time)
            out, self.out = self.out, []
            self.emit(ctx, out)
        finally:
            if clock is not None:
                clock.at = outer

    def _wait_for_upstream(self, ctx: Context, what: str, time: int) -> bool:
        """Whether a window or join before it still has due by ``time`` (a firing in slices):
        then this timer and theirs are set again, for the next batch (as an event-time step
        waits: runtime/flows/windowing.py)."""
        before = [(u, pend) for u in self.upstream if (pend := u.index.pending(time)) is not None]
        if not before:
            return False
        key = ctx.key
        for u, (due_key, due_time) in before:
            ctx.rebind(due_key, due_time)  # type: ignore[attr-defined]
            ctx.set_timer(u.timer_tag(f"@{due_time}"), due_time, TimeDomain.EVENT_TIME)
        ctx.rebind(key, time)  # type: ignore[attr-defined]
        ctx.set_timer(self.timer_tag(what), time, TimeDomain.EVENT_TIME)
        return True

    def finish(self, ctx: Context) -> None:
        self.step_ctx._state.flush(ctx)

    def abort(self) -> None:
        self.out = []
        self.step_ctx._state.forget()


class _Attempt:
    """The stage's context as one attempt of a fused sink's call sees it: it forwards
    everything, noting what each change to typed state and timers replaced, so
    :meth:`undo` takes back an attempt that raised. (The worker undoes a whole call of the
    stage; a sink's attempts are per record, inside one.)"""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self._undo: list[Callable[[], None]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)

    def state_of(self, spec: Any) -> Any:
        return bind(spec, self)  # type: ignore[arg-type]

    def _keep_cells(self, skeys: list[bytes]) -> None:
        eff = self._ctx.effects  # type: ignore[attr-defined]
        cells = eff.cells
        saved = [(s, s in cells, cells.get(s)) for s in skeys]

        def undo() -> None:
            for s, had, old in saved:
                if had:
                    cells[s] = old
                else:
                    cells.pop(s, None)
                    if eff.pending is not None:
                        eff.pending.forget()
        self._undo.append(undo)

    def _keep_timer(self, tag: str) -> None:
        eff = self._ctx.effects  # type: ignore[attr-defined]
        tk = (self._ctx.key, tag)
        was_set, was_deleted = eff.timers_set.get(tk), tk in eff.timers_deleted

        def undo() -> None:
            eff.timers_set.pop(tk, None)
            if was_set is not None:
                eff.timers_set[tk] = was_set
            (eff.timers_deleted.add if was_deleted else eff.timers_deleted.discard)(tk)
        self._undo.append(undo)

    def cell_put(self, skey: bytes, stored: bytes) -> None:
        self._keep_cells([skey])
        self._ctx.cell_put(skey, stored)  # type: ignore[attr-defined]

    def cell_delete(self, skey: bytes) -> None:
        self._keep_cells([skey])
        self._ctx.cell_delete(skey)  # type: ignore[attr-defined]

    def cell_clear(self, prefix: bytes) -> None:
        """The stage's clear (entry by entry within its budgets, else one range delete: a
        sink's clear of a million entries made a million point deletes, past what a
        replication frame holds), noting what it replaced so :meth:`undo` takes it back."""
        ctx: Any = self._ctx
        eff = ctx.effects
        before = ctx.cell_pending(prefix)
        ranges, points = len(eff.cleared), ctx.cleared_points
        ctx.cell_clear(prefix)

        def undo() -> None:
            cells = eff.cells
            for s in ctx.cell_pending(prefix):
                if s in before:
                    cells[s] = before[s]
                else:
                    del cells[s]
            del eff.cleared[ranges:]
            ctx.cleared_points = points
            if eff.pending is not None:
                eff.pending.forget()
        self._undo.append(undo)

    def expire_at(self, name: str, time: int, domain: TimeDomain = TimeDomain.EVENT_TIME) -> None:
        self._keep_timer(TTL_TAG + name)
        self._ctx.expire_at(name, time, domain)  # type: ignore[attr-defined]

    def set_timer(self, tag: str, time: Timestamp, domain: TimeDomain = TimeDomain.EVENT_TIME) -> None:
        self._keep_timer(tag)
        self._ctx.set_timer(tag, time, domain)

    def delete_timer(self, tag: str) -> None:
        self._keep_timer(tag)
        self._ctx.delete_timer(tag)

    def undo(self) -> None:
        while self._undo:
            self._undo.pop()()

    def keep(self) -> None:
        self._undo.clear()


class _SinkContext(StepContext):
    def produce(self, stream: str, value: Any, *, key: bytes | None = None, timestamp: Timestamp | None = None) -> None:
        raise UsageError(f"sink step {self.op.name!r} produced to {stream!r}; a sink writes out of millstream, "
                         "it cannot produce (use a process step before it)")


class SinkStep(Process):
    """A ``sink`` fused into the stage before it (Flink chains its sinks the same way): the
    user's :class:`~runtime.Sink` runs in the stage's tablet, so its output commits with the
    stage's batch, with no hop, delivery or commit of its own.

    The stage's call only collects the items, encoded by ``codec`` (an item whose value the
    codec refuses fails the call: the worker retries it, then dead-letters it, as for any
    step). The sink gets them in :meth:`finish`, once the rest of the call succeeded, so a
    call the worker undoes and runs again never hands the sink a record twice; and
    :meth:`finish` never raises. A sink that defines ``process_batch`` gets them in one call;
    if that raises, what it did is taken back and they go one by one. A record the sink's
    ``process_record`` (or ``process_batch`` of that one record) raises on is tried
    ``attempts`` times (the worker's ``max_attempts``), each failed attempt's state and
    timers taken back, then goes to the stage's ``<stage>.dead_letter`` stream (counted and
    logged by ``on_dead_letter``), and the others go on."""

    def __init__(self, name: str, comp: Computation, codec: Codec, dead_letters: str, attempts: int = 3,
                 on_dead_letter: Callable[[bytes, BaseException, int], None] | None = None) -> None:
        super().__init__(name, comp)
        self.step_ctx = _SinkContext(self)
        self.encode = codec.encode
        self.dead_letters = dead_letters
        self.attempts = attempts
        self.on_dead_letter = on_dead_letter
        self._batch_fn = sink_batch_fn(comp)
        self._pending: list[Item] = []

    def push(self, ctx: Context, items: list[Item], side: int = 0) -> None:
        encode = self.encode
        encoded = [(k, encode(v), t) for k, v, t in items]
        for _, v, _ in encoded:
            if type(v) is not bytes:  # refused here, where it dead-letters its record, not in finish
                raise UsageError(f"sink step {self.name!r}: its codec's encode returned {type(v).__name__}, "
                                 "not bytes; give the sink a codec whose encode returns bytes")
        self._pending += encoded


    def finish(self, ctx: Context) -> None:
        pending, self._pending = self._pending, []
        if not pending:
            return
        sc = self.step_ctx
        if self._batch_fn is not None and len(pending) > 1 and self._in_one_call(ctx, pending):
            return
        sc.ctx = attempt = _Attempt(ctx)  # type: ignore[assignment]
        fn = self._one
        rebind = ctx.rebind  # type: ignore[attr-defined]
        for k, v, t in pending:
            rebind(k, t)
            sc.key = k
            sc.timestamp = t
            error: BaseException | None = None
            for _ in range(self.attempts):
                self.out = []
                try:
                    fn(sc, Record(k, v, t, b""))
                except BaseException as e:  # user code: anything may happen, sys.exit() included
                    error = e
                    attempt.undo()
                    continue
                attempt.keep()
                error = None
                break
            if error is not None:
                self._dead_letter(ctx, k, v, t, error)
        self.out = []

    def _in_one_call(self, ctx: Context, pending: list[Item]) -> bool:
        """The call's records in one ``process_batch`` (``ctx.key`` is ``b""`` and the
        timestamp the lowest: the batch has many keys). False if it raised: what it did is
        taken back, and the records go one by one."""
        assert self._batch_fn is not None
        sc = self.step_ctx
        sc.ctx = attempt = _Attempt(ctx)  # type: ignore[assignment]
        low = min(t for _, _, t in pending)
        ctx.rebind(b"", low)  # type: ignore[attr-defined]
        sc.key = b""
        sc.timestamp = low
        self.out = []
        try:
            self._batch_fn(sc, [Record(k, v, t, b"") for k, v, t in pending])
        except BaseException as e:  # user code: anything may happen, sys.exit() included
            attempt.undo()
            self.out = []
            log.info("sink step %r: a batch of %d records failed in one call (%s: %s); running them one by one",
                     self.name, len(pending), type(e).__name__, e)
            return False
        attempt.keep()
        self.out = []
        return True

    def _dead_letter(self, ctx: Context, key: bytes, value: bytes, t: int, error: BaseException) -> None:
        # Straight onto the batch's productions, as the worker writes its own dead letters
        # (worker/batch.py): produce() could refuse it (a value near the size limit).
        ctx.out.append((self.dead_letters, key, dead_letter(error, self.name, value), t))  # type: ignore[attr-defined]
        if self.on_dead_letter is not None:
            self.on_dead_letter(key, error, self.attempts)

    def abort(self) -> None:
        self._pending = []
        self.out = []


class _Raw:
    name = "bytes"

    def encode(self, obj: Any) -> bytes:
        return bytes(obj)

    def decode(self, data: bytes) -> bytes:
        return data


_RAW = RAW = _Raw()


def renamed(spec: Any, state_name: str) -> Any:
    """A copy of typed state ``spec`` stored under a step's ``state_name``."""
    copy = object.__new__(type(spec))
    copy.__dict__.update(vars(spec))
    copy.name = f"{state_name}/{spec.name}"
    return copy
