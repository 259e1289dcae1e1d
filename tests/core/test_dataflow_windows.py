"""Dataflow windows and joins in process, against oracles: tumbling, sliding and session
windows with late records, window and interval joins, firings in slices over thousands of
keys, and what a firing that fails loses (its one window alone)."""

from __future__ import annotations

import base64
import json
import random
from collections import Counter, defaultdict
from typing import Any

import pytest
from prometheus_client import REGISTRY

from runtime import Dataflow, codecs
from runtime.flows import windowing
from runtime.flows.values import VALUES
from runtime.sinks import read_file_sink
from runtime.state import TYPED
from runtime.testing import TestRun
from runtime.windows import SECOND, Count, Session, Sliding, Sum, Tumbling
from tests import flowjobs as j

T0 = 1_700_000_000_000_000


def _j(record: Any) -> Any:
    return json.loads(record.value)


def _events(rng: random.Random, n: int, keys: int, spread_us: int, disorder_us: int) -> list[tuple[str, int, int]]:
    out = []
    for i in range(n):
        base = T0 + i * spread_us // n
        out.append((f"k{rng.randrange(keys)}", rng.randrange(100), base + rng.randrange(disorder_us + 1)))
    return out


@pytest.mark.parametrize("windows", [Tumbling(SECOND), Sliding(2 * SECOND, SECOND),
                                     Tumbling(SECOND, allowed_lateness=SECOND // 2)])
def test_windows_match_an_oracle_with_late_records_on_their_stream(windows: Any) -> None:
    """Records out of order by up to 2.5 s, the watermark 0.2 s behind the newest: some are
    late. A record is late when every window it falls in fired (the watermark passed its end
    plus the lateness); late records go to <step>.late, every other one is counted once."""
    rng = random.Random(7)
    events = _events(rng, 600, 5, 6 * SECOND, 2_500_000)
    flow = Dataflow("w", key_ranges=2)
    flow.input("ev", codec=codecs.JSON, keyed=True).map(j.value_of).window(windows, Sum(), name="sums") \
        .output("sums", codec=codecs.JSON)
    expected: dict[tuple[str, int, int], int] = defaultdict(int)
    late = []
    wm = T0 - 1
    with TestRun(flow) as run:
        for i, (k, v, ts) in enumerate(events):
            live = [(s, e) for s, e in windows.assign(ts) if e + windows.lateness > wm]
            if live:
                for s, e in live:
                    expected[(k, s, e)] += v
            else:
                late.append((k, v))
            run.inject("ev", k.encode(), json.dumps({"k": k, "v": v}).encode(), ts)
            if i % 50 == 49:
                wm = max(wm, max(t for _, _, t in events[:i + 1]) - 200_000)
                run.advance_watermark("ev", wm)
                run.run_until_idle()
        run.finish("ev")
        run.run_until_idle()
        got = {(r.key.decode(), *_j(r)[:2]): _j(r)[2] for r in run.output("sums")}
        assert len(got) == len(run.output("sums"))  # each window fired once
        assert got == dict(expected)
        assert all(r.timestamp == _j(r)[1] + windows.lateness for r in run.output("sums"))  # stamped when fired
        # Late records go on as the window step got them (after the map).
        assert sorted((r.key.decode(), _j(r)) for r in run.output("sums.late")) == sorted(late)
        assert late  # the schedule has late records


def test_session_windows_merge_out_of_order_and_send_late_records_on() -> None:
    gap = 300_000
    flow = Dataflow("s")
    flow.input("ev", codec=codecs.JSON, keyed=True).map(j.value_of) \
        .window(Session(gap, allowed_lateness=100_000), Sum(), name="sessions").output("out", codec=codecs.JSON)
    with TestRun(flow) as run:
        def send(k: str, v: int, dt: int) -> None:
            run.inject("ev", k.encode(), json.dumps({"k": k, "v": v}).encode(), T0 + dt)

        send("a", 1, 0)
        send("a", 2, 500_000)      # its own session for now
        send("a", 4, 250_000)      # bridges the two: one session [0, 800 000)
        send("b", 8, 100_000)
        run.advance_watermark("ev", T0 + 850_000)
        run.run_until_idle()
        # b's [100k, 400k) fired at 500k; a's [0, 800k) + lateness 100k fires at 900k
        assert [(r.key, r.timestamp - T0) for r in run.output("out")] == [(b"b", 500_000)]
        run.advance_watermark("ev", T0 + 2_000_000)
        run.run_until_idle()
        send("a", 16, 10_000)  # late: its session fired
        send("a", 32, 1_900_000)  # on time: a new session
        run.finish("ev")
        run.run_until_idle()
        got = sorted((r.key.decode(), _j(r)[0] - T0, _j(r)[1] - T0, _j(r)[2]) for r in run.output("out"))
        assert got == [("a", 0, 800_000, 7), ("a", 1_900_000, 2_200_000, 32), ("b", 100_000, 400_000, 8)]
        assert [_j(r) for r in run.output("sessions.late")] == [16]


def test_a_window_join_pairs_every_left_with_every_right_of_its_key_and_window() -> None:
    rng = random.Random(11)
    lefts = _events(rng, 120, 4, 4 * SECOND, 0)
    rights = _events(rng, 120, 4, 4 * SECOND, 0)
    windows = Tumbling(SECOND)
    flow = Dataflow("wj", key_ranges=2)
    left = flow.input("l", codec=codecs.JSON).key_by(j.key_of).map(j.value_of)
    right = flow.input("r", codec=codecs.JSON).key_by(j.key_of).map(j.value_of)
    left.join(right, windows, name="pairs").output("pairs", codec=codecs.JSON)
    with TestRun(flow) as run:
        for (k1, v1, t1), (k2, v2, t2) in zip(lefts, rights, strict=True):
            run.inject("l", b"", json.dumps({"k": k1, "v": v1}).encode(), t1)
            run.inject("r", b"", json.dumps({"k": k2, "v": v2}).encode(), t2)
        run.finish("l")
        run.finish("r")
        run.run_until_idle()
        got = Counter((r.key.decode(), tuple(_j(r))) for r in run.output("pairs"))
    expected = Counter((k1, (v1, v2)) for k1, v1, t1 in lefts for k2, v2, t2 in rights
                       if k1 == k2 and windows.assign(t1) == windows.assign(t2))
    assert got == expected and expected


def test_a_join_firing_deletes_its_windows_entry_by_entry(monkeypatch: Any) -> None:
    """A window's join buffers were cleared with a range delete per side: each left RocksDB a
    range tombstone that every iterator made afterwards paid for, so a firing of thousands of
    windows made its own scans quadratic (measured: 100 µs a key at 1,000 keys, 215 at
    16,000). Typed state is now deleted entry by entry, and nothing of the join is left."""
    from worker import writes
    ranges: list[bytes] = []
    real = writes.Writes.delete_range
    monkeypatch.setattr(writes.Writes, "delete_range",
                        lambda self, start, end: (ranges.append(start), real(self, start, end))[1])
    flow = Dataflow("jd", key_ranges=1)
    left, right = flow.input("l", keyed=True, codec=codecs.JSON), flow.input("r", keyed=True, codec=codecs.JSON)
    left.join(right, Tumbling(SECOND), name="pairs").output("pairs", codec=codecs.JSON)
    with TestRun(flow) as run:
        run.inject_batch("l", [(b"k%d" % i, b"1", T0 + i) for i in range(50)])
        run.inject_batch("r", [(b"k%d" % i, b"2", T0 + i) for i in range(50)])
        run.finish("l")
        run.finish("r")
        run.run_until_idle()
        assert len(run.output("pairs")) == 50
        assert list(run._tablet("pairs", b"k0").store.scan(TYPED)) == [], "the join's buffers and counts stayed"
    assert [s for s in ranges if s.startswith(TYPED)] == []


def test_an_interval_join_pairs_within_the_bounds_as_soon_as_both_are_in() -> None:
    rng = random.Random(5)
    lower, upper = -200_000, 300_000
    lefts = _events(rng, 150, 3, 3 * SECOND, 0)
    rights = _events(rng, 150, 3, 3 * SECOND, 0)
    flow = Dataflow("ij", key_ranges=2)
    left = flow.input("l", codec=codecs.JSON).key_by(j.key_of).map(j.value_of)
    right = flow.input("r", codec=codecs.JSON).key_by(j.key_of).map(j.value_of)
    left.interval_join(right, lower, upper, name="near").output("near", codec=codecs.JSON)
    with TestRun(flow) as run:
        for i, ((k1, v1, t1), (k2, v2, t2)) in enumerate(zip(lefts, rights, strict=True)):
            run.inject("l", b"", json.dumps({"k": k1, "v": v1}).encode(), t1)
            run.inject("r", b"", json.dumps({"k": k2, "v": v2}).encode(), t2)
            if i % 30 == 29:  # the watermark follows, so buffered records expire on the way
                now = min(t1, t2) - upper
                run.advance_watermark("l", now)
                run.advance_watermark("r", now)
                run.run_until_idle()
                if i == 89:
                    run.restart("near")
        run.finish("l")
        run.finish("r")
        run.run_until_idle()
        got = Counter((r.key.decode(), tuple(_j(r)), r.timestamp) for r in run.output("near"))
    expected = Counter((k1, (v1, v2), max(t1, t2)) for k1, v1, t1 in lefts for k2, v2, t2 in rights
                       if k1 == k2 and lower <= t2 - t1 <= upper)
    assert got == expected and expected


def test_a_window_beside_a_step_that_fails_its_finish_still_fires_every_other_record() -> None:
    """A window ("a_w", whose finish runs first) and a reduce whose running value of
    ``refuse`` cannot be stored, in one stage: the call fails in the reduce's finish after the
    window's. The window must not keep what it noted of the undone call: ``refuse`` came first
    in its window, and the window's one timer for that window's end, set in the undone call,
    would be thought set, and the window would never fire."""
    flow = Dataflow("wr", key_ranges=1)
    words = flow.input("w", codec=codecs.STR, keyed=True)
    words.map(j.poison).reduce(j.last).map(j.type_name).output("types", codec=codecs.STR)
    words.window(Tumbling(SECOND), Count(), name="a_w").output("counts", codec=codecs.JSON)
    assert len({c.code for c in flow.topology().computations.values()}) == 1  # one stage
    with TestRun(flow) as run:
        for i, w in enumerate(["refuse", "a", "bb", "c"]):
            run.inject("w", b"k%d" % i, w.encode(), T0 + i)
        run.finish("w")
        run.run_until_idle()
        assert len(run.output("wr.reduce.dead_letter")) == 1
        assert sorted((r.key, _j(r)[2]) for r in run.output("counts")) == [(b"k1", 1), (b"k2", 1), (b"k3", 1)]


def test_a_step_failing_on_one_keys_window_loses_that_window_alone() -> None:
    """A firing is one call for every key's window due. When a step after the window raises on
    one key's result, the firing goes on one window per call: that window's result goes to the
    dead letters, once, the other keys' results go on, and later firings are not held up;
    nothing fires again after a restart."""
    flow = Dataflow("fz", key_ranges=1)
    flow.input("ev", codec=codecs.JSON, keyed=True).map(j.value_of).window(Tumbling(SECOND), Sum(), name="sums") \
        .process(j.RaiseOnZero, name="check").output("o", codec=codecs.JSON)
    want = [(b"a", [T0, 5]), (b"a", [T0 + SECOND, 2]), (b"c", [T0, 7]), (b"d", [T0, 1])]
    with TestRun(flow) as run:
        for k, v, dt in [("a", 5, 0), ("b", 0, 1), ("c", 7, 2), ("d", 1, 3), ("a", 2, SECOND + 5)]:
            run.inject("ev", k.encode(), json.dumps({"k": k, "v": v}).encode(), T0 + dt)
        run.advance_watermark("ev", T0 + SECOND + 1)  # the first second's windows fire
        run.run_until_idle()
        run.finish("ev")
        run.run_until_idle()
        assert sorted((r.key, _j(r)) for r in run.output("o")) == want
        [letter] = run.output("sums.dead_letter")
        assert letter.key == b"b" and _j(letter)["computation"] == "sums"
        assert "a window of zero" in _j(letter)["error"]
        run.restart("sums")
        run.run_until_idle()
        assert len(run.output("o")) == len(want) and len(run.output("sums.dead_letter")) == 1


def test_windows_of_thousands_of_keys_all_come_out() -> None:
    """Regression: a batch firing many windows runs longer than TestRun's idle check looked,
    and run_until_idle returned with its results still in flight (it now waits for a batch
    running on a tablet's thread)."""
    flow = Dataflow("many", key_ranges=1)
    flow.input("ev", keyed=True).window(Tumbling(SECOND), Count(), name="counts").output("out", codec=codecs.JSON)
    with TestRun(flow) as run:
        for i in range(3000):
            run.inject("ev", b"k%d" % (i % 1500), b"", T0 + i)
        run.finish("ev")
        run.run_until_idle()
        got = [(r.key, _j(r)[2]) for r in run.output("out")]
    assert len(got) == 1500 and {c for _, c in got} == {2}


def test_a_second_boundary_over_thousands_of_keys_fires_in_slices_between_batches(monkeypatch: Any) -> None:
    """Issue 30: a timer's firing stops after FIRE_SLICE_S (here: after one chunk) and sets
    its timer again; the rest fires in the next batches. Every window still comes out once,
    and a window downstream of them sees the whole count (the watermark waited for the last
    slice)."""
    monkeypatch.setattr(windowing, "FIRE_SLICE_S", 0.0)
    flow = Dataflow("sliced", key_ranges=1)
    counts = flow.input("ev", keyed=True).window(Tumbling(SECOND), Count(), name="sliced_counts")
    counts.output("out", codec=codecs.JSON)
    counts.key_by(j.one_key).window(Tumbling(SECOND), Count(), name="sliced_total").output("total", codec=codecs.JSON)
    calls = _fire_calls("sliced_counts")
    with TestRun(flow) as run:
        for i in range(3000):
            run.inject("ev", b"k%d" % (i % 1500), b"", T0 + i)
        run.finish("ev")
        run.run_until_idle()
        got = Counter((r.key, _j(r)[2]) for r in run.output("out"))
        totals = [_j(r)[2] for r in run.output("total")]
    assert len(got) == 1500 and set(got.values()) == {1} and {c for _, c in got} == {2}
    assert _fire_calls("sliced_counts") - calls == -(-1500 // windowing.FIRE_CHUNK)
    assert totals == [1500]


def _three_windows_through(sink: type, name: str, path: str) -> None:
    """A flow ``<name>``: one-second counts (step ``<name>_counts``) into a fused ``sink``; three
    keys' windows fire at the end of the input, and all three reach the sink's files."""
    flow = Dataflow(name, key_ranges=1)
    flow.input("ev", keyed=True).window(Tumbling(SECOND), Count(), name=f"{name}_counts") \
        .sink(sink, name=f"{name}_out", path=path)
    with TestRun(flow) as run:
        for i in range(3):
            run.inject("ev", b"k%d" % i, b"", T0 + i)
        run.finish("ev")
        run.run_until_idle()
    assert len(list(read_file_sink(path))) == 3


def test_a_firings_stall_includes_the_fused_sink_writing_what_fired(monkeypatch: Any, tmp_path: Any) -> None:
    """millstream_window_fire_seconds is how long a firing held its tablet: the fused sink
    writes the fired windows at the end of the same call, so its time counts."""
    monkeypatch.setattr(windowing, "perf_counter", j.CLOCK)
    before = REGISTRY.get_sample_value("millstream_window_fire_seconds_sum", {"step": "tick_counts"}) or 0.0
    _three_windows_through(j.TickingSink, "tick", str(tmp_path))
    after = REGISTRY.get_sample_value("millstream_window_fire_seconds_sum", {"step": "tick_counts"})
    assert after - before == 3.0


def test_a_firings_cpu_is_its_threads_work_not_its_waits(tmp_path: Any) -> None:
    """millstream_window_fire_cpu_seconds counts the tablet thread's CPU in the same firings:
    a fused sink that waits 0.1 s per window fired holds the tablet that long (wall), but
    waiting is not work, so the CPU histogram stays far below it; nor is it waiting for a
    core (millstream_window_fire_queued_seconds)."""
    labels = {"step": "wait_counts"}
    wall0 = REGISTRY.get_sample_value("millstream_window_fire_seconds_sum", labels) or 0.0
    cpu0 = REGISTRY.get_sample_value("millstream_window_fire_cpu_seconds_sum", labels) or 0.0
    queued0 = REGISTRY.get_sample_value("millstream_window_fire_queued_seconds_sum", labels) or 0.0
    _three_windows_through(j.WaitingSink, "wait", str(tmp_path))
    wall = REGISTRY.get_sample_value("millstream_window_fire_seconds_sum", labels) - wall0
    cpu = REGISTRY.get_sample_value("millstream_window_fire_cpu_seconds_sum", labels) - cpu0
    calls = REGISTRY.get_sample_value("millstream_window_fire_cpu_seconds_count", labels)
    assert calls == REGISTRY.get_sample_value("millstream_window_fire_seconds_count", labels) >= 1
    assert wall >= 0.3 and 0 < cpu < 0.15
    # Nor is it waiting for a core: a sleeping thread is not in the kernel's run queue.
    assert REGISTRY.get_sample_value("millstream_window_fire_queued_seconds_count", labels) == calls
    assert (REGISTRY.get_sample_value("millstream_window_fire_queued_seconds_sum", labels) - queued0) < 0.15


def _fire_calls(step: str) -> float:
    return REGISTRY.get_sample_value("millstream_window_fire_seconds_count", {"step": step}) or 0.0


def test_an_aggregators_result_that_raises_loses_that_window_alone() -> None:
    """Review of the flows: the aggregator's own ``result()`` raised on the last try too, the
    timer call was dead-lettered whole, and that window's due time, left at the head of the
    index with no timer, stopped every later window of the tablet from firing."""
    flow = Dataflow("fr", key_ranges=1)
    flow.input("ev", codec=codecs.JSON, keyed=True).map(j.value_of) \
        .window(Tumbling(SECOND), j.SumOrRaise(1), name="sums").output("o", codec=codecs.JSON)
    with TestRun(flow) as run:
        for k, v, dt in [("a", 5, 0), ("b", 0, 1), ("c", 7, 2), ("a", 2, SECOND + 5), ("b", 3, 2 * SECOND)]:
            run.inject("ev", k.encode(), json.dumps({"k": k, "v": v}).encode(), T0 + dt)
        run.advance_watermark("ev", T0 + SECOND + 1)
        run.run_until_idle()
        run.finish("ev")
        run.run_until_idle()
        assert sorted((r.key, _j(r)[0] - T0, _j(r)[2]) for r in run.output("o")) == [
            (b"a", 0, 5), (b"a", SECOND, 2), (b"b", 2 * SECOND, 3), (b"c", 0, 7)]
        [letter] = run.output("sums.dead_letter")
        assert letter.key == b"b" and "a sum of zero has no result" in _j(letter)["error"]
        run.restart("sums")
        run.run_until_idle()
        assert len(run.output("o")) == 4, "fired again after a restart"


def test_an_interval_join_drops_what_can_no_longer_pair_and_its_counters_and_sends_late_records_on(
        monkeypatch: Any) -> None:
    """Review of the flows: a key whose values expire in two different seconds had both due
    times under one index entry; the second cleanup raised (KeyError), and was undone and tried
    again (or, after other calls, dead-lettered, and the tablet's buffers never cleaned again).
    Each side's counter cell is dropped with its last value too."""
    failed: list[BaseException] = []
    timer_failed = windowing.EventTimeOp.timer_failed

    def noted(step: Any, error: BaseException) -> None:
        failed.append(error)
        timer_failed(step, error)

    monkeypatch.setattr(windowing.EventTimeOp, "timer_failed", noted)
    flow = Dataflow("ic", key_ranges=1)
    left = flow.input("l", codec=codecs.JSON).key_by(j.key_of).map(j.value_of)
    right = flow.input("r", codec=codecs.JSON).key_by(j.key_of).map(j.value_of)
    left.interval_join(right, 0, SECOND, name="near").output("near", codec=codecs.JSON)
    with TestRun(flow) as run:
        for side, v, dt in [("l", 1, 0), ("l", 2, 2 * SECOND), ("r", 10, 500_000), ("r", 20, 2 * SECOND + 1)]:
            run.inject(side, b"", json.dumps({"k": "u", "v": v}).encode(), T0 + dt)
        run.run_until_idle()
        store = run._tablet("near", b"u").store
        kept = len(list(store.scan(TYPED)))  # four values, each side's counter
        for stream in ("l", "r"):  # past what the first two can pair with, not the last two
            run.advance_watermark(stream, T0 + 3 * SECOND)
        run.run_until_idle()
        assert len(list(store.scan(TYPED))) == kept - 2, "the first two values kept past their time"
        for stream in ("l", "r"):
            run.advance_watermark(stream, T0 + 10 * SECOND)
        run.run_until_idle()
        assert sorted(_j(r) for r in run.output("near")) == [[1, 10], [2, 20]]
        assert not [s for s in run.streams if s.endswith("dead_letter") and run.output(s)]
        assert not failed, f"a cleanup raised: {failed}"
        assert list(store.scan(TYPED)) == [], "values or counters kept after nothing could pair with them"
        # A record the watermark passed every time a partner could have for: late, unpaired
        # (whether its partners' cleanup ran yet or not).
        run.inject("l", b"", json.dumps({"k": "u", "v": 3}).encode(), T0 + 500_000)
        run.run_until_idle()
        assert [_j(r) for r in run.output("near.late")] == [3] and len(run.output("near")) == 2


def test_a_window_of_window_results_in_one_stage_counts_them_all_after_a_jump_of_the_watermark() -> None:
    """Review of the flows: a window after another in the same stage judged the first one's
    results (stamped at their firing) against the input's watermark, already far past them
    after a jump or ``finish``: every result went to its late stream."""
    flow = Dataflow("ww", key_ranges=1)
    flow.input("ev", codec=codecs.JSON, keyed=True).map(j.value_of) \
        .window(Tumbling(SECOND), Sum(), name="seconds").map(j.result_of) \
        .window(Tumbling(60 * SECOND), Sum(), name="minutes").map(j.result_of).output("o", codec=codecs.JSON)
    assert len(flow.topology().computations) == 1, "one stage: the test is about steps fused together"
    with TestRun(flow) as run:
        for i in range(10):
            run.inject("ev", b"a", json.dumps({"k": "a", "v": i}).encode(), T0 + i * SECOND)
        run.finish("ev")
        run.run_until_idle()
        assert [_j(r) for r in run.output("o")] == [45]
        assert run.output("minutes.late") == []


def test_a_window_after_another_in_one_stage_fires_once_the_first_fired_everything_due(monkeypatch: Any) -> None:
    """Review of the stage's firing clock: the seconds' windows fired in slices, the minute's
    window due in the same batch fired first with part of them, and the rest then opened it
    again and fired it a second time. It now waits for the steps before it."""
    monkeypatch.setattr(windowing, "FIRE_SLICE_S", 0.0)  # one chunk of windows per call
    flow = Dataflow("ws", key_ranges=1)
    flow.input("ev", keyed=True).window(Tumbling(SECOND), Count(), name="seconds").map(j.result_of) \
        .window(Tumbling(60 * SECOND), Sum(), name="minutes").map(j.result_of).output("o", codec=codecs.JSON)
    assert len(flow.topology().computations) == 1
    with TestRun(flow) as run:
        for second in range(5):
            for k in range(100):
                run.inject("ev", b"k%d" % k, b"", T0 + second * SECOND + k)
        run.finish("ev")
        run.run_until_idle()
        got = Counter((r.key, _j(r)) for r in run.output("o"))
        assert got == Counter({(b"k%d" % k, 5): 1 for k in range(100)})
        assert run.output("minutes.late") == []


def test_an_interval_join_with_a_positive_lower_bound_pairs_a_record_ahead_of_the_watermark() -> None:
    """Review of the late rule: judged by the record's own expiry, a right at 101 s (its last
    left partner at 96 s, behind a watermark at 100 s) went to the late stream, though it was
    ahead of the watermark and its partner at 92 s was still kept."""
    flow = Dataflow("ip", key_ranges=1)
    left = flow.input("l", codec=codecs.JSON).key_by(j.key_of).map(j.value_of)
    right = flow.input("r", codec=codecs.JSON).key_by(j.key_of).map(j.value_of)
    left.interval_join(right, 5 * SECOND, 10 * SECOND, name="later").output("later", codec=codecs.JSON)
    with TestRun(flow) as run:
        run.inject("l", b"", json.dumps({"k": "u", "v": 92}).encode(), T0 + 92 * SECOND)
        run.run_until_idle()
        for stream in ("l", "r"):
            run.advance_watermark(stream, T0 + 100 * SECOND)
        run.run_until_idle()
        run.inject("r", b"", json.dumps({"k": "u", "v": 101}).encode(), T0 + 101 * SECOND)
        run.run_until_idle()
        assert [_j(r) for r in run.output("later")] == [[92, 101]]
        assert run.output("later.late") == []


def test_a_firing_given_up_at_once_sends_its_windows_to_the_dead_letters_and_later_ones_fire() -> None:
    """With one attempt (no retries, so no window alone), a firing that raises is given up
    whole: every window that call took goes to the dead letters with its result, its state
    is cleaned up, and the next second's window fires. Before, the worker dead-lettered the
    timer's call, the windows stayed stored with their due time marked as timed, and every
    later firing of the tablet took them again and failed again."""
    flow = Dataflow("fg", key_ranges=1)
    flow.input("ev", codec=codecs.JSON, keyed=True).map(j.value_of).window(Tumbling(SECOND), Sum(), name="sums") \
        .process(j.RaiseOnZero, name="check").output("o", codec=codecs.JSON)
    with TestRun(flow, max_attempts=1) as run:
        for k, v, dt in [("a", 5, 0), ("b", 0, 1), ("c", 7, 2), ("a", 2, SECOND + 5), ("d", 4, 2 * SECOND)]:
            run.inject("ev", k.encode(), json.dumps({"k": k, "v": v}).encode(), T0 + dt)
        run.advance_watermark("ev", T0 + SECOND + 1)  # the first second's windows fire, and fail
        run.run_until_idle()
        run.finish("ev")
        run.run_until_idle()
        assert sorted((r.key, _j(r)) for r in run.output("o")) == [(b"a", [T0 + SECOND, 2]), (b"d", [T0 + 2 * SECOND, 4])]
        letters = run.output("sums.dead_letter")
        assert sorted((r.key, _j(r)["computation"]) for r in letters) == [(b"a", "sums"), (b"b", "sums"), (b"c", "sums")]
        assert all("a window of zero" in _j(r)["error"] for r in letters)
        results = sorted(VALUES.decode(base64.b64decode(_j(r)["value"])) for r in letters)  # each with its result
        assert [(w.start, w.value) for w in results] == [(T0, 0), (T0, 5), (T0, 7)]
        assert not list(run._tablet("sums", b"a").store.scan(TYPED)), "a window given up left its state"
        run.restart("sums")
        run.run_until_idle()
        assert len(run.output("o")) == 2 and len(run.output("sums.dead_letter")) == 3
