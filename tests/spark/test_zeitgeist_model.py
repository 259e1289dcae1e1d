"""The Zeitgeist computations, driven by a small event-time simulator (no cluster, no Spark).

The simulator follows DESIGN.md §7: a computation's low watermark is the
minimum of its input's watermark and its own pending event-time timers; a
timer fires once the watermark reaches it; productions are delivered before
the downstream watermark moves. Whatever the arrival order, batching and
watermark lag, the alerts must equal the batch rule (``reference_alerts``).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from examples import zeitgeist as z
from runtime.computation import Computation, Context, State, TimeDomain
from runtime.record import Record

END = (1 << 63) - 1
MIN = -(1 << 63)


class _State(State):
    def __init__(self, store: dict[bytes, bytes], key: bytes) -> None:
        self.store, self.key = store, key

    def get(self) -> bytes | None:
        return self.store.get(self.key)

    def set(self, value: bytes) -> None:
        assert isinstance(value, bytes)
        self.store[self.key] = value

    def clear(self) -> None:
        self.store.pop(self.key, None)


@dataclass
class SimComputation:
    """One computation (all its keys) with state, timers and a watermark."""

    comp: Computation
    state: dict[bytes, bytes] = field(default_factory=dict)
    timers: dict[tuple[bytes, str], int] = field(default_factory=dict)
    out: list[tuple[str, bytes, bytes, int]] = field(default_factory=list)
    watermark: int = MIN

    def ctx(self, key: bytes, ts: int) -> Context:
        sim = self

        class Ctx(Context):
            @property
            def key(self) -> bytes:
                return key

            @property
            def state(self) -> State:
                return _State(sim.state, key)

            @property
            def low_watermark(self) -> int:
                return sim.watermark

            @property
            def tablet(self) -> str:
                return "model/0"

            @property
            def sequencer_token(self) -> int:
                return 1

            def produce(self, stream: str, value: bytes, *, key: bytes | None = None,
                        timestamp: int | None = None) -> None:
                t = ts if timestamp is None else timestamp
                assert t >= sim.watermark, "a production must not be late downstream"
                sim.out.append((stream, key if key is not None else self_key, value, t))

            def set_timer(self, tag: str, time: int, domain: TimeDomain = TimeDomain.EVENT_TIME) -> None:
                assert domain == TimeDomain.EVENT_TIME
                sim.timers[(key, tag)] = time

            def delete_timer(self, tag: str) -> None:
                sim.timers.pop((key, tag), None)

            def now(self) -> int:
                return 0

        self_key = key
        return Ctx()

    def record(self, r: Record) -> None:
        if r.timestamp < self.watermark:
            raise AssertionError(f"late record {r} below {self.watermark}")
        self.comp.process_record(self.ctx(r.key, r.timestamp), r)

    def advance(self, input_wm: int, rng: random.Random) -> None:
        """Move the watermark (maybe lagging, never backwards) and fire the due timers."""
        while True:
            own = min(self.timers.values(), default=END)
            target = min(input_wm, own)
            if rng.random() < 0.3 and target > self.watermark and target != END:
                target = rng.randint(self.watermark if self.watermark > MIN else target - 5_000_000, target)
            self.watermark = max(self.watermark, target)
            due = sorted((t, k, tag) for (k, tag), t in self.timers.items() if t <= self.watermark)
            if not due:
                return
            for t, k, tag in due:
                del self.timers[(k, tag)]
                self.comp.process_timer(self.ctx(k, t), tag, t)


def simulate(events: list[tuple[str, int]], seed: int, batch: int = 50) -> tuple[list, list[z.Alert]]:
    rng = random.Random(seed)
    wc_comp, model_comp = z.WindowCounter(), z.ModelCalculator()
    wc_comp.setup({"windows": "w"})
    model_comp.setup({"alerts": "a"})
    wc, model = SimComputation(wc_comp), SimComputation(model_comp)
    # Arrival order: bounded disorder of up to 2 s.
    arrival = sorted(events, key=lambda e: e[1] + rng.randint(0, 2_000_000))
    windows: list[dict] = []
    for i in range(0, len(arrival) + 1, batch):
        chunk = arrival[i:i + batch]
        for _n, (q, ts) in enumerate(chunk):
            wc.record(Record(q.encode(), b"", ts, bytes(16)))
        rest = arrival[i + batch:]
        injector_wm = min((ts for _, ts in rest), default=END)
        for _ in range(3):  # watermarks flow down the pipeline, windows with them
            wc.advance(injector_wm, rng)
            for _stream, key, value, ts in wc.out:
                windows.append(json.loads(value))
                model.record(Record(key, value, ts, bytes(16)))
            wc.out.clear()
            model.advance(wc.watermark, rng)
    for _ in range(10_000):
        if not wc.timers and not model.timers:
            break
        wc.advance(END, rng)
        for _stream, key, value, ts in wc.out:
            windows.append(json.loads(value))
            model.record(Record(key, value, ts, bytes(16)))
        wc.out.clear()
        model.advance(wc.watermark, rng)
    assert not model.timers, "the model judged every second"
    assert not wc.timers and not wc.state, "every window was emitted"
    alerts = [z.Alert(**json.loads(v)) for _, _, v, _ in model.out]
    return windows, sorted(alerts)


def _events(rng: random.Random, seconds: int, base: int = 1_700_000_000) -> list[tuple[str, int]]:
    out = []
    rates = {"head": 40, "mid": 6, "tail": 1}
    for s in range(seconds):
        for q, rate in rates.items():
            n = rng.randint(0, 2 * rate)
            if q == "head" and 30 <= s < 34:
                n = rng.randint(0, 3)  # a dip
            if q == "mid" and 20 <= s < 23:
                n += 50  # a spike
            if q == "tail" and s in (5, 6, 40):
                n = 0
            out += [(q, (base + s) * z.SECOND + rng.randint(0, z.SECOND - 1)) for _ in range(n)]
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_streaming_alerts_equal_the_batch_rule(seed: int) -> None:
    rng = random.Random(seed)
    events = _events(rng, seconds=60)
    windows, alerts = simulate(events, seed)
    counts = z.reference_counts(events)
    assert sorted((w["query"], w["second"], w["count"]) for w in windows) == sorted(
        (q, s, c) for q, by in counts.items() for s, c in by.items())
    want = z.reference_alerts(counts)
    assert alerts == want
    kinds = {(a.query, a.kind) for a in want}
    assert ("mid", "spike") in kinds and ("head", "dip") in kinds


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 40), st.integers(0, 60)), max_size=40),
       st.integers(0, 1000))
def test_any_traffic_shape(shape: list[tuple[str, int, int]], seed: int) -> None:
    """Bursts of ``n`` queries for ``q`` in second ``s``, any order: same windows, same alerts."""
    rng = random.Random(seed)
    events = [(q, (1000 + s) * z.SECOND + rng.randint(0, z.SECOND - 1)) for q, s, n in shape for _ in range(n)]
    windows, alerts = simulate(events, seed, batch=rng.choice([1, 7, 100]))
    assert alerts == z.reference_alerts(z.reference_counts(events))


def test_rule() -> None:
    assert z.expected_count([5, 1, 9, 3, 7, 2, 8, 4, 6]) == 5
    assert z.classify(25, 5) == "spike" and z.classify(24, 5) is None
    assert z.classify(4, 20) == "dip" and z.classify(5, 20) is None
    assert z.classify(0, 19) is None  # too little traffic to call a dip
