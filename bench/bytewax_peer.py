"""The Bytewax peer: W2 on Bytewax (bench/bytewax/w2_job.py) with recovery off, on one worker
(``run_main``) and on one worker per core (``cluster_main``, a process each: Bytewax's
workers run Python, so one process uses one core), and with recovery on (Bytewax's SQLite
recovery, a snapshot every 1 s epoch, one worker), on the same records as millstream, checked
against the same oracle, for issue 30's ratio (W2 on flows ≥ 2× Bytewax with recovery off: the
fastest of its exact recovery-off runs).

The records are written as ``key,ts_us`` lines (untimed); the job reads them into memory
before its dataflow starts. Throughput is records over the dataflow's run time (from
``run_main``'s call to its return: every window closed and every spike written), the figure
most favourable to Bytewax; records per CPU-second count the job's whole process from that
same start. The check is millstream's W2 check: the spikes (key, window) equal the oracle's,
each with the oracle's count for its window.
"""

from __future__ import annotations

import os
import shutil
from collections import Counter
from typing import TYPE_CHECKING, Any

from bench import generator
from bench.bytewax_env import ROOT, BytewaxUnavailableError, ensure_venv, run_job

if TYPE_CHECKING:
    from bench.workloads import BenchConfig

JOB = os.path.join(ROOT, "bench", "bytewax", "w2_job.py")
SNAPSHOT_S = 1.0
BATCH = 1000  # lines per next_batch of the job's source (Bytewax's own file source reads 1,000)
PROCESSES = sorted({1, os.cpu_count() or 1})  # recovery off: one worker, and one per core
CONFIG = {
    "w2": (f"run_main (one worker), or cluster_main (one worker per process, as the row says; one input "
           f"partition, exchanged by key); source batches of {BATCH:,} lines; key_on, fold_window count (1 s TumblingWindower, EventClock with "
           "2 s wait on event time only), stateful_map spike stage, filter_map, output"),
    "recovery on": f"SQLite recovery, one partition, a snapshot every {SNAPSHOT_S:g} s epoch",
}


def write_input(data: generator.W2Data, path: str) -> None:
    with open(path, "wb") as f:
        f.writelines(b"%s,%d\n" % kt for kt in zip(data.keys, data.timestamps, strict=True))


def read_spikes(path: str) -> Counter[tuple[bytes, int, int]]:
    """``(key, window start µs, count)`` of every spike line the job wrote."""
    out: Counter[tuple[bytes, int, int]] = Counter()
    with open(path, "rb") as f:
        for line in f:
            key, start, count = line.split()
            out[(key, int(start), int(count))] += 1
    return out


def check(spikes: Counter[tuple[bytes, int, int]], oracle: generator.W2Oracle) -> dict[str, Any]:
    """millstream's W2 check: the spikes equal the oracle's, each once, with its window's count."""
    seen = Counter((k, w) for (k, w, _), n in spikes.items() for _ in range(n))
    counts_ok = all(oracle.windows.get((k, w)) == c for k, w, c in spikes)
    return {"spikes_observed": sum(seen.values()), "spikes_expected": len(oracle.spikes),
            "oracle_equal": seen == Counter(oracle.spikes) and counts_ok}


def run_w2(python: str, root: str, data_path: str, oracle: generator.W2Oracle, records: int,
           recovery: bool, timeout_s: float, processes: int = 1) -> dict[str, Any]:
    name = f"{'recovery' if recovery else 'plain'}-p{processes}"
    out = os.path.join(root, f"bytewax-w2-{name}.txt")
    argv = [JOB, data_path, out, "--batch", str(BATCH), "--processes", str(processes)]
    result: dict[str, Any] = {"recovery": f"{SNAPSHOT_S:g} s snapshots" if recovery else "off", "records": records,
                              "processes": processes}
    if recovery:
        db = os.path.join(root, "bytewax-recovery")
        shutil.rmtree(db, ignore_errors=True)
        argv += ["--recovery", db, "--epoch-s", str(SNAPSHOT_S)]
    job = run_job(python, argv, os.path.join(root, f"bytewax-w2-{name}.stderr"), timeout_s)
    result["cpu"] = job.cpu.as_dict()
    if job.error is not None:
        return result | {"error": job.error}
    assert job.running is not None
    run_s = float(job.result["run_s"])
    return result | check(read_spikes(out), oracle) | {
        "bytewax_version": job.result.get("bytewax_version"),
        "run_s": round(run_s, 2),
        "throughput_rps": round(records / run_s),
        "cpu_running": job.running.as_dict(),
        "records_per_cpu_s": round(records / max(1e-9, job.running.ours_s)),
    }


def run(root: str, cfg: BenchConfig, w2_data: generator.W2Data | None,
        w2_oracle: generator.W2Oracle | None) -> dict[str, Any]:
    """W2 on Bytewax, recovery off on each of :data:`PROCESSES`, then on (one process); ``error``
    says why not if Bytewax cannot run here."""
    out: dict[str, Any] = {"config": dict(CONFIG), "runs": []}
    try:
        python = ensure_venv()
    except (BytewaxUnavailableError, OSError) as e:
        out["error"] = f"cannot run Bytewax here, no Bytewax figures in this report: {e}"
        return out
    data = w2_data or generator.w2_data(cfg.w2_records)
    oracle = w2_oracle or generator.w2_oracle(data)
    path = os.path.join(root, "bytewax-w2-in.csv")
    write_input(data, path)
    for recovery, processes in [(False, n) for n in PROCESSES] + [(True, 1)]:
        print(f"  Bytewax W2 over {len(data.keys):,} records, recovery {'on' if recovery else 'off'}, "
              f"{processes} process{'es' if processes > 1 else ''}", flush=True)
        out["runs"].append(run_w2(python, root, path, oracle, len(data.keys), recovery, cfg.w2_timeout_s,
                                  processes))
    out["version"] = next((r["bytewax_version"] for r in out["runs"] if r.get("bytewax_version")), None)
    return out
