"""A tablet's pending timers, in memory: by (key, tag), and by due time per domain.

The durable copy is in the tablet's RocksDB (``K``/``T`` keys, see worker/storage.py);
this index is rebuilt from it when the tablet opens and follows every commit.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import TYPE_CHECKING

from runtime.computation import TimeDomain
from runtime.flows.ops import TIMER_PREFIX
from runtime.record import END_OF_TIME
from runtime.state import TTL_TAG, cell, expired, ttl_rearm
from worker.storage import Commit, Timer

if TYPE_CHECKING:
    from worker.context import KeyContext

TimerKey = tuple[bytes, str]


class TimerIndex:
    """One timer per (key, tag); heaps per domain with lazy deletion of moved timers."""

    def __init__(self) -> None:
        self._by_key: dict[TimerKey, Timer] = {}
        self._heaps: dict[TimeDomain, list[tuple[int, bytes, str]]] = {d: [] for d in TimeDomain}

    def __len__(self) -> int:
        return len(self._by_key)

    def get(self, key: TimerKey) -> Timer | None:
        return self._by_key.get(key)

    def remember(self, t: Timer) -> None:
        unchanged = self._by_key.get((t.key, t.tag)) == t
        self._by_key[(t.key, t.tag)] = t  # always: a new setting carries a new nonce
        if not unchanged:  # set again at the same time: already in its heap
            heapq.heappush(self._heaps[t.domain], (t.time, t.key, t.tag))

    def forget(self, t: Timer) -> None:
        """Drop ``t`` if it is still the timer of its (key, tag)."""
        if self._by_key.get((t.key, t.tag)) == t:
            del self._by_key[(t.key, t.tag)]

    def peek(self, domain: TimeDomain) -> Timer | None:
        """The earliest pending timer of ``domain``."""
        heap = self._heaps[domain]
        while heap:
            when, key, tag = heap[0]
            t = self._by_key.get((key, tag))
            if t is not None and t.domain == domain and t.time == when:
                return t
            heapq.heappop(heap)  # moved or deleted since it was pushed
        return None

    def pop_due(self, wall_now: int, watermark: int, limit: int = 10_000) -> list[Timer]:
        """Take the wall-clock timers due by ``wall_now`` and the event-time timers due by
        ``watermark`` out of the index (each once). If the batch firing them fails, the
        tablet reopens from disk, where they still are."""
        out: list[Timer] = []
        taken: set[TimerKey] = set()
        for domain, bound in ((TimeDomain.WALL_TIME, wall_now), (TimeDomain.EVENT_TIME, watermark)):
            while len(out) < limit:
                t = self.peek(domain)
                if t is None or t.time > bound:
                    break
                heapq.heappop(self._heaps[domain])
                if (t.key, t.tag) not in taken:  # a timer fires once per batch
                    taken.add((t.key, t.tag))
                    out.append(t)
                    del self._by_key[(t.key, t.tag)]
        # Typed-state TTL timers last: state is for the key's other timers first (and a batch
        # out of budget defers them first: they only collect garbage).
        out.sort(key=lambda t: t.tag.startswith(TTL_TAG))
        return out


def pending_timer(k: TimerKey, commit: Commit, due_now: dict[TimerKey, Timer], cancelled: set[TimerKey],
                  index: TimerIndex) -> Timer | None:
    """Timer ``k`` as a batch so far leaves it: set earlier in the batch, firing in it (taken
    out of the index, not cancelled), or pending in the index; None if there is none."""
    t = commit.timers_set.get(k)
    if t is not None:
        return t
    if k in commit.timers_deleted:
        return None
    t = due_now.get(k)
    if t is not None:
        return None if k in cancelled else t
    return index.get(k)


def earliest_set(commit: Commit) -> tuple[dict[bytes, int], int]:
    """Per key, the earliest event-time timer a batch set so far (not a TTL timer), and the
    earliest of a flow's window steps (``flow/<step>/@<time>``: it fires windows of many keys,
    filed under one). A key's TTL firing deletes nothing that expired after either: such a
    timer, firing in the next batch, reads its keys' state as of its own time."""
    out: dict[bytes, int] = {}
    every = END_OF_TIME
    for t in commit.timers_set.values():
        tag = t.tag
        if t.domain != TimeDomain.EVENT_TIME or tag.startswith(TTL_TAG):
            continue
        if t.time < out.get(t.key, END_OF_TIME):
            out[t.key] = t.time
        if tag.startswith(TIMER_PREFIX) and tag.startswith("@", tag.find("/", len(TIMER_PREFIX)) + 1):
            every = min(every, t.time)
    return out, every


def fire_ttl(timer: Timer, ctx: KeyContext, domain: TimeDomain,
             set_before: Callable[[], tuple[dict[bytes, int], int]]) -> None:
    """A key's typed-state TTL timer (runtime/state.py), the state's clock being ``domain``
    (the timer's own, unless an update changed the state's ``ttl_domain``): delete what
    expired by then, and come back at the next expiry, but no sooner than ``ttl_rearm`` (a
    key written on and on is not rescanned each tick).

    Event time: by the timer's time, and not past an event-time timer the batch set earlier
    for the key, nor a window step's (``set_before``: they read in the next batch). Wall
    time: by the clock now (no later call reads what expired by then: each judges at its
    own now), so a timer that fired late (an outage, a busy tablet) catches up at once."""
    if domain == TimeDomain.WALL_TIME:
        upto = at = ctx.now()
    else:
        at = timer.time if timer.domain == domain else min(timer.time, ctx.low_watermark)
        keys, every = set_before()
        upto = min(at, keys.get(timer.key, at), every)
    prefix = cell(timer.key, timer.tag[len(TTL_TAG):])
    room = ctx.expire_room()  # (none: no scan) the batch's budget of deletes is spent: the rest next batch
    gone, nxt = expired(prefix, ctx.cell_scan(prefix), upto, room + 1) if room else (None, None)
    if gone is None or not ctx.delete_expired(gone):
        ctx._set_timer(timer.tag, at, domain)
    elif nxt is not None:
        ctx._set_timer(timer.tag, ttl_rearm(at, nxt, ctx.low_watermark, domain), domain)
