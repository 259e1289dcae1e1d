"""The test kit (runtime.testing.TestRun): users' way to unit-test a job in-process, on
virtual time. These tests are also its examples (docs/testing.md)."""

from __future__ import annotations

import base64
import dataclasses
import json
from typing import Any

import pytest

from examples import windows, wordcount
from runtime import Computation, Context, Dataflow, Record, TimeDomain, Topology, codecs
from runtime.errors import MillstreamError
from runtime.testing import TestRun
from tests import flowjobs as j
from tests.jobs import TypedCounter

SECOND = 1_000_000
T0 = 1_700_000_000_000_000


def test_a_word_count_in_process() -> None:
    topo = wordcount.topology("/nonexistent-not-used", name="wc").without("counts_sink")  # read the run's
    with TestRun(topo) as run:
        for i, line in enumerate(["apple banana", "apple"]):
            run.inject("lines", b"", line.encode(), T0 + i)
        run.finish("lines")
        run.run_until_idle()
        assert sorted((r.key, r.value) for r in run.output("counts")) == [
            (b"apple", b"1"), (b"apple", b"2"), (b"banana", b"1")]
        assert run.state("counter", b"apple") == b"2"
        assert run.low_watermark("counter") == (1 << 63) - 1


def test_event_time_windows_fire_on_the_watermark_only() -> None:
    topo = windows.topology("/nonexistent-not-used", name="win").without("window_sink")
    with TestRun(topo) as run:
        for i in range(5):
            run.inject("events", b"k", b"", T0 + i * SECOND // 2)  # 0, .5, 1, 1.5, 2 s
        run.run_until_idle()
        assert run.output("window_counts") == [], "no window closes before the watermark passes it"
        run.advance_watermark("events", T0 + 2 * SECOND)
        run.run_until_idle()
        assert sorted(r.value for r in run.output("window_counts")) == [
            f"{T0},2".encode(), f"{T0 + SECOND},2".encode()]


class Reminder(Computation):
    """Sets a wall-clock timer 10 s after each record; it says when it fired."""

    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.set_timer("remind", ctx.now() + 10 * SECOND, TimeDomain.WALL_TIME)

    def process_timer(self, ctx: Context, tag: str, time: int) -> None:
        ctx.produce("reminders", str(ctx.now() - time).encode())


def test_wall_clock_timers_fire_on_the_virtual_clock() -> None:
    topo = Topology("remind").add_computation("reminder", "tests.unit.test_testing:Reminder",
                                              inputs={"in": None}, outputs=["reminders"])
    with TestRun(topo, start_us=T0) as run:
        run.inject("in", b"k", b"", T0)
        run.advance_wall_time(9 * SECOND)
        run.run_until_idle()
        assert run.output("reminders") == []
        run.advance_wall_time(SECOND)
        run.run_until_idle()
        assert [r.value for r in run.output("reminders")] == [b"0"]


def test_a_restart_keeps_what_was_committed_and_a_replay_counts_once() -> None:
    topo = wordcount.topology("/nonexistent-not-used", name="wc").without("counts_sink")
    topo.computations["counter"] = dataclasses.replace(topo.computations["counter"], code="tests.jobs:TypedCounter")
    with TestRun(topo) as run:
        run.inject("words", b"pear", b"1", T0, id=b"\x01" * 16)
        run.run_until_idle()
        run.restart("counter")
        run.inject("words", b"pear", b"1", T0, id=b"\x01" * 16)  # the same record again
        run.inject("words", b"pear", b"1", T0 + 1, id=b"\x02" * 16)
        run.run_until_idle()
        assert [r.value for r in run.output("counts")] == [b"1", b"2"]
        assert run.typed_state("counter", b"pear", TypedCounter.history) == [1, 2]
        assert run.typed_state("counter", b"pear", TypedCounter.count) == 2
        with pytest.raises(MillstreamError, match="no computation produces stream 'nope'"):
            run.output("nope")


def test_typed_state_without_a_ttl_outlives_a_finished_input() -> None:
    """Once every input has finished, the watermark is the end of time, which is also the
    expiry stored for state without a TTL: that state must still read (it read as missing)."""
    topo = wordcount.topology("/nonexistent-not-used", name="wc").without("counts_sink")
    topo.computations["counter"] = dataclasses.replace(topo.computations["counter"], code="tests.jobs:TypedCounter")
    with TestRun(topo) as run:
        run.inject("words", b"plum", b"1", T0)
        run.finish("words")
        run.finish("lines")
        run.run_until_idle()
        assert run.low_watermark("counter") == (1 << 63) - 1
        assert run.typed_state("counter", b"plum", TypedCounter.count) == 1
        assert run.typed_state("counter", b"plum", TypedCounter.history) == [1]


def test_a_key_extractor_that_raises_sends_the_record_to_its_readers_dead_letters_as_an_injector_does() -> None:
    """A flow's ``map`` before its ``key_by`` runs where the record is routed: a value it
    raises on went up through ``inject`` (the test, or ``millstream run``, stopped) where an
    injector sends it to that reader's dead letters and goes on."""
    flow = Dataflow("tk", key_ranges=2)
    flow.input("in", codec=codecs.STR).map(j.shout).key_by(j.word_key).output("out", codec=codecs.STR)
    with TestRun(flow) as run:
        run.inject_batch("in", [(b"", b"a", T0), (b"", b"boom", T0), (b"", b"b", T0)])
        run.run_until_idle()
        assert sorted(r.value for r in run.output("out")) == [b"A", b"B"]
        [stream] = [s for s in run.streams if s.endswith(".dead_letter") and run.output(s)]
        [letter] = run.output(stream)
        doc = json.loads(letter.value)
        assert doc["error"] == "ValueError: shout refuses boom" and base64.b64decode(doc["value"]) == b"boom"
        assert (doc["stream"], doc["producer"]) == ("in", "testrun")


def test_a_dead_letter_whose_own_reader_fails_is_lost_with_a_log_line_and_the_rest_arrive(caplog: Any) -> None:
    """A reader of the dead letters whose key extractor cannot read them: the letter is lost
    (logged, as an injector does), and the batch's other records still arrive."""
    topo = Topology("dl")
    topo.add_computation("parse", "tests.core.jobs:CountEcho", inputs={"in": "tests.core.jobs:extractor_raising"},
                         outputs=["out"])
    topo.add_computation("letters", "tests.core.jobs:CountEcho",
                         inputs={"parse.dead_letter": "tests.core.jobs:extractor_raising"}, outputs=["out2"])
    with TestRun(topo) as run:
        run.inject_batch("in", [(b"k", b'{"user": "ann"}', T0), (b"k", b"boom", T0), (b"k", b'{"user": "bob"}', T0)])
        run.run_until_idle()
        assert sorted(r.value for r in run.output("out")) == [b'{"user": "ann"}', b'{"user": "bob"}']
        assert "a dead letter is lost: the key extractor of 'letters'" in caplog.text


def test_a_wall_time_ttl_follows_the_runs_virtual_clock_not_the_records_times() -> None:
    from tests.core.jobs import WallTyped

    topo = Topology("wall")
    topo.add_computation("forgetful", WallTyped, inputs={"in": None}, outputs=["out"])
    with TestRun(topo) as run:
        run.inject("in", b"k", b"a", T0 - 365 * 86_400 * SECOND)  # a year-old record (a backfill)
        run.run_until_idle()
        assert run.typed_state("forgetful", b"k", WallTyped.count) == 1
        run.advance_wall_time(10 * SECOND - 1)
        run.run_until_idle()
        assert run.typed_state("forgetful", b"k", WallTyped.seen) == ["a"]
        run.advance_wall_time(1)  # 10 s of the run's clock after the write
        run.run_until_idle()
        assert run.typed_state("forgetful", b"k", WallTyped.count) == 0  # (its default)
        assert run.typed_state("forgetful", b"k", WallTyped.seen) == []
