"""The Flink peer: W2 and Nexmark on PyFlink (Flink SQL, local MiniCluster, parallelism 2,
exactly-once checkpoints every second), on the same records as millstream and Spark, for the
ratios (Nexmark: bench/nexmark/on_flink.py).

The jobs run in a virtualenv of their own (bench/flink_env.py: PyFlink pins protobuf and
grpcio versions this project cannot use), each in a session of its own, metered.

W2's records are written as two CSV files (Flink's filesystem source reads one split per
file: one per source task). The spike stage runs afterwards on the committed windows, in
key and window order, as the Spark peer's runs in ``foreachBatch`` on the driver; it is not
timed. Throughput is reported both ways: records over Flink's own net runtime of the job
(from RUNNING to FINISHED: the figure most favourable to Flink, used for the ratio) and
over the job's wall time from submission (SQL planning and MiniCluster start included).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import subprocess
from typing import TYPE_CHECKING, Any

from bench import generator
from bench.flink_env import ROOT, FlinkUnavailableError, ensure_venv, run_job

if TYPE_CHECKING:
    from bench.workloads import BenchConfig

log = logging.getLogger(__name__)
JOB = os.path.join(ROOT, "bench", "flink", "w2_job.py")


def _write_csv(data: generator.W2Data, directory: str, files: int = 2) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    per = -(-len(data.keys) // files)
    for n in range(files):
        lo = n * per
        with open(os.path.join(directory, f"part-{n}.csv"), "w") as f:
            f.writelines(f"{k.decode()},{t}\n" for k, t in zip(data.keys[lo:lo + per],
                                                              data.timestamps[lo:lo + per], strict=True))


def _read_windows(directory: str) -> dict[tuple[bytes, int], int]:
    """Committed output rows (Flink hides files still in progress as ``.part-*``)."""
    out: dict[tuple[bytes, int], int] = {}
    for d, _, names in os.walk(directory):
        for name in names:
            if name.startswith((".", "_")):
                continue
            with open(os.path.join(d, name)) as f:
                for line in f:
                    if line.strip():
                        k, first, n = line.strip().rsplit(",", 2)
                        out[(k.encode(), generator.window_of(int(first)))] = int(n)
    return out


def _spikes(windows: dict[tuple[bytes, int], int]) -> set[tuple[bytes, int]]:
    spikes: set[tuple[bytes, int]] = set()
    ewma: dict[bytes, float | None] = {}
    for (k, w), c in sorted(windows.items()):
        spike, ewma[k] = generator.spike_step(ewma.get(k), c)
        if spike:
            spikes.add((k, w))
    return spikes


def run_w2(python: str, root: str, data: generator.W2Data, oracle: generator.W2Oracle,
           timeout_s: float) -> dict[str, Any]:
    src, out, ckpt = (os.path.join(root, f"flink-w2-{d}") for d in ("in", "out", "ckpt"))
    _write_csv(data, src)
    for d in (out, ckpt):
        shutil.rmtree(d, ignore_errors=True)
    job = run_job(python, [JOB, src, out, ckpt], root, "w2", timeout_s)
    if job.error is not None:
        return {"error": job.error, "cpu": job.cpu.as_dict()}
    timing, running = job.timing, job.running
    assert running is not None
    windows = _read_windows(out)
    spikes = _spikes(windows)
    n = len(data.keys)
    return {
        "records": n, "flink_version": timing["flink_version"], "parallelism": 2,
        "checkpointing": "exactly-once every 1 s",
        "windows_observed": len(windows), "windows_expected": len(oracle.windows),
        "spikes_observed": len(spikes), "spikes_expected": len(oracle.spikes),
        "oracle_equal": windows == oracle.windows and spikes == oracle.spikes,
        "jvm_start_s": timing["jvm_start_s"], "job_s": timing["job_s"], "net_runtime_s": timing["net_runtime_s"],
        "throughput_rps": round(n / timing["net_runtime_s"]),
        "throughput_job_rps": round(n / timing["job_s"]),
        "cpu": job.cpu.as_dict(), "cpu_running": running.as_dict(),
        "records_per_cpu_s": round(n / max(1e-9, job.cpu.ours_s)),
        "records_per_cpu_s_running": round(n / max(1e-9, running.ours_s)),
    }


def run(root: str, cfg: BenchConfig, report: dict[str, Any], w2_data: generator.W2Data | None,
        w2_oracle: generator.W2Oracle | None) -> dict[str, Any]:
    """W2 on Flink; compared with the millstream figures in ``report``."""
    out: dict[str, Any] = {"config": {"mode": "local MiniCluster, parallelism 2, Flink SQL, exactly-once "
                                               "checkpoints every 1 s, JVM -Xmx1g",
                                      "w2": "CSV files -> TUMBLE 1 s count, watermark 2 s -> CSV files; "
                                            "spike stage on the committed windows afterwards (untimed)"}}
    try:
        python = ensure_venv()
    except (FlinkUnavailableError, OSError, subprocess.TimeoutExpired) as e:
        out["error"] = f"cannot run Flink: {e}"
        return out
    if w2_data is not None and w2_oracle is not None:
        print(f"  Flink W2 over {len(w2_data.keys):,} records", flush=True)
        out["w2"] = run_w2(python, root, w2_data, w2_oracle, cfg.w2_timeout_s)
    nx = report.get("nexmark")
    if nx:  # the same events, queries and configuration as millstream's run
        from bench.nexmark import on_flink
        from bench.nexmark.generator import NexmarkConfig

        config = NexmarkConfig(**{f.name: nx["config"][f.name] for f in dataclasses.fields(NexmarkConfig)})
        out["nexmark"] = on_flink.run(python, root, config, nx["config"]["throughput_events"],
                                      [q["query"] for q in nx["queries"]], cfg.w2_timeout_s)
        out["nexmark_comparison"] = on_flink.compare(nx, out["nexmark"])
    out["comparison"] = compare(report, out)
    return out


def compare(report: dict[str, Any], flink: dict[str, Any]) -> list[dict[str, str]]:
    """Rows of (what, millstream, Flink, ratio); a ratio > 1 means millstream is better."""
    from bench.report import w2_as_user

    (mw2, how), fw2 = w2_as_user(report), flink.get("w2") or {}
    mv, fv = mw2.get("throughput_rps"), fw2.get("throughput_rps")
    mc, fc = mw2.get("records_per_cpu_s"), fw2.get("records_per_cpu_s")
    fr = fw2.get("records_per_cpu_s_running")
    exact = "" if fw2.get("oracle_equal") else " (not equal to oracle)"
    return [
        {"what": f"W2 throughput, {how} (rec/s over Flink's net runtime; higher is better)",
         "millstream": f"{mv:,}" if mv else "–", "peer": f"{fv:,}{exact}" if fv else "–",
         "ratio": f"{mv / fv:.2f}×" if mv and fv else "–"},
        {"what": f"W2 throughput, {how} (rec/s over the job's wall time from submission)",
         "millstream": f"{mv:,}" if mv else "–",
         "peer": f"{fw2['throughput_job_rps']:,}{exact}" if fw2.get("throughput_job_rps") else "–",
         "ratio": f"{mv / fw2['throughput_job_rps']:.2f}×" if mv and fw2.get("throughput_job_rps") else "–"},
        {"what": f"W2 records per CPU-second, {how} (whole process tree; Flink's JVM start and planning included)",
         "millstream": f"{mc:,}" if mc else "–", "peer": f"{fc:,}" if fc else "–",
         "ratio": f"{mc / fc:.2f}×" if mc and fc else "–"},
        {"what": f"W2 records per CPU-second, {how} (Flink metered from its job's RUNNING to its end)",
         "millstream": f"{mc:,}" if mc else "–", "peer": f"{fr:,}" if fr else "–",
         "ratio": f"{mc / fr:.2f}×" if mc and fr else "–"},
    ]
