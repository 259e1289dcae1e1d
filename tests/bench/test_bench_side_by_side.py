"""Issue 30's report rows and verdicts (bench/side_by_side.py): pure logic over report documents
(no cluster; performance is measured, never asserted)."""

from __future__ import annotations

import os
from typing import Any

from bench import flows, report, side_by_side

# A window step's firings: 50 of 100 at or below 1 ms, 99 at or below 10 ms, one in (20, 50] ms.
BUCKETS = {0.001: 50.0, 0.01: 99.0, 0.02: 99.0, 0.05: 100.0, 1.0: 100.0, float("inf"): 100.0}
# The same firings' CPU: every one at or below 10 ms (the slow one waited).
CPU_BUCKETS = {0.001: 80.0, 0.01: 100.0, 0.02: 100.0, 0.05: 100.0, 1.0: 100.0, float("inf"): 100.0}

W2 = {"records": 2_000_000, "windows": 500_000, "spikes_expected": 40, "spikes_observed": 40}


def _report() -> dict[str, Any]:
    def w1(variant: str, p50: float) -> dict[str, Any]:
        return {"variant": variant, "description": variant, "rate": 10_000,
                "latency_ms": {"p50": p50, "p99": 3 * p50}}

    stall = flows.summarise_histogram(BUCKETS)
    return {
        "w1": [w1("flow-1-stage", 4.0), w1("flow-3-stages", 5.0), w1("eo-3-stages", 40.0)],
        "w2": {**W2, "available": True, "throughput_rps": 50_000, "records_per_cpu_s": 20_000, "oracle_equal": True,
               "sender": "two threads", "cpu": {"loadavg_start": [0.5, 0.4, 0.3]}},
        "w2_flow": {**W2, "available": True, "throughput_rps": 150_000, "records_per_cpu_s": 70_000,
                    "oracle_equal": True, "sender": "one injector", "cpu": {"loadavg_start": [0.25, 0.4, 0.3]},
                    "window_fire": {"steps": {"w2.windows": stall}, "errors": [],
                                    "cpu_steps": {"w2.windows": flows.summarise_histogram(CPU_BUCKETS)},
                                    "queued_steps": {"w2.windows": flows.summarise_histogram(CPU_BUCKETS)},
                                    "gc_pauses": {"generation 2": stall}}},
        "spark": {"w2": {"throughput_rps": 120_000, "oracle_equal": True}, "loadavg_start": [1.5, 1.0, 1.0],
                  "config": {"w2": "parquet"}},
        "bytewax": {"config": {"w2": "one worker"}, "runs": [
            {"recovery": "off", "throughput_rps": 60_000, "records_per_cpu_s": 55_000, "oracle_equal": True,
             "cpu": {"loadavg_start": [0.75, 0.5, 0.5], "stolen_cpu_s": 3.0, "wall_s": 50.0}},
            {"recovery": "1 s snapshots", "throughput_rps": 30_000, "oracle_equal": True,
             "cpu": {"loadavg_start": [0.8, 0.5, 0.5]}}]},
    }


def test_side_by_side_rows_ratios_and_loads() -> None:
    r = _report()
    rows = side_by_side.w2_rows(r)
    assert [x["system"] for x in rows] == ["millstream, W2 on a flow", "millstream, classic W2",
                                          "Spark Structured Streaming", "Bytewax, recovery off",
                                          "Bytewax, recovery 1 s snapshots"]  # no Flink run: no row
    assert [x["load"] for x in rows] == [0.25, 0.5, 1.5, 0.75, 0.8]
    md = "\n".join(side_by_side.markdown_lines(r))
    share = f"{3.0 / (50.0 * (os.cpu_count() or 1)) * 100:.0f} %"  # of the run's cores
    assert f"| Bytewax, recovery off | one worker | 60,000 | 55,000 | yes | 0.75 | 3 s ({share}) | 2.5× |" in md
    assert "| Spark Structured Streaming | parquet | 120,000 | – | yes | 1.50 | – | 1.25× |" in md
    assert "| w2.windows | 100 | 1.0 ms | 10.0 ms | 50.0 ms | 1 |" in md
    assert "| w2.windows, its CPU (`millstream_window_fire_cpu_seconds`) | 100 | 1.0 ms | 10.0 ms | 10.0 ms | 0 |" in md
    assert "| w2.windows, its wait for a core (`millstream_window_fire_queued_seconds`; the rest of its wall " in md
    assert "| garbage collector, generation 2 (`millstream_gc_pause_seconds`) | 100 | 1.0 ms |" in md
    assert "| millstream, W2 on a flow | one injector | 150,000 | 70,000 | yes | 0.25 | – | – |" in md  # no ratio to itself


def test_a_peer_that_did_not_start_has_a_row_with_its_error() -> None:
    r = _report()
    r["spark"] = {"config": {"w2": "parquet"}, "error": "cannot start Spark: no Java", "loadavg_start": [1.0]}
    row = next(x for x in side_by_side.w2_rows(r) if x["system"] == "Spark Structured Streaming")
    assert row["rps"] is None and row["error"] == "cannot start Spark: no Java"
    md = "\n".join(side_by_side.markdown_lines(r))
    assert "| Spark Structured Streaming | parquet | error: cannot start Spark: no Java | – | – | 1.00 | – | – |" in md
    assert [met for _, met, _ in side_by_side.targets(r)][0] is None  # the ratio is not claimed


def test_issue_30_verdicts() -> None:
    r = _report()
    verdicts = [met for _, met, _ in side_by_side.targets(r)]
    # 150k ≥ 120k Spark (1.25×) and ≥ 2 × 60k Bytewax (2.5×); fused W1 5.0 / 4.0 = 1.25× ≤ 1.5×;
    # one firing took more than 20 ms: missed.
    assert verdicts == [True, True, True, False]
    r["w2_flow"]["oracle_equal"] = False  # a fast run that is not exact meets nothing
    r["w1"][1]["latency_ms"]["p50"] = 6.5  # 1.625× one stage's
    assert [met for _, met, _ in side_by_side.targets(r)][:3] == [False, False, False]
    del r["bytewax"], r["spark"], r["w1"]
    assert [met for _, met, _ in side_by_side.targets(r)][:3] == [None, None, None]


def test_bytewax_is_measured_by_its_fastest_exact_run_with_recovery_off() -> None:
    r = _report()
    runs = r["bytewax"]["runs"]
    runs.insert(1, {"recovery": "off", "processes": 2, "throughput_rps": 90_000, "oracle_equal": True,
                    "cpu": {"loadavg_start": [0.7, 0.5, 0.5]}})
    assert [x["system"] for x in side_by_side.w2_rows(r)][-3:] == [
        "Bytewax, recovery off", "Bytewax, recovery off, 2 processes", "Bytewax, recovery 1 s snapshots"]
    bytewax = side_by_side.targets(r)[1]
    assert bytewax[1] is False and "150,000 against 90,000 rec/s: 1.67×" in bytewax[2]  # the faster one
    runs[1]["throughput_rps"] = 200_000
    runs[1]["oracle_equal"] = False  # a faster run that is not exact is not the one compared
    bytewax = side_by_side.targets(r)[1]
    assert bytewax[1] is True and "150,000 against 60,000 rec/s: 2.50×" in bytewax[2]


def test_report_markdown_carries_the_section_and_the_targets() -> None:
    r = _report() | {"started_at": "now", "git": {"short": "abc", "dirty": False}, "report_file": "x.json",
                     "environment": {"cpus": 2, "cpu": "cpu", "python": "3.11", "loadavg_at_start": [0.1]},
                     "config": {"quick": True}}
    md = report.markdown(r)
    assert "## W2 on flows, side by side" in md
    assert "| on a flow | 2,000,000 | 500,000 | 40 (40) |" in md
    assert "| W2 on a flow ≥ 2× Bytewax's fastest (recovery off), same run | met (150,000 against 60,000 rec/s: 2.50×) |" in md
    assert ("**missed** (w2.windows: 100 firings, p99 ≤ 10.0 ms, slowest ≤ 50.0 ms, 1 over 20 ms "
            "(their CPU: slowest ≤ 10.0 ms, 0 over 20 ms))") in md


def test_the_peers_own_tables_compare_w2_as_a_user_writes_it_and_say_so() -> None:
    """The report's "Side by side with Spark" and "with Flink" tables compared the classic W2
    (50,000 here) under a label that did not say so, next to the flows table's W2 on a flow
    (150,000): one report gave 0.3× and 0.74× Spark for one run. They now compare the run
    issue 30's verdicts use, and name it; without a flow run, the classic one, named."""
    from bench import flink_peer, spark_peer

    r = _report()
    r["flink"] = {"w2": {"throughput_rps": 300_000, "throughput_job_rps": 200_000, "records_per_cpu_s": 100_000,
                         "records_per_cpu_s_running": 140_000, "oracle_equal": True}}
    (spark_w2,) = [row for row in spark_peer.compare(r, r["spark"]) if row["what"].startswith("W2")]
    assert (spark_w2["what"], spark_w2["millstream"], spark_w2["ratio"]) == (
        "W2 throughput, millstream on a flow (rec/s; higher is better)", "150,000", "1.2×")
    flink_rows = flink_peer.compare(r, r["flink"])
    assert [row["millstream"] for row in flink_rows] == ["150,000", "150,000", "70,000", "70,000"]
    assert all("millstream on a flow" in row["what"] for row in flink_rows)
    del r["w2_flow"]
    (spark_w2,) = [row for row in spark_peer.compare(r, r["spark"]) if row["what"].startswith("W2")]
    assert (spark_w2["what"], spark_w2["millstream"]) == (
        "W2 throughput, millstream's classic computations (rec/s; higher is better)", "50,000")
