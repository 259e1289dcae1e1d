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

import datetime
from typing import Any, NamedTuple, Protocol, cast

from runtime import codecs
from runtime.computation import Computation, Context
from runtime.errors import MillstreamError
from runtime.record import Record
from runtime.state import MapState
from runtime.topology import late_stream

SECOND = 1_000_000
_TAG = "window/"


def _us(v: int | datetime.timedelta, what: str) -> int:
    us = int(v.total_seconds() * 1_000_000) if isinstance(v, datetime.timedelta) else v
    if isinstance(us, bool) or not isinstance(us, int) or us < 0:
        raise MillstreamError(f"{what}={v!r} must be a non-negative int of microseconds (or a timedelta)")
    return us


class _Windows:
    def __init__(self, allowed_lateness: int | datetime.timedelta) -> None:
        self.lateness = _us(allowed_lateness, "allowed_lateness")

    def assign(self, ts: int) -> list[tuple[int, int]]:
        raise NotImplementedError


class Tumbling(_Windows):
    """Fixed, non-overlapping windows of ``size``: ``[k·size, (k+1)·size)``."""

    def __init__(self, size: int | datetime.timedelta, *, allowed_lateness: int | datetime.timedelta = 0) -> None:
        super().__init__(allowed_lateness)
        self.size = _us(size, "size")
        if not self.size:
            raise MillstreamError("Tumbling: size must be > 0")

    def assign(self, ts: int) -> list[tuple[int, int]]:
        start = ts - ts % self.size
        return [(start, start + self.size)]


class Sliding(_Windows):
    """Windows of ``size`` starting every ``period``: a record is in ``size / period`` of them."""

    def __init__(self, size: int | datetime.timedelta, period: int | datetime.timedelta, *,
                 allowed_lateness: int | datetime.timedelta = 0) -> None:
        super().__init__(allowed_lateness)
        self.size, self.period = _us(size, "size"), _us(period, "period")
        if not self.period or self.size < self.period:
            raise MillstreamError("Sliding: period must be > 0 and at most size")

    def assign(self, ts: int) -> list[tuple[int, int]]:
        last = ts - ts % self.period
        return [(s, s + self.size) for s in range(last - self.size + self.period, last + 1, self.period)
                if s <= ts < s + self.size]


class Session(_Windows):
    """Per-key sessions: records less than ``gap`` apart are one session, ``[first, last + gap)``."""

    def __init__(self, gap: int | datetime.timedelta, *, allowed_lateness: int | datetime.timedelta = 0) -> None:
        super().__init__(allowed_lateness)
        self.gap = _us(gap, "gap")
        if not self.gap:
            raise MillstreamError("Session: gap must be > 0")

    def assign(self, ts: int) -> list[tuple[int, int]]:
        return [(ts, ts + self.gap)]


class WindowResult(NamedTuple):
    """What a flow's ``window`` step emits for one key and window (DESIGN.md §3b): the window's
    ``[start, end)`` in microseconds of event time and the aggregator's ``value``."""

    start: int
    end: int
    value: Any


class Aggregator(Protocol):
    """How a window's records become its result: ``create() -> acc``, ``add(acc, value) -> acc``,
    ``merge(a, b) -> acc`` (sessions that merge), ``result(acc)`` (what a flow's
    :class:`WindowResult` carries; the accumulator itself if absent) and ``emit(acc) -> bytes``
    (what a :class:`WindowedComputation` produces). Accumulators are stored between batches: in
    a flow they may be any value a flow carries (runtime/flows/values.py), in a
    :class:`WindowedComputation` JSON values."""

    def create(self) -> Any: ...

    def add(self, acc: Any, value: Any) -> Any: ...

    def merge(self, a: Any, b: Any) -> Any: ...

    def emit(self, acc: Any) -> bytes: ...


class _Builtin:
    """What the built-in aggregators share: ``result`` is the accumulator, ``emit`` its text."""

    def result(self, acc: Any) -> Any:
        return acc

    def emit(self, acc: Any) -> bytes:
        return str(self.result(acc)).encode()

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and vars(other) == vars(self)

    def __hash__(self) -> int:
        return hash(type(self))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Count(_Builtin):
    """How many records a window holds."""

    def create(self) -> int:
        return 0

    def add(self, acc: int, value: Any) -> int:
        return acc + 1

    def merge(self, a: int, b: int) -> int:
        return a + b


class Sum(_Builtin):
    """The sum of the values (:meth:`WindowedComputation.value` must return numbers)."""

    def create(self) -> float:
        return 0

    def add(self, acc: float, value: Any) -> float:
        return acc + value

    def merge(self, a: float, b: float) -> float:
        return a + b


class Min(_Builtin):
    """The smallest value (None for an empty window, which never fires)."""

    def create(self) -> Any:
        return None

    def add(self, acc: Any, value: Any) -> Any:
        return value if acc is None or value < acc else acc

    def merge(self, a: Any, b: Any) -> Any:
        return b if a is None else a if b is None else min(a, b)


class Max(_Builtin):
    """The largest value."""

    def create(self) -> Any:
        return None

    def add(self, acc: Any, value: Any) -> Any:
        return value if acc is None or value > acc else acc

    def merge(self, a: Any, b: Any) -> Any:
        return b if a is None else a if b is None else max(a, b)


class Mean(_Builtin):
    """The mean of the values: the accumulator is ``[sum, count]``."""

    def create(self) -> list[float]:
        return [0, 0]

    def add(self, acc: list[float], value: Any) -> list[float]:
        return [acc[0] + value, acc[1] + 1]

    def merge(self, a: list[float], b: list[float]) -> list[float]:
        return [a[0] + b[0], a[1] + b[1]]

    def result(self, acc: list[float]) -> float:
        return acc[0] / acc[1] if acc[1] else 0.0


class Collect(_Builtin):
    """Every value, in arrival order (keep windows small: the list is stored whole)."""

    def create(self) -> list[Any]:
        return []

    def add(self, acc: list[Any], value: Any) -> list[Any]:
        acc.append(value)
        return acc

    def merge(self, a: list[Any], b: list[Any]) -> list[Any]:
        return a + b


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
    _STEP = "millstream.windows"   # its window step's name: its state and timers are flow/<this>/...

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
            from runtime.flows.windowing import Window

            step = self.__dict__["_window_step"] = Window(self._STEP, self.windows, self.aggregator, "")
            step.nexts = [(cast(Any, _Fired(self)), 0)]
        if ctx is not None and not step.late:
            step.late = late_stream(self._name(ctx))
        return step

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
        try:
            step.push(ctx, [(r.key, self.value(r), r.timestamp) for r in records])
        except BaseException:
            step.abort()
            raise
        step.finish(ctx)

    def process_timer(self, ctx: Context, tag: str, time: int) -> None:
        if tag.startswith(_TAG):
            self._fire_stored_before_flows(ctx, int(tag[len(_TAG):]))
            return
        prefix = f"flow/{self._STEP}/"
        if tag.startswith(prefix):
            step = self._step(ctx)
            try:
                step.on_timer(ctx, tag[len(prefix):], time)
            except BaseException:
                step.abort()
                raise
            step.finish(ctx)

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


class _Fired:
    """What a :class:`WindowedComputation`'s window step emits goes to its ``on_window``."""

    def __init__(self, comp: WindowedComputation) -> None:
        self.comp = comp

    def push(self, ctx: Context, items: list[tuple[bytes, WindowResult, int]], side: int = 0) -> None:
        for key, result, ts in items:
            ctx.rebind(key, ts)  # type: ignore[attr-defined]
            self.comp.on_window(ctx, result.start, result.end, result.value)
