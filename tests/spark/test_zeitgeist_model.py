"""The Zeitgeist computations on the test kit (the real worker, virtual time; no cluster, no
Spark): whatever the arrival order, batching and watermark lag, the windows equal the
per-second counts and the alerts equal the batch rule (``reference_alerts``)."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from examples import zeitgeist as z
from runtime.testing import TestRun


def simulate(events: list[tuple[str, int]], seed: int, batch: int = 50) -> tuple[list, list[z.Alert]]:
    """Inject ``events`` with up to 2 s of disorder, ``batch`` at a time; after each batch the
    input watermark moves somewhere between where it was and what the rest allows (a lagging
    injector), and the run settles."""
    rng = random.Random(seed)
    topo = z.topology("/nonexistent-not-used", name="zg", key_ranges=2)
    for sink in ("zg.windows_sink", "zg.alerts_sink"):
        del topo.computations[sink]
    arrival = sorted(events, key=lambda e: e[1] + rng.randint(0, 2_000_000))
    with TestRun(topo) as run:
        wm = -(1 << 63)
        for i in range(0, len(arrival), batch):
            for q, ts in arrival[i:i + batch]:
                run.inject("queries", q.encode(), b"", ts)
            allowed = min((ts for _, ts in arrival[i + batch:]), default=None)
            if allowed is not None and allowed > wm:
                wm = allowed if rng.random() < 0.7 else rng.randint(max(wm, allowed - 5_000_000), allowed)
                run.advance_watermark("queries", wm)
            run.run_until_idle()
        run.finish("queries")
        run.run_until_idle()
        windows = [json.loads(r.value) for r in run.output("zg.windows")]
        alerts = sorted(z.Alert(**json.loads(r.value)) for r in run.output("zg.alerts"))
        assert run.output("zg.window_counter.late") == [] and run.output("zg.model.late") == []
    return windows, alerts


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


@settings(max_examples=25, deadline=None)
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
