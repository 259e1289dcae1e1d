"""Event-time windows (DESIGN.md §3a): ``Tumbling``, ``Sliding`` and ``Session`` windows with
allowed lateness, aggregated through a small accumulator interface.

Derive from :class:`WindowedComputation` and say what to window, how to aggregate and where
the results go::

    class Clicks(WindowedComputation):
        windows = Tumbling(60 * SECOND)
        aggregator = Count()
        output = "clicks_per_minute"

Each window fires **exactly once**, when the computation's input watermark passes its end plus
the allowed lateness, with a record on ``output``: key = the record's key, value =
``aggregator.emit(acc)`` (bytes), timestamp = the moment it fires: the window's end plus the
allowed lateness (a pending window holds the computation's watermark there, so anything older
could be late downstream). A record whose every window
has already fired is *late*: it goes to the stream ``<computation>.late`` instead (and is
counted there). Session windows merge as records arrive, out of order included: a record
within ``gap`` of a session joins it, and one that bridges two sessions merges them.

It runs on the machinery of a :class:`~runtime.Dataflow`'s ``window`` step
(runtime/flows/windowing.py, docs/dataflows.md): windows live in typed state (one cell per key
and window), read and written once per batch, with one event-time timer per due time per
tablet, so they commit with the batch, survive failover and follow their keys through splits.
Accumulators are values a flow carries (numbers, strings, bytes, lists, tuples, dicts).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

from runtime import codecs
from runtime.computation import Computation, Context
from runtime.flows.assigners import (
    SECOND,
    Aggregator,
    Collect,
    Count,
    Max,
    Mean,
    Min,
    Session,
    Sliding,
    Sum,
    Tumbling,
    WindowResult,
    _Windows,
)
from runtime.flows.windowing import Window
from runtime.record import Record
from runtime.state import MapState
from runtime.topology import dead_letter_stream, late_stream

__all__ = ["SECOND", "Aggregator", "Collect", "Count", "Max", "Mean", "Min", "Session", "Sliding", "Sum",
           "Tumbling", "WindowResult", "WindowedComputation"]

_TAG = "window/"
_CALLS = ("process_record", "process_batch", "process_timer", "dead_letter_timer")  # each one call of the worker
_STEP = "millstream.windows"  # its window step's name: its state and timers are flow/<this>/...
_FIRES = f"flow/{_STEP}/"      # the tags of its window step's timers


class WindowedComputation(Computation):
    """A computation that aggregates each key's records per event-time window (module doc).

    Set ``windows``, ``aggregator`` and ``output`` on the subclass (and list ``output`` in
    ``outputs=``; ``<name>.late`` is every computation's); override :meth:`value` to pick what is aggregated
    (default: the record's value) and :meth:`on_window` to emit something else.

    It is a thin layer over the window step of a :class:`~runtime.Dataflow`
    (runtime/flows/windowing.py): batches of records in one call, one state write per key and
    window per batch, one timer per due time per tablet. Windows a job stored before that
    (a map per key and a timer per window, ``window/<start>``) still fire as they were."""

    windows: _Windows
    aggregator: Aggregator
    output: str = ""
    _open = MapState("millstream.windows", codecs.INT, codecs.JSON)  # the layout before flows: start -> [end, acc]
    _STEP = _STEP
    #: How often the worker tries a firing, and who counts and logs its dead letters: the
    #: worker sets its own (worker/tablet.py), as for a flow's stage.
    max_attempts = 3
    on_dead_letter: Callable[[bytes, BaseException, int], None] | None = None
    #: A firing takes a due time's windows in slices of wall-clock time: a re-run may fire
    #: others, so weak productions (ids from the call's place) are refused (runtime/topology.py).
    repeatable_timers = False

    def value(self, record: Record) -> Any:
        """What the aggregator adds for ``record`` (default: its value, bytes)."""
        return record.value

    def on_window(self, ctx: Context, start: int, end: int, acc: Any) -> None:
        """A window fired: by default produce ``aggregator.emit(acc)`` to ``output``, stamped
        at :meth:`fired_at` (an override stamping anything older risks being late downstream)."""
        ctx.produce(self.output, self.aggregator.emit(acc), timestamp=self.fired_at(end))

    def fired_at(self, end: int) -> int:
        """When the window ending at ``end`` fires: its end plus the allowed lateness."""
        return end + self.windows.lateness

    def _step(self, ctx: Context | None = None) -> Any:
        step = self.__dict__.get("_window_step")
        if step is None:
            # (on_window takes the accumulator: aggregator.emit makes the result of it)
            step = self.__dict__["_window_step"] = Window(self._STEP, self.windows, self.aggregator, "", results=False)
            step.nexts = [(cast(Any, _Fired(self)), 0)]
        if ctx is not None and not step.late:
            name = self._name(ctx)
            step.late, step.dead_letters, step.owner = late_stream(name), dead_letter_stream(name), name
            step.attempts, step.on_dead_letter = self.max_attempts, self.on_dead_letter
        return step

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass's own ``process_record``, ``process_batch``, ``process_timer`` or
        ``dead_letter_timer`` is one call of the worker's too: what the window step keeps in memory follows it."""
        super().__init_subclass__(**kwargs)
        for name in _CALLS:
            own = cls.__dict__.get(name)
            if own is not None and not getattr(own, "_one_call", False):
                setattr(cls, name, _one_call(own))

    def process_record(self, ctx: Context, record: Record) -> None:
        self._add(ctx, [record])

    def process_batch(self, ctx: Context, records: list[Record]) -> None:
        if type(self).process_record is not WindowedComputation.process_record:
            for r in records:  # a subclass's own process_record (a filter, say) sees each record
                ctx.rebind(r.key, r.timestamp)  # type: ignore[attr-defined]
                self.process_record(ctx, r)
            return
        self._add(ctx, records)

    def _add(self, ctx: Context, records: list[Record]) -> None:
        step = self._step(ctx)
        step.push(ctx, [(r.key, self.value(r), r.timestamp) for r in records])
        step.finish(ctx)

    def process_timer(self, ctx: Context, tag: str, time: int) -> None:
        if tag.startswith(_TAG):
            self._fire_stored_before_flows(ctx, int(tag[len(_TAG):]))
            return
        if tag.startswith(_FIRES):
            step = self._step(ctx)
            step.on_timer(ctx, tag[len(_FIRES):], time)
            step.finish(ctx)

    def dead_letter_timer(self, ctx: Context, tag: str, time: int, error: BaseException) -> bool:
        """The worker gave up on a firing (every try raised: :meth:`on_window`, say): the
        windows it took go to ``<computation>.dead_letter``, each with its accumulator, and their
        state is cleaned up, so later windows fire (runtime/flows/windowing.py ``give_up``)."""
        step = self._step(ctx)
        if not tag.startswith(_FIRES) or not step.took:
            return False
        try:
            step.give_up(ctx, tag[len(_FIRES):], time, error)
            step.finish(ctx)
            step.timer_done()
        finally:
            step.given_up()
        return True

    def recover_timers(self, scan: Any) -> list[tuple[bytes, str, int]]:
        """At open: the window step's index from the stored windows (worker/tablet.py)."""
        from runtime.state import TYPED, split_cell

        name = f"flow/{self._STEP}"
        cells = []
        for skey, stored in scan(TYPED):
            key, cell_name, rest = split_cell(skey)
            if cell_name == name:
                cells.append((key, rest, stored))
        timers: list[tuple[bytes, str, int]] = self._step().recover(iter(cells))
        return timers

    def _fire_stored_before_flows(self, ctx: Context, start: int) -> None:
        state = ctx.state_of(self._open)
        window = state.get(start)
        if window is None:
            return
        state.remove(start)
        self.on_window(ctx, start, int(window[0]), window[1])

    @staticmethod
    def _name(ctx: Context) -> str:
        return ctx.tablet.rpartition("/")[0]


_F = TypeVar("_F", bound=Callable[..., Any])


def _one_call(method: _F) -> _F:
    """``method`` as one call of the worker (the outermost of a subclass's method and the
    base's it calls): when it raises, the worker undoes every state write of the call, and
    the window step forgets what the call noted (its due index, its cached windows); when
    it returns, the step keeps it. Inner calls (a subclass's ``process_record`` calling the
    base's, or ``process_batch`` calling ``process_record`` per record) are part of it.

    A call of the step's timer that raises, wherever in it (a subclass's ``process_timer``
    after the base's fired), is a firing that failed: the next tries take one window per
    call, so the worker's tries and dead letter reach the failing window alone."""
    fires = method.__name__ == "process_timer"

    @functools.wraps(method)
    def call(self: WindowedComputation, ctx: Context, *args: Any) -> Any:
        if self.__dict__.get("_in_call"):
            return method(self, ctx, *args)
        self.__dict__["_in_call"] = True
        step = self._step(ctx)
        firing = fires and str(args[0]).startswith(_FIRES)
        try:
            result = method(self, ctx, *args)
        except BaseException as e:
            step.abort()
            if firing:
                step.timer_failed(e)
            raise
        else:
            step.commit()
            if firing:
                step.timer_done()
        finally:
            self.__dict__["_in_call"] = False
        return result
    call._one_call = True  # type: ignore[attr-defined]
    return cast(_F, call)


for _method in _CALLS:
    setattr(WindowedComputation, _method, _one_call(getattr(WindowedComputation, _method)))
del _method


class _Fired:
    """What a :class:`WindowedComputation`'s window step emits goes to its ``on_window``."""

    def __init__(self, comp: WindowedComputation) -> None:
        self.comp = comp

    def push(self, ctx: Context, items: list[tuple[bytes, WindowResult, int]], side: int = 0) -> None:
        for key, result, ts in items:
            ctx.rebind(key, ts)  # type: ignore[attr-defined]
            self.comp.on_window(ctx, result.start, result.end, result.value)
