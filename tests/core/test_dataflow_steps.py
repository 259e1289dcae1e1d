"""Dataflow ``process`` steps and fused sinks in process: each step's own state and timers,
state held for a call and forgotten when the call is undone, size limits, and what a fused
sink's failed try takes back."""

from __future__ import annotations

import json
import os
import weakref
from collections import Counter, defaultdict
from typing import Any

import pytest
from prometheus_client import REGISTRY

from runtime import Dataflow, Topology, codecs
from runtime.errors import UsageError
from runtime.sinks import FileSink, read_file_sink
from runtime.testing import TestRun
from runtime.windows import SECOND, Sum, Tumbling
from tests import flowjobs as j

T0 = 1_700_000_000_000_000


def _j(record: Any) -> Any:
    return json.loads(record.value)


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


def test_a_process_steps_timer_fires_whatever_its_tag_holds() -> None:
    """Review of the flows' state: a step's timer tag is ``flow/<step>/:<user tag>``, and the
    stage split it at its last "/", so a user tag with a "/" named no step: the timer was
    taken and never reached ``process_timer``."""
    tags = ["flush", "flush/daily", "a/b/c", "/", "x/"]
    flow = Dataflow("tags", key_ranges=1)
    (flow.input("in", codec=codecs.STR).key_by(j.word_key).process(j.TimerPerValue, name="p")
     .output("o", codec=codecs.STR))
    with TestRun(flow) as run:
        for i, tag in enumerate(tags):
            run.inject("in", b"", tag.encode(), T0 + i)
        run.finish("in")
        run.run_until_idle()
        fired = sorted(r.value.decode() for r in run.output("o"))
    assert fired == sorted("fired " + t for t in tags)


def test_batches_injected_across_key_ranges_are_each_taken_once() -> None:
    """Review of the flows' state: ``TestRun.inject_batch`` told every tablet a batch reached
    that it had the batch's last record, so the next batch to a tablet that had not was
    refused as out of order, and retried for ever (every flow of 4 key ranges)."""
    flow = Dataflow("ranges")  # the default key ranges
    (flow.input("in", codec=codecs.STR).key_by(j.word_key).map(j.one).reduce(j.add, name="n")
     .output("o", codec=codecs.INT))
    words = [f"w{i}" for i in range(20)]
    with TestRun(flow) as run:
        for b in range(3):
            run.inject_batch("in", [(b"", w.encode(), T0 + b) for w in words])
        run.finish("in")
        run.run_until_idle()
        last: dict[bytes, int] = {}
        for r in run.output("o"):
            last[r.key] = int(r.value)
    assert all(c.key_ranges > 1 for c in flow.topology().computations.values())
    assert last == {w.encode(): 3 for w in words}


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


def test_a_typed_state_named_like_ctx_state_or_too_long_is_refused_where_the_flow_is_set_up() -> None:
    """Declared on the class: refused when the step is set up (at submit; here, when the run
    starts), not by dead-lettering every record; a name over 255 bytes once the step's name is
    before it failed every call with a ValueError."""
    for cls, step, says in ((j.NamedState, "ns", "may not be named 'state'"),
                            (j.LongNamedState, "l" * 120, "over the 255 a state name may have")):
        flow = Dataflow("ns", key_ranges=1)
        flow.input("w", keyed=True).process(cls, name=step).output("out")
        with pytest.raises(UsageError, match=says):
            with TestRun(flow) as run:
                run.inject("w", b"k", b"a", T0)
                run.run_until_idle()


def test_a_class_attribute_that_only_looks_like_a_spec_is_left_alone() -> None:
    """Review of this round's fixes: the step took every class attribute with ``name`` and
    ``kind`` for a typed state spec and copied it (a namedtuple has no ``__dict__``)."""
    flow = Dataflow("na", key_ranges=1)
    flow.input("w", keyed=True).process(j.WithNamedAttribute, name="na").output("out")
    with TestRun(flow) as run:
        run.inject("w", b"k", b"a", T0)
        run.run_until_idle()
        assert [r.value for r in run.output("out")] == [b"a"]


def test_a_spec_made_where_a_freed_one_lived_gets_its_own_copy() -> None:
    """Review of typed state (3), made certain: a spec is freed and another of another kind is
    made at its address (CPython gives a freed block to the next object of its size)."""
    from runtime import ListState, ValueState
    from runtime.flows.steps import Process

    op = Process("p", j.InlineSpecs())
    first = ListState("a", codecs.INT)
    address, ref = id(first), weakref.ref(first)
    op.renamed(first)
    del first
    second = ValueState("b", codecs.STR)
    alive = []
    while ref() is None and id(second) != address:  # freed: objects are made until one lives there
        alive.append(second)
        second = ValueState("b", codecs.STR)
        assert len(alive) < 100_000, "no object was made at the freed spec's address; the test cannot tell"
    copy = op.renamed(second)
    assert type(copy) is ValueState and copy.name.endswith("/b")


def test_specs_made_in_each_call_each_get_their_own_state() -> None:
    """Specs made in each call, not declared on the class, work in a flow step (a ListState
    then a ValueState: the case of review of typed state (3), which the test above makes sure
    of: here the allocator may or may not put the second where the first was)."""
    flow = Dataflow("inl", key_ranges=1)
    flow.input("w", keyed=True).process(j.InlineSpecs, name="inl").output("out")
    with TestRun(flow) as run:
        run.inject_batch("w", [(b"k", b"a", T0 + i) for i in range(20)])
        run.run_until_idle()
        assert run.output("inl.dead_letter") == []
        assert [r.value for r in run.output("out")] == [b"None"] * 20


def test_a_handle_kept_from_one_key_is_refused_for_the_next_key_of_the_same_call() -> None:
    """Review of typed state: a flow's step runs a batch of keys in one call of its stage, so
    the per-call check let a handle kept from key ``a`` count ``b``'s record into ``a``'s state."""
    flow = Dataflow("ch", key_ranges=1)
    flow.input("w", keyed=True).process(j.CachedHandle, name="ch").output("out")
    with TestRun(flow) as run:
        run.inject_batch("w", [(b"a", b"1", T0), (b"b", b"2", T0 + 1)])
        run.run_until_idle()
        # b's use fails the call; run again one record per call, each use of the kept handle is
        # outside the call that got it: both are dead-lettered, and nothing counted into a's state
        assert run.output("out") == []
        letters = run.output("ch.dead_letter")
        assert sorted(r.key for r in letters) == [b"a", b"b"]
        assert all("call ctx.state_of(...) again" in _j(r)["error"] for r in letters)


def test_a_ttl_firing_leaves_what_a_window_firing_it_overtakes_is_to_read(monkeypatch: Any) -> None:
    """Review of the TTL bound: a window step's timer fires many keys' windows under one key;
    a firing that ran out of its slice set itself again for the others, and their TTL timers
    in the same batch deleted what those windows were to read at their own time."""
    from runtime.flows import windowing
    monkeypatch.setattr(windowing, "FIRE_SLICE_S", 0.0)  # one chunk of windows per call
    keys = [b"k%02d" % i for i in range(40)]
    flow = Dataflow("prev", key_ranges=1)
    flow.input("ev", codec=codecs.INT, keyed=True).window(Tumbling(SECOND), Sum(), name="sums") \
        .process(j.PreviousWindow, name="prev").output("out", codec=codecs.JSON)
    with TestRun(flow) as run:
        run.inject_batch("ev", [(k, b"1", T0) for k in keys])
        run.advance_watermark("ev", T0 + 2 * SECOND)
        run.run_until_idle()  # each key's value: T0, until T0 + 1 s + 10 s
        run.inject_batch("ev", [(k, b"1", T0 + 5 * SECOND) for k in keys])
        run.run_until_idle()
        run.advance_watermark("ev", T0 + 100 * SECOND)  # the windows at 6 s and the TTL timers at 11 s at once
        run.run_until_idle()
        got = defaultdict(list)
        for r in run.output("out"):
            got[r.key].append(_j(r))
    assert got == {k: [[None, T0], [T0, T0 + 5 * SECOND]] for k in keys}


def test_a_flows_state_is_read_by_its_steps_names() -> None:
    """A flow's state was unreadable from outside (``state get --state``, Spark): its stage
    declares none. It names its steps' now: a reduce step's running value by the step's name,
    a process step's ``ctx.state`` by its name and its typed states as ``<step>/<state>``."""
    from runtime.errors import ConfigError
    flow = Dataflow("rs", key_ranges=1)
    flow.input("w", codec=codecs.STR).flat_map(j.words).key_by(j.word_key).map(j.one) \
        .reduce(j.add, name="counts").process(j.Remember, name="remember").output("out", codec=codecs.INT)
    [stage] = [c for c in flow.topology().computations if c != "rs.input"]
    with TestRun(flow) as run:
        run.inject("w", b"", b"a b a", T0)
        run.inject("w", b"", b"a", T0 + 1)
        run.run_until_idle()
        assert run.typed_state(stage, b"a", "counts") == 3
        assert run.typed_state(stage, b"b", "counts") == 1
        assert run.typed_state(stage, b"a", "remember") == b"3"
        assert run.typed_state(stage, b"a", "remember/seen") == [1, 2, 3]
        with pytest.raises(ConfigError, match=r"stage 'counts' declares no typed state 'seen' .*'counts' \(ValueState\), 'remember' "
                                              r"\(ValueState\), 'remember/seen' \(ListState\)"):
            run.typed_state(stage, b"a", "seen")


@pytest.mark.parametrize("clear_points", [1024, 0])
def test_a_failed_try_of_a_fused_sink_takes_back_its_timer_list_and_state(tmp_path: Any, monkeypatch: Any,
                                                                          clear_points: int) -> None:
    """A sink's first try of each record sets a timer, rewrites its list and its ``ctx.state``,
    then raises: the retry sees none of it, and the timer never fires. Its list's clear is the
    stage's (with ``clear_points`` 0, a range delete, as for a clear past the limit), taken back."""
    from worker import context
    monkeypatch.setattr(context, "CLEAR_POINTS", clear_points)
    ranges: list[int] = []
    real = context.KeyContext.cell_clear
    monkeypatch.setattr(context.KeyContext, "cell_clear",
                        lambda self, prefix: (real(self, prefix), ranges.append(len(self.effects.cleared)))[0])
    monkeypatch.setattr(j.UndoneTrySink, "failed", set())
    flow = Dataflow("h", key_ranges=1)
    flow.input("w", codec=codecs.STR, keyed=True).sink(j.UndoneTrySink, name="h_out", path=str(tmp_path))
    with TestRun(flow) as run:
        run.inject("w", b"k", b"a", T0)
        run.run_until_idle()
        run.inject("w", b"k", b"b", T0 + 5)
        run.finish("w")
        run.run_until_idle()
    assert sorted(str(r["value"]) for r in read_file_sink(str(tmp_path))) == ["a:a:-", "b:a,b:-"]
    assert ranges == [0, 1 if clear_points == 0 else 0]  # the stage's clear ran: of "a", a range delete with 0


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


def _dead_lettered(computation: str) -> float:
    return REGISTRY.get_sample_value("millstream_dead_lettered_total", {"computation": computation}) or 0.0


def _lines(path: Any) -> list[bytes]:
    out = []
    for name in sorted(os.listdir(path)):
        if name.endswith(".txt"):
            with open(os.path.join(path, name), "rb") as f:
                out += f.read().splitlines()
    return out


def test_a_sink_that_writes_batches_gets_one_call_and_a_bad_record_is_dead_lettered_alone(tmp_path: Any) -> None:
    """``process_batch`` takes the stage's call in one call; when it raises, the records go one
    by one to ``process_batch`` (the class has no ``process_record``: the base class's does
    nothing, and would lose them), and only the bad one is dead-lettered."""
    flow = Dataflow("b", key_ranges=1)
    flow.input("w", codec=codecs.STR, keyed=True).sink(j.BatchSink, name="b_out", path=str(tmp_path / "ok"))
    j.BatchSink.calls.clear()
    with TestRun(flow) as run:
        run.inject_batch("w", [(b"k%d" % i, w.encode(), T0 + i) for i, w in enumerate(["a", "b", "c", "d"])])
        run.run_until_idle()
        assert sorted(_lines(tmp_path / "ok")) == [b"a", b"b", b"c", b"d"]
        assert j.BatchSink.calls == [4]
        j.BatchSink.calls.clear()
        run.inject_batch("w", [(b"k%d" % i, w.encode(), T0 + 10 + i) for i, w in enumerate(["e", "bad", "f"])])
        run.run_until_idle()
        [letter] = run.output("b.input.dead_letter")
    assert _j(letter)["computation"] == "b_out" and "refuses bad values" in _j(letter)["error"]
    assert sorted(_lines(tmp_path / "ok")) == [b"a", b"b", b"c", b"d", b"e", b"f"]
    assert j.BatchSink.calls[0] == 3 and set(j.BatchSink.calls[1:]) == {1}


def test_a_classic_sink_that_writes_batches_loses_nothing_when_a_batch_fails(tmp_path: Any) -> None:
    """The same sink as a classic computation (worker/batch.py's batch call and its one-by-one
    fallback)."""
    topo = Topology("c").add_computation("c_out", j.BatchSink, inputs={"w": None}, key_ranges=1,
                                         params={"path": str(tmp_path)})
    j.BatchSink.calls.clear()
    with TestRun(topo) as run:
        run.inject_batch("w", [(b"k%d" % i, w.encode(), T0 + i) for i, w in enumerate(["e", "bad", "f", "g"])])
        run.run_until_idle()
        [letter] = run.output("c_out.dead_letter")
    assert "refuses bad values" in _j(letter)["error"]
    assert sorted(_lines(tmp_path)) == [b"e", b"f", b"g"]
    assert j.BatchSink.calls[0] == 4


def test_a_subclass_that_checks_each_record_of_a_sink_that_writes_batches_still_sees_each(tmp_path: Any) -> None:
    """FileSink writes batches; PickySink overrides its process_record to check and rewrite
    each record: that must run for every record of a batch, not FileSink's process_batch."""
    flow = Dataflow("s", key_ranges=1)
    flow.input("w", codec=codecs.STR, keyed=True).sink(j.PickySink, name="s_out", path=str(tmp_path))
    with TestRun(flow) as run:
        run.inject_batch("w", [(b"k%d" % i, w.encode(), T0 + i) for i, w in enumerate(["good", "bad", "fine"])])
        run.run_until_idle()
        [letter] = run.output("s.input.dead_letter")
    assert "refuses bad values" in _j(letter)["error"]
    assert sorted(str(r["value"]) for r in read_file_sink(str(tmp_path))) == ["fine:1", "good:1"]


def test_a_sink_that_writes_batches_on_weak_productions_gets_each_record(tmp_path: Any) -> None:
    """Weak productions take no batch call (their ids derive from the record that made them):
    a class with process_batch only gets each record through it, not the base class's no-op."""
    topo = Topology("w").add_computation("w_out", j.BatchSink, inputs={"w": None}, key_ranges=1,
                                         productions="weak", params={"path": str(tmp_path)})
    j.BatchSink.calls.clear()
    with TestRun(topo) as run:
        run.inject_batch("w", [(b"k%d" % i, w.encode(), T0 + i) for i, w in enumerate(["e", "f", "g"])])
        run.run_until_idle()
    assert sorted(_lines(tmp_path)) == [b"e", b"f", b"g"]
    assert j.BatchSink.calls == [1, 1, 1]


def test_a_flows_stage_takes_larger_batches_than_a_classic_computation(tmp_path: Any) -> None:
    """A flow's operators work per batch (one state write per key and window), so its stage's
    tablet takes batches of flow_batch_records; a classic computation keeps
    max_batch_records (its per-record state gains nothing, and its watermark would lag)."""
    from worker.core import WorkerLimits

    limits = WorkerLimits()
    assert limits.flow_batch_records > limits.max_batch_records
    flow = Dataflow("f", key_ranges=1)
    flow.input("w", codec=codecs.STR, keyed=True).sink(j.BatchSink, name="f_out", path=str(tmp_path / "f"))
    topo = Topology("c").add_computation("c_out", j.BatchSink, inputs={"v": None}, key_ranges=1,
                                         params={"path": str(tmp_path / "c")})
    for job, stream, computation, want in ((flow, "w", "f.input", limits.flow_batch_records),
                                           (topo, "v", "c_out", limits.max_batch_records)):
        with TestRun(job) as run:
            run.inject(stream, b"k", b"x", T0)
            run.run_until_idle()
            assert run._tablet(computation, b"k").max_batch == want
