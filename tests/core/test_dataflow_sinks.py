"""A ``sink`` fused into the stage before it, in process: a failed try takes back what it did,
the codec's refusals and the sink's own dead-letter only their record, each record reaches the
sink once when its batch runs again, and sinks that write whole batches."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from prometheus_client import REGISTRY

from runtime import Dataflow, Topology, codecs
from runtime.sinks import FileSink, read_file_sink
from runtime.testing import TestRun
from tests import flowjobs as j

T0 = 1_700_000_000_000_000


def _j(record: Any) -> Any:
    return json.loads(record.value)


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
