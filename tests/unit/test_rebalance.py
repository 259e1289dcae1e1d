"""The rebalancing policy (master/rebalance.py): pure decisions over measured loads."""

from __future__ import annotations

from master.rebalance import LoadMeter, Policy, Rebalancer, candidates

HALF = 1 << 63
POLICY = Policy(hold_s=2, cooldown_s=5, min_rate=100, window_s=2)


def test_a_range_far_above_its_fair_share_is_split_and_the_hottest_first() -> None:
    ranges = {"c": [(0, 0, HALF // 2), (1, HALF // 2, HALF), (2, HALF, 1 << 64)]}
    d = candidates(ranges, {("c", 0): 100.0, ("c", 1): 3000.0, ("c", 2): 2000.0}, 4, POLICY)
    assert [(x.kind, x.ranges) for x in d] == [("split", (1,))]
    assert "fair share" in d[0].reason


def test_an_even_load_or_a_slow_range_is_left_alone() -> None:
    ranges = {"c": [(0, 0, HALF), (1, HALF, 1 << 64)]}
    assert candidates(ranges, {("c", 0): 1000.0, ("c", 1): 1000.0}, 2, POLICY) == []
    # one range holds everything on a 4-worker cluster, but it is below min_rate
    assert candidates({"c": [(0, 0, 1 << 64)]}, {("c", 0): 50.0}, 4, Policy(min_rate=100, merge_below=0)) == []


def test_cold_neighbours_merge_and_the_pair_stays_far_below_the_split_threshold() -> None:
    ranges = {"c": [(0, 0, HALF // 2), (1, HALF // 2, HALF), (2, HALF, 1 << 64)]}
    rates = {("c", 0): 10.0, ("c", 1): 20.0, ("c", 2): 4000.0}
    d = candidates(ranges, rates, 1, POLICY)
    assert [(x.kind, x.ranges) for x in d] == [("merge", (0, 1))]
    merged = candidates({"c": [(3, 0, HALF), (2, HALF, 1 << 64)]}, {("c", 3): 30.0, ("c", 2): 4000.0}, 1, POLICY)
    assert merged == []


def test_a_range_without_a_measured_load_is_waited_for() -> None:
    ranges = {"c": [(0, 0, HALF), (1, HALF, 1 << 64)]}
    assert candidates(ranges, {("c", 0): 5000.0}, 4, POLICY) == []


def test_the_meter_measures_records_per_second_per_token() -> None:
    m = LoadMeter(window_s=2)
    for i in range(5):
        m.observe(("c", 0), 1, i * 500, i * 500.0)
    assert m.rate(("c", 0), 2000.0) == 1000.0
    m.observe(("c", 0), 2, 10, 2500.0)  # a new owner counts from zero
    assert m.rate(("c", 0), 2500.0) is None


def test_decisions_hold_before_they_are_made_then_the_computation_cools_down() -> None:
    r = Rebalancer(POLICY)
    ranges = {"c": [(0, 0, 1 << 64)]}
    t = 0.0
    decided = []
    while t <= 6000:
        r.load.observe(("c", 0), 1, int(t * 5), t)  # 5,000 rec/s on one range, 4 workers
        decided += [(t, d) for d in r.decide(ranges, 4, t)]
        t += 250
        if decided:
            break
    first_at, d = decided[0]
    assert d.kind == "split" and first_at >= 2000 + 1000  # rate known after half a window, then held 2 s
    r.done(d, [1, 2], first_at)
    halves = {"c": [(1, 0, HALF), (2, HALF, 1 << 64)]}
    for t in range(int(first_at), int(first_at) + 4000, 250):
        r.load.observe(("c", 1), 2, t * 5, float(t))
        r.load.observe(("c", 2), 2, t * 5, float(t))
        assert r.decide(halves, 4, float(t)) == []  # cooling down


def test_a_split_that_did_not_divide_the_load_is_not_split_again() -> None:
    r = Rebalancer(POLICY)
    d = candidates({"c": [(0, 0, 1 << 64)]}, {("c", 0): 5000.0}, 4, POLICY)[0]
    r.done(d, [1, 2], 0.0)
    halves = {"c": [(1, 0, HALF), (2, HALF, 1 << 64)]}
    for t in range(0, 20000, 250):
        r.load.observe(("c", 1), 2, t * 5, float(t))   # one hot key: all of it here
        r.load.observe(("c", 2), 2, 0, float(t))
        assert all(x.ranges != (1,) for x in r.decide(halves, 4, float(t)))
    assert ("c", 1) in r.stuck
