"""examples/windows.py: the flow version and the classic WindowedComputation count the same
windows, in process (runtime.testing.TestRun), against a plain-Python oracle."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from examples import windows
from runtime import Topology
from runtime.testing import TestRun

SECOND = windows.WINDOW_US
T0 = 1_700_000_000_000_000


def _events(seed: int) -> list[list[tuple[bytes, int, bool]]]:
    """Rounds of (key, timestamp, on time) over 20 s: each round a second of records on a few
    keys, shuffled, plus some late ones at least 2 s behind the watermark the round ends with."""
    rng = random.Random(seed)
    rounds = []
    for second in range(20):
        batch = [(b"k%d" % rng.randrange(5), T0 + second * SECOND + rng.randrange(SECOND), True)
                 for _ in range(rng.randrange(1, 30))]
        if second >= 3:
            batch += [(b"k%d" % rng.randrange(5), T0 + rng.randrange((second - 2) * SECOND), False)
                      for _ in range(rng.randrange(3))]
        rng.shuffle(batch)
        rounds.append(batch)
    return rounds


def _oracle(rounds: list[list[tuple[bytes, int, bool]]]) -> Counter[tuple[bytes, bytes, int]]:
    counts: Counter[tuple[bytes, int]] = Counter()
    for batch in rounds:
        for key, ts, on_time in batch:
            if on_time:
                counts[(key, ts - (ts - T0) % SECOND)] += 1
    return Counter({(k, f"{start},{n}".encode(), start + SECOND): 1 for (k, start), n in counts.items()})


def _run(topo: Topology, rounds: list[list[tuple[bytes, int, bool]]], late_stream: str,
         restart: bool) -> tuple[Counter[tuple[bytes, bytes, int]], int]:
    with TestRun(topo) as run:
        for i, batch in enumerate(rounds):
            for key, ts, _ in batch:
                run.inject("events", key, b"", ts)
            # Every record of this second is in: the watermark moves to its end.
            run.advance_watermark("events", T0 + (i + 1) * SECOND)
            run.run_until_idle()
            if restart and i == len(rounds) // 2:
                for computation in list(run.topology.computations):
                    run.restart(computation)
        run.finish("events")
        run.run_until_idle()
        got = Counter((r.key, r.value, r.timestamp) for r in run.output("window_counts"))
        return got, len(run.output(late_stream))


@pytest.mark.parametrize("seed", [1, 2])
def test_the_flow_and_the_classic_windows_count_what_the_oracle_counts(seed: int, tmp_path: Path) -> None:
    rounds = _events(seed)
    expected = _oracle(rounds)
    late = sum(not on_time for batch in rounds for _, _, on_time in batch)
    assert len(expected) > 50 and late > 5  # the check means something

    flow = windows.flow(str(tmp_path), name="winflow", key_ranges=3).topology()
    assert list(flow.computations) == ["winflow.counts"]  # window, format and sink fused: one stage
    classic = windows.topology("/nonexistent-not-used", name="win", key_ranges=3).without("window_sink")

    assert _run(flow, rounds, "winflow.counts.late", restart=False) == (expected, late)
    assert _run(flow, rounds, "winflow.counts.late", restart=True) == (expected, late)
    assert _run(classic, rounds, "window_counter.late", restart=False) == (expected, late)
