"""bench/flows.py: W1 on a flow compiles to one fused computation and a sink without fsync; the
window-fire histogram read from /metrics is summarised as the report quotes it."""

from __future__ import annotations

import dataclasses
import json
import math
import os

import pytest

from bench import flows, generator, worker_metrics, workloads
from bench.cli import ROOT
from bench.workloads import W1_VARIANTS, BenchConfig, w1_topology

METRICS = """\
# HELP millstream_window_fire_seconds Time a flow's event-time step ...
# TYPE millstream_window_fire_seconds histogram
millstream_window_fire_seconds_bucket{le="0.0005",step="w2.windows"} 10.0
millstream_window_fire_seconds_bucket{le="0.001",step="w2.windows"} 50.0
millstream_window_fire_seconds_bucket{le="0.0025",step="w2.windows"} 90.0
millstream_window_fire_seconds_bucket{le="0.005",step="w2.windows"} 98.0
millstream_window_fire_seconds_bucket{le="0.01",step="w2.windows"} 99.0
millstream_window_fire_seconds_bucket{le="0.02",step="w2.windows"} 99.0
millstream_window_fire_seconds_bucket{le="0.05",step="w2.windows"} 100.0
millstream_window_fire_seconds_bucket{le="0.1",step="w2.windows"} 100.0
millstream_window_fire_seconds_bucket{le="0.25",step="w2.windows"} 100.0
millstream_window_fire_seconds_bucket{le="1.0",step="w2.windows"} 100.0
millstream_window_fire_seconds_bucket{le="+Inf",step="w2.windows"} 100.0
millstream_window_fire_seconds_count{step="w2.windows"} 100.0
millstream_window_fire_seconds_sum{step="w2.windows"} 0.2
millstream_commit_seconds_bucket{computation="w2.windows",le="0.0001"} 7.0
millstream_gc_pause_seconds_bucket{generation="2",le="0.005"} 3.0
millstream_gc_pause_seconds_bucket{generation="2",le="0.02"} 4.0
millstream_gc_pause_seconds_bucket{generation="2",le="0.05"} 5.0
millstream_gc_pause_seconds_bucket{generation="2",le="+Inf"} 5.0
"""


def test_window_fire_buckets_are_parsed_and_summarised() -> None:
    buckets = flows.parse_buckets(METRICS)
    assert list(buckets) == ["w2.windows"]  # other histograms are not read
    assert buckets["w2.windows"][math.inf] == 100 and buckets["w2.windows"][0.02] == 99
    s = flows.summarise_histogram(buckets["w2.windows"])
    # 50 of 100 at or below 1 ms, 99 at or below 10 ms, the last one in (20, 50] ms.
    assert (s["firings"], s["p50_le_ms"], s["p99_le_ms"], s["max_le_ms"]) == (100, 1.0, 10.0, 50.0)
    assert (s["over_limit"], s["limit_ms"], s["last_bound_ms"]) == (1, 20.0, 1000.0)
    # The collector's pauses, read the same way beside the firings.
    gc = flows.parse_buckets(METRICS, flows.GC_METRIC, "generation")
    assert list(gc) == ["2"]
    g = flows.summarise_histogram(gc["2"])
    assert (g["firings"], g["p50_le_ms"], g["max_le_ms"], g["over_limit"]) == (5, 5.0, 50.0, 1)


def test_two_workers_add_up_and_a_firing_past_the_last_bound_is_not_hidden() -> None:
    total: dict[str, dict[float, float]] = {}
    flows.add_buckets(total, flows.parse_buckets(METRICS))
    beyond = {"w2.windows": {0.02: 0.0, 1.0: 0.0, math.inf: 2.0}}
    flows.add_buckets(total, beyond)
    s = flows.summarise_histogram(total["w2.windows"])
    assert s["firings"] == 102 and s["over_limit"] == 3
    assert s["max_le_ms"] is None  # slower than every finite bound: reported as "> 1000 ms"
    assert flows.summarise_histogram({})["firings"] == 0


def test_w1_on_a_flow_fuses_its_stages_and_its_sink() -> None:
    variants = {v.name: v for v in W1_VARIANTS}
    for name, steps in (("flow-1-stage", 1), ("flow-3-stages", 3)):
        topo = w1_topology(variants[name], "/tmp/arrivals", 4)
        assert list(topo.computations) == ["count1"]  # three process steps and the sink: one computation
        stage = topo.computations["count1"]
        assert stage.inputs == {"in": None} and stage.key_ranges == 4
        assert stage.code == "runtime.flows.stage:SinkStage" and stage.fsync is None  # exactly once, fsync
        plan = json.loads(stage.params["flow.plan"])
        assert json.dumps(plan).count("bench.jobs:ChainedCounter") == steps
        assert plan["steps"]["sink"]["cls"] == "bench.jobs:ArrivalSink"
        assert plan["steps"]["sink"]["params"] == {"path": "/tmp/arrivals"}
    classic = w1_topology(variants["eo-3-stages"], "/tmp/arrivals", 4)
    assert list(classic.computations) == ["count1", "count2", "count3", "sink"]


# ------------------------------------------------------------ on a real local cluster


@pytest.mark.timeout(240)
def test_w2_on_a_flow_is_exact_and_its_window_firings_are_read(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """W2 on a flow (bench.jobs.w2_flow) through run_w2 on a real cluster: one injector's send()
    loop, the spikes equal to the oracle's, the window step's firing histogram read from the
    workers' /metrics before they stop."""
    cfg = dataclasses.replace(BenchConfig.make(True), w2_timeout_s=120.0)
    data = generator.w2_data(20_000, events_per_second=2_000, spikes=10, n_keys=200)
    oracle = generator.w2_oracle(data)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    res = workloads.run_w2(str(tmp_path), cfg, data, oracle, flow=True)
    assert res["variant"] == "flow" and "error" not in res, res.get("error")
    assert res["oracle_equal"] is True and res["spikes_observed"] == len(oracle.spikes) > 0
    fire = res["window_fire"]
    assert fire["errors"] == [] and len(fire["per_worker"]) == cfg.workers
    # Windows fired (once per watermark advance and tablet, on either worker): counted, summarised.
    assert fire["steps"]["w2.windows"]["firings"] > 0
    assert fire["steps"]["w2.windows"]["p99_le_ms"] is not None or fire["steps"]["w2.windows"]["over_limit"] > 0


@pytest.mark.timeout(240)
def test_w1_on_flows_is_exact_one_and_three_fused_stages(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = BenchConfig.make(True)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    variants = {v.name: v for v in W1_VARIANTS}
    for name, stages in (("flow-1-stage", 1), ("flow-3-stages", 3)):
        res = workloads.run_w1(str(tmp_path), cfg, variants[name], 1_000, seconds=2.0)
        assert "error" not in res, res.get("error")
        assert res["exactness"]["exact"] is True, res["exactness"]
        # Each fused ChainedCounter step stamped the record: one hop per stage, then the sink.
        assert len(res["hops_ms"]) == stages + 1, res["hops_ms"]


BATCH_METRICS = """\
millstream_batch_seconds_count{computation="count1"} 100.0
millstream_batch_seconds_sum{computation="count1"} 0.7
millstream_commit_seconds_count{computation="count1"} 100.0
millstream_commit_seconds_sum{computation="count1"} 0.2
millstream_replication_seconds_count{computation="count1"} 100.0
millstream_replication_seconds_sum{computation="count1"} 0.3
millstream_batch_seconds_count{computation="sink"} 50.0
millstream_batch_seconds_sum{computation="sink"} 0.1
millstream_batch_seconds_bucket{computation="sink",le="0.005"} 50.0
"""


def test_a_w1_rounds_parts_are_the_means_of_every_workers_histograms() -> None:
    other = BATCH_METRICS.replace("100.0", "300.0").replace("0.7", "2.1").replace("0.2", "0.6")
    got = worker_metrics.batch_breakdown([BATCH_METRICS, other])
    assert got["count1"] == {"batches": 400, "batch_ms": 7.0, "commit_ms": 2.0, "replication_wait_ms": 1.5}
    assert got["sink"] == {"batches": 100, "batch_ms": 2.0}  # no followers: no replication figures
    assert worker_metrics.batch_breakdown([]) == {}


def test_the_messages_a_round_cost_are_counted_by_carrier_over_every_worker() -> None:
    page = ('millstream_deliver_calls_total{carrier="frame"} 1055.0\n'
            'millstream_deliver_calls_created{carrier="frame"} 1.79e+09\n'
            'millstream_replicate_calls_total{carrier="frame"} 2156.0\n'
            'millstream_replicate_calls_total{carrier="unary"} 3.0\n')
    assert worker_metrics.received([page, page]) == {"deliver frame": 2110, "replicate frame": 4312,
                                                     "replicate unary": 6}


def test_the_w1_report_shows_each_rounds_parts_and_messages() -> None:
    from bench import report

    run = {"variant": "eo-strong-fsync", "rate": 10_000,
           "batches": {"count1": {"batches": 400, "batch_ms": 7.0, "commit_ms": 2.0, "replication_wait_ms": 1.5}},
           "received": {"deliver frame": 2110, "replicate frame": 4312}}
    text = "\n".join(report._w1_batches([run, {"variant": "at-least-once", "rate": 1_000}]))
    assert "| eo-strong-fsync | 10,000 | count1 | 400 | 7.00 | 2.00 | 1.50 | – |" in text
    assert "the workers received 2,110 deliver frames, 4,312 replicate frames" in text
    assert "at-least-once" not in text  # a run without the figures (an older tree's) gets no row


def test_the_targets_judge_w2_on_a_flow_beside_the_classic_w2() -> None:
    from bench import report

    run = {"w2": {"available": True, "throughput_rps": 59_913, "oracle_equal": True},
           "w2_flow": {"available": True, "throughput_rps": 173_052, "oracle_equal": True}}
    rows = dict(report.targets(run))
    assert rows["W2 ≥ 150,000 rec/s exactly once (classic computations)"].startswith("**missed**")
    assert rows["W2 ≥ 150,000 rec/s exactly once (on a flow, as a user writes it)"].startswith("met")
    run["w2_flow"]["oracle_equal"] = False  # fast and wrong is not met
    assert dict(report.targets(run))["W2 ≥ 150,000 rec/s exactly once (on a flow, as a user writes it)"] \
        .startswith("**missed**")
