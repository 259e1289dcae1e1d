"""What an injector checks of the records it is given, before it queues any: bytes keys and
values within the limits of runtime/record.py, timestamps in signed 64 bits of microseconds.
Each message says what was wrong and how to put it right (``where``: which record of a batch)."""

from __future__ import annotations

from runtime.errors import InvalidRecordError
from runtime.record import END_OF_TIME, MAX_KEY_BYTES, MAX_VALUE_BYTES, MIN_TIME

MIN, MAX = MIN_TIME, END_OF_TIME


def check_time(t: object, what: str) -> None:
    """Raise :class:`InvalidRecordError` unless ``t`` (``what``: a timestamp, a watermark) is
    an int of microseconds in signed 64 bits."""
    if isinstance(t, bool) or not isinstance(t, int) or not MIN <= t <= MAX:
        raise InvalidRecordError(f"{what} {t!r} must be an int of microseconds since the epoch, "
                                 "within signed 64 bits (e.g. time.time_ns() // 1000)")


def check_record(key: object, value: object, timestamp: object, where: str = "") -> None:
    """Raise :class:`InvalidRecordError` saying what is wrong with a record (``where``: which
    one, for a batch), if anything is."""
    if not isinstance(key, bytes):
        raise InvalidRecordError(f"{where}key must be bytes, got {type(key).__name__} {key!r}; encode it")
    if not isinstance(value, bytes):
        raise InvalidRecordError(f"{where}value must be bytes, got {type(value).__name__}; encode it")
    check_time(timestamp, f"{where}timestamp")
    if len(value) > MAX_VALUE_BYTES or len(key) > MAX_KEY_BYTES:
        raise InvalidRecordError(
            f"{where}a record of {len(key):,} key bytes and {len(value):,} value bytes is over the limits "
            f"({MAX_KEY_BYTES:,} and {MAX_VALUE_BYTES:,}); store large objects elsewhere and send a reference")


def plain(keys: list[bytes], values: list[bytes], timestamps: list[int]) -> bool:
    """Whether every record of the columns is fine, tested a column at a time (no call of ours
    per record); False: look at each (:func:`check_record`) to say which is not."""
    return (set(map(type, keys)) == {bytes} and set(map(type, values)) == {bytes}
            and set(map(type, timestamps)) == {int} and MIN <= min(timestamps) and max(timestamps) <= MAX
            and max(map(len, keys)) <= MAX_KEY_BYTES and max(map(len, values)) <= MAX_VALUE_BYTES)
