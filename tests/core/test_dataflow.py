"""Dataflows (DESIGN.md §3b) in process: the API's refusals, what a flow compiles to, and
every operator against an oracle, on the real worker (runtime.testing.TestRun: its batches,
dedup, timers, typed state and RocksDB), through restarts."""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from typing import Any

import pytest
from prometheus_client import REGISTRY

from runtime import Dataflow, KeyedStream, Topology, codecs
from runtime.client import check_not_main
from runtime.errors import ImportPathError, MillstreamError, TopologyError, UsageError
from runtime.flows import windowing
from runtime.flows.values import VALUES
from runtime.sinks import FileSink, read_file_sink
from runtime.testing import TestRun
from runtime.windows import SECOND, Count, Session, Sliding, Sum, Tumbling, WindowResult
from tests import flowjobs as j

T0 = 1_700_000_000_000_000


def _j(record: Any) -> Any:
    return json.loads(record.value)


# ------------------------------------------------------------------ refusals


def test_a_lambda_a_closure_or_a_method_is_refused_when_the_step_is_added() -> None:
    flow = Dataflow("f")
    words = flow.input("lines", codec=codecs.STR)
    with pytest.raises(ImportPathError, match="a lambda cannot be loaded by the workers; define it with def"):
        words.map(lambda w: w)

    def local(w: str) -> str:
        return w

    with pytest.raises(ImportPathError, match="defined inside a function; define it at module level"):
        words.filter(local)
    with pytest.raises(ImportPathError, match="cannot be imported back"):
        words.map(j.SumAgg(1).add)
    with pytest.raises(ImportPathError, match="is not a function or class"):
        words.map(42)  # type: ignore[arg-type]


def test_bad_steps_say_what_to_do() -> None:
    flow = Dataflow("f")
    keyed = flow.input("a", codec=codecs.JSON).key_by(j.key_of)
    other = Dataflow("g").input("b", keyed=True)
    with pytest.raises(UsageError, match="not a runtime.Sink subclass"):
        keyed.sink(j.RawCounter)
    with pytest.raises(UsageError, match="not a runtime.Computation subclass"):
        keyed.process(j.SumAgg)
    with pytest.raises(UsageError, match="lower=5 is above upper=1"):
        keyed.interval_join(flow.input("c", keyed=True), 5, 1)
    with pytest.raises(UsageError, match="belongs to another Dataflow"):
        keyed.join(other, Tumbling(SECOND))  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="must be a KeyedStream"):
        keyed.join(flow.input("d"), Tumbling(SECOND))  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="not windows"):
        keyed.window(SECOND, Count())
    with pytest.raises(UsageError, match="pass an aggregator object, e.g. Count"):
        keyed.window(Tumbling(SECOND), Count)
    with pytest.raises(UsageError, match="already has a step named 'x'"):
        keyed.map(j.value_of, name="x").map(j.value_of, name="x")
    with pytest.raises(UsageError, match="params .* must be strings"):
        keyed.process(j.RawCounter, every=3)  # type: ignore[arg-type]
    with pytest.raises(TopologyError, match="has no input"):
        Dataflow("empty").topology()


def test_code_of_the_script_being_run_is_refused_at_submit() -> None:
    topo = Topology("t").add_computation("c", "__main__:Counter", inputs={"s": None})
    with pytest.raises(TopologyError, match="defined in the script you are running; the workers import code by "
                                            "module path"):
        check_not_main(topo)


def test_values_that_cannot_travel_between_steps_are_refused_clearly() -> None:
    for value in ({"a": (1, b"x")}, WindowResult(1, 2, [3]), (1, "two"), None, 3.5):
        assert VALUES.decode(VALUES.encode(value)) == value
    assert type(VALUES.decode(VALUES.encode((1, 2)))) is tuple
    with pytest.raises(UsageError, match="a value of type set cannot travel between the steps of a flow"):
        VALUES.encode({1, 2})


# --------------------------------------------------------------- compiling


def test_stateless_steps_fuse_with_the_stateful_step_after_them() -> None:
    """input -> filter -> map -> key_by -> window -> process -> output: one computation; the
    filter and map before key_by run in its key extractor on the producing side."""
    flow = Dataflow("clicks")
    counts = (flow.input("clicks", codec=codecs.JSON).filter(j.is_even).map(j.value_of)
              .key_by(j.word_key).window(Tumbling(SECOND), Count(), name="per_key"))
    counts.process(j.Rising, name="rising").output("rising", codec=codecs.JSON)
    counts.output("counts", codec=codecs.JSON)
    topo = flow.topology()
    assert list(topo.computations) == ["per_key"]
    spec = topo.computations["per_key"]
    assert spec.code == "runtime.flows.stage:FlowStage"
    assert spec.inputs == {"clicks": "runtime.flows.keys:key_of"}
    assert set(spec.outputs) == {"rising", "counts"}


def test_a_flat_map_before_key_by_takes_a_hop_and_a_sink_runs_in_the_stage_before_it() -> None:
    flow = Dataflow("wc")
    counts = flow.input("lines", codec=codecs.STR).flat_map(j.words).key_by(j.word_key).map(j.one).reduce(j.add)
    counts.sink(FileSink, name="wc_out", path="/tmp/unused")
    topo = flow.topology()
    assert list(topo.computations) == ["wc.input", "wc.reduce"]
    assert topo.computations["wc.input"].outputs == ["wc.key_by"]
    assert topo.computations["wc.reduce"].inputs == {"wc.key_by": None}
    assert topo.computations["wc.reduce"].code == "runtime.flows.stage:SinkStage"
    assert topo.computations["wc.reduce"].outputs == []


def test_a_stage_writing_to_two_sinks_keeps_each_in_a_computation_of_its_own() -> None:
    flow = Dataflow("two")
    counts = flow.input("ev", keyed=True).map(j.one).reduce(j.add)
    counts.sink(FileSink, name="a_out", path="/tmp/unused")
    counts.sink(FileSink, name="b_out", path="/tmp/unused")
    topo = flow.topology()
    assert list(topo.computations) == ["two.reduce", "a_out", "b_out"]
    assert topo.computations["two.reduce"].code == "runtime.flows.stage:FlowStage"
    assert sorted(topo.computations["two.reduce"].outputs) == ["a_out", "b_out"]


def test_a_join_puts_both_sides_in_one_computation() -> None:
    flow = Dataflow("j")
    left = flow.input("l", codec=codecs.JSON).key_by(j.key_of)
    right = flow.input("r", codec=codecs.JSON).key_by(j.key_of).map(j.value_of)
    left.join(right, Tumbling(SECOND), name="pairs").output("out", codec=codecs.JSON)
    topo = flow.topology()
    assert list(topo.computations) == ["pairs"]
    assert topo.computations["pairs"].inputs == {"l": "runtime.flows.keys:key_of", "r": "runtime.flows.keys:key_of"}
    assert isinstance(left, KeyedStream)


# --------------------------------------------------------- semantics vs oracles


def test_a_word_count_counts_every_word_once_through_a_restart() -> None:
    rng = random.Random(3)
    lines = [" ".join(rng.choice(["a", "bb", "ccc", "dddd", "boom"]) for _ in range(rng.randint(0, 6)))
             for _ in range(200)]
    flow = Dataflow("wc", key_ranges=3)
    counts = (flow.input("lines", codec=codecs.STR).flat_map(j.words).map(j.fragile).key_by(j.word_key)
              .map(j.one).reduce(j.add))
    counts.output("counts", codec=codecs.INT)
    with TestRun(flow) as run:
        for i, line in enumerate(lines):
            run.inject("lines", b"", line.encode(), T0 + i)
            if i == 100:
                run.run_until_idle()
                run.restart("wc.reduce")
                run.restart("wc.input")
        run.run_until_idle()
        got: dict[str, list[int]] = defaultdict(list)
        for r in run.output("counts"):
            got[r.key.decode()].append(int(r.value))
        # A record a step raises on goes to the dead letters whole (a line with "boom" in it).
        expected = Counter(w for line in lines if "boom" not in line.split() for w in line.split())
        assert {w: max(ns) for w, ns in got.items()} == dict(expected)
        assert all(sorted(ns) == list(range(1, len(ns) + 1)) for ns in got.values())  # each running count once
        letters = run.output("wc.input.dead_letter")
        assert len(letters) == sum("boom" in line.split() for line in lines)
        assert all("ValueError: boom is not a word" in _j(r)["error"] for r in letters)


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


def test_a_process_step_keeps_its_own_state_and_timers_inside_a_fused_stage() -> None:
    flow = Dataflow("p")
    windows = flow.input("ev", codec=codecs.JSON, keyed=True).map(j.value_of) \
        .window(Tumbling(SECOND), Sum(), name="sums")
    windows.process(j.Rising, name="rising").output("up", codec=codecs.JSON)
    assert list(flow.topology().computations) == ["sums"]
    with TestRun(flow) as run:
        for dt, v in ((0, 5), (SECOND, 3), (2 * SECOND, 9), (3 * SECOND, 1)):
            run.inject("ev", b"a", json.dumps({"k": "a", "v": v}).encode(), T0 + dt)
        run.finish("ev")
        run.run_until_idle()
        ups = [_j(r) for r in run.output("up")]
    assert [u["value"] for u in ups if "value" in u] == [5, 9]
    # One timer per key and tag: set again by each window, it fires once, at its last time.
    assert [u["at"] - T0 for u in ups if "timer" in u] == [4 * SECOND + 1]


def test_fused_process_steps_each_keep_their_own_bytes_state_through_a_restart() -> None:
    """Two RawCounter steps in one stage: each counts 1..n per key in its own ``ctx.state``
    (shared state would make the second count twice as fast), and a restart keeps both."""
    flow = Dataflow("raw")
    flow.input("ev", keyed=True).process(j.RawCounter, name="first").map(j.to_list) \
        .process(j.RawCounter, name="second").output("n", codec=codecs.INT)
    assert list(flow.topology().computations) == ["first"]
    keys = [b"a", b"b", b"a", b"c", b"a", b"b"] * 5
    with TestRun(flow) as run:
        for i, k in enumerate(keys):
            run.inject("ev", k, b"x", T0 + i)
            if i == 13:
                run.run_until_idle()
                run.restart("first")
        run.run_until_idle()
        got: dict[bytes, list[int]] = defaultdict(list)
        for r in run.output("n"):
            got[r.key].append(int(r.value))
    assert got == {k: list(range(1, n + 1)) for k, n in Counter(keys).items()}


def test_a_process_steps_state_held_for_a_call_is_forgotten_when_the_call_is_undone() -> None:
    """A step's ``ctx.state`` is held per key for the stage's call and written when it ends:
    when a later step raises, the worker undoes the call and runs its records one by one, and
    the counts of the undone call must not leak into the reruns."""
    flow = Dataflow("tally", key_ranges=1)
    flow.input("w", codec=codecs.STR, keyed=True).process(j.Tally, name="tally").map(j.fragile_tally) \
        .output("out", codec=codecs.STR)
    with TestRun(flow) as run:
        for i, w in enumerate(["a", "b", "boom", "c", "d"]):
            run.inject("w", b"k", w.encode(), T0 + i)
        run.run_until_idle()
        run.restart("tally")
        run.inject("w", b"k", b"e", T0 + 9)
        run.run_until_idle()
        assert [r.value for r in run.output("out")] == [b"a:1", b"b:2", b"c:3", b"d:4", b"e:5"]
        assert len(run.output("tally.dead_letter")) == 1


def test_a_process_steps_state_over_the_limit_dead_letters_the_record_that_wrote_it() -> None:
    """A held state value over 16 MiB is refused at its ``set`` (as ``ctx.state`` refuses it
    outside a flow), and only its record is lost."""
    flow = Dataflow("dbl", key_ranges=1)
    flow.input("w", keyed=True).process(j.Doubler, name="dbl").output("held", codec=codecs.INT)
    big = b"x" * (9 << 20)
    with TestRun(flow) as run:
        for i, v in enumerate([b"ab", big, b"cde", b"f"]):
            run.inject("w", b"k", v, T0 + i)
        run.run_until_idle()
        assert [int(r.value) for r in run.output("held")] == [0, 4, 6]
        [letter] = run.output("dbl.dead_letter")
        assert "state value" in _j(letter)["error"]


def test_a_state_value_over_the_limit_is_refused_however_the_records_are_batched() -> None:
    """``big`` sets 17 MiB, the next record of its key clears it: in one call the value is
    never written, but ``big`` is refused all the same (as it is when run alone)."""
    flow = Dataflow("shr", key_ranges=1)
    flow.input("w", keyed=True).process(j.Shrinker, name="shr").output("out")
    with TestRun(flow) as run:
        run.inject_batch("w", [(b"k", v, T0 + i) for i, v in enumerate([b"a", b"big", b"b"])])
        run.run_until_idle()
        assert [r.value for r in run.output("out")] == [b"a", b"b"]
        [letter] = run.output("shr.dead_letter")
        assert "over the limit" in _j(letter)["error"]


def test_a_typed_state_named_like_ctx_state_is_refused_in_a_process_step() -> None:
    flow = Dataflow("ns", key_ranges=1)
    flow.input("w", keyed=True).process(j.NamedState, name="ns").output("out")
    with TestRun(flow) as run:
        run.inject("w", b"k", b"a", T0)
        run.run_until_idle()
        assert run.output("out") == []
        [letter] = run.output("ns.dead_letter")
        assert "may not be named 'state'" in _j(letter)["error"]


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


def test_a_failed_try_of_a_fused_sink_takes_back_its_timer_list_and_state(tmp_path: Any) -> None:
    """A sink's first try of each record sets a timer, rewrites its list and its ``ctx.state``,
    then raises: the retry sees none of it, and the timer never fires."""
    flow = Dataflow("h", key_ranges=1)
    flow.input("w", codec=codecs.STR, keyed=True).sink(j.UndoneTrySink, name="h_out", path=str(tmp_path))
    with TestRun(flow) as run:
        run.inject("w", b"k", b"a", T0)
        run.run_until_idle()
        run.inject("w", b"k", b"b", T0 + 5)
        run.finish("w")
        run.run_until_idle()
    assert sorted(str(r["value"]) for r in read_file_sink(str(tmp_path))) == ["a:a:-", "b:a,b:-"]


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


def test_a_sink_codec_that_does_not_make_bytes_dead_letters_only_its_record(tmp_path: Any) -> None:
    flow = Dataflow("sc", key_ranges=1)
    flow.input("w", codec=codecs.STR, keyed=True).sink(FileSink, name="sc_out", codec=j.STRINGY, path=str(tmp_path))
    with TestRun(flow) as run:
        for i, w in enumerate(["a", "str", "b"]):
            run.inject("w", b"k%d" % i, w.encode(), T0 + i)
        run.run_until_idle()
        [letter] = [r for c in run.topology.computations for r in run.output(c + ".dead_letter")]
        assert "not bytes" in _j(letter)["error"]
    assert sorted(str(r["value"]) for r in read_file_sink(str(tmp_path))) == ["a", "b"]


def test_a_process_steps_bytes_state_takes_bytes_like_values_and_refuses_others() -> None:
    flow = Dataflow("raw")
    flow.input("ev", keyed=True).process(j.RawState, name="keep").output("held", codec=codecs.JSON)
    with TestRun(flow) as run:
        for i, v in enumerate([b"one", b"two", b"int", b"clear", b"three"]):
            run.inject("ev", b"k", v, T0 + i)
            run.run_until_idle()
        held = [_j(r) for r in run.output("held")]
        [letter] = run.output("keep.dead_letter")
    assert "state must be bytes, not int" in _j(letter)["error"]
    # "int" was dead-lettered whole, so its state write never happened.
    assert held == [None, "one", "two", None]


def test_a_process_step_may_not_move_records_to_another_key() -> None:
    flow = Dataflow("p")
    flow.input("ev", keyed=True).process(j.Rekeys).output("x")
    with TestRun(flow) as run:
        run.inject("ev", b"k", b"v", T0)
        run.run_until_idle()
        [letter] = run.output("p.process.dead_letter")
        assert "must keep the current key" in _j(letter)["error"]
        assert run.output("x") == []


def test_a_key_function_returning_no_key_dead_letters_its_record() -> None:
    flow = Dataflow("k")
    flow.input("w", codec=codecs.STR, keyed=True).map(j.fragile).key_by(j.int_key).reduce(j.add) \
        .output("out", codec=codecs.JSON)
    with TestRun(flow) as run:
        run.inject("w", b"a", b"a", T0)
        run.run_until_idle()
        [letter] = run.output("k.input.dead_letter")
        assert "returned int (7); return the key as str or bytes" in _j(letter)["error"]


def test_a_user_aggregator_is_rebuilt_from_its_class_and_fields() -> None:
    flow = Dataflow("a")
    flow.input("ev", codec=codecs.JSON, keyed=True).map(j.value_of).window(Tumbling(SECOND), j.SumAgg(10)) \
        .output("out", codec=codecs.JSON)
    with TestRun(flow) as run:
        for v in (1, 2, 3):
            run.inject("ev", b"a", json.dumps({"k": "a", "v": v}).encode(), T0 + v)
        run.finish("ev")
        run.run_until_idle()
        assert [_j(r)[2] for r in run.output("out")] == [60]


def test_a_sink_step_gets_the_values_encoded(tmp_path: Any) -> None:
    flow = Dataflow("s")
    flow.input("w", codec=codecs.STR, keyed=True).map(j.to_list).sink(FileSink, name="s_out", path=str(tmp_path))
    with TestRun(flow) as run:
        run.inject("w", b"k", b"hello", T0)
        run.run_until_idle()
    assert [(r["key"], r["value"]) for r in read_file_sink(str(tmp_path))] == [("k", '["hello"]')]


def test_a_fused_sink_gets_each_record_once_when_its_batch_runs_again_one_by_one(tmp_path: Any) -> None:
    """The sink is handed a call's records only once the call succeeded: here a branch after
    the sink raises on "boom", the worker undoes the batch's call and runs its records one by
    one, and the sink must not have kept the records of the undone call."""
    flow = Dataflow("b", key_ranges=1)
    words = flow.input("w", codec=codecs.STR, keyed=True)
    words.sink(FileSink, name="b_out", path=str(tmp_path))
    words.map(j.fragile).output("checked", codec=codecs.STR)
    assert flow.topology().computations["b.input"].code == "runtime.flows.stage:SinkStage"
    sent = ["a", "b", "boom", "c", "d"]
    with TestRun(flow) as run:
        for i, w in enumerate(sent):
            run.inject("w", b"k%d" % i, w.encode(), T0 + i)
        run.run_until_idle()
        [letter] = run.output("b.input.dead_letter")
        assert "boom is not a word" in _j(letter)["error"]
        assert sorted(r.value for r in run.output("checked")) == [b"a", b"b", b"c", b"d"]
    # "boom" was dead-lettered whole, so the sink never wrote it; the others once each.
    assert sorted(str(r["value"]) for r in read_file_sink(str(tmp_path))) == ["a", "b", "c", "d"]


def test_a_record_a_fused_sink_raises_on_goes_to_the_stages_dead_letters(tmp_path: Any) -> None:
    """Each record the sink fails on is tried, then dead-lettered, counted and the others go
    on; a failed try's state and timers are taken back (a flaky value's count is 1, not 2);
    an exception that cannot say what it is still makes a dead letter."""
    flow = Dataflow("p", key_ranges=1)
    flow.input("w", codec=codecs.STR, keyed=True).map(j.fragile).sink(j.PickySink, name="p_out", path=str(tmp_path))
    dead_before = _dead_lettered("p.input")
    with TestRun(flow) as run:
        for i, w in enumerate(["good", "bad", "boom", "fine", "odd", "flaky"]):
            run.inject("w", b"k%d" % i, w.encode(), T0 + i)
        run.run_until_idle()
        letters = sorted((_j(r)["error"], _j(r)["computation"]) for r in run.output("p.input.dead_letter"))
        run.restart("p.input")
        run.inject("w", b"k9", b"after", T0 + 9)
        run.run_until_idle()
    assert letters == [("Unprintable (its message could not be shown)", "p_out"),
                       ("ValueError: boom is not a word", "p.input"),
                       ("ValueError: the sink refuses bad values", "p_out")]
    assert _dead_lettered("p.input") - dead_before == 3
    # The sink's output survives the restart once (its meta commits with the stage's batch).
    assert sorted(str(r["value"]) for r in read_file_sink(str(tmp_path))) == ["after:1", "fine:1", "flaky:1",
                                                                             "good:1"]


def test_a_step_that_fails_writing_its_state_does_not_hand_the_sink_its_call_twice(tmp_path: Any) -> None:
    """A reduce refuses its running value when the stage writes it (at the end of the call,
    before the sink's turn): the worker undoes the call and runs its records one by one; the
    sink, beside the reduce, gets each other record once."""
    flow = Dataflow("r", key_ranges=1)
    words = flow.input("w", codec=codecs.STR, keyed=True)
    words.sink(FileSink, name="r_out", path=str(tmp_path))
    words.map(j.poison).reduce(j.last).map(j.type_name).output("types", codec=codecs.STR)
    assert flow.topology().computations["r.reduce"].code == "runtime.flows.stage:SinkStage"
    sent = ["a", "bb", "refuse", "c", "dd"]
    with TestRun(flow) as run:
        for i, w in enumerate(sent):
            run.inject("w", b"k%d" % i, w.encode(), T0 + i)
        run.run_until_idle()
        [letter] = run.output("r.reduce.dead_letter")
        assert _j(letter)["computation"] == "r.reduce" and "object" in _j(letter)["error"]
        run.inject("w", b"k1", b"eee", T0 + 9)
        run.run_until_idle()
    assert sorted(str(r["value"]) for r in read_file_sink(str(tmp_path))) == ["a", "bb", "c", "dd", "eee"]


def test_a_fused_sink_producing_from_its_timer_is_refused_and_its_timer_dead_lettered(tmp_path: Any) -> None:
    flow = Dataflow("t", key_ranges=1)
    flow.input("w", codec=codecs.STR, keyed=True).sink(j.FlushingSink, name="t_out", path=str(tmp_path))
    with TestRun(flow) as run:
        run.inject("w", b"k1", b"loud", T0)
        run.inject("w", b"k2", b"quiet", T0 + 1)
        run.finish("w")
        run.run_until_idle()
        [letter] = run.output("t.input.dead_letter")
    assert "a sink writes out of millstream" in _j(letter)["error"]
    assert sorted(str(r["value"]) for r in read_file_sink(str(tmp_path))) == ["flushed quiet", "loud", "quiet"]


def test_a_computation_with_two_inputs_knows_where_each_record_came_from() -> None:
    topo = Topology("two").add_computation("by_source", j.BySource, inputs={"left": None, "right": None},
                                           outputs=["out"])
    assert topo.computations["by_source"].code == "tests.flowjobs:BySource"
    with TestRun(topo) as run:
        run.inject("left", b"k", b"1", T0)
        run.inject("right", b"k", b"2", T0)
        run.run_until_idle()
        assert sorted(r.value for r in run.output("out")) == [b"left:1", b"right:2"]
        assert {r.stream for r in run.output("out")} == {"out"}


def test_a_stage_fed_a_record_of_a_stream_it_does_not_read_says_so() -> None:
    from runtime.flows.stage import FlowStage
    from runtime.record import Record

    flow = Dataflow("x")
    a = flow.input("a", keyed=True)
    a.join(flow.input("b", keyed=True), Tumbling(SECOND), name="jx").output("o")
    stage = FlowStage()
    stage.setup(flow.topology().computations["jx"].params)
    with pytest.raises(MillstreamError, match="got a record of stream 'c', which it does not read"):
        stage.process_record(None, Record(b"k", b"v", T0, b"", "c"))  # type: ignore[arg-type]


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


def test_a_firings_stall_includes_the_fused_sink_writing_what_fired(monkeypatch: Any, tmp_path: Any) -> None:
    """millstream_window_fire_seconds is how long a firing held its tablet: the fused sink
    writes the fired windows at the end of the same call, so its time counts."""
    monkeypatch.setattr(windowing, "perf_counter", j.CLOCK)
    flow = Dataflow("tick", key_ranges=1)
    flow.input("ev", keyed=True).window(Tumbling(SECOND), Count(), name="tick_counts") \
        .sink(j.TickingSink, name="tick_out", path=str(tmp_path))
    before = REGISTRY.get_sample_value("millstream_window_fire_seconds_sum", {"step": "tick_counts"}) or 0.0
    with TestRun(flow) as run:
        for i in range(3):
            run.inject("ev", b"k%d" % i, b"", T0 + i)
        run.finish("ev")
        run.run_until_idle()
    assert len(list(read_file_sink(str(tmp_path)))) == 3
    after = REGISTRY.get_sample_value("millstream_window_fire_seconds_sum", {"step": "tick_counts"})
    assert after - before == 3.0


def _dead_lettered(computation: str) -> float:
    return REGISTRY.get_sample_value("millstream_dead_lettered_total", {"computation": computation}) or 0.0


def _fire_calls(step: str) -> float:
    return REGISTRY.get_sample_value("millstream_window_fire_seconds_count", {"step": step}) or 0.0
