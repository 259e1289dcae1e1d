"""Records and their identifiers, and the clocks their times are on (:class:`TimeDomain`)."""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass
from datetime import UTC, timedelta
from datetime import datetime as _datetime

from runtime.errors import UsageError

ID_BYTES = 16


class TimeDomain(enum.IntEnum):
    """Which clock a timer (or a typed state's TTL) follows."""

    #: fires when the computation's input watermark (``ctx.low_watermark``) reaches the timer's time
    EVENT_TIME = 0
    #: fires when the wall clock reaches the timer's time
    WALL_TIME = 1


# The start and end of event time, in microseconds: a watermark at MIN_TIME holds everything
# back (nothing is known yet), one at END_OF_TIME promises nothing more will come (a finished
# input). Every timestamp lies between them (signed 64 bits). Defined here only.
MIN_TIME = -(1 << 63)
END_OF_TIME = (1 << 63) - 1
Timestamp = int | _datetime  # microseconds since the epoch, or a datetime with a time zone
_EPOCH = _datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def check_time(t: object, what: str, error: type[Exception] = UsageError) -> int:
    """``t`` (``what``: a timestamp, a timer's time, a watermark) as microseconds since the
    Unix epoch in signed 64 bits: it is an int, or a ``datetime`` with a time zone (one without
    has no known instant). ``error`` saying what is wrong otherwise."""
    if isinstance(t, _datetime):
        if t.tzinfo is None or t.utcoffset() is None:
            raise error(f"{what} {t!r} has no time zone, so its instant is not known; give it one "
                        "(datetime(..., tzinfo=datetime.UTC), or .astimezone()) or pass int microseconds")
        t = (t - _EPOCH) // _MICROSECOND
    if isinstance(t, bool) or not isinstance(t, int) or not MIN_TIME <= t <= END_OF_TIME:
        kind = "" if isinstance(t, int) or not hasattr(t, "__index__") else (
            f" (it is a {type(t).__module__}.{type(t).__name__}: pass int(...) of it)")
        raise error(f"{what} {t!r} must be an int of microseconds since the epoch, within signed 64 bits "
                    f"(e.g. time.time_ns() // 1000), or a datetime with a time zone{kind}")
    return t


# Microseconds since the epoch of a date from 1973 to 5138: times outside look like another unit.
PLAUSIBLE_MIN, PLAUSIBLE_MAX = 10**14, 10**17


class TimestampUnitWarning(UserWarning):
    """An int timestamp an injector was given looks like a clock's reading in seconds or
    milliseconds (a date from 2001 on) or nanoseconds (:func:`clock_unit`); it is sent as it
    is, as microseconds."""


def clock_unit(t: int) -> str | None:
    """The unit ``t`` looks like a clock's reading in, when it is not microseconds: seconds
    or milliseconds since the epoch of a date from 2001 to 5138, or nanoseconds of a date
    after 1973; None for anything else, the small numbers of a test among them."""
    t = abs(t)
    if 10**9 <= t < 10**11:
        return "seconds"
    if 10**12 <= t < PLAUSIBLE_MIN:
        return "milliseconds"
    return "nanoseconds" if t > PLAUSIBLE_MAX else None


def time_unit(biggest: int) -> str | None:
    """The unit times whose largest absolute value is ``biggest`` look like when it is not
    microseconds since the epoch: "seconds" or "milliseconds" below 10^14 (1973 in
    microseconds), "nanoseconds" above 10^17 (the year 5138); None if it is plausible (or 0)."""
    if 0 < biggest < PLAUSIBLE_MIN:
        return "seconds" if biggest < 10**11 else "milliseconds"
    if biggest > PLAUSIBLE_MAX:
        return "nanoseconds"
    return None


@dataclass(frozen=True, slots=True, init=False)
class Record:
    """One element of a stream.

    ``key`` and ``value`` are opaque bytes; ``timestamp`` is event time in
    microseconds since the Unix epoch; ``id`` is 16 unique bytes, stable across
    retries, which receivers use to drop duplicates. ``stream`` is the stream the record
    arrived on, so a computation with several inputs can tell them apart ("" where it is not
    known: a record made by hand). Inside a :class:`~runtime.Dataflow`, ``value`` is the
    step's Python value.
    """

    key: bytes
    value: bytes
    timestamp: int
    id: bytes
    stream: str = ""

    def __init__(self, key: bytes, value: bytes, timestamp: int, id: bytes, stream: str = "") -> None:
        # A record is made once per record per step of user code: a frozen dataclass's own
        # __init__ sets each field through object.__setattr__ (1.6 us a record); the slots'
        # setters do the same in half that. Frozen, equal, hashed and replaced as before.
        set_key, set_value, set_timestamp, set_id, set_stream = _SET_FIELDS
        set_key(self, key)
        set_value(self, value)
        set_timestamp(self, timestamp)
        set_id(self, id)
        set_stream(self, stream)

    @property
    def datetime(self) -> _datetime:
        """``timestamp`` as an aware ``datetime`` in UTC (years 1 to 9999, as ``datetime`` has)."""
        try:
            return _EPOCH + timedelta(microseconds=self.timestamp)
        except OverflowError:
            raise UsageError(f"timestamp {self.timestamp} µs is outside the years a datetime holds (1 to 9999); "
                             "was it sent in nanoseconds (time.time_ns() needs // 1000)?") from None


_SET_FIELDS = tuple(Record.__dict__[f].__set__ for f in ("key", "value", "timestamp", "id", "stream"))


# Bounds on one record (key, value): it must fit one delivery (gRPC messages are capped at
# 64 MiB, runtime/wire) with room for the rest of its batch. Checked where records are made:
# ctx.produce, ctx.state, Injector.send.
MAX_VALUE_BYTES = 16 << 20
MAX_KEY_BYTES = 64 << 10


# The first bit of a producer prefix says where its producer lives: set for producers inside
# the cluster (a tablet, and a weak tablet's producer per upstream producer), clear for every
# other (injectors, files, Spark partitions). A worker takes producers with it set only from
# callers holding the worker role, so an injector's credentials cannot move the mark of a
# tablet's output at any receiver (review N4).
WORKER_PRODUCER_BIT = 0x80


def producer_prefix(producer: str) -> bytes:
    """The 8-byte prefix shared by every id one producer outside the cluster mints."""
    digest = hashlib.blake2b(producer.encode(), digest_size=8).digest()
    return bytes((digest[0] & ~WORKER_PRODUCER_BIT & 0xFF,)) + digest[1:]


def worker_producer(prefix: bytes) -> bytes:
    """The 8 bytes ``prefix`` (a digest) as the prefix of a producer inside the cluster."""
    return bytes((prefix[0] | WORKER_PRODUCER_BIT,)) + prefix[1:8]


def is_worker_producer(prefix: bytes) -> bool:
    """Whether ``prefix`` names a producer inside the cluster (only workers may send its ids)."""
    return bool(prefix[0] & WORKER_PRODUCER_BIT)


def sequence_id(prefix: bytes, seq: int) -> bytes:
    """A record id made of a producer prefix and that producer's sequence number."""
    return prefix + seq.to_bytes(8, "big")


def derived_id(*parts: bytes) -> bytes:
    """A record id derived deterministically from other identifiers."""
    h = hashlib.blake2b(digest_size=ID_BYTES)
    for part in parts:
        h.update(len(part).to_bytes(4, "big"))
        h.update(part)
    return h.digest()
