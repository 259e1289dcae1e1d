"""Dataflows (DESIGN.md §3b) in process: the API's refusals, what a flow compiles to (which
steps fuse), keys and multi-input stages, and a word count through a restart, on the real
worker (runtime.testing.TestRun: its batches, dedup, timers, typed state and RocksDB).
Windows and joins: test_dataflow_windows.py; process steps and fused sinks:
test_dataflow_steps.py."""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from typing import Any

import pytest

from runtime import Dataflow, KeyedStream, Topology, codecs
from runtime.client import check_not_main
from runtime.errors import ImportPathError, MillstreamError, TopologyError, UsageError
from runtime.flows.values import VALUES
from runtime.sinks import FileSink
from runtime.testing import TestRun
from runtime.windows import SECOND, Count, Session, Tumbling, WindowResult
from tests import flowjobs as j

T0 = 1_700_000_000_000_000


def _j(record: Any) -> Any:
    return json.loads(record.value)


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
    with pytest.raises(UsageError, match="joins take Tumbling or Sliding windows .* use interval_join"):
        keyed.join(flow.input("e", keyed=True), Session(SECOND))  # (when the step is added, not at submit)
    with pytest.raises(UsageError, match="pass an aggregator object, e.g. Count"):
        keyed.window(Tumbling(SECOND), Count)
    with pytest.raises(UsageError, match="already has a step named 'x'"):
        keyed.map(j.value_of, name="x").map(j.value_of, name="x")
    with pytest.raises(UsageError, match=r"param every=\[3\] is a list; params reach the step's setup as text"):
        keyed.process(j.RawCounter, every=[3])
    with pytest.raises(TopologyError, match="has no input"):
        Dataflow("empty").topology()


def test_step_params_reach_setup_as_text_paths_and_numbers_included(tmp_path: Any) -> None:
    """``sink(FileSink, path=tmp_path)`` with pytest's Path, numbers and booleans: each as the
    text the class's setup reads (DESIGN.md: ``sink(cls, **params)``)."""
    from runtime.sinks import FileSink

    flow = Dataflow("params")
    keyed = flow.input("in", keyed=True).process(j.RawCounter, every=3, loud=True, ratio=0.5)
    keyed.sink(FileSink, path=tmp_path / "out")
    steps = {c.name: c for c in flow.topology().computations.values()}
    plan = json.loads(next(iter(steps.values())).params["flow.plan"])["steps"]
    assert plan["params.process"]["params"] == {"every": "3", "loud": "true", "ratio": "0.5"}
    assert plan["params.sink"]["params"] == {"path": str(tmp_path / "out")}


def test_a_stream_read_by_one_stage_both_keyed_as_it_comes_and_by_key_by_reaches_both_sides() -> None:
    """Review: a keyed input's entry replaced the other reader's of the same stream in one
    stage (a join of the two), and that side silently got no records. The key_by's reader
    now hops through the input's stateless stage, whichever was declared first; two keyed
    readers of one stream in one stage are refused."""
    for keyed_first in (False, True):
        flow = Dataflow("twice")
        if keyed_first:
            direct = flow.input("x", codec=codecs.JSON, keyed=True)
            by_key = flow.input("x", codec=codecs.JSON).key_by(j.key_of)
        else:
            by_key = flow.input("x", codec=codecs.JSON).key_by(j.key_of)
            direct = flow.input("x", codec=codecs.JSON, keyed=True)
        by_key.map(j.value_of).join(direct, Tumbling(SECOND), name="both").output("o", codec=codecs.JSON)
        with TestRun(flow) as run:
            run.inject("x", b"k", json.dumps({"k": "k", "v": 1}).encode(), T0)
            run.finish("x")
            run.run_until_idle()
            assert [json.loads(r.value) for r in run.output("o")] == [[1, {"k": "k", "v": 1}]], keyed_first
    flow = Dataflow("twice_keyed")
    flow.input("x", keyed=True).join(flow.input("x", keyed=True), Tumbling(SECOND)).output("o")
    with pytest.raises(TopologyError, match="stream 'x' is read twice, keyed as it comes, by one stage"):
        flow.topology()


def test_a_lookup_join_may_take_its_table_from_the_streams_input_through_a_window() -> None:
    """A window's results come when it fires, never in the call that takes a record: a table
    of them may come from the stream's own input (each click with its page's last closed
    minute's count); straight from that input it may not (the record would meet itself)."""
    flow = Dataflow("lw")
    clicks = flow.input("clicks", codec=codecs.JSON).key_by(j.key_of)
    per_minute = clicks.window(Tumbling(60 * SECOND), Count(), name="minutes")
    clicks.lookup_join(per_minute, name="with_last_minute").output("o", codec=codecs.JSON)
    assert "with_last_minute" in flow.steps
    updates = clicks.window(Tumbling(SECOND), Count(), name="live", emit="updates")
    with pytest.raises(UsageError, match="the table comes from input 'clicks'"):
        clicks.lookup_join(updates)
    earlier = per_minute.key_by(j.window_key, name="rekeyed")  # results of a stage before: records as they come
    with pytest.raises(UsageError, match="the table comes from input 'clicks'"):
        flow.input("clicks", codec=codecs.JSON).key_by(j.key_of, name="again").lookup_join(earlier)


def test_a_second_lookup_join_may_take_a_table_from_the_input_an_earlier_ones_table_came_from() -> None:
    """A lookup_join's table records update its state and go no further: a second join whose
    table comes from the same input is no record meeting itself (it was refused: the walk went
    through the first join's table side)."""
    flow = Dataflow("two_lookups", key_ranges=1)
    users = flow.input("users", codec=codecs.JSON, keyed=True)
    names = users.map(j.value_of, name="names")
    flow.input("visits", codec=codecs.JSON, keyed=True).lookup_join(users, name="with_user") \
        .lookup_join(names, name="with_name").output("o", codec=codecs.JSON)
    with pytest.raises(UsageError, match="the table comes from input 'users'"):
        users.lookup_join(names)  # (straight from the input it still may not)
    with TestRun(flow) as run:
        run.inject("users", b"ann", json.dumps({"k": "ann", "v": "Ann"}).encode(), T0)
        run.inject("visits", b"ann", b"1", T0 + 1)
        run.run_until_idle()
        assert [json.loads(r.value) for r in run.output("o")] == [[[1, {"k": "ann", "v": "Ann"}], "Ann"]]
    # A table of joined records carries its own table's values: a record of that input could
    # meet itself through it, whichever came first.
    other = Dataflow("carried")
    users = other.input("users", codec=codecs.JSON, keyed=True)
    enriched = other.input("orders", codec=codecs.JSON, keyed=True).lookup_join(users).key_by(j.key_of)
    with pytest.raises(UsageError, match="the table carries, through an earlier lookup_join's table, input 'users'"):
        other.input("users", codec=codecs.JSON).key_by(j.key_of, name="users_again").lookup_join(enriched)


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


def test_what_a_process_steps_event_time_timer_produces_is_on_time_for_a_window_after_it() -> None:
    """Review of the flows: fused before a window, a process step's timer output was judged by
    the window against the stage's input watermark, not the timer's time: with the watermark
    past the window's end (here: finish), the delayed record went to ``w.late`` and its window
    never fired. As in a computation of its own (whose pending timer would hold the window's
    watermark), it now counts."""
    flow = Dataflow("delay")
    flow.input("in", keyed=True).process(j.Delay, name="hold").window(Tumbling(SECOND), Count(), name="w") \
        .output("counts", codec=codecs.JSON)
    with TestRun(flow) as run:
        run.inject("in", b"k", b"x", T0)
        run.inject("in", b"k", b"y", T0 + SECOND - 1)  # held into the next window: [T0 + 1 s, T0 + 2 s)
        run.finish("in")
        run.run_until_idle()
        assert sorted(json.loads(r.value) for r in run.output("counts")) == [[T0, T0 + SECOND, 1],
                                                                            [T0 + SECOND, T0 + 2 * SECOND, 1]]
        assert run.output("w.late") == []


def test_a_process_steps_event_time_timer_waits_for_the_window_before_it_to_fire_what_is_due(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Review of the flows: a window fires what falls due in slices, batch after batch, and a
    process step after it in the stage ran its event-time timers in the first batch, before
    the window's later slices reached it. Its timer now waits, as an event-time step after a
    window does: each key counts both of its windows before it reports."""
    from runtime.flows import windowing

    monkeypatch.setattr(windowing, "FIRE_SLICE_S", 0)  # one slice of FIRE_CHUNK windows per batch
    keys = [b"k%02d" % i for i in range(40)]
    flow = Dataflow("late_report", key_ranges=1)  # (one tablet: its window fires 40 keys in slices)
    flow.input("in", keyed=True).window(Tumbling(SECOND), Count(), name="w").process(j.CountResults, name="count") \
        .output("reports", codec=codecs.JSON)
    with TestRun(flow) as run:
        for k in keys:
            run.inject("in", k, b"x", T0)
        for k in reversed(keys):  # the second windows fire from the last key, the timers from the first
            run.inject("in", k, b"x", T0 + SECOND)
        run.advance_watermark("in", T0 + SECOND)
        run.run_until_idle()
        run.advance_watermark("in", T0 + 10 * SECOND)
        run.run_until_idle()
        assert sorted((r.key, json.loads(r.value)) for r in run.output("reports")) == [(k, 2) for k in keys]


def test_a_process_steps_timer_set_past_the_watermark_makes_late_output_and_never_refires_a_window() -> None:
    """After review: judged at its own time, the output of a timer a late record set (below
    the watermark) re-made a window that had fired and fired it again. As in a computation
    of its own, whose output watermark had passed that time, it is late: one result per
    window, and the held-back record on ``w.late``."""
    flow = Dataflow("delay_late")
    flow.input("in", keyed=True).process(j.Delay, name="hold").window(Tumbling(SECOND), Count(), name="w") \
        .output("counts", codec=codecs.JSON)
    with TestRun(flow) as run:
        run.inject("in", b"k", b"x", T0)
        run.advance_watermark("in", T0 + 5 * SECOND)
        run.run_until_idle()
        assert [json.loads(r.value) for r in run.output("counts")] == [[T0, T0 + SECOND, 1]]
        run.inject("in", b"k", b"late", T0 + 10_000)  # late: its window fired
        run.run_until_idle()
        run.finish("in")
        run.run_until_idle()
        assert [json.loads(r.value) for r in run.output("counts")] == [[T0, T0 + SECOND, 1]]
        assert [(r.key, r.timestamp) for r in run.output("w.late")] == [(b"k", T0 + 110_000)]


def test_timers_a_process_step_sets_while_the_stage_fires_are_on_time_for_the_window_after_it() -> None:
    """After review: the hold of a timer set below the watermark was taken against the stage's
    input watermark, not where the steps after it judge (a firing's time): a timer set from
    a window's result, or from the step's own timer, after a finish was late for the next
    window, as it would not be in a computation of its own."""
    flow = Dataflow("wpw", key_ranges=1)
    flow.input("in", keyed=True).window(Tumbling(SECOND), Count(), name="w1").process(j.Delay, name="hold") \
        .window(Tumbling(SECOND), Count(), name="w2").output("counts", codec=codecs.JSON)
    ticks = Dataflow("ticks", key_ranges=1)
    ticks.input("in", keyed=True).process(j.Ticks, name="tick").window(Tumbling(SECOND), Count(), name="w") \
        .output("counts", codec=codecs.JSON)
    for f, late, want in ((flow, "w2.late", [[T0 + SECOND, T0 + 2 * SECOND, 1]]),
                          (ticks, "w.late", [[T0 + s * SECOND, T0 + (s + 1) * SECOND, 1] for s in (1, 2, 3, 4)])):
        with TestRun(f) as run:
            run.inject("in", b"k", b"x", T0)
            run.finish("in")
            run.run_until_idle()
            assert sorted(json.loads(r.value) for r in run.output("counts")) == want
            assert run.output(late) == []
