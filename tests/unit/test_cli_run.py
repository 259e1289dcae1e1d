"""``millstream run`` (cli/run.py): a job run once over files in this process, its outputs
printed as JSON lines; bad input named by file and line."""

from __future__ import annotations

import datetime
import io
import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from typing import Any

import pytest

from cli.run import plain, run_job
from runtime.errors import ConfigError, MillstreamError
from runtime.windows import WindowResult

JOBS = textwrap.dedent('''
    import json

    from millstream import Computation, Dataflow, Topology, codecs
    from millstream.windows import SECOND, Count, Tumbling

    def page_of(click):
        return click["page"]

    def checked(click):
        if click.get("bad"):
            raise ValueError("a bad click")
        return click

    def amount(doc):
        return doc["amount"]

    def add(a, b):
        return a + b

    flow = Dataflow("runclicks")
    (flow.input("clicks", codec=codecs.JSON).map(checked).key_by(page_of)
         .window(Tumbling(60 * SECOND), Count()).output("page_counts", codec=codecs.JSON))

    totals = Dataflow("runtotals")
    totals.input("payments", codec=codecs.JSON, keyed=True).map(amount).reduce(add).output("totals", codec=codecs.INT)

    class Fragile:
        """A codec that reads back only while ``works`` holds (a user's codec with a bug)."""
        works = True

        def encode(self, value):
            return json.dumps(value).encode()

        def decode(self, data):
            if not Fragile.works:
                raise ValueError("cannot read this back")
            return json.loads(data)

    FRAGILE = Fragile()
    fragile = Dataflow("runfragile")
    fragile.input("notes", codec=codecs.JSON).output("fragile_out", codec=FRAGILE)
    fragile.input("notes2", codec=codecs.JSON).output("fragile_two", codec=codecs.JSON)

    joined = Dataflow("runjoin")
    people = joined.input("people", codec=codecs.JSON, keyed=True)
    joined.input("visits", codec=codecs.JSON, keyed=True).lookup_join(people, how="left") \
        .output("enriched", codec=codecs.JSON)

    class Shout(Computation):
        def process_record(self, ctx, record):
            ctx.produce("loud", record.value.upper())

    topo = Topology("runshout")
    topo.add_computation("shout", Shout, inputs={"words": None}, outputs=["loud"])
    not_a_job = 3
''')
T0 = 1_704_067_200_000_000  # 2024-01-01T00:00:00Z


@pytest.fixture
def jobs(tmp_path: Any, monkeypatch: Any) -> Any:
    (tmp_path / "runjobs_cli.py").write_text(JOBS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _run(*inputs: str, **kw: Any) -> tuple[int, list[dict[str, Any]]]:
    out = io.StringIO()
    code = run_job(kw.pop("job", "runjobs_cli:flow"), list(inputs), stdout=out, **kw)
    return code, [json.loads(line) for line in out.getvalue().splitlines()]


def test_a_flow_runs_over_a_file_and_its_windows_match_an_oracle(jobs: Any) -> None:
    """Out of order within a minute, times as ISO 8601 and as microseconds: every minute's
    count per page, once, stamped when its window closed."""
    clicks = [(f"/p{i % 3}", T0 + (i * 7_919_000) % 180_000_000) for i in range(300)]
    path = jobs / "clicks.jsonl"
    iso = [datetime.datetime.fromtimestamp(t / 1e6, datetime.UTC).isoformat() for _, t in clicks]
    path.write_text("".join(json.dumps({"page": p, "ts": t if i % 2 else iso[i]}) + "\n"
                            for i, (p, t) in enumerate(clicks)))
    code, lines = _run(f"clicks={path}", time_field="ts")
    expected = Counter((p, (t - T0) // 60_000_000) for p, t in clicks)
    got = {(r["key"], (r["value"][0] - T0) // 60_000_000): r["value"][2] for r in lines}  # WindowResult, as JSON
    assert code == 0 and len(got) == len(lines) == len(expected) and got == dict(expected)
    assert all(r["stream"] == "page_counts" and r["timestamp"] == r["value"][1] for r in lines)


def _refused(path: Any, text: str, says: str) -> None:
    """``text`` as the file at ``path``, read with timestamp field ``ts``: refused with ``says``."""
    path.write_text(text)
    with pytest.raises(ConfigError, match=says):
        _run(f"clicks={path}", time_field="ts")


def test_iso_times_with_a_zone_are_read_and_without_one_refused(jobs: Any) -> None:
    path = jobs / "iso.jsonl"
    path.write_text('{"page": "/a", "ts": "2024-01-01T00:00:59.5+00:00"}\n{"page": "/a", "ts": "2024-01-01T01:00:00Z"}\n')
    code, lines = _run(f"clicks={path}", time_field="ts")
    assert sorted((r["value"][0], r["value"][2]) for r in lines) == [(T0, 1), (T0 + 3_600_000_000, 1)]
    _refused(path, '{"page": "/a", "ts": "2024-01-01T00:00:00"}\n',
             r"iso.jsonl, line 1: field 'ts' is .*, with no time zone")
    _refused(path, '{"page": "/a", "ts": "yesterday"}\n',
             r"line 1: field 'ts' is 'yesterday': give a number of microseconds .* ISO 8601")


def test_keyed_inputs_take_their_key_from_a_field_and_a_classic_topology_prints_what_it_leaves(jobs: Any) -> None:
    path = jobs / "pay.jsonl"
    path.write_text("".join(json.dumps({"user": u, "amount": a}) + "\n" for u, a in [("ann", 3), ("bob", 1), ("ann", 4)]))
    code, lines = _run(f"payments={path}", job="runjobs_cli:totals", key_field="user")
    assert code == 0 and sorted((r["key"], r["value"]) for r in lines) == [("ann", 3), ("ann", 7), ("bob", 1)]
    words = jobs / "words.txt"
    words.write_text("apple\nbanana\r\n")
    code, lines = _run(f"words={words}", job="runjobs_cli:topo")
    assert code == 0 and [(r["stream"], r["value"]) for r in lines] == [("loud", "APPLE"), ("loud", "BANANA")]


def test_records_user_code_raises_on_go_to_the_dead_letters_and_the_exit_code_says_so(jobs: Any) -> None:
    path = jobs / "clicks.jsonl"
    path.write_text('{"page": "/a"}\n{"page": "/a", "bad": true}\n{"page": "/b"}\n')
    out_dir = jobs / "out"
    code, _ = _run(f"clicks={path}", out_dir=str(out_dir))
    assert code == 1
    counts = [json.loads(line) for line in (out_dir / "page_counts.jsonl").read_text().splitlines()]
    assert sorted((r["key"], r["value"][2]) for r in counts) == [("/a", 1), ("/b", 1)]
    [dead] = [f for f in os.listdir(out_dir) if f.endswith(".dead_letter.jsonl")]
    [letter] = [json.loads(line) for line in (out_dir / dead).read_text().splitlines()]
    assert "a bad click" in json.dumps(letter["value"])


@pytest.mark.parametrize("args, says", [
    (["clicks"], "write STREAM=PATH"),
    (["click=x"], "'click' is not an input stream of the job; its inputs are clicks"),
    (["clicks=nowhere.jsonl"], "'nowhere.jsonl' is not a file"),
])
def test_bad_inputs_are_named(jobs: Any, args: list[str], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        _run(*args)


def test_a_line_that_is_not_json_or_lacks_the_field_is_named_by_its_line(jobs: Any) -> None:
    path = jobs / "c.jsonl"
    _refused(path, '{"page": "/a", "ts": 1704067200000000}\nnot json\n', r"c.jsonl, line 2: not JSON")
    _refused(path, '{"page": "/a"}\n', r"line 1: no field 'ts' in this line")


def test_values_are_written_as_json_can_hold_them() -> None:
    assert plain(WindowResult(1, 2, (b"x", b"\xff", {3: None}))) == {
        "start": 1, "end": 2, "value": ["x", {"base64": "/w=="}, {"3": None}]}


def test_the_command_prints_only_json_on_stdout_and_reads_stdin(jobs: Any) -> None:
    """Through the real command line: `millstream run`, stdin for the input, and `submit`'s
    loader taking a Dataflow too (it refused one: "is Dataflow, not a Topology")."""
    prog = "import sys\nfrom cli.main import main\nsys.exit(main(sys.argv[1:]))"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), *sys.path]))
    done = subprocess.run([sys.executable, "-c", prog, "run", "runjobs_cli:flow", "--input", "clicks=-"],
                          input=b'{"page": "/a"}\n{"page": "/a"}\n', capture_output=True, timeout=120,
                          check=False, cwd=str(jobs), env=env)
    assert done.returncode == 0, done.stderr
    [line] = [json.loads(x) for x in done.stdout.decode().splitlines()]
    assert (line["key"], line["value"][2]) == ("/a", 2)
    bad = subprocess.run([sys.executable, "-c", prog, "run", "runjobs_cli:not_a_job"], capture_output=True,
                         timeout=120, check=False, cwd=str(jobs), env=env)
    assert bad.returncode == 2 and b"'runjobs_cli:not_a_job' is int, not a Topology or a Dataflow" in bad.stderr
    from cli.lifecycle import topology_at
    assert sorted(topology_at("runjobs_cli:flow").computations) == sorted(
        __import__("runjobs_cli").flow.topology().computations)


def test_the_readmes_example_prints_what_the_readme_shows(tmp_path: Any, monkeypatch: Any) -> None:
    """README.md's taste of the API, its file and its `millstream run` lines, run as shown."""
    readme = open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md")).read()
    taste = readme[readme.index("## A taste of the API"):]
    code = taste[taste.index("```python\n") + 10:taste.index("```\n")]
    shell = taste[taste.index("$ cat clicks.jsonl\n"):]
    shell = shell[:shell.index("```")].splitlines()
    command = next(i for i, line in enumerate(shell) if line.startswith("$ millstream run"))
    (tmp_path / "readme_jobs.py").write_text(code)
    (tmp_path / "clicks.jsonl").write_text("".join(line + "\n" for line in shell[1:command]))
    args = shell[command].split()[3:]  # (after "$ millstream run")
    assert args[:4] == ["jobs:flow", "--input", "clicks=clicks.jsonl", "--timestamp-field"]
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    assert run_job("readme_jobs:flow", [args[2]], time_field=args[4], stdout=out) == 0
    assert sorted(out.getvalue().splitlines()) == sorted(shell[command + 1:])


def test_inputs_are_fed_in_timestamp_order_whatever_the_order_of_the_flags(jobs: Any) -> None:
    """A lookup_join sees its table as of each record's time: the person comes first in time,
    so each order of --input gives the visit its person (fed one file after the other, the
    visits file first found no one)."""
    (jobs / "people.jsonl").write_text(json.dumps({"user": "ann", "name": "Ann", "ts": T0}) + "\n\n")
    (jobs / "visits.jsonl").write_text(json.dumps({"user": "ann", "page": "/a", "ts": T0 + 1}) + "\n")
    for flags in (["visits=visits.jsonl", "people=people.jsonl"], ["people=people.jsonl", "visits=visits.jsonl"]):
        code, lines = _run(*flags, job="runjobs_cli:joined", key_field="user", time_field="ts")
        assert code == 0 and [r["value"] for r in lines] == [[{"user": "ann", "page": "/a", "ts": T0 + 1},
                                                              {"user": "ann", "name": "Ann", "ts": T0}]]


def test_a_keyed_input_without_a_key_field_is_refused_and_a_classic_one_warned(jobs: Any, capsys: Any) -> None:
    """Without --key-field every record has the empty key: a flow's keyed input would put
    every user's payments in one running total (it did, and said nothing)."""
    (jobs / "pay.jsonl").write_text('{"user": "ann", "amount": 3}\n')
    with pytest.raises(ConfigError, match="the keyed input step 'runtotals.input' reads 'payments' by its records' "
                                          "own keys: give --key-field FIELD"):
        _run("payments=pay.jsonl", job="runjobs_cli:totals")
    (jobs / "words.txt").write_text("apple\n")
    assert _run("words=words.txt", job="runjobs_cli:topo")[0] == 0
    assert "computation 'shout' reads 'words' by its records' own keys" in capsys.readouterr().err


def test_stdin_for_two_streams_and_an_out_that_is_a_file_are_refused_before_the_run(jobs: Any) -> None:
    (jobs / "people.jsonl").write_text("{}\n")
    with pytest.raises(ConfigError, match=r"standard input \('-'\) is already another stream's"):
        _run("people=-", "visits=-", job="runjobs_cli:joined", key_field="user")
    (jobs / "taken").write_text("")
    with pytest.raises(ConfigError, match="--out '.*taken': cannot write there"):
        _run(f"clicks={jobs / 'people.jsonl'}", out_dir=str(jobs / "taken"))


def test_a_second_run_into_the_same_out_leaves_no_stale_dead_letters_and_logging_is_as_it_was(jobs: Any) -> None:
    import logging

    path = jobs / "clicks.jsonl"
    path.write_text('{"page": "/a", "bad": true}\n')
    out_dir = jobs / "out"
    loggers = [logging.getLogger(n) for n in ("master", "worker", "runtime")]
    before = [lg.level for lg in loggers]
    try:
        for lg in loggers:
            lg.setLevel(logging.INFO)  # (a level of the caller's own, which the run must give back)
        assert _run(f"clicks={path}", out_dir=str(out_dir))[0] == 1
        assert [lg.level for lg in loggers] == [logging.INFO] * 3
    finally:
        for lg, level in zip(loggers, before, strict=True):
            lg.setLevel(level)
    path.write_text('{"page": "/a"}\n')
    assert _run(f"clicks={path}", out_dir=str(out_dir))[0] == 0
    assert sorted(os.listdir(out_dir)) == ["page_counts.jsonl"]
    path.write_text('{"page": "/a", "ts": "soon"}\n')  # refused: the last run's results stay
    with pytest.raises(ConfigError, match="field 'ts' is 'soon'"):
        _run(f"clicks={path}", out_dir=str(out_dir), time_field="ts")
    assert sorted(os.listdir(out_dir)) == ["page_counts.jsonl"]


@pytest.mark.parametrize("unit, times, says", [
    (None, [1704067200, 1704067260], r"field 'ts' in .* looks like seconds since the epoch, not microseconds .* "
                                     r"--timestamp-unit s"),
    (None, [T0, 1704067200000], None),  # the largest is microseconds: taken as they are
    ("s", [1704067200, 1704067260], None),
    ("ms", ["1704067200000", 1704067260000], None),
])
def test_numeric_times_in_another_unit_are_refused_unless_the_unit_is_given(jobs: Any, unit: str | None,
                                                                            times: list[Any], says: str | None) -> None:
    path = jobs / "clicks.jsonl"
    path.write_text("".join(json.dumps({"page": "/a", "ts": t}) + "\n" for t in times))
    if says is not None:
        with pytest.raises(ConfigError, match=says):
            _run(f"clicks={path}", time_field="ts", unit=unit)
        return
    code, lines = _run(f"clicks={path}", time_field="ts", unit=unit)
    starts = sorted(r["value"][0] for r in lines)
    assert code == 0 and starts == ([T0, T0 + 60_000_000] if unit else [1704067200000 - 1704067200000 % 60_000_000, T0])


@pytest.mark.parametrize("ts, says", [("--5", "give a number of microseconds"), ("²", "give a number of microseconds"),
                                      ("9" * 5000, "outside the signed 64 bits")])
def test_a_time_string_that_is_no_number_nor_iso_is_named(jobs: Any, ts: str, says: str) -> None:
    path = jobs / "clicks.jsonl"
    _refused(path, json.dumps({"page": "/a", "ts": ts}) + "\n", f"line 1: field 'ts' is .*{says}")


def test_a_flows_sink_step_is_named_on_stderr(jobs: Any, capsys: Any) -> None:
    (jobs / "sinkjobs_cli.py").write_text(textwrap.dedent('''
        from millstream import Dataflow, codecs
        from runtime.sinks import FileSink
        flow = Dataflow("runsink")
        flow.input("words", codec=codecs.STR).sink(FileSink, name="runsink_out", path="written")
    '''))
    (jobs / "words.txt").write_text("apple\n")
    assert _run("words=words.txt", job="sinkjobs_cli:flow") == (0, [])
    assert "step 'runsink_out' is a sink: it wrote its records where it writes" in capsys.readouterr().err
    assert os.path.isdir(jobs / "written")


def test_each_input_is_judged_for_its_unit_and_a_unit_needs_a_field(jobs: Any) -> None:
    (jobs / "people.jsonl").write_text(json.dumps({"user": "ann", "ts": 1704067200}) + "\n")
    (jobs / "visits.jsonl").write_text(json.dumps({"user": "ann", "ts": T0 + 1}) + "\n")
    with pytest.raises(ConfigError, match="field 'ts' in 'people.jsonl' looks like seconds .*; nothing was run"):
        _run("visits=visits.jsonl", "people=people.jsonl", job="runjobs_cli:joined", key_field="user", time_field="ts")
    with pytest.raises(ConfigError, match="--timestamp-unit ns says the unit of --timestamp-field's numbers"):
        _run("visits=visits.jsonl", job="runjobs_cli:joined", key_field="user", unit="ns")
    (jobs / "ns.jsonl").write_text(json.dumps({"user": "ann", "ts": (T0 + 7) * 1000 + 999}) + "\n")
    code, lines = _run("visits=ns.jsonl", job="runjobs_cli:joined", key_field="user", time_field="ts", unit="ns")
    assert code == 0 and [r["timestamp"] for r in lines] == [T0 + 7]


def test_thousands_of_alternating_records_across_batches_each_find_the_table_as_of_their_time(jobs: Any) -> None:
    """2,400 records, a person then a visit, again and again: batches of 1,000 hold runs of
    one record of each input, and every visit finds the name its person had just before it."""
    people, visits = [], []
    for i in range(1_200):
        people.append(json.dumps({"user": f"u{i % 7}", "name": f"n{i}", "ts": T0 + 2 * i}))
        visits.append(json.dumps({"user": f"u{i % 7}", "n": i, "ts": T0 + 2 * i + 1}))
    (jobs / "people.jsonl").write_text("\n".join(people) + "\n")
    (jobs / "visits.jsonl").write_text("\n".join(visits) + "\n")
    code, lines = _run("visits=visits.jsonl", "people=people.jsonl", job="runjobs_cli:joined", key_field="user",
                       time_field="ts")
    assert code == 0 and len(lines) == 1_200
    assert all(r["value"][1]["name"] == f"n{r['value'][0]['n']}" for r in lines)


def test_without_a_timestamp_field_inputs_go_one_after_the_other_and_blank_lines_are_records(jobs: Any) -> None:
    (jobs / "people.jsonl").write_text(json.dumps({"user": "ann", "name": "Ann"}) + "\n")
    (jobs / "visits.jsonl").write_text(json.dumps({"user": "ann", "page": "/a"}) + "\n")
    for flags, person in ((["people=people.jsonl", "visits=visits.jsonl"], {"user": "ann", "name": "Ann"}),
                          (["visits=visits.jsonl", "people=people.jsonl"], None)):
        code, lines = _run(*flags, job="runjobs_cli:joined", key_field="user")
        assert [r["value"][1] for r in lines] == [person]
    (jobs / "words.txt").write_text("apple\n\nbanana\n")
    assert [r["value"] for r in _run("words=words.txt", job="runjobs_cli:topo")[1]] == ["APPLE", "", "BANANA"]


class _Busy:
    """A stand-in for a TestRun that never settles, making ``grows`` outputs a round."""

    streams = ["out"]

    def __init__(self, grows: int) -> None:
        self.grows, self.made, self.calls = grows, 0, 0

    def output(self, stream: str) -> list[int]:
        return [0] * self.made

    def run_until_idle(self) -> None:
        self.calls += 1
        self.made += self.grows
        raise MillstreamError("TestRun: still busy after 10000 rounds")


def test_a_run_that_stops_making_progress_or_never_stops_is_given_up() -> None:
    from cli.run import _settle

    busy = _Busy(0)
    with pytest.raises(ConfigError, match="the job does not settle: TestRun: still busy"):
        _settle(busy, 5)
    assert busy.calls == 1
    busy = _Busy(1)
    with pytest.raises(ConfigError, match="still busy after 5 x 10,000 rounds of the worker, making output"):
        _settle(busy, 5)
    assert busy.calls == 5


def test_an_output_codec_that_cannot_read_back_is_named_and_the_last_runs_files_stay(jobs: Any) -> None:
    (jobs / "n.jsonl").write_text('{"a": 1}\n')
    out_dir = jobs / "out"
    assert _run("notes=n.jsonl", "notes2=n.jsonl", job="runjobs_cli:fragile", out_dir=str(out_dir))[0] == 0
    assert sorted(os.listdir(out_dir)) == ["fragile_out.jsonl", "fragile_two.jsonl"]
    import runjobs_cli
    runjobs_cli.Fragile.works = False
    try:
        with pytest.raises(ConfigError, match="output 'fragile_out': its codec cannot read back a record it wrote "
                                              r"\(ValueError: cannot read this back\); nothing was written"):
            _run("notes=n.jsonl", "notes2=n.jsonl", job="runjobs_cli:fragile", out_dir=str(out_dir))
    finally:
        runjobs_cli.Fragile.works = True
    assert sorted(os.listdir(out_dir)) == ["fragile_out.jsonl", "fragile_two.jsonl"]
    assert all(json.loads(line)["value"] == {"a": 1} for f in os.listdir(out_dir)
               for line in (out_dir / f).read_text().splitlines())
