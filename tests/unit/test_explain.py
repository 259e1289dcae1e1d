"""``Dataflow.explain()`` and ``millstream explain``: what a job runs as, read from the
topology it compiles to: which steps fuse into which stage, how each stage's inputs are
keyed, and where the hops are."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

from cli.explain import topology_text
from examples import wordcount
from runtime import Dataflow, Topology
from runtime.sinks import FileSink
from runtime.windows import SECOND, Count, Session, Sliding, Sum, Tumbling

M = __name__  # (how the functions' import paths start)


def valid(v: bytes) -> bool:
    return bool(v)


def parse(v: bytes) -> str:
    return v.decode()


def first_letter(v: str) -> bytes:
    return v[:1].encode()


def add(a: int, b: int) -> int:
    return a + b


def one(v: object) -> int:
    return 1


def lines_of(text: str, stage: str) -> list[str]:
    """The lines of ``stage``'s paragraph."""
    block = text.split(f"stage {stage!r}:", 1)[1].split("\n\n", 1)[0]
    return [" ".join(line.split()) for line in block.strip("\n").splitlines()]


def test_a_keyed_input_windows_and_a_sink_fuse_into_one_stage() -> None:
    flow = Dataflow("w", key_ranges=3)
    (flow.input("events", keyed=True)
     .window(Tumbling(SECOND), Count(), name="w.counts")
     .map(one, name="w.ones")
     .sink(FileSink, name="w.sink", path="/tmp/never-written"))
    text = flow.explain()
    assert text.splitlines()[0] == ("dataflow 'w': 1 stage, 0 hops between them; each a computation of "
                                    "3 key ranges, exactly once")
    assert lines_of(text, "w.counts") == [
        "reads events keyed as sent (input keyed=True); codec bytes",
        "runs w.counts window tumbling 1 s, count",
        f"w.ones map {M}:one",
        "w.sink sink runtime.sinks:FileSink, written in this stage's commit (fused)",
        "writes w.counts.late records too late for w.counts",
        "fused: 3 steps in one tablet per key range, one commit per batch, no hop between them"]


def test_stateless_steps_before_a_key_by_run_in_the_producers_key_extractor() -> None:
    flow = Dataflow("x")
    (flow.input("clicks").filter(valid).map(parse).key_by(first_letter, name="x.by_letter")
     .map(one).reduce(add, name="x.totals").output("totals"))
    text = flow.explain()
    assert "1 stage, 0 hops" in text
    assert lines_of(text, "x.totals")[0] == (
        f"reads clicks keyed by its producer with x.by_letter ({M}:first_letter), after filter {M}:valid, "
        f"map {M}:parse, which run there and again here; codec bytes")
    assert "writes totals an output; codec bytes" in lines_of(text, "x.totals")


def test_a_flat_map_before_the_key_by_takes_one_hop_through_the_inputs_stage() -> None:
    text = wordcount.flow("/tmp/never-written").explain()
    assert "2 stages, 1 hop between them" in text.splitlines()[0]
    assert lines_of(text, "wordcount.input") == [
        "reads lines by the records' own keys, as sent (no key_by: a stateless stage); codec str",
        "runs wordcount.flat_map flat_map examples.wordcount:words",
        "writes wordcount.key_by to stage 'wordcount.counts', keyed here by examples.wordcount:word (a hop)"]
    assert lines_of(text, "wordcount.counts")[0] == (
        "reads wordcount.key_by from stage 'wordcount.input', keyed there (a hop)")


def test_a_stage_writing_two_sinks_leaves_each_a_computation_of_its_own() -> None:
    flow = Dataflow("two")
    counts = flow.input("events", keyed=True).reduce(add, name="two.sum")
    counts.sink(FileSink, name="two.a", path="/tmp/never-a")
    counts.sink(FileSink, name="two.b", path="/tmp/never-b")
    text = flow.explain()
    assert "1 stage and 2 sink computations, 2 hops" in text.splitlines()[0]
    assert "writes two.a to the sink computation 'two.a' (a hop); codec auto" in lines_of(text, "two.sum")
    sink = text.split("sink computation 'two.b': ", 1)[1].split("\n\n", 1)[0].splitlines()
    assert sink[0].startswith("runtime.sinks:FileSink, on its own (the stage before it writes to more than one sink")
    assert " ".join(sink[1].split()) == "reads two.b from stage 'two.sum' (a hop)"


def test_both_sides_of_a_join_are_one_stage() -> None:
    flow = Dataflow("j")
    left = flow.input("a", keyed=True)
    right = flow.input("b", keyed=True).map(one)
    left.join(right, Tumbling(SECOND), name="j.pairs").output("pairs")
    text = flow.explain()
    assert "1 stage, 0 hops" in text
    rows = lines_of(text, "j.pairs")
    assert rows[:2] == ["reads a keyed as sent (input keyed=True); codec bytes",
                        "b keyed as sent (input keyed=True); codec bytes"]
    assert "j.pairs join tumbling 1 s (left a, right j.map)" in rows


def test_a_keyed_input_of_stateless_steps_is_still_read_keyed() -> None:
    flow = Dataflow("k")
    flow.input("events", keyed=True).map(one, name="k.ones").output("ones")
    flow.input("raw").map(one, name="k.raw_ones").output("raw_ones")
    text = flow.explain()
    assert lines_of(text, "k.input")[0] == "reads events keyed as sent (input keyed=True); codec bytes"
    assert lines_of(text, "k.input_2")[0] == (
        "reads raw by the records' own keys, as sent (no key_by: a stateless stage); codec bytes")


def test_a_re_key_after_a_stateful_step_is_a_hop_keyed_at_its_end() -> None:
    flow = Dataflow("rk", key_ranges=1, exactly_once=False)
    flow.input("a", keyed=True).reduce(add, name="rk.r1").key_by(first_letter, name="rk.k2").reduce(
        add, name="rk.r2").output("o")
    text = flow.explain()
    assert text.splitlines()[0] == ("dataflow 'rk': 2 stages, 1 hop between them; each a computation of 1 key range, "
                                    "at least once")
    assert lines_of(text, "rk.r1")[-1] == f"writes rk.k2 to stage 'rk.r2', keyed here by {M}:first_letter (a hop)"
    assert lines_of(text, "rk.r2")[0] == "reads rk.k2 from stage 'rk.r1', keyed there (a hop)"


def test_each_operator_says_its_arguments_and_where_its_records_come_from() -> None:
    flow = Dataflow("ops")
    table = flow.input("t", keyed=True)
    a = flow.input("a", keyed=True)
    b = flow.input("b").key_by(first_letter, name="ops.kb")
    a.lookup_join(table, how="left", name="ops.lj").output("looked")
    (a.interval_join(b, -5 * SECOND, 250_000, name="ops.ij")
     .window(Sliding(10 * SECOND, 5 * SECOND, allowed_lateness=2 * SECOND), Count(), name="ops.w", emit="updates")
     .window(Session(30 * SECOND), Sum(), name="ops.s").output("o"))
    a.map(one, name="ops.m").output("ones")
    rows = lines_of(flow.explain(), "ops.lj")
    assert "runs ops.lj lookup_join, how=left (stream a, table t)" in rows
    assert "ops.ij interval_join, right - left within [-5 s, 250 ms] (left a, right b)" in rows
    assert ("ops.w window sliding 10 s every 5 s, lateness 2 s, count, each update emitted, then the final result"
            in rows)
    assert "ops.s window session, gap 30 s, sum" in rows
    assert f"ops.m map {M}:one (from a)" in rows  # (a branch: not from the row before it)
    assert "ones an output; codec bytes" in rows and "o an output; codec bytes (from ops.s)" in rows
    assert "ops.w.late records too late for ops.w" in rows


def test_a_flow_reading_its_own_output_says_who_keys_it() -> None:
    flow = Dataflow("own")
    flow.input("a", keyed=True).reduce(add, name="own.r").output("mid")
    flow.input("mid").key_by(first_letter, name="own.k").reduce(add, name="own.r2").output("final")
    text = flow.explain()
    assert "writes mid an output; codec bytes; read again by stage 'own.r2'" in lines_of(text, "own.r")
    assert lines_of(text, "own.r2")[0] == (
        f"reads mid keyed by its producer with own.k ({M}:first_letter), written by stage 'own.r'; codec bytes")


def test_a_topology_lists_its_computations_and_their_streams() -> None:
    topo = Topology("t")
    topo.add_computation("count", "jobs:Counter", inputs={"in": "jobs:key_of"}, outputs=["counts"])
    topo.add_computation("sink", "jobs:Sink", inputs={"counts": None}, outputs=[])
    assert topology_text(topo).splitlines() == [
        "topology 't': 2 computations", "",
        "computation 'count': jobs:Counter, 4 key ranges, exactly once",
        "  reads   in  keyed by jobs:key_of on the producing side",
        "  writes  counts  read by 'sink'", "",
        "computation 'sink': jobs:Sink, 4 key ranges, exactly once",
        "  reads   counts  keyed as sent"]


def test_the_command_prints_it(tmp_path: Any) -> None:
    (tmp_path / "explainjobs.py").write_text(textwrap.dedent("""
        from millstream import Dataflow, Topology
        def one(v):
            return 1
        def add(a, b):
            return a + b
        flow = Dataflow("cli")
        flow.input("events", keyed=True).map(one).reduce(add, name="cli.sum").output("sums")
        topo = flow.topology()
        not_a_job = 3
    """))
    prog = "import sys\nfrom cli.main import main\nsys.exit(main(sys.argv[1:]))"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), *sys.path]))

    def explain(path: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", prog, "explain", path], capture_output=True, text=True,
                              timeout=120, check=False, cwd=str(tmp_path), env=env)

    done = explain("explainjobs:flow")
    assert done.returncode == 0, done.stderr
    assert "runs    cli.map  map explainjobs:one" in done.stdout and "cli.sum  reduce explainjobs:add" in done.stdout
    classic = explain("explainjobs:topo")
    assert classic.returncode == 0 and "computation 'cli.sum': runtime.flows.stage:FlowStage" in classic.stdout
    bad = explain("explainjobs:not_a_job")
    assert bad.returncode == 2 and bad.stderr.strip().endswith("is int, not a Topology or a Dataflow")


def test_the_dataflows_page_shows_what_explain_prints() -> None:
    page = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "dataflows.md")).read()
    shown = page.split('`wordcount.flow("out").explain()`:\n\n```text\n', 1)[1].split("\n```", 1)[0]
    assert shown == wordcount.flow("out").explain()
