"""Event-time windows (runtime/windows.py) against an oracle, with disorder and late data,
through the test kit (the real worker, virtual time)."""

from __future__ import annotations

import datetime
import json
import random
import re
from typing import Any

import pytest

from runtime import Dataflow, Record, Topology, codecs
from runtime.errors import MillstreamError, UsageError
from runtime.flows.assigners import MAX_SPAN, MAX_WINDOWS_PER_RECORD
from runtime.state import TYPED
from runtime.testing import TestRun
from runtime.windows import SECOND, Count, Mean, Session, Sliding, Sum, Tumbling, WindowedComputation

T0 = 1_700_000_000_000_000


class TumblingCounts(WindowedComputation):
    windows = Tumbling(SECOND, allowed_lateness=SECOND // 2)
    aggregator = Count()
    output = "counts"


class SlidingSums(WindowedComputation):
    windows = Sliding(2 * SECOND, SECOND)
    aggregator = Sum()
    output = "counts"

    def value(self, record: Record) -> int:
        return int(record.value)


class Sessions(WindowedComputation):
    windows = Session(SECOND)
    aggregator = Count()
    output = "counts"

    def on_window(self, ctx, start, end, acc):  # type: ignore[no-untyped-def]
        ctx.produce("counts", f"{start},{end},{acc}".encode(), timestamp=self.fired_at(end))


def _events(n: int, seed: int) -> list[tuple[bytes, int, int]]:
    """(key, timestamp, value) about 100 ms apart, shuffled within 3 s, a few of them far behind."""
    rng = random.Random(seed)
    out = [(b"k%d" % rng.randrange(3), T0 + i * 100_000 + rng.randrange(3 * SECOND), rng.randrange(10))
           for i in range(n)]
    for i in range(0, n, 37):  # late data: far behind everything else
        out[i] = (out[i][0], out[i][1] - 20 * SECOND, out[i][2])
    return out


def _run(code: str, events: list[tuple[bytes, int, int]], chunk: int = 20) -> tuple[TestRun, list[int]]:
    """Inject in chunks; after each, the input watermark moves to 3 s behind the newest base
    time and the run settles. Returns the run and the watermark each chunk's records saw."""
    topo = Topology("w").add_computation("win", code, inputs={"in": None}, outputs=["counts"])
    run = TestRun(topo)
    seen, wm = [], -(1 << 63)
    for lo in range(0, len(events), chunk):
        for key, ts, v in events[lo:lo + chunk]:
            run.inject("in", key, str(v).encode(), ts)
        seen.append(wm)
        wm = T0 + (lo + chunk) * 100_000 - 3 * SECOND
        run.advance_watermark("in", wm)
        run.run_until_idle()
    run.finish("in")
    run.run_until_idle()
    return run, seen


def _fixed_oracle(events, seen, assign, lateness, chunk=20, agg=lambda vs: len(vs)):  # type: ignore[no-untyped-def]
    windows: dict[tuple[bytes, int, int], list[int]] = {}
    late = 0
    for i, (key, ts, v) in enumerate(events):
        wm = seen[i // chunk]
        live = [(s, e) for s, e in assign(ts) if e + lateness > wm]
        if not live:
            late += 1
        for s, e in live:
            windows.setdefault((key, s, e), []).append(v)
    return {(k, e + lateness): str(agg(vs)).encode() for (k, s, e), vs in windows.items()}, late


def _got(run: TestRun) -> dict[tuple[bytes, int], bytes]:
    out: dict[tuple[bytes, int], bytes] = {}
    for r in run.output("counts"):
        assert (r.key, r.timestamp) not in out, f"window {(r.key, r.timestamp)} fired twice"
        out[(r.key, r.timestamp)] = r.value
    return out


def test_tumbling_windows_with_allowed_lateness_equal_the_oracle() -> None:
    events = _events(400, seed=1)
    run, seen = _run("tests.unit.test_windows:TumblingCounts", events)
    with run:
        expected, late = _fixed_oracle(events, seen, Tumbling(SECOND).assign, SECOND // 2)
        assert _got(run) == expected
        assert len(run.output("win.late")) == late and late > 0


def test_sliding_windows_sum_equal_the_oracle() -> None:
    events = _events(300, seed=2)
    run, seen = _run("tests.unit.test_windows:SlidingSums", events)
    with run:
        expected, late = _fixed_oracle(events, seen, Sliding(2 * SECOND, SECOND).assign, 0, agg=sum)
        assert _got(run) == expected
        assert len(run.output("win.late")) == late


def _session_oracle(events, seen, gap, chunk=20):  # type: ignore[no-untyped-def]
    """Sessions simulated chunk by chunk: a record whose own [ts, ts + gap) has expired is
    late; the others join every open session they overlap; sessions fire once the watermark
    passes their end."""
    open_: dict[bytes, list[list[int]]] = {}
    fired: list[tuple[bytes, int, int, int]] = []
    late = 0
    for c in range(0, len(events), chunk):
        wm = seen[c // chunk]
        for key, ts, _ in events[c:c + chunk]:
            if ts + gap <= wm:
                late += 1
                continue
            s, e, n = ts, ts + gap, 1
            rest = []
            for w in open_.get(key, []):
                if w[0] < e and s < w[1]:
                    s, e, n = min(s, w[0]), max(e, w[1]), n + w[2]
                else:
                    rest.append(w)
            # a merge can make it overlap more: repeat until stable
            changed = True
            while changed:
                changed, keep = False, []
                for w in rest:
                    if w[0] < e and s < w[1]:
                        s, e, n, changed = min(s, w[0]), max(e, w[1]), n + w[2], True
                    else:
                        keep.append(w)
                rest = keep
            open_[key] = [*rest, [s, e, n]]
        nxt = seen[c // chunk + 1] if c // chunk + 1 < len(seen) else None
        wm_after = nxt if nxt is not None else (1 << 63) - 1
        for key, ws in open_.items():
            fired += [(key, w[0], w[1], w[2]) for w in ws if w[1] <= wm_after]
            open_[key] = [w for w in ws if w[1] > wm_after]
    for key, ws in open_.items():
        fired += [(key, w[0], w[1], w[2]) for w in ws]
    return {(k, e): f"{s},{e},{n}".encode() for k, s, e, n in fired}, late


def test_session_windows_merge_across_out_of_order_records() -> None:
    events = _events(300, seed=3)
    run, seen = _run("tests.unit.test_windows:Sessions", events)
    with run:
        expected, late = _session_oracle(events, seen, SECOND)
        assert _got(run) == expected
        assert len(run.output("win.late")) == late


def everything(record: Record) -> bytes:
    return b"all"


class Total(WindowedComputation):
    """The second stage: sums the first stage's per-key counts per window, keyed by nothing."""

    windows = Tumbling(SECOND)
    aggregator = Sum()
    output = "totals"

    def value(self, record: Record) -> int:
        return int(record.value)


def test_window_results_are_never_late_for_the_next_windowed_stage() -> None:
    """Results are stamped when their window fires; stamped earlier (the window's end - 1),
    they fall below the watermark the pending window published, and the next stage counts
    them late and drops them."""
    topo = (Topology("two")
            .add_computation("win", "tests.unit.test_windows:TumblingCounts", inputs={"in": None},
                             outputs=["counts"])
            .add_computation("total", "tests.unit.test_windows:Total", inputs={"counts": "tests.unit.test_windows:everything"},
                             outputs=["totals"], late_records="drop"))
    events = [(b"k%d" % (i % 5), T0 + i * 50_000) for i in range(200)]  # 10 s of events
    with TestRun(topo) as run:
        for i, (key, ts) in enumerate(events):
            run.inject("in", key, b"", ts)
            if i % 20 == 19:
                run.advance_watermark("in", ts)
                run.run_until_idle()
        run.finish("in")
        run.run_until_idle()
        assert run.output("total.late") == []
        totals = sorted(float(r.value) for r in run.output("totals"))
        assert sum(totals) == len(events), "every count reached the second stage"


def test_bad_window_options_are_refused() -> None:
    with pytest.raises(MillstreamError, match="period must be > 0 and at most size"):
        Sliding(SECOND, 2 * SECOND)
    with pytest.raises(MillstreamError, match="allowed_lateness=-1 must be a non-negative int"):
        Tumbling(SECOND, allowed_lateness=-1)


@pytest.mark.parametrize("make, says", [
    (lambda: Tumbling(2**64), "size=18446744073709551616 is longer than"),
    (lambda: Session(datetime.timedelta(days=10**8)), "gap=datetime.timedelta(days=100000000) is longer than"),
    (lambda: Tumbling(SECOND, allowed_lateness=2**63), "allowed_lateness=9223372036854775808 is longer than"),
    (lambda: Sliding(2**63, 2**62), "size=9223372036854775808 is longer than"),
    (lambda: Sliding(3600 * SECOND, 1), "puts every record in 3,600,000,000 windows"),
    (lambda: Sliding(20_001, 2), "puts every record in 10,001 windows"),  # (some records: rounded up)
])
def test_spans_that_cannot_be_stored_or_would_not_end_are_refused_when_made(make: Any, says: str) -> None:
    """A size, gap or lateness past 64 bits of event time was accepted and then dead-lettered
    every record with an error about a timer's time; a sliding window of a microsecond's period
    over an hour made 3.6 billion windows for each record (a stage that never came back)."""
    with pytest.raises(MillstreamError, match=re.escape(says)):
        make()
    assert Tumbling(MAX_SPAN).size == MAX_SPAN and len(Sliding(MAX_WINDOWS_PER_RECORD, 1).assign(5)) == MAX_WINDOWS_PER_RECORD


def test_interval_join_bounds_past_64_bits_are_refused_when_the_step_is_added() -> None:
    flow = Dataflow("ij")
    left = flow.input("l", keyed=True)
    right = flow.input("r", keyed=True)
    with pytest.raises(UsageError, match="lower=-9223372036854775808 is further than"):
        left.interval_join(right, -(2**63), 0)
    with pytest.raises(UsageError, match="upper=8640000000000000000 is further than"):
        left.interval_join(right, 0, datetime.timedelta(days=10**8))
    left.interval_join(right, -MAX_SPAN, MAX_SPAN)


class FragileCounts(WindowedComputation):
    windows = Tumbling(SECOND)
    aggregator = Count()
    output = "counts"

    def value(self, record: Record) -> bytes:
        if record.value == b"boom":
            raise ValueError("cannot count this one")
        return record.value


def test_a_record_whose_value_raises_leaves_the_windows_before_it_to_fire() -> None:
    """Review of the flows: WindowedComputation never committed its window step's due index,
    so undoing one failed call undid every window it had noted since the tablet opened: they
    no longer fired until a reopen."""
    topo = Topology("w").add_computation("win", "tests.unit.test_windows:FragileCounts", inputs={"in": None},
                                          outputs=["counts"])
    with TestRun(topo) as run:
        run.inject("in", b"a", b"x", T0)
        run.run_until_idle()
        run.inject("in", b"a", b"boom", T0 + 1)  # the same tablet
        run.run_until_idle()
        run.finish("in")
        run.run_until_idle()
        assert [(r.key, r.value) for r in run.output("counts")] == [(b"a", b"1")]
        assert len(run.output("win.dead_letter")) == 1


class CheckedCounts(WindowedComputation):
    """Its own process_record, which raises after the base class counted the record."""

    windows = Tumbling(SECOND)
    aggregator = Count()
    output = "counts"

    def process_record(self, ctx: Any, record: Record) -> None:
        super().process_record(ctx, record)
        if record.value == b"boom":
            raise ValueError("checked after counting")


def test_a_subclass_that_raises_after_counting_loses_no_window_and_counts_nothing_twice() -> None:
    """Review of the index commit: committed per record inside one worker call, a later
    record's failure undid the call's writes (the first record's window and its timer) while
    the window step kept them in memory: the retried first record found its window noted,
    set no timer, and the window never fired (or, raising in the subclass, counted twice)."""
    topo = Topology("w").add_computation("win", "tests.unit.test_windows:CheckedCounts", inputs={"in": None},
                                          outputs=["counts"])
    with TestRun(topo) as run:
        run.inject("in", b"a", b"x", T0)
        run.inject("in", b"a", b"boom", T0 + 1)  # one batch with the first
        run.inject("in", b"a", b"y", T0 + 2)
        run.run_until_idle()
        run.finish("in")
        run.run_until_idle()
        assert [(r.key, r.value) for r in run.output("counts")] == [(b"a", b"2")]
        assert len(run.output("win.dead_letter")) == 1


class PickyWindows(WindowedComputation):
    """Its ``on_window`` raises on every try for key ``bad``."""

    windows = Tumbling(SECOND)
    aggregator = Count()
    output = "counts"

    def on_window(self, ctx: Any, start: int, end: int, acc: Any) -> None:
        if ctx.key == b"bad":
            raise ValueError("cannot publish this window")
        super().on_window(ctx, start, end, acc)


@pytest.mark.parametrize("first", [b"a", b"bad"])
@pytest.mark.parametrize("attempts", [3, 2, 1])
def test_an_on_window_that_always_raises_loses_its_own_window_and_holds_up_no_later_one(attempts: int,
                                                                                       first: bytes) -> None:
    """Review of the flows: a WindowedComputation's firing never told its window step that it
    failed, so it never went on one window per call. An ``on_window`` raising on every try
    had the whole firing dead-lettered (one dead letter for every key due then), those
    windows stayed stored with their due time marked as timed, and every later firing of the
    tablet took them again and failed. Now its tries reach the failing window alone, whose
    result goes to ``win.dead_letter``; with one attempt (no retries: no window alone) the
    windows of the call that failed go there, each with its result. Later windows fire.
    (``first``: the failing window first in its due time, or not: an undone firing put what
    it took back at the end, and the next try took another window. With two attempts, the
    second try of a firing that failed was its window's last, and sent it to the dead letters
    without trying it alone.)"""
    topo = Topology("w").add_computation("win", "tests.unit.test_windows:PickyWindows", inputs={"in": None},
                                          outputs=["counts"], key_ranges=1)
    with TestRun(topo, max_attempts=attempts) as run:
        for key, dt in [(first, 0), (b"bad" if first == b"a" else b"a", 1), (b"c", 2), (b"a", SECOND + 1)]:
            run.inject("in", key, b"x", T0 + dt)
        run.advance_watermark("in", T0 + SECOND + 1)  # the first second fires
        run.run_until_idle()
        run.finish("in")
        run.run_until_idle()
        fired = sorted((r.key, r.timestamp) for r in run.output("counts"))
        letters = sorted(r.key for r in run.output("win.dead_letter"))
        if attempts > 1:
            assert fired == [(b"a", T0 + SECOND), (b"a", T0 + 2 * SECOND), (b"c", T0 + SECOND)]
            assert letters == [b"bad"]
        else:
            assert fired == [(b"a", T0 + 2 * SECOND)]
            assert letters == [b"a", b"bad", b"c"]
        letter = json.loads(next(r for r in run.output("win.dead_letter") if r.key == b"bad").value)
        assert letter["computation"] == "win" and "cannot publish this window" in letter["error"]
        assert not list(run._tablet("win", b"a").store.scan(TYPED)), "a window dead-lettered left its state"
        run.restart("win")
        run.run_until_idle()
        assert len(run.output("counts")) == len(fired), "fired again after a restart"


class LoudWindows(WindowedComputation):
    """Its own ``process_timer`` raises after the base's fired the windows due."""

    windows = Tumbling(SECOND)
    aggregator = Count()
    output = "counts"

    def process_timer(self, ctx: Any, tag: str, time: int) -> None:
        super().process_timer(ctx, tag, time)
        raise ValueError("after every firing")


def test_a_process_timer_that_raises_after_the_firing_dead_letters_each_window_and_leaves_no_state() -> None:
    """Review of the give-up: a subclass raising after the base's firing had the step think
    the firing went well (no window-per-call tries, no count of what it took); the worker then
    dead-lettered the timer's call whole and the windows stayed stored for ever. Now every
    window ends in the dead letters, with its result, and nothing is left."""
    topo = Topology("w").add_computation("win", "tests.unit.test_windows:LoudWindows", inputs={"in": None},
                                          outputs=["counts"], key_ranges=1)
    with TestRun(topo) as run:
        for key, dt in [(b"a", 0), (b"b", 1), (b"a", SECOND + 1)]:
            run.inject("in", key, b"x", T0 + dt)
        run.finish("in")
        run.run_until_idle()
        assert run.output("counts") == []
        letters = [json.loads(r.value) for r in run.output("win.dead_letter")]
        assert all("after every firing" in d["error"] for d in letters)
        # each window with its result; a call of the timer set again that found nothing left
        # to take raises too, and is dead-lettered as a call (its value empty)
        assert sorted(r.key for r in run.output("win.dead_letter") if json.loads(r.value)["value"]) == [b"a", b"a", b"b"]
        assert not list(run._tablet("win", b"a").store.scan(TYPED)), "a window dead-lettered left its state"


def test_weak_productions_are_refused_for_a_windowed_computation() -> None:
    """Review of the flows' state (F1): a firing takes its due windows in slices of wall-clock
    time, and after a reopen in another order, so a re-run of a timer call fires other windows;
    weak ids (the call's input and place) would then name other windows' results, and
    receivers would drop some as duplicates and get others twice. Refused where the topology
    is built with the class, and where a tablet opens one named by its path."""
    from runtime.errors import TopologyError

    with pytest.raises(TopologyError, match="productions='weak'"):
        Topology("w").add_computation("win", TumblingCounts, inputs={"in": None}, outputs=["counts"],
                                      productions="weak")
    named = Topology("w").add_computation("win", f"{__name__}:TumblingCounts", inputs={"in": None},
                                          outputs=["counts"], productions="weak", key_ranges=1)
    with pytest.raises(MillstreamError, match="productions='weak'"):
        with TestRun(named) as run:
            run.inject("in", b"k", b"v", T0)
    strong = Topology("w").add_computation("win", TumblingCounts, inputs={"in": None}, outputs=["counts"],
                                           key_ranges=1)
    with TestRun(strong) as run:
        run.inject("in", b"k", b"v", T0)
        run.finish("in")
        run.run_until_idle()
        assert [json.loads(r.value) for r in run.output("counts")] == [1]


class CountingPickyWindows(WindowedComputation):
    """Its ``on_window`` counts its key's windows in ``ctx.state``, then raises for key ``bad``."""

    windows = Tumbling(SECOND)
    aggregator = Count()
    output = "counts"

    def on_window(self, ctx: Any, start: int, end: int, acc: Any) -> None:
        n = int(ctx.state.get() or b"0") + 1
        ctx.state.set(b"%d" % n)
        if ctx.key == b"bad":
            raise ValueError("cannot publish this window")
        super().on_window(ctx, start, end, acc)


def test_a_firing_that_raises_takes_back_the_state_of_every_key_its_on_window_wrote() -> None:
    """Review of the receive path: one firing runs ``on_window`` for several keys in one call
    (rebinding the context to each), but an undo took back one key's ``ctx.state`` write, and
    applied it to the key the call had reached. Here ``a``'s window wrote ``a``'s count and
    ``bad``'s raised: ``a``'s write stayed, so when the windows were tried one by one ``a``
    counted its window twice, and the undo deleted ``bad``'s write instead of ``a``'s."""
    topo = Topology("w").add_computation("win", "tests.unit.test_windows:CountingPickyWindows",
                                          inputs={"in": None}, outputs=["counts"], key_ranges=1)
    with TestRun(topo, max_attempts=2) as run:
        run.inject("in", b"a", b"x", T0)
        run.inject("in", b"bad", b"x", T0 + 1)
        run.advance_watermark("in", T0 + SECOND + 1)
        run.run_until_idle()
        assert [(r.key, r.timestamp) for r in run.output("counts")] == [(b"a", T0 + SECOND)]
        assert [r.key for r in run.output("win.dead_letter")] == [b"bad"]
        assert run.state("win", b"a") == b"1"
        assert run.state("win", b"bad") is None  # every try of its window raised: none of its writes stayed



class MeanWindows(WindowedComputation):
    windows = Tumbling(SECOND)
    aggregator = Mean()
    output = "means"

    def value(self, record: Record) -> Any:
        return int(record.value)


class Spread:
    """An aggregator whose result is not its accumulator: ``[low, high]`` -> ``high - low``."""

    def create(self) -> list[int] | None:
        return None

    def add(self, acc: list[int] | None, value: Any) -> list[int]:
        v = int(value)
        return [v, v] if acc is None else [min(acc[0], v), max(acc[1], v)]

    def merge(self, a: list[int], b: list[int]) -> list[int]:
        return [min(a[0], b[0]), max(a[1], b[1])]

    def result(self, acc: list[int]) -> int:
        return acc[1] - acc[0]

    def emit(self, acc: list[int]) -> bytes:
        return b"%d..%d spread %d" % (acc[0], acc[1], self.result(acc))


class SpreadWindows(WindowedComputation):
    windows = Tumbling(SECOND)
    aggregator = Spread()
    output = "spreads"


class LowHighWindows(SpreadWindows):
    def on_window(self, ctx: Any, start: int, end: int, acc: Any) -> None:
        ctx.produce(self.output, json.dumps(acc).encode(), timestamp=self.fired_at(end))


@pytest.mark.parametrize("job, out, want", [("MeanWindows", "means", b"1.5"),
                                            ("SpreadWindows", "spreads", b"1..2 spread 1"),
                                            ("LowHighWindows", "spreads", b"[1, 2]")])
def test_on_window_and_emit_get_the_accumulator_not_the_result(job: str, out: str, want: bytes) -> None:
    """Review of the flows: a WindowedComputation's window step fired ``aggregator.result(acc)``
    and handed that to ``on_window`` as ``acc``: with Mean(), ``emit`` took a float for its
    ``[sum, count]`` and every window went to the dead letters; an aggregator with its own
    ``result`` and ``emit`` (the Aggregator protocol) had ``result`` applied twice."""
    topo = Topology("w").add_computation("win", f"tests.unit.test_windows:{job}", inputs={"in": None},
                                          outputs=[out], key_ranges=1)
    with TestRun(topo) as run:
        run.inject("in", b"a", b"1", T0)
        run.inject("in", b"a", b"2", T0 + 1)
        run.finish("in")
        run.run_until_idle()
        assert [(r.key, r.value) for r in run.output(out)] == [(b"a", want)]
        assert run.output("win.dead_letter") == []


@pytest.mark.parametrize("size, period", [(10 * SECOND, 4 * SECOND), (90 * SECOND, 60 * SECOND),
                                          (7 * SECOND, 3 * SECOND), (10 * SECOND, 5 * SECOND)])
def test_sliding_windows_start_on_multiples_of_their_period_when_it_does_not_divide_their_size(
        size: int, period: int) -> None:
    """Review of the flows: windows started at ``-size mod period`` (``Sliding(10 s, 4 s)`` put
    a record at 8 s in [2, 12) and [6, 16), not in [0, 10), [4, 14) and [8, 18)), so a record
    was in floor(size / period) windows, and a 90-s window sliding by 60 s was a 60-s tumbling
    one. A flow counting one record a second, against windows made from their definition."""
    windows = Sliding(size, period)
    for t in range(-3 * SECOND, 3 * SECOND, SECOND // 2):
        want = [(k * period, k * period + size) for k in range(-50, 50) if k * period <= t < k * period + size]
        assert windows.assign(t) == want, t
    flow = Dataflow("slide")
    flow.input("in", keyed=True).window(windows, Count()).output("counts", codec=codecs.JSON)
    with TestRun(flow) as run:
        times = [T0 + s * SECOND for s in range(30)]
        for t in times:
            run.inject("in", b"k", b"x", t)
        run.finish("in")
        run.run_until_idle()
        got = {(start, end): n for start, end, n in (json.loads(r.value) for r in run.output("counts"))}
    starts = {k * period for t in times for k in range((t - size) // period, t // period + 1)
              if k * period <= t < k * period + size}
    expected = {(s, s + size): sum(s <= t < s + size for t in times) for s in starts}
    assert got == expected
