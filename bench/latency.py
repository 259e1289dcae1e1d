"""Open-loop paced injection and the arrival-time collector.

The sender hands record ``i`` to the injector at its scheduled instant
``t0 + i / rate`` (an open loop: a slow cluster does not slow the schedule). Each
record's value is its *scheduled* time in ``time.time_ns()`` nanoseconds, so a
stall shows up in full in the latencies (no coordinated omission). By default the
sender flushes after every tick — flush blocks until the tablets have committed —
and whatever fell due meanwhile forms the next batch, so batches stay small at low
load and grow only as far as the cluster needs. With ``flush_each_tick=False`` it
only calls ``send()``, as a user's loop would, and the injector's linger decides when
records leave.

All processes run on one machine, so ``time.time_ns()`` is one clock for the
sender, the workers and the collector.
"""

from __future__ import annotations

import glob
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from injectors import Injector

WATERMARK_EVERY_NS = 50_000_000


@dataclass
class SendStats:
    sent: int = 0
    flushes: int = 0
    max_batch: int = 0
    max_behind_ms: float = 0.0  # how far the sender fell behind its schedule
    start_ns: int = 0
    end_ns: int = 0
    per_key: Counter[bytes] = field(default_factory=Counter)


def paced_send(masters: str, stream: str, name: str, keys: list[bytes], rate: int,
               *, event_time: bool = True, stop: threading.Event | None = None,
               on_progress: Callable[[int], None] | None = None, flush_each_tick: bool = True) -> SendStats:
    """Send ``keys`` at ``rate`` records/s; returns once every record is committed."""
    stats = SendStats()
    period_ns = 1_000_000_000 / rate
    inj = (Injector(masters, stream, name, batch_size=1 << 30, timeout=120)
           if flush_each_tick else Injector(masters, stream, name, timeout=120))
    try:
        t0 = time.time_ns() + 50_000_000
        stats.start_ns = t0
        i, n = 0, len(keys)
        next_report = 0
        while i < n and not (stop is not None and stop.is_set()):
            now = time.time_ns()
            due = t0 + int(i * period_ns)
            if due > now:
                time.sleep(min((due - now) / 1e9, 0.0005))
                continue
            start = i
            while i < n:
                due = t0 + int(i * period_ns)
                if due > now:
                    break
                inj.send(keys[i], b"%d" % due, due // 1000 if event_time else now // 1000)
                i += 1
            stats.max_behind_ms = max(stats.max_behind_ms, (now - (t0 + int(start * period_ns))) / 1e6)
            if flush_each_tick:
                inj.flush()
            if now >= next_report:
                # Everything before the next record's time is committed: promise that. Not
                # after every flush: reporting a watermark costs a round trip to the master.
                inj.advance_watermark((t0 + int(i * period_ns)) // 1000)
                next_report = now + WATERMARK_EVERY_NS
            stats.flushes += 1
            stats.max_batch = max(stats.max_batch, i - start)
            if on_progress is not None:
                on_progress(i)
        stats.sent = i
        stats.per_key.update(keys[:i])
        inj.finish()
    finally:
        inj.close()
        stats.end_ns = time.time_ns()
    return stats


@dataclass(frozen=True)
class Arrival:
    key: bytes
    count: int
    sched_ns: int
    arrival_ns: int
    stamps: tuple[int, ...] = ()  # when each W1 stage's user code saw the record

    @property
    def latency_ms(self) -> float:
        return (self.arrival_ns - self.sched_ns) / 1e6


def read_arrivals(path: str) -> list[Arrival]:
    """Every line the :class:`bench.jobs.ArrivalSink` tablets under ``path`` committed."""
    out = []
    for name in sorted(glob.glob(os.path.join(path, "*.txt"))):
        with open(name, "rb") as f:
            for line in f:
                k, sched, n, arr = line.split()
                times = [int(t) for t in sched.split(b",")]
                out.append(Arrival(k, int(n), times[0], int(arr), tuple(times[1:])))
    return out


def hops(arrivals: Iterable[Arrival]) -> list[dict[str, object]]:
    """Where a W1 record's time goes: p50 and p99 (ms) of each hop between the scheduled
    send, each stage's user code and the sink's. The first hop holds the injector (its
    linger), the delivery and stage 1's queue; each next one the previous stage's batch,
    fsynced commit, replication and production, and the next stage's queue."""
    xs = [a for a in arrivals if a.stamps]
    if not xs:
        return []
    n = min(len(a.stamps) for a in xs)
    names = ["send → stage 1", *(f"stage {i} → stage {i + 1}" for i in range(1, n)), f"stage {n} → sink"]
    out: list[dict[str, object]] = []
    for i, name in enumerate(names):
        def hop(a: Arrival, i: int = i) -> float:
            times = (a.sched_ns, *a.stamps[:n], a.arrival_ns)
            return (times[i + 1] - times[i]) / 1e6
        pc = percentiles(hop(a) for a in xs)
        out.append({"hop": name, "p50": pc["p50"], "p99": pc["p99"]})
    return out


def count_lines(path: str) -> int:
    n = 0
    for name in glob.glob(os.path.join(path, "*.txt")):
        with open(name, "rb") as f:
            n += sum(1 for _ in f)
    return n


def percentiles(values: Iterable[float], ps: Iterable[float] = (50, 95, 99)) -> dict[str, float]:
    """Nearest-rank percentiles (and max) of ``values``, rounded to 0.01."""
    xs = sorted(values)
    if not xs:
        return {}
    out = {}
    for p in ps:
        rank = max(1, -(-int(p * len(xs)) // 100))
        out[f"p{p:g}"] = round(xs[min(len(xs), rank) - 1], 2)
    out["max"] = round(xs[-1], 2)
    out["mean"] = round(sum(xs) / len(xs), 2)
    return out


@dataclass(frozen=True)
class ExactnessCheck:
    """Did every sent record produce exactly one output, with counts 1..n per key?"""

    expected: int
    observed: int
    lost: int
    doubled: int
    keys_wrong: int

    @property
    def exact(self) -> bool:
        return self.lost == 0 and self.doubled == 0 and self.keys_wrong == 0


def check_exact(arrivals: list[Arrival], sent: Counter[bytes]) -> ExactnessCheck:
    seen: dict[bytes, Counter[int]] = {}
    for a in arrivals:
        seen.setdefault(a.key, Counter())[a.count] += 1
    lost = doubled = wrong = 0
    for key, n in sent.items():
        got = seen.get(key, Counter())
        missing = sum(1 for c in range(1, n + 1) if c not in got)
        extra = sum(v - 1 for v in got.values() if v > 1) + sum(v for c, v in got.items() if c > n)
        lost += missing
        doubled += extra
        wrong += bool(missing or extra)
    wrong += sum(1 for k in seen if k not in sent)
    return ExactnessCheck(sum(sent.values()), len(arrivals), lost, doubled, wrong)


def latency_timeline(arrivals: list[Arrival], origin_ns: int, bucket_ms: int = 250) -> list[tuple[float, float]]:
    """``(seconds since origin, max latency ms)`` per bucket of scheduled time."""
    buckets: dict[int, float] = {}
    for a in arrivals:
        b = (a.sched_ns - origin_ns) // (bucket_ms * 1_000_000)
        buckets[b] = max(buckets.get(b, 0.0), a.latency_ms)
    return [(round(b * bucket_ms / 1000, 3), round(v, 2)) for b, v in sorted(buckets.items())]


@dataclass(frozen=True)
class SpikeSeen:
    key: bytes
    window: int
    count: int
    arrival_ns: int


def read_spikes(path: str) -> list[SpikeSeen]:
    """The spikes W2's :class:`bench.jobs.ArrivalSink` committed under ``path``."""
    out = []
    for name in sorted(glob.glob(os.path.join(path, "*.txt"))):
        with open(name, "rb") as f:
            for line in f:
                k, w, c, arr = line.split()
                out.append(SpikeSeen(k, int(w), int(c), int(arr)))
    return out
