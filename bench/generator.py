"""Deterministic, seeded input data for the benchmarks, and the exact oracles.

Every workload draws from :class:`ZipfKeys` (10,000 distinct keys by default,
exponent 1.1) with a fixed seed, so a run of millstream and a run of the Spark
peer see exactly the same records in the same order.
"""

from __future__ import annotations

import bisect
import itertools
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

SECOND_US = 1_000_000
EWMA_ALPHA = 0.3
SPIKE_FACTOR = 3.0
SPIKE_MARGIN = 5.0


def key_name(i: int) -> bytes:
    return b"k%05d" % i


class ZipfKeys:
    """Draws key indices 0..n-1 with P(i) proportional to 1 / (i+1)**s."""

    def __init__(self, n: int = 10_000, s: float = 1.1, seed: int = 42) -> None:
        self.n = n
        weights = [1.0 / (i + 1) ** s for i in range(n)]
        self._cum = list(itertools.accumulate(weights))
        self._total = self._cum[-1]
        self._rng = random.Random(seed)

    def draw(self) -> int:
        return bisect.bisect_left(self._cum, self._rng.random() * self._total)

    def keys(self, count: int) -> list[bytes]:
        return [key_name(self.draw()) for _ in range(count)]


def w1_keys(rate: int, seconds: float, seed: int = 42, n_keys: int = 10_000) -> list[bytes]:
    """The keys of a W1 run, in send order (record i is due at ``i / rate`` s)."""
    return ZipfKeys(n_keys, seed=seed).keys(int(rate * seconds))


# ------------------------------------------------------------------ W2


@dataclass(frozen=True)
class W2Data:
    """W2's input: keys and event times (µs) in send order, plus its parameters."""

    keys: list[bytes]
    timestamps: list[int]
    start_us: int
    events_per_second: int
    disorder_us: int

    def watermark_after(self, i: int) -> int:
        """The injector watermark once records ``0..i`` are sent (bounded disorder)."""
        return self.start_us + (i * SECOND_US) // self.events_per_second - self.disorder_us


def w2_data(total: int = 2_000_000, events_per_second: int = 20_000, disorder_s: float = 2.0,
            seed: int = 7, n_keys: int = 10_000, spikes: int = 40) -> W2Data:
    """Zipf-keyed records, ``events_per_second`` of event time each second, each record
    displaced up to ``disorder_s`` seconds into the past; ``spikes`` bursts (one key, one
    second, 50..200 extra records) are mixed in so the detector has something to find."""
    rng = random.Random(seed)
    zipf = ZipfKeys(n_keys, seed=seed)
    start = 1_700_000_000 * SECOND_US
    disorder = int(disorder_s * SECOND_US)
    seconds = max(1, total // events_per_second)
    bursts: dict[int, list[tuple[int, int]]] = {}
    for _ in range(spikes):
        sec = rng.randrange(5, max(6, seconds - 1))
        bursts.setdefault(sec, []).append((rng.randrange(50, n_keys), rng.randrange(50, 200)))
    keys: list[bytes] = []
    stamps: list[int] = []
    step = SECOND_US / events_per_second
    for i in range(total):
        nominal = start + int(i * step)
        sec = (nominal - start) // SECOND_US
        burst = bursts.get(sec)
        k = zipf.draw()
        if burst and rng.random() < 0.02:  # a burst record takes this slot
            j = rng.randrange(len(burst))
            k, left = burst[j]
            burst[j] = (k, left - 1)
            if left <= 1:
                burst.pop(j)
        keys.append(key_name(k))
        stamps.append(nominal - rng.randrange(disorder))
    return W2Data(keys, stamps, start, events_per_second, disorder)


def window_of(ts: int) -> int:
    """The start (µs) of the one-second tumbling window holding ``ts``."""
    return ts - ts % SECOND_US


def spike_step(ewma: float | None, count: int) -> tuple[bool, float]:
    """One window of one key: (is it a spike?, the new EWMA). Shared by job and oracle."""
    spike = ewma is not None and count > SPIKE_FACTOR * ewma + SPIKE_MARGIN
    new = float(count) if ewma is None else EWMA_ALPHA * count + (1 - EWMA_ALPHA) * ewma
    return spike, new


@dataclass(frozen=True)
class W2Oracle:
    windows: dict[tuple[bytes, int], int]   # (key, window start) -> count
    spikes: set[tuple[bytes, int]]


def w2_oracle(data: W2Data) -> W2Oracle:
    windows = Counter(zip(data.keys, (window_of(t) for t in data.timestamps), strict=True))
    per_key: dict[bytes, list[tuple[int, int]]] = {}
    for (k, w), c in windows.items():
        per_key.setdefault(k, []).append((w, c))
    spikes: set[tuple[bytes, int]] = set()
    for k, ws in per_key.items():
        ewma: float | None = None
        for w, c in sorted(ws):
            spike, ewma = spike_step(ewma, c)
            if spike:
                spikes.add((k, w))
    return W2Oracle(dict(windows), spikes)


def iter_w1(keys: list[bytes]) -> Iterator[tuple[int, bytes]]:
    yield from enumerate(keys)
