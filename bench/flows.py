"""W1 and W2 as a user writes them on a :class:`runtime.Dataflow`, and what the benchmark reads
of a flow's window firings.

- W1 on a flow: ``input("in", keyed=True)`` then one or three :class:`bench.jobs.ChainedCounter`
  ``process`` steps (three in a row fuse into one computation: one commit, fsync and
  replication per batch for all of them), then :class:`bench.jobs.ArrivalSink`, fused into
  the same stage (its output commits with the stage's batch: no hop to a sink computation).
- W2 on a flow (:func:`bench.jobs.w2_flow`) is fed as a user's loop feeds it: one
  :class:`~injectors.Injector` with its default batching, ``send()`` per record and
  ``advance_watermark`` every few thousand records (:func:`inject_as_user`).
- :func:`window_fire_stalls` reads ``millstream_window_fire_seconds`` (how long a window step
  stalled its tablet firing what one watermark advance made due) from every worker's
  ``/metrics``; :func:`summarise_histogram` turns the buckets into the figures the report
  quotes (issue 30: no tablet stalled more than ~20 ms).
"""

from __future__ import annotations

import math
import re
from typing import Any

from bench import generator, worker_metrics
from injectors import Injector
from runtime import Dataflow, Topology
from runtime.cluster import LocalCluster

WATERMARK_EVERY = 4000  # records between two advance_watermark calls of the W2-on-flow sender
FIRE_METRIC = "millstream_window_fire_seconds"
FIRE_CPU_METRIC = "millstream_window_fire_cpu_seconds"  # the same firings' own CPU time
FIRE_QUEUED_METRIC = "millstream_window_fire_queued_seconds"  # ... and their wait for a core
GC_METRIC = "millstream_gc_pause_seconds"  # the workers' collector pauses, beside the firings
STALL_LIMIT_S = 0.02  # issue 30: no tablet stalled more than 20 ms by window firings


def w1_flow_topology(name: str, stages: int, sink_dir: str, key_ranges: int, *, output: str | None = None) -> Topology:
    """W1 as a flow of ``stages`` fused ChainedCounter steps and the ArrivalSink, all one stage
    (the sink commits with the stage's batch); ``output``: the counts go to that stream instead
    (bench/profile.py measures the stage alone)."""
    from bench.jobs import ArrivalSink, ChainedCounter

    flow = Dataflow(name, key_ranges=key_ranges)
    stream = flow.input("in", keyed=True)
    for i in range(1, stages + 1):
        stream = stream.process(ChainedCounter, name=f"count{i}", out=f"s{i}")
    if output is None:
        stream.sink(ArrivalSink, name="sink", path=sink_dir)
    else:
        stream.output(output)
    return flow.topology()


def inject_as_user(masters: str, data: generator.W2Data, stream: str = "events",
                   every: int = WATERMARK_EVERY) -> int:
    """W2's records through one Injector, as a user's loop sends them; returns the count."""
    with Injector(masters, stream, "w2-flow", timeout=300) as inj:
        watermark_after = data.watermark_after
        for i, (key, ts) in enumerate(zip(data.keys, data.timestamps, strict=True)):
            inj.send(key, b"", ts)
            if i % every == every - 1:
                inj.advance_watermark(watermark_after(i))
    return len(data.keys)


# ------------------------------------------------------------- window-fire metrics

_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_buckets(text: str, metric: str = FIRE_METRIC, label: str = "step") -> dict[str, dict[float, float]]:
    """The cumulative buckets of histogram ``metric`` in one ``/metrics`` page, by the value of
    ``label``: ``{step: {upper bound s: observations at or below it}}`` (``+Inf`` as ``math.inf``)."""
    out: dict[str, dict[float, float]] = {}
    for m in re.finditer(rf'^{metric}_bucket{{(?P<labels>[^}}]*)}} (?P<value>\S+)$', text, re.M):
        labels = dict(_LABEL.findall(m["labels"]))
        le = labels.get("le")
        if le is None:
            continue
        out.setdefault(labels.get(label, ""), {})[float(le)] = float(m["value"])
    return out


def add_buckets(into: dict[str, dict[float, float]], more: dict[str, dict[float, float]]) -> None:
    """Add one process's buckets to ``into`` (the same step on several workers adds up)."""
    for step, buckets in more.items():
        mine = into.setdefault(step, {})
        for le, n in buckets.items():
            mine[le] = mine.get(le, 0.0) + n


def _ms(bound: float) -> float | None:
    return None if math.isinf(bound) else round(bound * 1000, 3)


def summarise_histogram(buckets: dict[float, float], limit_s: float = STALL_LIMIT_S) -> dict[str, Any]:
    """Firings, and bucket bounds (ms) the p50, p99 and slowest firing fall in: ``max_le_ms`` is
    the smallest bound that holds every firing (None: only ``+Inf`` does, past the last bound,
    ``last_bound_ms``); ``over_limit`` counts firings above ``limit_s`` (a bound of the
    histogram, so the count is exact)."""
    bounds = sorted(buckets)
    total = buckets.get(math.inf, max(buckets.values(), default=0.0))
    finite = [b for b in bounds if not math.isinf(b)]
    out: dict[str, Any] = {"firings": int(total), "last_bound_ms": _ms(finite[-1]) if finite else None}

    def quantile(q: float) -> float | None:
        need = q * total
        return next((_ms(b) for b in bounds if buckets[b] >= need), None)

    if total == 0:
        return out | {"p50_le_ms": None, "p99_le_ms": None, "max_le_ms": None, "over_limit": 0,
                      "limit_ms": _ms(limit_s)}
    at_limit = max((buckets[b] for b in bounds if b <= limit_s), default=0.0)
    return out | {"p50_le_ms": quantile(0.5), "p99_le_ms": quantile(0.99), "max_le_ms": quantile(1.0),
                  "over_limit": int(total - at_limit), "limit_ms": _ms(limit_s)}


def window_fire_stalls(c: LocalCluster) -> dict[str, Any]:
    """``millstream_window_fire_seconds`` of every live worker, per step (summed over workers),
    summarised, and beside it (``cpu_steps``) the same firings' CPU time on the tablet's thread
    (``millstream_window_fire_cpu_seconds``: wall time over it is time waited for the
    interpreter lock or a core) and (``queued_steps``) their wait for a core; read before
    the cluster stops (the histograms live in the worker processes)."""
    total: dict[str, dict[float, float]] = {}
    cpu: dict[str, dict[float, float]] = {}
    queued: dict[str, dict[float, float]] = {}
    pauses: dict[str, dict[float, float]] = {}
    per_worker: dict[str, dict[str, Any]] = {}
    pages, errors = worker_metrics.scrape(c)
    for name, text in pages.items():
        mine = parse_buckets(text)
        per_worker[name] = {step: summarise_histogram(b) for step, b in mine.items()}
        add_buckets(total, mine)
        add_buckets(cpu, parse_buckets(text, FIRE_CPU_METRIC))
        add_buckets(queued, parse_buckets(text, FIRE_QUEUED_METRIC))
        add_buckets(pauses, parse_buckets(text, GC_METRIC, "generation"))
    return {"steps": {step: summarise_histogram(b) for step, b in total.items()},
            "cpu_steps": {step: summarise_histogram(b) for step, b in cpu.items()},
            "queued_steps": {step: summarise_histogram(b) for step, b in queued.items()},
            "per_worker": per_worker, "errors": errors,
            "gc_pauses": {f"generation {g}": summarise_histogram(b) for g, b in sorted(pauses.items())}}
