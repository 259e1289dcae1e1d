"""The Flink virtualenv and how a job of bench/flink runs in it, metered.

PyFlink pins protobuf < 6 and grpcio < 1.66, which this project cannot use, so it gets a
virtualenv of its own, ``.venv-flink`` at the repository root, made on first use from
``bench/flink/requirements.txt`` (about a minute and 850 MB; then reused while the file is
unchanged). A job script runs there in a session of its own; the JVM it starts belongs to
that session, is measured with it (bench/cpu.py) and is stopped with it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from bench.cpu import CpuFigures, CpuMeter, session
from runtime.errors import MillstreamError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, ".venv-flink")
REQUIREMENTS = os.path.join(ROOT, "bench", "flink", "requirements.txt")


class FlinkUnavailableError(MillstreamError):
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
