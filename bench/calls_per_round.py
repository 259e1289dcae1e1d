"""Unary calls per injector round on the data plane (issue 29: "count the unary calls per W1
round before and after"): W1, one exactly-once stage, a paced sender flushing every tick, on
two workers with two copies of every tablet; then each worker's /metrics: the deliveries it
received (``millstream_deliver_calls``: unary calls, stream frames) and the replication it
received as a follower (``millstream_replicate_calls``; before that counter existed, every
``Replicate``/``ReplicateMany`` was a unary call, counted by
``millstream_replicated_tablets_per_call``), each divided by the injector's rounds.

    python -m bench.calls_per_round [RATE] [SECONDS]        # 1,000 rec/s for 10 s by default

Runs against older trees too: ``PYTHONPATH=<old tree> python <this file>`` (from the old
tree's directory), so the same file measures before and after.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import urllib.request

from bench import generator, latency, workloads
from runtime.client import Client
from runtime.cluster import LocalCluster


def _count(text: str, name: str, labels: str = "") -> float:
    """The sum of the samples of ``name`` (with ``labels`` among theirs)."""
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*{labels}[^}}]*}})? (\S+)$", text, re.M))


def main(rate: int = 1000, seconds: float = 10.0) -> None:
    root = os.getcwd()
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    print(f"load average at start: {os.getloadavg()}; tree {root}")
    with tempfile.TemporaryDirectory() as d, \
            LocalCluster(d, workers=2, allow_code="bench", replication=2).running() as c:
        sink = os.path.join(d, "arrivals")
        with Client(c.masters_arg, timeout=30) as client:
            client.submit(workloads.w1_topology(workloads.W1_VARIANTS[0], sink, 4))
            workloads.wait_tablets_open(c, client, "in", sink)
        texts = []
        for w in c.workers:  # what opening the tablets cost, before any record
            port = next(line.rsplit(":", 1)[1] for line in w.lines if " metrics on " in line)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                texts.append(r.read().decode())
        stats = latency.paced_send(c.masters_arg, "in", "calls", generator.w1_keys(rate, seconds), rate)
        got: dict[str, float] = {}
        for w, before in zip(c.workers, texts, strict=True):
            port = next(line.rsplit(":", 1)[1] for line in w.lines if " metrics on " in line)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                text = r.read().decode()
            for what, name, labels in (("deliver unary", "millstream_deliver_calls_total", 'carrier="unary"'),
                                       ("deliver frames", "millstream_deliver_calls_total", 'carrier="frame"'),
                                       ("replicate unary", "millstream_replicate_calls_total", 'carrier="unary"'),
                                       ("replicate frames", "millstream_replicate_calls_total", 'carrier="frame"'),
                                       ("replicate (any)", "millstream_replicated_tablets_per_call_count", "")):
                got[what] = got.get(what, 0.0) + _count(text, name, labels) - _count(before, name, labels)
    rounds = max(1, stats.flushes)
    if not got["replicate unary"] and not got["replicate frames"]:  # a tree without the counter: all unary
        got["replicate unary"] = got["replicate (any)"]
    print(f"{stats.sent} records in {rounds} rounds ({stats.sent / rounds:.1f} per round)")
    for what in ("deliver unary", "deliver frames", "replicate unary", "replicate frames"):
        print(f"{what}: {got[what]:.0f} ({got[what] / rounds:.2f} per round)")
    unary = got["deliver unary"] + got["replicate unary"]
    frames = got["deliver frames"] + got["replicate frames"]
    print(f"unary calls per round: {unary / rounds:.2f}; stream frames per round: {frames / rounds:.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000, float(sys.argv[2]) if len(sys.argv) > 2 else 10.0)
