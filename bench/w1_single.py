"""One W1 run, for A/B comparisons between two checkouts (the full `millstream bench`
takes minutes per variant)::

    python -m bench.w1_single eo-3-stages 10000 15

prints the variant, rate, latency percentiles (ms) and their hops, the sender's flushes, the
batches' parts per computation (bench/worker_metrics.py), whether the output was exact, and
the CPU seconds of the whole process tree (etcd, master, workers, this process, each by
role: bench/cpu.py) with the foreign CPU the machine spent meanwhile.
Run it alternately from two checkouts (each with its own PYTHONPATH) to compare them on
the same machine at the same time; docs/performance.md cites such interleaved runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile

from bench import workloads
from bench.cpu import CpuMeter


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.w1_single")
    p.add_argument("variant", choices=[v.name for v in workloads.W1_VARIANTS])
    p.add_argument("rate", type=int)
    p.add_argument("seconds", type=float)
    p.add_argument("--replication", type=int, default=None,
                   help="copies of every tablet (default: the bench's); checkouts from before "
                        "replication existed run with one copy whatever this says")
    p.add_argument("--key-ranges", type=int, default=None,
                   help="key ranges of the stage (default: the bench's, 4): how a round's cost "
                        "grows with the tablets each worker holds")
    args = p.parse_args(argv)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    cfg = workloads.BenchConfig.make(False)
    if args.replication is not None and hasattr(cfg, "replication"):
        cfg = dataclasses.replace(cfg, replication=args.replication)
    if args.key_ranges is not None:
        cfg = dataclasses.replace(cfg, key_ranges=args.key_ranges)
    v = next(x for x in workloads.W1_VARIANTS if x.name == args.variant)
    with CpuMeter() as meter:
        r = workloads.run_w1(tempfile.mkdtemp(prefix="millstream-w1-"), cfg, v, args.rate, seconds=args.seconds)
    assert meter.figures is not None
    print(json.dumps({"variant": args.variant, "rate": args.rate, "seconds": args.seconds,
                      "replication": getattr(cfg, "replication", 1), "key_ranges": cfg.key_ranges,
                      "latency_ms": r["latency_ms"], "hops_ms": r.get("hops_ms"),
                      "sender": r.get("sender"), "batches": r.get("batches"),
                      "received": r.get("received"),
                      "exact": r["exactness"]["exact"],
                      "cpu": meter.figures.as_dict(),
                      "loadavg": os.getloadavg()}))
    return 0 if r["exactness"]["exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
