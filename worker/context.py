"""The :class:`~runtime.Context` user code sees, over one batch's uncommitted effects."""

from __future__ import annotations

import time
from collections.abc import Callable

from runtime.computation import Context, State, TimeDomain
from runtime.errors import MillstreamError
from runtime.record import MAX_KEY_BYTES, MAX_VALUE_BYTES
from worker.storage import Timer

MAX_TAG_BYTES = 1024


def _check_size(data: bytes, limit: int, what: str) -> None:
    if len(data) > limit:
        raise ValueError(f"{what} of {len(data):,} bytes is over the limit of {limit:,} bytes; "
                         "store large objects elsewhere and pass a reference")


def _check_tag(tag: str) -> None:
    """A tag the commit can store: checked here, where the error reaches the dead letters,
    not at commit time, where it would fail the whole batch again and again."""
    if not isinstance(tag, str):
        raise TypeError(f"timer tag must be str, not {type(tag).__name__}")
    try:
        encoded = tag.encode()
    except UnicodeEncodeError as e:  # e.g. a lone surrogate from surrogateescape decoding
        raise ValueError(f"timer tag {tag!r} cannot be stored as UTF-8 ({e.reason}); use text "
                         "without lone surrogates, e.g. decode bytes with errors='replace'") from None
    _check_size(encoded, MAX_TAG_BYTES, "timer tag")


def _check_time(t: int, what: str) -> int:
    if isinstance(t, bool) or not isinstance(t, int) or not -(1 << 63) <= t < (1 << 63):
        raise ValueError(f"{what} {t!r} must be an int of microseconds within 64 bits")
    return t


class Effects:
    """What one record (or timer) did; merged into the batch only if user code returned."""

    __slots__ = ("state", "timers_set", "timers_deleted", "produced")

    def __init__(self) -> None:
        self.state: dict[bytes, bytes | None] = {}
        self.timers_set: dict[tuple[bytes, str], Timer] = {}
        self.timers_deleted: set[tuple[bytes, str]] = set()
        self.produced: list[tuple[str, bytes, bytes, int]] = []  # stream, key, value, ts


class _KeyState(State):
    __slots__ = ("_ctx",)

    def __init__(self, ctx: KeyContext) -> None:
        self._ctx = ctx

    def get(self) -> bytes | None:
        key = self._ctx._key
        eff = self._ctx.effects
        if key in eff.state:
            return eff.state[key]
        return self._ctx.read_state(key)

    def set(self, value: bytes) -> None:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError(f"state must be bytes, not {type(value).__name__}; encode it first")
        _check_size(value, MAX_VALUE_BYTES, "state value")
        self._ctx.effects.state[self._ctx._key] = bytes(value)

    def clear(self) -> None:
        self._ctx.effects.state[self._ctx._key] = None


class KeyContext(Context):
    """A context reused across the records of a batch (rebound per record)."""

    def __init__(
        self,
        outputs: frozenset[str],
        read_state: Callable[[bytes], bytes | None],
        watermark: Callable[[], int],
        now_us: Callable[[], int] = lambda: time.time_ns() // 1000,
    ) -> None:
        self.outputs = outputs
        self.read_state = read_state
        self._watermark = watermark
        self._now_us = now_us
        self._key = b""
        self._timestamp = 0
        self._state = _KeyState(self)
        self.effects = Effects()

    def bind(self, key: bytes, timestamp: int, effects: Effects) -> None:
        self._key = key
        self._timestamp = timestamp
        self.effects = effects

    @property
    def key(self) -> bytes:
        return self._key

    @property
    def state(self) -> State:
        return self._state

    @property
    def low_watermark(self) -> int:
        return self._watermark()

    def produce(self, stream: str, value: bytes, *, key: bytes | None = None,
                timestamp: int | None = None) -> None:
        if stream not in self.outputs:
            raise MillstreamError(
                f"produce() to unknown stream {stream!r}: this computation's outputs are "
                f"{sorted(self.outputs)}; add it to outputs= in add_computation"
            )
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError(f"produce() value must be bytes, not {type(value).__name__}")
        if key is not None and not isinstance(key, (bytes, bytearray)):
            raise TypeError(f"produce() key must be bytes, not {type(key).__name__}")
        ts = self._timestamp if timestamp is None else _check_time(timestamp, "produce() timestamp")
        _check_size(value, MAX_VALUE_BYTES, "produce() value")
        if key is not None:
            _check_size(key, MAX_KEY_BYTES, "produce() key")
        self.effects.produced.append((stream, self._key if key is None else bytes(key), bytes(value), ts))

    def set_timer(self, tag: str, time: int, domain: TimeDomain = TimeDomain.EVENT_TIME) -> None:
        _check_tag(tag)
        t = Timer(self._key, tag, TimeDomain(domain), _check_time(time, "timer time"))
        self.effects.timers_set[(self._key, tag)] = t
        self.effects.timers_deleted.discard((self._key, tag))

    def delete_timer(self, tag: str) -> None:
        _check_tag(tag)
        self.effects.timers_set.pop((self._key, tag), None)
        self.effects.timers_deleted.add((self._key, tag))

    def now(self) -> int:
        return self._now_us()
