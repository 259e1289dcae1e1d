"""The garbage collector's pauses with and without runtime/collector.py's freeze, interleaved::

    python -m bench.gc_pauses [ROUNDS]
    python -m bench.gc_pauses [ROUNDS] --young 50000   # frozen, young generation 700 against 50,000

Each round runs W2 on a flow (the bench's 2,000,000 records) and W1 one stage (10,000 rec/s,
20 s) twice, once with the collector as CPython has it (``MILLSTREAM_GC_FREEZE=0``) and
once with start-up objects frozen (``=1``, the default), and prints one row per run: the load before it, W2's throughput,
records per CPU-second and window firings over 20 ms, the workers' full collections (how
many, bucket bounds of their median and slowest pause), and W1's p50 and p99; the table is
also written to ``bench/results/<UTC stamp>-<commit>-gc-pauses.md``. With ``--young N``
both sides are frozen and the young generation's threshold differs (``MILLSTREAM_GC_YOUNG``):
700 objects (CPython's) against N. Figures for
docs/performance.md, "Garbage collector pauses"; never a test.
"""

from __future__ import annotations

import datetime
import os
import sys
import tempfile
from typing import Any

from bench import report, workloads
from bench.cli import ROOT

SETTINGS: tuple[tuple[str, dict[str, str]], ...] = (("CPython's", {"MILLSTREAM_GC_FREEZE": "0"}), ("frozen", {"MILLSTREAM_GC_FREEZE": "1"}))


def young_settings(young: int) -> tuple[tuple[str, dict[str, str]], ...]:
    """``--young N``: frozen with CPython's young generation (700 objects) against frozen with
    a young generation of N (runtime/collector.py's ``MILLSTREAM_GC_YOUNG``)."""
    return (("frozen, young 700", {"MILLSTREAM_GC_FREEZE": "1", "MILLSTREAM_GC_YOUNG": "700"}),
            (f"frozen, young {young:,}", {"MILLSTREAM_GC_FREEZE": "1", "MILLSTREAM_GC_YOUNG": str(young)}))


def _one(setting: dict[str, str]) -> dict[str, Any]:
    os.environ.update(setting)  # the cluster's processes inherit it
    cfg = workloads.BenchConfig.make(False)
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="millstream-gc-") as root:
        w2 = workloads.run_w2(root, cfg, flow=True)
    fire = w2.get("window_fire") or {}
    full = (fire.get("gc_pauses") or {}).get("generation 2") or {}
    firings = (fire.get("steps") or {}).get("w2.windows") or {}
    w1_variant = workloads.W1_VARIANTS[0]
    with tempfile.TemporaryDirectory(prefix="millstream-gc-") as root:
        w1 = workloads.run_w1(root, cfg, w1_variant, 10_000, seconds=20)
    return {"load": load, "w2_rps": w2.get("throughput_rps"), "w2_per_cpu_s": w2.get("records_per_cpu_s"),
            "w2_exact": w2.get("oracle_equal"), "firings_over_20ms": firings.get("over_limit"),
            "firings": firings.get("firings"), "full": full.get("firings"), "full_p50_le_ms": full.get("p50_le_ms"),
            "full_max_le_ms": full.get("max_le_ms"), "w1_p50": w1["latency_ms"]["p50"],
            "w1_p99": w1["latency_ms"]["p99"], "w1_exact": w1["exactness"]["exact"]}


def main(argv: list[str]) -> int:
    settings = SETTINGS
    if "--young" in argv:
        at = argv.index("--young")
        settings = young_settings(int(argv[at + 1]))
        argv = argv[:at] + argv[at + 2:]
    rounds = int(argv[0]) if argv else 3
    git, env = report.git_commit(ROOT), report.environment()
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    path = os.path.join(ROOT, "bench", "results", f"{stamp}-{git['short']}-gc-pauses.md")
    lines = [f"# Garbage collector pauses: `python -m bench.gc_pauses {' '.join(sys.argv[1:]) or rounds}`", "",
             f"Commit `{git['short']}`{' (uncommitted changes)' if git['dirty'] else ''}, {env['cpus']} CPUs "
             f"({env['cpu']}), Python {env['python']}, load average at start {env['loadavg_at_start']}; "
             "rounds interleaved, each run on a fresh cluster.", "",
             "| collector | load | W2 rec/s | W2 rec per CPU-s | firings over 20 ms | full collections | "
             "their p50 ≤ | slowest ≤ | W1 p50 ms | W1 p99 ms | exact |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    print("\n".join(lines), flush=True)
    for _ in range(rounds):
        for name, setting in settings:
            r = _one(setting)
            lines.append(f"| {name} | {r['load']:.1f} | {r['w2_rps']:,} | {r['w2_per_cpu_s']:,} | "
                         f"{r['firings_over_20ms']} of {r['firings']} | {r['full']} | {r['full_p50_le_ms']} ms | "
                         f"{r['full_max_le_ms']} ms | {r['w1_p50']} | {r['w1_p99']} | {r['w2_exact'] and r['w1_exact']} |")
            print(lines[-1], flush=True)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
