"""User code as steps of a flow's stage (runtime/flows/stage.py): ``process`` runs a
:class:`~runtime.Computation` per key, with its own state and timers inside the stage (a
``sink``, fused into the stage before it, is a process step too: runtime/flows/sinkstep.py).

A ``process`` step's ``ctx.state`` is held per key for the length of the stage's call and
written once when it ends (``finish``), as ``reduce`` holds its running values
(runtime/flows/ops.py). Its event-time timers fire as in a computation of its own after the
stage's windows and joins before it (:meth:`Process.on_timer`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runtime.codecs import INT, STR
from runtime.computation import Computation, Context, State, TimeDomain, record_fn
from runtime.errors import UsageError
from runtime.flows.ops import Item, Op, judged_at
from runtime.record import MAX_VALUE_BYTES, Record, Timestamp, check_time
from runtime.state import NEVER_EXPIRES, VALUE, MapState, ValueState, cell, declared, kept, payload

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


MAX_HELD_BYTES = MAX_VALUE_BYTES - len(NEVER_EXPIRES)  # a held value, stored with its expiry


class _HeldRef(_StepState):
    """A ``process`` step's ``ctx.state``, held per key for the length of the stage's call:
    read from its cell the first time the call asks for a key, written to it once, when the
    call ends (:meth:`flush`, from the step's ``finish``), as ``reduce`` does. A step called
    for many records of a key in one batch reads and writes its cell once, not per record.

    In Python, the reference: ``runtime/flows/_steps.c``'s ``HeldCore`` does ``get``, ``set``
    and ``clear`` in C on their common path and comes back here for the rest (:data:`_HeldState`)."""

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
        """The keys it changed written, in one merge (each value was checked at its ``set``)."""
        held, name = self._held, self._name
        if self._dirty:
            ctx.cell_write({cell(key, name) + VALUE: None if (v := held[key]) is None else NEVER_EXPIRES + v  # type: ignore[attr-defined]
                            for key in self._dirty})
        self.forget()

    def forget(self) -> None:
        self._held.clear()
        self._dirty.clear()


class _StepCoreRef:
    """What a ``process`` step's context is bound by per record (the item's key and
    timestamp, the call's list of what it produced, the stage's context) and ``produce``:
    in Python, the reference of ``runtime/flows/_steps.c``'s ``StepCore`` (which comes back
    here for a ``produce`` with keywords)."""

    key: bytes = b""  # the item's, set with ``timestamp`` per item (a plain attribute: read per state call)

    def __init__(self) -> None:
        self.key = b""
        self.timestamp = 0
        self.out: list[Item] = []   # what the call produced, handed on when it returns
        self.ctx: Context = None  # type: ignore[assignment]  # the stage's, bound per call
        self._state: Any = None

    @property
    def state(self) -> State:  # (read-only, as a computation's ctx.state is everywhere)
        return self._state  # type: ignore[no-any-return]

    def produce(self, stream: str, value: Any, *, key: bytes | None = None, timestamp: Timestamp | None = None) -> None:
        here = self.key
        if key is None and timestamp is None:  # the common call: no checks
            self.out.append((here, value, self.timestamp))
            return
        if key is not None and key != here:
            raise UsageError(f"step {self.op.name!r}: produce(key={key!r:.40}) in a flow must keep the current key "  # type: ignore[attr-defined]
                             f"({here!r:.40}); re-key with key_by after the step")
        if timestamp is not None and (isinstance(timestamp, bool) or not isinstance(timestamp, int)):
            timestamp = check_time(timestamp, "produce() timestamp")
        self.out.append((here, value, self.timestamp if timestamp is None else timestamp))


def _run_py(step: Any, fn: Callable[[Any, Record], None], rebind: Callable[[bytes, int], None],
            items: list[Item]) -> None:
    """Each item to ``fn`` as a record, the stage's context rebound to it: in Python, the
    reference of ``runtime/flows/_steps.c``'s ``run``."""
    for k, v, t in items:
        rebind(k, t)
        step.key, step.timestamp = k, t
        fn(step, Record(k, v, t, b""))


_StepCore: Any = _StepCoreRef
_HeldState: Any = _HeldRef
run_items = _run_py
if os.environ.get("MILLSTREAM_PURE_PYTHON", "") in ("", "0"):  # as worker/recordloop.py reads it
    try:
        from runtime.flows import _steps  # type: ignore[attr-defined]

        _steps.init(Record, _HeldRef.get, _HeldRef.set, _HeldRef.clear, _StepCoreRef.produce, MAX_HELD_BYTES)

        class _HeldState(_steps.HeldCore, _HeldRef):  # type: ignore[no-redef]
            """:class:`_HeldRef` with ``get``, ``set`` and ``clear`` in C."""

        _StepCore = _steps.StepCore
        run_items = _steps.run
    except (ImportError, AttributeError, TypeError):  # not built, built from an older _steps.c, or Record changed
        pass

COMPILED: bool = _StepCore is not _StepCoreRef
"""Whether a ``process`` step runs on the compiled core (``runtime/flows/_steps.c``)."""

if TYPE_CHECKING:
    _StepBase = _StepCoreRef
else:
    _StepBase = _StepCore


class StepContext(_StepBase, Context):
    """What a :class:`~runtime.Computation` run as a ``process`` step sees: its own state and
    timers (named apart from every other step's), and ``produce`` handing values on."""

    def __init__(self, op: Process) -> None:
        super().__init__()
        self.op = op
        self._state = op.state_kind(self)

    @property
    def low_watermark(self) -> int:
        return self.ctx.low_watermark

    @property
    def tablet(self) -> str:
        return self.ctx.tablet

    @property
    def sequencer_token(self) -> int:
        return self.ctx.sequencer_token

    def set_timer(self, tag: str, time: Timestamp, domain: TimeDomain = TimeDomain.EVENT_TIME) -> None:
        self.ctx.set_timer(self.op.timer_tag(":" + tag), time, domain)
        if self.op.judged_after:  # (a wall-clock timer under the tag replaces an event-time one: no hold)
            event = domain is TimeDomain.EVENT_TIME
            self.op.note_hold(self.ctx, tag, (time if type(time) is int else check_time(time, "timer time"))
                              if event else None)

    def delete_timer(self, tag: str) -> None:
        self.ctx.delete_timer(self.op.timer_tag(":" + tag))
        if self.op.judged_after:
            self.op.note_hold(self.ctx, tag, None)

    def now(self) -> int:
        return self.ctx.now()

    def state_of(self, spec: Any) -> Any:
        return self.ctx.state_of(self.op.renamed(spec))


class Process(Op):
    """A user :class:`~runtime.Computation` per key: each item is a record for its
    ``process_record``; what it produces goes on."""

    state_kind: type[_StepState] = _HeldState  # its ctx.state: held for the call (a sink's: _StepState)

    def __init__(self, name: str, comp: Computation) -> None:
        super().__init__(name)
        self.comp = comp
        self._one = record_fn(comp)  # its process_record (or process_batch of one record)
        self.raw = ValueState(f"{self.state_name}/state", _RAW)
        self.step_ctx = StepContext(self)
        # The stage's (runtime/flows/stage.py): its firing clock, the windows and joins before
        # this step (whose results an event-time timer of this step waits for), and whether a
        # window or join after it judges what its timers produce (at their time, or for a timer
        # set past the watermark, at the watermark then: ``holds``, by tag).
        self.clock: Any = None
        self.upstream: list[Any] = []
        self.judged_after = False
        self.holds = MapState(f"{self.state_name}/state.holds", STR, INT)
        self._renamed: dict[tuple[type, str], tuple[Any, Any]] = {}  # (kind, name) -> (spec, its copy)
        self._by_id: dict[int, tuple[Any, Any, str]] = {}             # id(spec) -> (spec, its copy, its name then)
        for spec in declared(type(comp)).values():  # declared on the class: refused at submit, not per record
            self.renamed(spec)

    def renamed(self, spec: Any) -> Any:
        """The step's own copy of a typed state ``spec`` (its name prefixed by the step's).
        Kept per (kind, name) with the spec it copies, so a spec made in a call and freed
        cannot pass for another one that comes to live at its address."""
        hit = self._by_id.get(id(spec))  # (the spec itself, checked, and its name: a spec may be renamed)
        if hit is not None and hit[0] is spec and hit[2] == spec.name:
            return hit[1]
        if not hasattr(spec, "name") or not hasattr(spec, "kind"):
            return spec  # not a state spec: ctx.state_of says what is wrong with it
        held = self._renamed.get((type(spec), spec.name))
        if held is not None and held[0] is spec:
            self._by_id[id(spec)] = (spec, held[1], spec.name)
            return held[1]
        if spec.name == "state" or spec.name.startswith("state."):
            raise UsageError(f"step {self.name!r}: a typed state may not be named {spec.name!r} in a flow's "
                             "process step ('state' is its ctx.state, 'state.*' the step's own); give it another name")
        name = f"{self.state_name}/{spec.name}"
        if len(name.encode()) > 255:
            raise UsageError(f"step {self.name!r}: its typed state {spec.name!r} is stored as {name!r}, "
                             f"{len(name.encode())} bytes, over the 255 a state name may have; shorten the "
                             "step's name or the state's")
        copy = renamed(spec, self.state_name)
        if held is not None:  # one spec per (kind, name) is held: a spec made per call is not kept for ever
            self._by_id.pop(id(held[0]), None)
        self._renamed[(type(spec), spec.name)] = (spec, copy)
        self._by_id[id(spec)] = (spec, copy, spec.name)
        return copy

    def push(self, ctx: Context, items: list[Item], side: int = 0) -> None:
        sc = self.step_ctx
        sc.ctx = ctx
        out: list[Item] = []
        sc.out = out
        run_items(sc, self._one, ctx.rebind, items)  # type: ignore[attr-defined]
        sc.out = []
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
        sc.out = []
        clock = self.clock
        outer = None if clock is None else clock.at
        if event_time and self.judged_after and clock is not None:
            at = time
            holds = ctx.state_of(self.holds)
            held = holds.get(what[1:])
            if held is not None:  # set when the watermark had passed its time: what it makes is as late
                holds.remove(what[1:])
                at = max(at, held)
            clock.at = at if outer is None else min(outer, at)
        try:
            self.comp.process_timer(sc, what[1:], time)
            out, sc.out = sc.out, []
            self.emit(ctx, out)
        finally:
            if clock is not None:
                clock.at = outer

    def note_hold(self, ctx: Context, tag: str, time: int | None) -> None:
        """Event-time timer ``tag`` is set for ``time`` (None: deleted). Set past the stage's
        watermark, it is noted with that watermark: in a computation of its own, the step's
        output watermark would have passed its time already, and what it makes is late."""
        holds = ctx.state_of(self.holds)
        wm = judged_at(ctx, None if self.clock is None else self.clock.at, self.upstream)  # (as the steps after it judge)
        if time is not None and time < wm:
            holds.put(tag, wm)
        elif holds.contains(tag):
            holds.remove(tag)

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
        self.step_ctx.out = []
        self.step_ctx._state.forget()


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
