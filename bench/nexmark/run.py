"""Nexmark on a real cluster (``millstream bench --nexmark``): each query on a fresh local
cluster (etcd, a master, two workers, exactly-once, fsync, replication as configured),
checked against the exact oracle.

By default the queries are the :class:`~runtime.Dataflow` versions (:mod:`bench.nexmark.flows`,
q0–q12, checked against :data:`oracle.FLOW_ORACLES`); ``millstream bench --nexmark-classic``
runs the classic computations instead (:mod:`bench.nexmark.queries`, :data:`oracle.ORACLES`).

Two runs per query:

- **Throughput**: the events, generated beforehand, are injected as fast as one injector
  goes (its watermark following the generator's promise), and the run ends when the last
  expected output has arrived. Reported: events per second of wall time, and events per
  CPU-second of the whole process tree (this process, which injects, plus etcd, master and
  workers; bench/cpu.py), with the foreign CPU of the same interval.
- **Latency**: the events are injected on a paced schedule, each at the wall-clock instant
  of its event time (the generator's base time is the run's start), so an output's latency
  is its arrival time minus its timestamp: for a windowed query, minus the moment its window
  could fire (the watermark's delay included, as a user sees it).

Both runs compare every output record (key, value, timestamp) with the oracle's multiset:
``lost`` are expected records that never came, ``doubled`` records that came more often
than expected (q12 groups by processing time: only each bidder's total is checked).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from bench import latency
from bench.cpu import CpuMeter
from bench.linecount import LineCounter
from bench.nexmark import flows, oracle, queries
from bench.nexmark.generator import SECOND_US, NexmarkConfig, records, watermark_after
from bench.nexmark.sink import read_outputs
from injectors import Injector
from runtime import Topology
from runtime.client import Client
from runtime.cluster import wait_until
from runtime.errors import UsageError

if TYPE_CHECKING:
    from bench.workloads import BenchConfig

STREAM, OUT = "nx-events", "nx-out"
Output = Counter[tuple[bytes, bytes, int]]


def _topology(query: str, prefix: str, config: NexmarkConfig, sink_dir: str, key_ranges: int,
              classic: bool = False) -> Topology:
    """The query (its flow version, or the classic one) and the sink of its output."""
    args = (prefix, f"{prefix}{STREAM}", f"{prefix}{OUT}")
    if classic:
        topo = queries.QUERIES[query](*args, key_ranges=key_ranges, config=config)
        topo.add_computation(f"{prefix}sink", "bench.nexmark.sink:OutputSink", inputs={f"{prefix}{OUT}": None},
                             key_ranges=2, fsync=False, params={"path": sink_dir})
        return topo
    # As a user writes it: the sink at the end of the flow, fused into its last stage.
    return flows.FLOWS[query](*args, key_ranges=key_ranges, config=config, sink_dir=sink_dir).topology()


def _oracles(classic: bool) -> Mapping[str, Any]:
    return oracle.ORACLES if classic else oracle.FLOW_ORACLES


def _check(query: str, config: NexmarkConfig, events: list[tuple[bytes, bytes, int]],
           got: list[tuple[bytes, bytes, int, int]], classic: bool = False) -> dict[str, Any]:
    if query == "q12":
        want: Counter[bytes] = oracle.q12_totals(config, events)
        have: Counter[bytes] = Counter()
        for k, v, _, _ in got:
            have[k] += int(v)
        lost, doubled = sum((want - have).values()), sum((have - want).values())
        return {"expected": sum(want.values()), "observed": sum(have.values()), "lost": lost, "doubled": doubled,
                "exact": lost == doubled == 0, "checked": "bids per bidder (processing-time panes)"}
    expected: Output = _oracles(classic)[query](config, events)
    observed: Output = Counter((k, v, ts) for k, v, ts, _ in got)
    lost, doubled = sum((expected - observed).values()), sum((observed - expected).values())
    return {"expected": sum(expected.values()), "observed": sum(observed.values()), "lost": lost,
            "doubled": doubled, "exact": lost == doubled == 0, "checked": "every output record"}


def _wait_open(client: Client, prefix: str, timeout: float = 60.0) -> None:
    def ready() -> bool:
        tablets = [t for t in client.status()["tablets"] if t["computation"].startswith(prefix)]
        return bool(tablets) and all(t.get("health") == "ok" for t in tablets)
    wait_until(ready, timeout, f"every tablet of {prefix} to be open and in sync")


def _expected(query: str, config: NexmarkConfig, events: list[tuple[bytes, bytes, int]], classic: bool) -> int:
    """How many outputs the oracle expects (for q12, bids its panes must hold): worked out
    before the CPU meter starts, since the oracle is the benchmark's work, not the system's."""
    if query == "q12":
        return sum(oracle.q12_totals(config, events).values())
    return sum(_oracles(classic)[query](config, events).values())


def _wait_outputs(query: str, want: int, sink: str, timeout_s: float) -> None:
    """Until the ``want`` outputs (:func:`_expected`) have arrived (for q12, until the panes hold
    every bid: they close on the wall clock, ``window_size_sec`` after their first bid)."""
    if query == "q12":
        wait_until(lambda: sum(int(v) for _, v, _, _ in read_outputs(sink)) >= want, timeout_s,
                   f"q12's panes to hold all {want:,} bids")
    else:
        count = LineCounter(sink)
        wait_until(lambda: count() >= want, timeout_s, f"{query}'s {want:,} outputs")


def _inject(masters: str, name: str, config: NexmarkConfig, events: list[tuple[bytes, bytes, int]],
            paced_from_ns: int | None) -> None:
    """Send ``events`` (paced at their event times from ``paced_from_ns``, or as fast as the
    injector goes), the watermark following the generator's promise; then finish."""
    # A watermark report is a call to the master: every 500 events, or every 50 ms when paced.
    every = 500 if paced_from_ns is None else max(1, config.events_per_second // 20)
    # The queries' key extractors (bench.nexmark.queries; a flow's runs bench.nexmark.steps)
    # route the events in the injector.
    with Injector(masters, f"{name}{STREAM}", f"{name}injector", timeout=120, allow_code=["bench"]) as inj:
        for i, (key, value, ts) in enumerate(events):
            if paced_from_ns is not None:
                due = ts * 1000
                while (now := time.time_ns()) < due:
                    time.sleep(min((due - now) / 1e9, 0.0005))  # the schedule, not a test wait
            inj.send(key, value, ts)
            if i % every == every - 1:
                inj.advance_watermark(watermark_after(config, i))


def run_query(c: Any, query: str, config: NexmarkConfig, n_throughput: int, latency_s: float,
              latency_rate: int, key_ranges: int, timeout_s: float, classic: bool = False) -> dict[str, Any]:
    """Both runs of one query (its flow version, or the classic one) on the cluster ``c``."""
    out: dict[str, Any] = {"query": query, "version": "classic" if classic else "flow"}
    with Client(c.masters_arg, timeout=30) as client:
        # Throughput.
        prefix = "t-"
        sink = os.path.join(c.data_dir, "nexmark-t")
        client.submit(_topology(query, prefix, config, sink, key_ranges, classic))
        _wait_open(client, prefix)
        events = list(records(config, 0, n_throughput))
        want = _expected(query, config, events, classic)
        with CpuMeter() as meter:
            t0 = time.time_ns()
            sender0 = time.thread_time()
            _inject(c.masters_arg, prefix, config, events, None)
            sender_s = time.thread_time() - sender0  # the caller's send() loop, without the injector's threads
            _wait_outputs(query, want, sink, timeout_s)
        # Read and checked outside the meter: parsing 200,000 output lines is the benchmark's
        # work (~0.3 CPU-s, 6 % of q0's), not the system's; their arrival stamps are the ends.
        got = read_outputs(sink)
        t_end = max((a for *_, a in got), default=time.time_ns())
        assert meter.figures is not None
        wall = (t_end - t0) / 1e9
        out["throughput"] = {"events": n_throughput, "wall_s": round(wall, 2),
                             "events_per_s": round(n_throughput / wall),
                             "events_per_cpu_s": round(n_throughput / max(1e-9, meter.figures.ours_s)),
                             "cpu": meter.figures.as_dict(), "send_loop_cpu_s": round(sender_s, 2),
                             "outputs": len(got),
                             "exactness": _check(query, config, events, got, classic)}
        # Latency: event times on the wall clock, paced.
        prefix = "l-"
        sink = os.path.join(c.data_dir, "nexmark-l")
        start_ns = time.time_ns() + 2_000_000_000
        paced = dataclasses.replace(config, base_time_us=start_ns // 1000, events_per_second=latency_rate)
        client.submit(_topology(query, prefix, paced, sink, key_ranges, classic))
        _wait_open(client, prefix)
        events = list(records(paced, 0, int(latency_s * latency_rate)))
        _inject(c.masters_arg, prefix, paced, events, start_ns)
        _wait_outputs(query, _expected(query, paced, events, classic), sink, timeout_s)
        got = read_outputs(sink)
        # Outputs of the end of the input (windows closed by finish()) fire early: left out.
        closed_by_end = paced.base_time_us + int(latency_s * SECOND_US)
        lat = [(arrival / 1000 - ts) / 1000 for _, _, ts, arrival in got if ts <= closed_by_end]
        out["latency"] = {"events": len(events), "rate": latency_rate, "ms": latency.percentiles(lat),
                          "samples": len(lat), "exactness": _check(query, paced, events, got, classic)}
    return out


def queries_of(classic: bool = False) -> list[str]:
    """The queries a run covers: every flow version (q0–q12), or the classic ones."""
    return list(queries.QUERIES if classic else flows.FLOWS)


def run(root: str, cfg: BenchConfig, only: Sequence[str] | None = None, *, classic: bool = False) -> dict[str, Any]:
    """Every query (or ``only``), each on a fresh cluster: the flow versions, or the classic
    ones if ``classic``."""
    known = queries_of(classic)
    unknown = [q for q in only or () if q not in known]
    if unknown:
        raise UsageError(f"no {'classic ' if classic else ''}Nexmark query {', '.join(unknown)}; "
                         f"there are {', '.join(known)}")
    from bench.workloads import cluster

    n = 20_000 if cfg.quick else 200_000
    latency_s, rate = (3.0, 2_000) if cfg.quick else (20.0, 5_000)
    config = NexmarkConfig()
    result: dict[str, Any] = {"config": dataclasses.asdict(config) | {
        "throughput_events": n, "latency_seconds": latency_s, "latency_rate": rate,
        "replication": cfg.replication, "workers": cfg.workers, "key_ranges": cfg.key_ranges,
        "version": "classic" if classic else "flow"}, "queries": []}
    for query in only or known:
        print(f"  Nexmark {query} ({'classic' if classic else 'flow'})", flush=True)
        with cluster(root, f"nexmark-{query}", cfg) as c:
            try:
                result["queries"].append(run_query(c, query, config, n, latency_s, rate, cfg.key_ranges,
                                                   cfg.w2_timeout_s, classic))
            except TimeoutError as e:
                result["queries"].append({"query": query, "error": str(e)})
    return result


if __name__ == "__main__":
    # python -m bench.nexmark.run q0,q5 [--classic]: those queries alone, as the bench runs
    # them, their figures (CPU by process included) as JSON.
    import json
    import sys
    import tempfile

    from bench.workloads import BenchConfig

    chosen = [a for a in sys.argv[1:] if not a.startswith("--")]
    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(run(tmp, BenchConfig.make(False), chosen[0].split(",") if chosen else None,
                             classic="--classic" in sys.argv), indent=1))
