"""The user API for computations: :class:`Computation`, :class:`Context`, :class:`TimeDomain`."""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, overload

from runtime.errors import MillstreamError
from runtime.record import Record, TimeDomain, Timestamp

if TYPE_CHECKING:
    from runtime.state import ListHandle, ListState, MapHandle, MapState, ValueHandle, ValueState


class State(abc.ABC):
    """Per-key persistent bytes, committed atomically with the batch that changed them."""

    @abc.abstractmethod
    def get(self) -> bytes | None:
        """The key's state, or ``None`` if it has none."""

    @abc.abstractmethod
    def set(self, value: bytes) -> None:
        """Replace the key's state."""

    @abc.abstractmethod
    def clear(self) -> None:
        """Remove the key's state."""


class Context(abc.ABC):
    """What user code sees while it processes one record or one timer for one key."""

    @property
    @abc.abstractmethod
    def key(self) -> bytes:
        """The key being processed."""

    @property
    @abc.abstractmethod
    def state(self) -> State:
        """The key's persistent state."""

    @property
    @abc.abstractmethod
    def low_watermark(self) -> int:
        """The computation's current low watermark, in microseconds."""

    @property
    def tablet(self) -> str:
        """The tablet running this call: ``"<computation>/<key range>"``, e.g. ``"orders_sink/3"``
        ("" outside a worker)."""
        return ""

    @property
    def sequencer_token(self) -> int:
        """The tablet's sequencer token: it goes up every time the tablet changes owner, so
        external writes made conditional on it (``UPDATE ... WHERE token <= :token``, then
        store it) refuse an older owner still running after it lost the tablet (0 outside a
        worker)."""
        return 0

    @abc.abstractmethod
    def produce(
        self, stream: str, value: bytes, *, key: bytes | None = None, timestamp: Timestamp | None = None
    ) -> None:
        """Send a record to ``stream`` (one of the computation's outputs).

        ``key`` defaults to the current key and ``timestamp`` to the timestamp of
        the record (or timer) being processed (an int of microseconds, or a ``datetime``
        with a time zone).
        """

    @abc.abstractmethod
    def set_timer(self, tag: str, time: Timestamp, domain: TimeDomain = TimeDomain.EVENT_TIME) -> None:
        """Set the timer ``tag`` for the current key at ``time`` (microseconds, or a
        ``datetime`` with a time zone); setting it again moves it."""

    @abc.abstractmethod
    def delete_timer(self, tag: str) -> None:
        """Delete the timer ``tag`` of the current key, if set."""

    @abc.abstractmethod
    def now(self) -> int:
        """The wall clock, in microseconds since the Unix epoch."""

    @overload
    def state_of(self, spec: ValueState) -> ValueHandle: ...
    @overload
    def state_of(self, spec: ListState) -> ListHandle: ...
    @overload
    def state_of(self, spec: MapState) -> MapHandle: ...

    def state_of(self, spec: Any) -> Any:
        """The handle of typed state ``spec`` (a ``ValueState``, ``ListState`` or ``MapState``
        declared on the computation class) for the current key, valid during this call only."""
        raise MillstreamError(f"{type(self).__name__} has no typed state")


class Computation:
    """Base class of user computations.

    Subclasses override :meth:`process_record` and, if they set timers,
    :meth:`process_timer`. Processing for one key is serialised. Workers create
    one instance per tablet by importing the class from its ``module:Class``
    path, then call :meth:`setup` with the computation's ``params``.
    """

    params: Mapping[str, str] = {}

    def setup(self, params: Mapping[str, str]) -> None:
        """Receive the computation's ``params`` (from ``Topology.add_computation``)."""
        self.params = dict(params)

    def process_record(self, ctx: Context, record: Record) -> None:
        """Handle one input record for ``ctx.key``."""

    def process_timer(self, ctx: Context, tag: str, time: int) -> None:
        """Handle the timer ``tag`` of ``ctx.key``, set for ``time``, firing."""


def record_fn(comp: Computation) -> Callable[[Context, Record], None]:
    """What runs one record of ``comp``: its ``process_record``, or, for a class that defines
    only ``process_batch`` (a sink that writes whole batches), ``process_batch`` with a batch
    of one. A batch that failed in one call runs record by record (each tried, then
    dead-lettered); it must not meet the base class's ``process_record``, which does nothing."""
    batch = getattr(comp, "process_batch", None)
    if batch is None or getattr(type(comp), "process_record", None) is not Computation.process_record:
        return comp.process_record
    return lambda ctx, record: batch(ctx, [record])
