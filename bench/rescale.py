"""The rescaling run (issue 13): W1 on one range per computation, two workers added mid-run,
the rebalancing policy splits the hot ranges and spreads them (docs/rescaling.md).

Reported: throughput and latency before the workers join, while the policy reshards, and
after; every split and merge the policy made (when, which range, why); and for each split
the *pause*: p99 and max latency of the records routed through the split range in the
seconds around it, next to that range's p99 before.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import threading
import time
from typing import Any

from bench import generator, latency
from bench.workloads import (
    W1_VARIANTS,
    WARMUP_PREFIX,
    BenchConfig,
    StatusSampler,
    peak_rss,
    w1_topology,
    wait_tablets_open,
)
from runtime.client import Client
from runtime.cluster import LocalCluster, wait_until
from runtime.keyspace import key_hash

HOLD_S, COOLDOWN_S = 3, 5  # the policy's hold and cooldown for this run (defaults: 10 s, 30 s)


def run_rescale(root: str, cfg: BenchConfig) -> dict[str, Any]:
    rate = 2_000 if cfg.quick else 10_000
    seconds = 20.0 if cfg.quick else 60.0
    add_at_s = 5.0 if cfg.quick else 15.0
    keys = generator.w1_keys(rate, seconds)
    result: dict[str, Any] = {"rate": rate, "seconds": seconds, "records": len(keys), "workers_before": 2,
                              "workers_added": 2, "add_at_s": add_at_s,
                              "policy": {"hold_s": HOLD_S, "cooldown_s": COOLDOWN_S, "split_above": 1.5}}
    data = os.path.join(root, "rescale")
    shutil.rmtree(data, ignore_errors=True)
    args = ["--rebalance-hold-s", str(HOLD_S), "--rebalance-cooldown-s", str(COOLDOWN_S)]
    with LocalCluster(data, workers=2, lease_ms=cfg.lease_ms, allow_code="bench", replication=cfg.replication,
                      master_args=args).running() as c:
        sink_dir = os.path.join(c.data_dir, "arrivals")
        topo = w1_topology(W1_VARIANTS[0], sink_dir, 1)
        for name, spec in list(topo.computations.items()):
            topo.computations[name] = dataclasses.replace(spec, rebalance=True)
        with Client(c.masters_arg, timeout=30) as client:
            client.submit(topo)
            wait_tablets_open(c, client, "in", sink_dir)
        samples: list[tuple[int, list[dict[str, Any]]]] = []
        added: dict[str, int] = {}

        def add_workers(start_ns: int) -> None:
            time.sleep(max(0.0, start_ns / 1e9 + add_at_s - time.time()))  # the run's schedule
            added["ns"] = time.time_ns()
            c.add_worker()
            c.add_worker()

        with StatusSampler(c.masters_arg, lambda doc, t: samples.append((t, doc["tablets"]))):
            adder = threading.Thread(target=add_workers, args=(time.time_ns(),), daemon=True)
            adder.start()
            stats = latency.paced_send(c.masters_arg, "in", "rescale", keys, rate)
            adder.join()
            try:
                wait_until(lambda: latency.count_lines(sink_dir) >= stats.sent + 64, 120, "every output")
            except TimeoutError as e:
                result["error"] = str(e)
            with Client(c.masters_arg, timeout=30) as client:
                doc = client.status()
        result["reshards"] = [r["what"] for r in doc.get("reshards", [])]
        result["ranges_after"] = {comp: sum(1 for t in doc["tablets"] if t["computation"] == comp)
                                  for comp in topo.computations}
        result["primaries_after"] = sorted({t["primary"] for t in doc["tablets"]})
        result["peak_rss_bytes"] = peak_rss(c)
        arrivals = [a for a in latency.read_arrivals(sink_dir) if not a.key.startswith(WARMUP_PREFIX)]
    check = latency.check_exact(arrivals, stats.per_key)
    result["exactness"] = check.__dict__ | {"exact": check.exact}
    result["achieved_rate"] = round(stats.sent / max(1e-9, (stats.end_ns - stats.start_ns) / 1e9))
    splits = _replaced(samples)
    result["splits"] = [_pause(s, arrivals, stats.start_ns + int(cfg.warmup_s * 1e9)) for s in splits]
    warm = stats.start_ns + int(cfg.warmup_s * 1e9)
    add_ns = added.get("ns", stats.end_ns)
    # "during": from the join until 5 s after the last change the policy made after it
    settled = max([add_ns, *(s["at_ns"] for s in splits if s["at_ns"] >= add_ns)]) + 5_000_000_000
    result["phases"] = {
        "before": _phase(arrivals, warm, add_ns),
        "during": _phase(arrivals, add_ns, settled),
        "after": _phase(arrivals, settled, stats.end_ns),
    }
    result["timeline_max_latency_ms"] = latency.latency_timeline(arrivals, stats.start_ns, 1000)
    return result


def _replaced(samples: list[tuple[int, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """Ranges that disappeared between two status samples (split or merged away)."""
    out = []
    for (_, before), (t, after) in zip(samples, samples[1:], strict=False):
        now = {(x["computation"], x["key_range"]) for x in after}
        for x in before:
            if (x["computation"], x["key_range"]) not in now and after:
                out.append({"at_ns": t, "computation": x["computation"], "key_range": x["key_range"],
                            "start": x["start"], "end": x["end"]})
    return out


def _phase(arrivals: list[latency.Arrival], lo: int, hi: int) -> dict[str, Any]:
    inside = [a for a in arrivals if lo <= a.sched_ns < hi]
    if hi <= lo or not inside:
        return {"records": 0}
    return {"seconds": round((hi - lo) / 1e9, 1), "records": len(inside),
            "throughput_rps": round(len(inside) / ((hi - lo) / 1e9)),
            "latency_ms": latency.percentiles(a.latency_ms for a in inside)}


def _pause(split: dict[str, Any], arrivals: list[latency.Arrival], warm_ns: int) -> dict[str, Any]:
    """Latency of the records through the split range: around the split, and before it."""
    t = split["at_ns"]

    def through(a: latency.Arrival) -> bool:
        return bool(split["start"] <= key_hash(a.key) < split["end"])

    around = [a.latency_ms for a in arrivals if t - 1_000_000_000 <= a.sched_ns < t + 2_000_000_000 and through(a)]
    before = [a.latency_ms for a in arrivals if warm_ns <= a.sched_ns < t - 1_000_000_000 and through(a)]
    out = {k: v for k, v in split.items() if k != "at_ns"}
    out["latency_around_ms"] = latency.percentiles(around, (50, 99, 100)) if around else {}
    out["latency_before_ms"] = latency.percentiles(before, (50, 99)) if before else {}
    return out
