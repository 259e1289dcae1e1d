"""Property tests of the low-watermark math (master/watermarks.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from master.scheduler import Ownership
from master.watermarks import END_OF_TIME, MIN, Settler, TabletReport, compute, publish
from runtime.topology import ComputationSpec

TS = st.integers(min_value=-(10**6), max_value=10**6)


def chain(n: int) -> list[ComputationSpec]:
    """c0 reads "s0" (an injector's stream), c1 reads c0's output, and so on."""
    return [ComputationSpec(f"c{i}", "m:C", {f"s{i}": None}, [f"s{i + 1}"], key_ranges=2) for i in range(n)]


def tablets(specs: list[ComputationSpec], token: int = 1) -> dict[tuple[str, int], Ownership]:
    return {(s.name, r): Ownership("w", token) for s in specs for r in range(s.key_ranges)}


@given(n=st.integers(1, 5), oldest=st.lists(st.one_of(st.none(), TS), min_size=10, max_size=10), inj=TS)
def test_lwm_is_the_min_over_own_work_and_everything_upstream(n: int, oldest: list[int | None], inj: int) -> None:
    specs = chain(n)
    owned = tablets(specs)
    reports = {k: TabletReport(1, oldest[i]) for i, k in enumerate(sorted(owned))}
    result = compute(specs, owned, reports, {"src": ("s0", inj)}, {})
    for i, spec in enumerate(specs):
        upstream = [inj] + [o for (c, _), rep in reports.items()
                            for o in [rep.oldest] if o is not None and int(c[1:]) <= i]
        assert result[spec.name].value == min(upstream)
        if i:
            assert result[spec.name].value <= result[f"c{i - 1}"].value


@given(oldest=TS, published=TS)
def test_a_report_under_a_stale_token_is_ignored(oldest: int, published: int) -> None:
    specs = chain(1)
    owned = tablets(specs, token=2)
    reports = {("c0", 0): TabletReport(1, oldest), ("c0", 1): TabletReport(2, None)}
    result = compute(specs, owned, reports, {"src": ("s0", END_OF_TIME)}, {"c0": published})
    assert result["c0"].value == published  # held where it was, not moved by the stale report
    assert "no recent report" in result["c0"].holder


def test_a_stream_nobody_feeds_holds_its_readers_at_the_minimum() -> None:
    specs = chain(2)
    owned = tablets(specs)
    result = compute(specs, owned, {k: TabletReport(1, None) for k in owned}, {}, {})
    assert result["c0"].value == MIN and "no injector" in result["c0"].holder
    assert result["c1"].value == MIN


def test_finished_injectors_and_idle_tablets_release_everything() -> None:
    specs = chain(3)
    owned = tablets(specs)
    result = compute(specs, owned, {k: TabletReport(1, None) for k in owned}, {"src": ("s0", END_OF_TIME)}, {})
    assert all(w.value == END_OF_TIME for w in result.values())


@given(st.lists(st.lists(TS, min_size=3, max_size=3), min_size=1, max_size=20))
def test_published_watermarks_never_decrease(rounds: list[list[int]]) -> None:
    specs = chain(3)
    owned = tablets(specs)
    published: dict[str, int] = {}
    for values in rounds:
        reports = {k: TabletReport(1, values[int(k[0][1:])]) for k in owned}
        computed = compute(specs, owned, reports, {"src": ("s0", END_OF_TIME)}, published)
        new = publish(computed, published)
        for c, v in new.items():
            assert v >= published.get(c, MIN)
        published = new


@given(st.lists(st.tuples(st.integers(0, 50), TS), min_size=1, max_size=30), st.integers(0, 100))
def test_settler_is_the_min_over_the_settle_window(reports: list[tuple[int, int]], settle: int) -> None:
    s = Settler(settle)
    now = 0
    history = []
    for gap, value in reports:
        now += gap
        s.observe("x", value, now)
        history.append((now, value))
    later = now + 7
    in_force_at_start = [v for t, v in history if t <= later - settle][-1:]
    window = [v for t, v in history if t > later - settle]
    assert s.value("x", later) == min(in_force_at_start + window)
    # Increases wait out the window; a decrease counts at once.
    s.observe("x", MIN, later)
    assert s.value("x", later) == MIN
