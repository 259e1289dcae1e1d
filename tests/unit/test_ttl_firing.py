"""A typed-state TTL timer's firing (worker/timers.py ``fire_ttl``) and the timer a write arms
(worker/context.py ``expire_at``), on a context that only records what they do: a wall-clock
TTL's late firing deletes everything the clock has passed at once, and a timer of the other
clock (the state's ``ttl_domain`` changed by an update) is replaced, never compared with."""

from __future__ import annotations

from collections.abc import Iterator

from runtime.computation import TimeDomain
from runtime.state import _EXPIRY, TTL_TAG, VALUE, cell
from worker.context import KeyContext
from worker.storage import Timer
from worker.timers import fire_ttl

NAME = "seen"
S = 1_000_000


class _Ctx:
    """What ``fire_ttl`` uses of a KeyContext: a clock, a watermark, stored entries, a budget."""

    def __init__(self, now: int, watermark: int, expiries: list[int], room: int = 1000) -> None:
        self._now, self.low_watermark, self.room = now, watermark, room
        prefix = cell(b"k", NAME)
        self.entries = {prefix + VALUE + i.to_bytes(2, "big"): _EXPIRY.pack(e) + b"x" for i, e in enumerate(expiries)}
        self.deleted: list[bytes] = []
        self.set: list[tuple[str, int, TimeDomain]] = []

    def now(self) -> int:
        return self._now

    def expire_room(self) -> int:
        return self.room

    def cell_scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        return iter(sorted((k, v) for k, v in self.entries.items() if k.startswith(prefix)))

    def delete_expired(self, skeys: list[bytes]) -> bool:
        self.deleted += skeys[:self.room]
        return len(skeys) <= self.room

    def _set_timer(self, tag: str, time: int, domain: TimeDomain) -> None:
        self.set.append((tag, time, domain))


def _timer(time: int, domain: TimeDomain) -> Timer:
    return Timer(b"k", TTL_TAG + NAME, domain, time)


def _none_set() -> tuple[dict[bytes, int], int]:
    return {}, 1 << 62


def test_a_late_wall_clock_firing_deletes_all_the_clock_has_passed_at_once() -> None:
    t = 1_800_000_000 * S
    ctx = _Ctx(now=t + 60 * S, watermark=0, expiries=[t + 10 * S, t + 15 * S, t + 19 * S, t + 70 * S])
    fire_ttl(_timer(t + 10 * S, TimeDomain.WALL_TIME), ctx, TimeDomain.WALL_TIME, _none_set)  # (due 50 s ago)
    assert len(ctx.deleted) == 3  # not one per firing, a second apart
    assert ctx.set == [(TTL_TAG + NAME, t + 70 * S, TimeDomain.WALL_TIME)]  # back at the next expiry


def test_an_event_time_firing_deletes_by_its_own_time_only() -> None:
    ctx = _Ctx(now=10**18, watermark=50 * S, expiries=[10 * S, 20 * S, 40 * S])
    fire_ttl(_timer(10 * S, TimeDomain.EVENT_TIME), ctx, TimeDomain.EVENT_TIME, _none_set)
    assert len(ctx.deleted) == 1
    assert ctx.set == [(TTL_TAG + NAME, 30 * S, TimeDomain.EVENT_TIME)]  # (half way to the watermark)


def test_a_firing_in_the_clock_the_state_left_rearms_in_the_one_it_has_now() -> None:
    t = 1_800_000_000 * S
    ctx = _Ctx(now=t, watermark=5 * S, expiries=[t - S, t + 20 * S])  # (written under a wall-clock TTL)
    fire_ttl(_timer(3 * S, TimeDomain.EVENT_TIME), ctx, TimeDomain.WALL_TIME, _none_set)  # (set under event time)
    assert len(ctx.deleted) == 1 and ctx.set == [(TTL_TAG + NAME, t + 20 * S, TimeDomain.WALL_TIME)]
    ctx = _Ctx(now=t, watermark=5 * S, expiries=[4 * S, 9 * S])  # and back: event time again
    fire_ttl(_timer(t, TimeDomain.WALL_TIME), ctx, TimeDomain.EVENT_TIME, _none_set)
    assert len(ctx.deleted) == 1  # by the watermark, not by the wall timer's time (far past it)
    assert ctx.set == [(TTL_TAG + NAME, 9 * S, TimeDomain.EVENT_TIME)]


def test_a_write_replaces_a_pending_timer_of_the_other_clock() -> None:
    pending = {(b"k", TTL_TAG + NAME): _timer(5 * S, TimeDomain.EVENT_TIME)}  # earlier, but of event time
    ctx = KeyContext(frozenset(), lambda k: None, lambda: 0, pending_timer=pending.get)
    ctx.begin(b"k", 0)
    ctx.expire_at(NAME, 1_800_000_000 * S, TimeDomain.WALL_TIME)
    [armed] = ctx.effects.timers_set.values()
    assert (armed.time, armed.domain) == (1_800_000_000 * S, TimeDomain.WALL_TIME)
    ctx.begin(b"k", 0)
    pending[(b"k", TTL_TAG + NAME)] = _timer(5 * S, TimeDomain.WALL_TIME)  # of its own clock, and earlier: kept
    ctx.expire_at(NAME, 9 * S, TimeDomain.WALL_TIME)
    assert not ctx.effects.timers_set
