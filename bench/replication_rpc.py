"""Where a replicated commit's time goes: W1 (1 stage) at 1,000 rec/s for 6 s on two
workers, then each worker's mean local commit, Replicate round trip (sent to answered)
and replication wait (local commit to in-sync acknowledgement), from its /metrics.

    python -m bench.replication_rpc [COPIES]     # COPIES: 2 (default) or 1
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

METRICS = ("millstream_commit_seconds", "millstream_replication_rpc_seconds", "millstream_replication_seconds",
           "millstream_batch_seconds")


def _means(text: str) -> dict[str, tuple[int, float]]:
    out = {}
    for name in METRICS:
        total = sum(float(v) for v in re.findall(rf"^{name}_sum{{[^}}]*}} (\S+)", text, re.M))
        n = sum(float(v) for v in re.findall(rf"^{name}_count{{[^}}]*}} (\S+)", text, re.M))
        out[name] = (int(n), 1000 * total / max(n, 1))
    return out


def main(copies: int = 2) -> None:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    print(f"load average at start: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as d, \
            LocalCluster(d, workers=2, allow_code="bench", replication=copies).running() as c:
        sink = os.path.join(d, "arrivals")
        with Client(c.masters_arg, timeout=30) as client:
            client.submit(workloads.w1_topology(workloads.W1_VARIANTS[0], sink, 4))
            workloads.wait_tablets_open(c, client, "in", sink)
        latency.paced_send(c.masters_arg, "in", "probe", generator.w1_keys(1000, 6), 1000)
        print("end-to-end latency (ms):", latency.percentiles([a.latency_ms for a in latency.read_arrivals(sink)]))
        for w in c.workers:
            port = next(line.rsplit(":", 1)[1] for line in w.lines if " metrics on " in line)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                for name, (n, mean) in _means(r.read().decode()).items():
                    print(f"{w.name} {name}: {n} observations, mean {mean:.2f} ms")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
