"""What an injector checks of the records it is given, before it queues any: bytes keys and
values within the limits of runtime/record.py, timestamps in signed 64 bits of microseconds
(and a warning for an int that looks like a clock's reading in seconds, milliseconds or
nanoseconds: runtime/record.py ``clock_unit``).
Each message says what was wrong and how to put it right (``where``: which record of a batch);
and, before it registers, of the settings it is made with, its name's credential and the code
its stream's readers key their records with."""

from __future__ import annotations

import logging
import numbers
import threading
import warnings
from typing import Any

from runtime.errors import InjectionError, InvalidRecordError
from runtime.imports import CodeNotAllowedError
from runtime.record import (
    END_OF_TIME,
    MAX_KEY_BYTES,
    MAX_VALUE_BYTES,
    MIN_TIME,
    PLAUSIBLE_MAX,
    PLAUSIBLE_MIN,
    TimestampUnitWarning,
    clock_unit,
)
from runtime.record import check_time as _check_time
from runtime.routing import RoutingTable
from runtime.security import Security, covers, credential_owner

MIN, MAX = MIN_TIME, END_OF_TIME
log = logging.getLogger(__name__)


def check_time(t: object, what: str) -> int:
    """``t`` (``what``: a timestamp, a watermark) as an int of microseconds in signed 64 bits
    (it is one, or a ``datetime`` with a time zone); :class:`InvalidRecordError` otherwise."""
    return _check_time(t, what, InvalidRecordError)


def check_record(key: object, value: object, timestamp: object, where: str = "", units: bool = True) -> int:
    """The record's timestamp in microseconds (:func:`check_time`); :class:`InvalidRecordError`
    saying what is wrong with the record (``where``: which one, for a batch), if anything is.
    With ``units``, an int timestamp that looks like a clock's reading in another unit than
    microseconds is warned about (:func:`warn_unit`, at the caller's caller's line), not
    refused."""
    if not isinstance(key, bytes):
        raise InvalidRecordError(f"{where}key must be bytes, got {type(key).__name__} {key!r}; encode it")
    if not isinstance(value, bytes):
        raise InvalidRecordError(f"{where}value must be bytes, got {type(value).__name__}; encode it")
    ts = check_time(timestamp, f"{where}timestamp")
    if len(value) > MAX_VALUE_BYTES or len(key) > MAX_KEY_BYTES:
        raise InvalidRecordError(
            f"{where}a record of {len(key):,} key bytes and {len(value):,} value bytes is over the limits "
            f"({MAX_KEY_BYTES:,} and {MAX_VALUE_BYTES:,}); store large objects elsewhere and send a reference")
    if units and type(timestamp) is int and (unit := clock_unit(ts)) is not None:
        warn_unit(unit, 4)
    return ts


def check_columns(keys: list[Any], values: list[Any], timestamps: list[Any], units: bool) -> None:
    """:func:`check_record` of every record of the columns, their timestamps made
    microseconds in place; with ``units``, one warning for the batch (the first unit found)."""
    unit = None
    for i in range(len(keys)):
        given = timestamps[i]
        timestamps[i] = check_record(keys[i], values[i], given, f"record {i}: ", units=False)
        if units and unit is None and type(given) is int:
            unit = clock_unit(given)
    if unit is not None:
        warn_unit(unit, 4)


def warn_unit(unit: str, stacklevel: int) -> None:
    """A :class:`~runtime.record.TimestampUnitWarning` at the line ``stacklevel`` frames up
    from the caller. One message per unit: Python shows it once per line of its caller."""
    warnings.warn(f"record timestamps look like {unit} since the epoch, not microseconds: windows, timers and "
                  "watermarks count in microseconds. Send time.time_ns() // 1000, or a datetime with a time "
                  "zone", TimestampUnitWarning, stacklevel=stacklevel)


def plain(keys: list[bytes], values: list[bytes], timestamps: list[Any]) -> bool:
    """Whether every record of the columns is fine, its timestamp plausible microseconds, tested
    a column at a time (no call of ours per record); False: look at each (:func:`check_record`)."""
    return (set(map(type, keys)) == {bytes} and set(map(type, values)) == {bytes}
            and set(map(type, timestamps)) == {int} and PLAUSIBLE_MIN <= min(timestamps)
            and max(timestamps) <= PLAUSIBLE_MAX
            and max(map(len, keys)) <= MAX_KEY_BYTES and max(map(len, values)) <= MAX_VALUE_BYTES)


def check_settings(linger_ms: object, batch_size: object, max_queued: object, max_in_flight: object,
                   idle_after: object) -> int:
    """Raise :class:`InjectionError` unless an injector's settings are numbers in range (a
    float batch size once dropped records in the round thread); returns ``max_queued``, its
    default if None."""
    def number(n: object) -> bool:  # of seconds or milliseconds a thread can wait (numpy's too)
        if not isinstance(n, numbers.Real) or isinstance(n, bool):
            return False
        try:
            return -threading.TIMEOUT_MAX < float(n) < threading.TIMEOUT_MAX  # (not NaN, not inf)
        except OverflowError:
            return False

    def integer(n: object) -> bool:  # an int, or an integer of numpy's (not a bool, not a float)
        return isinstance(n, numbers.Integral) and not isinstance(n, bool)

    def bad(name: str, value: object, must: str) -> InjectionError:
        return InjectionError(f"{name}={value!r} must be {must}")

    if not number(linger_ms) or linger_ms < 0:  # type: ignore[operator]
        raise bad("linger_ms", linger_ms, "a number of milliseconds >= 0")
    if not integer(batch_size) or batch_size < 1:  # type: ignore[operator]
        raise bad("batch_size", batch_size, "an int >= 1")
    if max_queued is None:
        max_queued = max(100_000, batch_size)  # type: ignore[call-overload]
    if not integer(max_queued) or max_queued < batch_size:  # type: ignore[operator]
        raise bad("max_queued", max_queued, f"an int >= batch_size ({batch_size})")
    if not integer(max_in_flight) or max_in_flight < 1:  # type: ignore[operator]
        raise bad("max_in_flight", max_in_flight, "an int >= 1")
    if idle_after is not None and (not number(idle_after) or not idle_after > 0):  # type: ignore[operator]
        raise bad("idle_after", idle_after, "a number of seconds above 0, or None (never idle by itself; "
                  "mark_idle() still works)")
    return int(max_queued)  # type: ignore[call-overload]


def check_credential(name: str, security: Security) -> None:
    """Refuse an injector name its credential does not cover (review N4)."""
    if security.injector_credential is not None:
        owner = credential_owner(security.injector_credential)
        if not covers(owner, name):
            raise InjectionError(f"injector {name!r} is not covered by its credential, which is for {owner!r}: "
                                 f"name it {owner!r} or {owner + '/...'!r}, or get a credential for its name "
                                 f"(`millstream credential {name}`)")


def check_code(routing: RoutingTable, name: str, stream: str) -> None:
    """Refuse, before an injector registers (and so holds its stream's watermark) or sends
    anything, a stream every reader of which keys its records with code this injector may not
    load (``routing``'s extractors loaded under its policy; a flow's ``key_by`` runs here):
    each record would go to the dead letters. When only some readers' is refused, the others
    still get the records (one reader's code does not stop the stream): a warning names them.
    (Readers that come later are not looked at: their records go to their dead letters.)"""
    refused = routing.refused(stream)
    if not refused:
        return
    if set(refused) >= routing.readers(stream):
        raise CodeNotAllowedError(f"injector {name!r} cannot key the records of {stream!r} for its readers: "
                                  f"{next(iter(refused.values()))} (nothing was sent)")
    log.warning("injector %s: the records of %r for %s go to their dead letters: %s", name, stream,
                ", ".join(map(repr, sorted(refused))), "; ".join(refused.values()))
