"""Smoke tests of ``millstream bench``: it runs, and its report has the expected shape.

Performance is measured by the benchmark, never asserted here: no timing checks.
"""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter

import pytest

from bench import generator, jobs
from bench.cli import run_bench
from bench.latency import Arrival, check_exact, count_lines, hops, percentiles, read_arrivals
from bench.linecount import LineCounter
from runtime.computation import TimeDomain


@pytest.mark.timeout(120)
def test_quick_bench_writes_json_and_markdown(tmp_path: object) -> None:
    out = os.path.join(str(tmp_path), "results")
    args = argparse.Namespace(peer=None, quick=True, only="recovery,memory", out=out)
    assert run_bench(args) == 0  # 0: every run's output was exact (timings are not judged)
    with open(os.path.join(out, "latest.json")) as f:
        report = json.load(f)
    for key in ("started_at", "git", "environment", "versions", "config", "targets", "recovery",
                "memory", "elapsed_s", "report_file"):
        assert key in report, key
    assert report["config"]["quick"] is True
    assert {"commit", "dirty"} <= set(report["git"])
    assert {"python", "cpus"} <= set(report["environment"])
    assert {"grpcio", "rocksdict", "pyspark"} <= set(report["versions"])
    rec = report["recovery"]
    assert rec["exactness"]["exact"] is True
    assert {"p50", "p95", "p99"} <= set(rec["latency_ms"])
    assert [h["hop"] for h in rec["hops_ms"]] == ["send → stage 1", "stage 1 → sink"]
    assert {"serving_again_after_s", "reassigned_after_s", "tablets_moved"} <= set(rec["recovery"])
    assert {"state_only", "state_plus_opaque_id"} <= set(report["memory"]["rocksdb"])
    assert report["memory"]["peak_rss_by_role"].get("worker", 0) > 0
    md = open(os.path.join(out, "latest.md")).read()
    assert "## Recovery" in md and "## Targets" in md
    assert os.path.exists(report["report_file"])


def test_unknown_workload_is_a_clear_error(tmp_path: object) -> None:
    from runtime.errors import ConfigError

    args = argparse.Namespace(peer=None, quick=True, only="w9", out=str(tmp_path))
    with pytest.raises(ConfigError, match="unknown workload; choose from w1"):
        run_bench(args)


def test_exactness_check_names_losses_and_doubles() -> None:
    sent = Counter({b"a": 3, b"b": 1})
    arr = [Arrival(b"a", 1, 0, 1), Arrival(b"a", 2, 0, 1), Arrival(b"a", 2, 0, 1), Arrival(b"b", 1, 0, 1)]
    check = check_exact(arr, sent)
    assert (check.lost, check.doubled, check.exact) == (1, 1, False)
    assert percentiles([1.0, 2.0, 3.0, 4.0])["p50"] == 2.0


def test_the_incremental_line_counter_agrees_with_a_full_count(tmp_path: object) -> None:
    """bench.linecount.LineCounter reads only what was appended since its last call; a partial
    last line is not a line yet; a file that shrank (a sink cut back) is counted again."""
    d = str(tmp_path)
    a, b = os.path.join(d, "0.txt"), os.path.join(d, "1.txt")
    count = LineCounter(d)
    assert count() == 0
    with open(a, "wb") as f:
        f.write(b"x 1\ny 2\nz")  # two lines and the start of a third
    assert count() == 2
    with open(a, "ab") as f:
        f.write(b" 3\n")
    with open(b, "wb") as f:
        f.write(b"w 4\n" * 1000)
    assert count() == 1003 == count_lines(d)
    with open(b, "r+b") as f:
        f.truncate(40)  # cut back to its first ten lines
    assert count() == 13 == count_lines(d)
    with open(os.path.join(d, "note.log"), "wb") as f:
        f.write(b"not an output\n")
    assert count() == 13


def test_hops_split_a_records_latency_by_stage(tmp_path: object) -> None:
    """The stamps each W1 stage appends (bench.jobs.ChainedCounter) come back per hop."""
    with open(os.path.join(str(tmp_path), "sink-0.txt"), "wb") as f:
        for i in range(10):  # sent at 0, stage 1 at +1 ms, stage 2 at +3 ms, sink at +6 ms (+i µs)
            base = i * 10_000_000
            f.write(b"k%d %d,%d,%d %d %d\n" % (i, base, base + 1_000_000, base + 3_000_000, 1,
                                               base + 6_000_000 + i * 1000))
    arrivals = read_arrivals(str(tmp_path))
    assert arrivals[0].stamps == (1_000_000, 3_000_000) and arrivals[0].latency_ms == 6.0
    got = hops(arrivals)
    assert [h["hop"] for h in got] == ["send → stage 1", "stage 1 → stage 2", "stage 2 → sink"]
    assert [h["p50"] for h in got] == [1.0, 2.0, 3.0]
    assert got[2]["p99"] == 3.01


class _Ctx:
    """Just enough Context to drive the W2 computations key by key, without a cluster."""

    def __init__(self) -> None:
        self.states: dict[bytes, bytes | None] = {}
        self.timers: dict[tuple[bytes, str], int] = {}
        self.out: list[tuple[str, bytes, bytes, int]] = []
        self.key = b""
        self.ts = 0
        ctx = self

        class _State:
            def get(self) -> bytes | None:
                return ctx.states.get(ctx.key)

            def set(self, v: bytes) -> None:
                ctx.states[ctx.key] = v

            def clear(self) -> None:
                ctx.states.pop(ctx.key, None)

        self.state = _State()

    def set_timer(self, tag: str, time: int, domain: TimeDomain = TimeDomain.EVENT_TIME) -> None:
        self.timers[(self.key, tag)] = time

    def produce(self, stream: str, value: bytes, *, key: bytes | None = None, timestamp: int | None = None) -> None:
        self.out.append((stream, self.key, value, self.ts if timestamp is None else timestamp))

    def fire_all(self, comp: object) -> None:
        for (key, tag), t in sorted(self.timers.items(), key=lambda kv: kv[1]):
            self.key, self.ts = key, t
            comp.process_timer(self, tag, t)  # type: ignore[attr-defined]
        self.timers.clear()


def test_w2_computations_match_the_oracle() -> None:
    from runtime.record import Record

    data = generator.w2_data(20_000, events_per_second=2_000, spikes=10, n_keys=200)
    oracle = generator.w2_oracle(data)
    windows, spikes = jobs.WindowCounter(), jobs.SpikeDetector()
    windows.setup({}), spikes.setup({})
    c1, c2 = _Ctx(), _Ctx()
    for k, ts in zip(data.keys, data.timestamps, strict=True):
        c1.key, c1.ts = k, ts
        windows.process_record(c1, Record(k, b"", ts, b"0" * 16))  # type: ignore[arg-type]
    c1.fire_all(windows)
    for _, k, v, ts in reversed(c1.out):  # any arrival order: the detector must sort it out
        c2.key, c2.ts = k, ts
        spikes.process_record(c2, Record(k, v, ts, b"0" * 16))  # type: ignore[arg-type]
    c2.fire_all(spikes)
    got_windows = {(k, int(v.split()[0])): int(v.split()[1]) for _, k, v, _ in c1.out}
    got_spikes = {(k, int(v.split()[0])) for _, k, v, _ in c2.out}
    assert got_windows == oracle.windows
    assert got_spikes == oracle.spikes and oracle.spikes


def test_the_record_path_and_its_floor_measure_the_deliveries() -> None:
    """``bench.overhead recordpath``, ``recordfloor`` and ``recordparts`` run one tablet on a
    real RocksDB (every delivery must be accepted) and time the deliveries alone; the user
    code alone made one production per record."""
    from bench.overhead import record_floor, record_path
    from bench.recordparts import record_parts

    path = record_path([100], records=400)
    assert path["cpu_us_per_record"]["100"] > 0 and path["us_per_record"]["100"] > 0
    floor = record_floor(batch=100, records=400, runs=1)
    assert floor["whole_path_cpu_us_per_record"] > 0 and floor["runtime_only_cpu_us_per_record"] > 0
    assert floor["user_code_only_cpu_us_per_record"] > 0 and floor["runtime_only_share"] > 0
    assert floor["user_code_productions"] == 400
    parts = record_parts(batch=100, records=400, runs=1)["cpu_us_per_record"]
    assert set(parts) == {"nothing", "state_read", "state_write", "state_read_and_write", "one_production",
                          "w1_counter"}
    assert all(v > 0 for v in parts.values()), parts


def test_the_joins_bench_prints_a_figure_per_join_and_size(capsys: pytest.CaptureFixture[str]) -> None:
    from bench import joins
    assert joins.main(["40"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(x["what"], x["n"]) for x in lines] == [("join", 40), ("interval_join", 40)]
    assert lines[0]["us_per_key"] > 0 and lines[1]["us_per_record"] > 0
