"""The operators of a flow's stage (runtime/flows/stage.py): stateless steps, ``reduce``
and the emitters (``output``, a sink's input, ``key_by`` to the next stage). User code as a
step (``process``; a fused ``sink``) is in runtime/flows/steps.py (and sinkstep.py); windows and joins in
runtime/flows/windowing.py and runtime/flows/joins.py.

Operators work on lists of items ``(key, value, timestamp)``: a batch of records, or one,
flows through the stage step by step (``push``), each step handing its results to the steps
after it (``emit``). State is per key, in the tablet's typed-state cells
(runtime/state.py), read at most once and written at most once per key per call of the stage
(``finish`` writes what a call changed; ``abort`` forgets it when the call raised: the
worker undoes the call and runs it again).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from runtime.codecs import Codec
from runtime.computation import Context
from runtime.errors import UsageError
from runtime.flows.values import VALUES
from runtime.state import VALUE, cell, kept, payload

Item = tuple[bytes, Any, int]  # key, value, event time
TIMER_PREFIX = "flow/"         # the tags of a flow's timers: flow/<step>/<what>


def as_key(key: Any, step: str) -> bytes:
    """What a ``key_by`` function returned, as a record key."""
    if type(key) is bytes:
        return key
    if isinstance(key, str):
        return key.encode("utf-8", "surrogatepass")
    if isinstance(key, (bytearray, memoryview)):
        return bytes(key)
    raise UsageError(f"the key function of step {step!r} returned {type(key).__name__} ({key!r:.40}); "
                     "return the key as str or bytes")


class Op:
    """One step of a stage."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.nexts: list[tuple[Op, int]] = []
        self.muted: list[Item] | None = None  # set: what it emits is kept here, not passed on

    def push(self, ctx: Context, items: list[Item], side: int = 0) -> None:
        raise NotImplementedError

    def emit(self, ctx: Context, items: list[Item]) -> None:
        if items:
            if self.muted is not None:  # kept from the steps after (runtime/flows/windowing.py)
                self.muted += items
                return
            for op, side in self.nexts:
                op.push(ctx, items, side)

    def on_timer(self, ctx: Context, what: str, time: int) -> None:
        """A timer this step set (tag ``flow/<step>/<what>``) fires."""

    def timer_done(self) -> None:
        """The stage's call that ran :meth:`on_timer` ended, its ``finish`` included."""

    def timer_failed(self, error: BaseException) -> None:
        """The stage's call that ran :meth:`on_timer` raised ``error`` (it is undone)."""

    def finish(self, ctx: Context) -> None:
        """The stage's call ends: write what it changed (may raise: the call is undone)."""

    def commit(self) -> None:
        """Every step's :meth:`finish` of the call succeeded: what the step keeps in memory
        beyond the call follows it. Never raises (a later step's ``finish`` may still fail
        after this one's: nothing that call changes may be kept before all succeeded)."""

    def abort(self) -> None:
        """The stage's call raised (the worker undoes it): forget what it changed."""

    def recover(self, cells: Iterator[tuple[bytes, bytes, bytes]]) -> list[tuple[bytes, str, int]]:
        """At open, from this step's stored cells ``(key, rest of the storage key, stored)``:
        rebuild what it keeps in memory; returns the timers ``(key, tag, time)`` it needs."""
        return []

    def timer_tag(self, what: str) -> str:
        return f"{TIMER_PREFIX}{self.name}/{what}"

    @property
    def state_name(self) -> str:
        return f"{TIMER_PREFIX}{self.name}"


class Map(Op):
    def __init__(self, name: str, fn: Callable[[Any], Any]) -> None:
        super().__init__(name)
        self.fn = fn

    def push(self, ctx: Context, items: list[Item], side: int = 0) -> None:
        fn = self.fn
        self.emit(ctx, [(k, fn(v), t) for k, v, t in items])


class FlatMap(Op):
    def __init__(self, name: str, fn: Callable[[Any], Any]) -> None:
        super().__init__(name)
        self.fn = fn

    def push(self, ctx: Context, items: list[Item], side: int = 0) -> None:
        fn = self.fn
        self.emit(ctx, [(k, out, t) for k, v, t in items for out in fn(v)])


class Filter(Op):
    def __init__(self, name: str, fn: Callable[[Any], Any]) -> None:
        super().__init__(name)
        self.fn = fn

    def push(self, ctx: Context, items: list[Item], side: int = 0) -> None:
        fn = self.fn
        self.emit(ctx, [item for item in items if fn(item[1])])


class Emit(Op):
    """Writes items out of the stage: to a named stream encoded by ``codec`` (an ``output``,
    a sink's input), or, with ``key``, re-keyed for the next stage."""

    def __init__(self, name: str, stream: str, codec: Codec, key: Callable[[Any], Any] | None = None) -> None:
        super().__init__(name)
        self.stream = stream
        self.codec = codec
        self.key = key

    def push(self, ctx: Context, items: list[Item], side: int = 0) -> None:
        produce, encode, stream = ctx.produce, self.codec.encode, self.stream
        if self.key is None:
            for k, v, t in items:
                produce(stream, encode(v), key=k, timestamp=t)
        else:
            fn, name = self.key, self.name
            for _, v, t in items:
                produce(stream, encode(v), key=as_key(fn(v), name), timestamp=t)


class Reduce(Op):
    """A running value per key: ``fn(acc, value)``; emits it for every item (the object
    itself: ``fn`` returns a new value rather than change ``acc`` in place, docs/dataflows.md)."""

    def __init__(self, name: str, fn: Callable[[Any, Any], Any]) -> None:
        super().__init__(name)
        self.fn = fn
        self._changed: dict[bytes, Any] = {}   # key -> its running value, this call

    def push(self, ctx: Context, items: list[Item], side: int = 0) -> None:
        fn, changed, out = self.fn, self._changed, []
        missing = object()
        for k, v, t in items:
            acc = changed.get(k, missing)
            if acc is missing:
                stored = ctx.cell_get(cell(k, self.state_name) + VALUE)  # type: ignore[attr-defined]
                acc = missing if stored is None else VALUES.decode(payload(stored))
            acc = v if acc is missing else fn(acc, v)
            changed[k] = acc
            out.append((k, acc, t))
        self.emit(ctx, out)

    def finish(self, ctx: Context) -> None:
        for k, acc in self._changed.items():
            ctx.cell_put(cell(k, self.state_name) + VALUE, kept(VALUES.encode(acc)))  # type: ignore[attr-defined]
        self._changed.clear()

    def abort(self) -> None:
        self._changed.clear()


def judged_at(ctx: Context, at: int | None, upstream: list[Any]) -> int:
    """Where a step of a stage judges lateness now: the input's watermark, or ``at``, the time
    of a firing running in the stage (the stage's FiringClock), and never past what a window
    or join before it (``upstream``) still has due: their results, stamped then, are yet to come."""
    wm = ctx.low_watermark
    if at is not None and at < wm:
        wm = at
    for u in upstream:
        due = u.index.pending(wm)
        if due is not None and due[1] < wm:
            wm = due[1]
    return wm
