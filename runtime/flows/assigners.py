"""What a window is and what it computes (DESIGN.md §3a): which windows a timestamp falls into
(``Tumbling``, ``Sliding``, ``Session``, with allowed lateness), what a window step emits
(``WindowResult``), and the accumulator interface with its built-in aggregators.

Users import these from :mod:`runtime.windows` (or ``millstream``); they live here, below both
the flow's window step (runtime/flows/windowing.py) and ``WindowedComputation``
(runtime/windows.py), so that neither imports the other's module to reach them."""

from __future__ import annotations

import datetime
from typing import Any, NamedTuple, Protocol

from runtime.errors import MillstreamError

SECOND = 1_000_000
# The longest span a window's size, gap, period or lateness (and an interval join's bound) may
# be: ~73,000 years, so a window's end plus its lateness fits the signed 64 bits a timer's time
# is stored in for any timestamp up to 2**62 (years past 146,000). Longer ones were accepted and
# then dead-lettered every record, each with an error about a timer the user never set.
MAX_SPAN = 1 << 61
MAX_WINDOWS_PER_RECORD = 10_000  # a Sliding window's size / period


def _us(v: int | datetime.timedelta, what: str) -> int:
    us = v // datetime.timedelta(microseconds=1) if isinstance(v, datetime.timedelta) else v  # (exact)
    if isinstance(us, bool) or not isinstance(us, int) or us < 0:
        raise MillstreamError(f"{what}={v!r} must be a non-negative int of microseconds (or a timedelta)")
    if us > MAX_SPAN:
        raise MillstreamError(f"{what}={v!r} is longer than the {MAX_SPAN:,} µs (~73,000 years) a span may be; "
                              "is it in nanoseconds (microseconds are time.time_ns() // 1000)?")
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
    """Windows of ``size`` starting every ``period`` (at its multiples since the epoch): a record
    is in ``size / period`` of them, rounded up or down as it falls when the period does not
    divide the size."""

    def __init__(self, size: int | datetime.timedelta, period: int | datetime.timedelta, *,
                 allowed_lateness: int | datetime.timedelta = 0) -> None:
        super().__init__(allowed_lateness)
        self.size, self.period = _us(size, "size"), _us(period, "period")
        if not self.period or self.size < self.period:
            raise MillstreamError("Sliding: period must be > 0 and at most size")
        if -(-self.size // self.period) > MAX_WINDOWS_PER_RECORD:
            raise MillstreamError(f"Sliding: size={self.size} µs over period={self.period} µs puts every record in "
                                  f"{-(-self.size // self.period):,} windows, more than {MAX_WINDOWS_PER_RECORD:,}; "
                                  "use a longer period (or aggregate a tumbling window's results)")

    def assign(self, ts: int) -> list[tuple[int, int]]:
        # Every window starts on a multiple of the period: from the last such start at or before
        # ``ts`` back as far as a window of ``size`` still holds ``ts``.
        period = self.period
        last = ts - ts % period
        return [(s, s + self.size) for s in range(last - (self.size - 1) // period * period, last + 1, period)
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
    """Every value, in arrival order (a session's: the merged sessions' lists one after the
    other, in event-time order). Keep windows small: the list is stored whole."""

    def create(self) -> list[Any]:
        return []

    def add(self, acc: list[Any], value: Any) -> list[Any]:
        acc.append(value)
        return acc

    def merge(self, a: list[Any], b: list[Any]) -> list[Any]:
        return a + b
