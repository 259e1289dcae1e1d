"""The demo's pipeline (Spark -> Zeitgeist -> Parquet -> Spark) on real processes, with a worker SIGKILLed."""

from __future__ import annotations

import os
from typing import Any

from cli.demo import run_pipeline
from examples.zeitgeist_spark import LogSpec, generate_log, planted_found
from runtime.client import Client
from tests.harness import Cluster, wait_until

SPEC = LogSpec().small(queries=30_000, seconds=40, vocabulary=60)


def test_results_exact_when_a_worker_is_sigkilled_mid_stream(spark: Any, cluster: Cluster) -> None:
    log_dir = os.path.join(cluster.data_dir, "log")
    generate_log(spark, log_dir, SPEC)
    victim = cluster.workers[0]
    killed_at: list[int] = []

    def kill_mid_stream(client: Client) -> None:
        # Once a third of the queries are counted, while Spark still injects: windows and
        # timers in flight, the model's state, sink files.
        seen: list[int] = []

        def a_third_counted() -> bool:
            seen.append(client.status()["computations"].get("zg.window_counter", {}).get("processed", 0))
            return seen[-1] >= SPEC.queries // 3

        wait_until(a_third_counted, 120, "a third of the queries to be counted")
        cluster.kill_worker(victim, graceful=False)
        killed_at.append(seen[-1])

    res = run_pipeline(spark, cluster.masters_arg, log_dir, os.path.join(cluster.data_dir, "out"),
                       name="zg", stream="zg.queries", spec=SPEC, during=kill_mid_stream)
    assert killed_at and not victim.alive()
    assert killed_at[0] < SPEC.queries, "killed while the stream ran"
    assert res.equal, res.differences()
    assert sum(c for _, _, c in res.windows) == res.records_in
    assert res.alerts and all(hit for _, hit in planted_found(SPEC, [(q, s, k) for q, s, k, _, _ in res.alerts]))
