"""The Flink peer: W2 and Nexmark on PyFlink (Flink SQL, local MiniCluster, parallelism 2,
exactly-once checkpoints every second), on the same records as millstream and Spark, for the
ratios (Nexmark: bench/nexmark/on_flink.py).

PyFlink pins protobuf < 6 and grpcio < 1.66, which this project cannot use, so it gets a
virtualenv of its own, ``.venv-flink`` at the repository root, made on first use from
``bench/flink/requirements.txt`` (about a minute and 850 MB; then reused while the file is
unchanged). The job (bench/flink/w2_job.py) runs there in a session of its own; the JVM it
starts belongs to that session, is measured with it (bench/cpu.py) and is stopped with it.

W2's records are written as two CSV files (Flink's filesystem source reads one split per
file: one per source task). The spike stage runs afterwards on the committed windows, in
key and window order, as the Spark peer's runs in ``foreachBatch`` on the driver; it is not
timed. Throughput is reported both ways: records over Flink's own net runtime of the job
(from RUNNING to FINISHED: the figure most favourable to Flink, used for the ratio) and
over the job's wall time from submission (SQL planning and MiniCluster start included).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from bench import generator
from bench.cpu import CpuFigures, CpuMeter, session

if TYPE_CHECKING:
    from bench.workloads import BenchConfig

log = logging.getLogger(__name__)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, ".venv-flink")
REQUIREMENTS = os.path.join(ROOT, "bench", "flink", "requirements.txt")
JOB = os.path.join(ROOT, "bench", "flink", "w2_job.py")


class FlinkUnavailableError(Exception):
    """The Flink virtualenv could not be made, or Java is missing (reported, not raised out)."""


def ensure_venv() -> str:
    """The Flink virtualenv's python, made (or remade after a change of the requirements)."""
    with open(REQUIREMENTS, "rb") as f:
        want = hashlib.sha256(f.read()).hexdigest()
    stamp = os.path.join(VENV, ".installed")
    python = os.path.join(VENV, "bin", "python")
    if os.path.exists(stamp) and open(stamp).read().strip() == want:
        return python
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise FlinkUnavailableError("no java on PATH (Flink needs Java 11, 17 or 21)")
    print("  making the Flink virtualenv (.venv-flink, about a minute, once)", flush=True)
    shutil.rmtree(VENV, ignore_errors=True)
    base = getattr(sys, "_base_executable", sys.executable)
    for argv in ([base, "-m", "venv", VENV],
                 [python, "-m", "pip", "install", "--quiet", "--prefer-binary", "-r", REQUIREMENTS]):
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=1200)
        if proc.returncode != 0:
            raise FlinkUnavailableError(f"{' '.join(argv[:4])} failed: {proc.stderr.strip()[-500:]}")
    with open(stamp, "w") as f:
        f.write(want + "\n")
    return python


def stop_session(leader: int, grace_s: float = 15.0) -> None:
    """Wait for every process of ``leader``'s session (the JVM outlives its Python launcher
    by a moment), then SIGTERM and SIGKILL what is left."""
    deadline = time.monotonic() + grace_s
    for sig in (None, signal.SIGTERM, signal.SIGKILL):
        if sig is not None:
            try:
                os.killpg(leader, sig)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if not session(leader):
                return
            time.sleep(0.1)  # polling /proc for the session's end: a benchmark, not a test


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


@dataclasses.dataclass
class Job:
    """How a Flink job run went: its printed timings, the CPU of the whole process tree, and
    the CPU from the job's RUNNING to its end (JVM start and SQL planning left out)."""

    cpu: CpuFigures
    running: CpuFigures | None = None
    timing: dict[str, Any] = dataclasses.field(default_factory=dict)
    error: str | None = None


def run_job(python: str, argv: list[str], root: str, name: str, timeout_s: float) -> Job:
    """Run a job script of bench/flink in a session of its own, metered. The script prints
    ``RUNNING`` once its job runs, then one JSON line of timings."""
    env = dict(os.environ, FLINK_LOG_DIR=os.path.join(root, "flink-log"), JVM_ARGS="-Xmx1g")
    running = CpuMeter()
    lines: list[str] = []
    with CpuMeter() as meter, open(os.path.join(root, f"flink-{name}.stderr"), "w+") as err:
        proc = subprocess.Popen([python, *argv], stdout=subprocess.PIPE, stderr=err, text=True, env=env,
                                start_new_session=True)
        killer = threading.Timer(timeout_s, os.killpg, (proc.pid, signal.SIGKILL))
        killer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.strip() == "RUNNING":
                    running.__enter__()
                elif line.startswith("{") and running.started and running.figures is None:
                    running.__exit__()
                    lines.append(line)
            proc.wait()
        finally:
            killer.cancel()
            stop_session(proc.pid)
        err.seek(0)
        stderr = err.read()
    assert meter.figures is not None
    if proc.returncode != 0 or running.figures is None or not lines:
        why = f"failed (exit {proc.returncode})" if proc.returncode else "never reported RUNNING and its end"
        return Job(meter.figures, error=f"the Flink job {why}: {stderr.strip()[-800:]}")
    return Job(meter.figures, running.figures, json.loads(lines[-1]))


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
    mw2, fw2 = report.get("w2") or {}, flink.get("w2") or {}
    mv, fv = mw2.get("throughput_rps"), fw2.get("throughput_rps")
    mc, fc = mw2.get("records_per_cpu_s"), fw2.get("records_per_cpu_s")
    fr = fw2.get("records_per_cpu_s_running")
    exact = "" if fw2.get("oracle_equal") else " (not equal to oracle)"
    return [
        {"what": "W2 throughput (rec/s over Flink's net runtime; higher is better)",
         "millstream": f"{mv:,}" if mv else "–", "peer": f"{fv:,}{exact}" if fv else "–",
         "ratio": f"{mv / fv:.2f}×" if mv and fv else "–"},
        {"what": "W2 throughput (rec/s over the job's wall time from submission)",
         "millstream": f"{mv:,}" if mv else "–",
         "peer": f"{fw2['throughput_job_rps']:,}{exact}" if fw2.get("throughput_job_rps") else "–",
         "ratio": f"{mv / fw2['throughput_job_rps']:.2f}×" if mv and fw2.get("throughput_job_rps") else "–"},
        {"what": "W2 records per CPU-second (whole process tree; Flink's JVM start and planning included)",
         "millstream": f"{mc:,}" if mc else "–", "peer": f"{fc:,}" if fc else "–",
         "ratio": f"{mc / fc:.2f}×" if mc and fc else "–"},
        {"what": "W2 records per CPU-second (Flink metered from its job's RUNNING to its end)",
         "millstream": f"{mc:,}" if mc else "–", "peer": f"{fr:,}" if fr else "–",
         "ratio": f"{mc / fr:.2f}×" if mc and fr else "–"},
    ]
