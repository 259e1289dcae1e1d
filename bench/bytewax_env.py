"""The Bytewax virtualenv and how a job of bench/bytewax runs in it, metered.

Bytewax is a peer, not a dependency: it gets a virtualenv of its own, ``.venv-bytewax`` at the
repository root, made on first use from ``bench/bytewax/requirements.txt`` (pinned; a few
seconds, about 30 MB; then reused while the file is unchanged), as the Flink peer's is
(bench/flink_env.py). A job script runs there in a session of its own, measured with
bench/cpu.py (the whole run, and from the job's ``RUNNING`` line to its result) and stopped
with its session.
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
from typing import Any

from bench.cpu import CpuFigures, CpuMeter
from bench.flink_env import stop_session
from runtime.errors import MillstreamError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, ".venv-bytewax")
REQUIREMENTS = os.path.join(ROOT, "bench", "bytewax", "requirements.txt")


class BytewaxUnavailableError(MillstreamError):
    """The Bytewax virtualenv could not be made (reported in the bench output, not raised out)."""


def _wanted(requirements: str) -> str:
    with open(requirements, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def venv_ready(venv: str = VENV, requirements: str = REQUIREMENTS) -> bool:
    """Is the Bytewax virtualenv made, from these requirements (nothing to install)?"""
    stamp = os.path.join(venv, ".installed")
    if not os.path.exists(stamp):
        return False
    with open(stamp) as f:
        return f.read().strip() == _wanted(requirements)


def ensure_venv(venv: str = VENV, requirements: str = REQUIREMENTS) -> str:
    """The Bytewax virtualenv's python, made (or remade after a change of the requirements)."""
    want = _wanted(requirements)
    stamp = os.path.join(venv, ".installed")
    python = os.path.join(venv, "bin", "python")
    if venv_ready(venv, requirements):
        return python
    print(f"  making the Bytewax virtualenv ({os.path.basename(venv)}, once)", flush=True)
    shutil.rmtree(venv, ignore_errors=True)
    base = getattr(sys, "_base_executable", sys.executable)
    for argv in ([base, "-m", "venv", venv],
                 [python, "-m", "pip", "install", "--quiet", "--prefer-binary", "-r", requirements]):
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise BytewaxUnavailableError(f"{' '.join(argv[:4])} failed: {e}") from e
        if proc.returncode != 0:
            err = proc.stderr.strip().splitlines()
            raise BytewaxUnavailableError(f"{' '.join(argv[:4])} failed: {' | '.join(err[-3:])[-500:]}")
    with open(stamp, "w") as f:
        f.write(want + "\n")
    return python


@dataclasses.dataclass
class Job:
    """How a job run went: its result line, the CPU of the whole run (interpreter start and
    input loading included) and from its ``RUNNING`` to its result."""

    cpu: CpuFigures
    running: CpuFigures | None = None
    result: dict[str, Any] = dataclasses.field(default_factory=dict)
    error: str | None = None


def run_job(python: str, argv: list[str], log_path: str, timeout_s: float) -> Job:
    """Run a job script of bench/bytewax in a session of its own, metered. The script prints
    ``RUNNING`` once its dataflow starts, then one JSON line."""
    running = CpuMeter()
    result: dict[str, Any] | None = None
    with CpuMeter() as meter, open(log_path, "w+") as err:
        proc = subprocess.Popen([python, *argv], stdout=subprocess.PIPE, stderr=err, text=True,
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
                    result = json.loads(line)
            proc.wait()
        finally:
            killer.cancel()
            stop_session(proc.pid)
        err.seek(0)
        stderr = err.read()
    assert meter.figures is not None
    if proc.returncode != 0 or result is None:
        why = (f"was killed after {timeout_s:g} s" if proc.returncode == -signal.SIGKILL
               else f"failed (exit {proc.returncode})" if proc.returncode else "never reported its result")
        return Job(meter.figures, error=f"the Bytewax job {why}: {stderr.strip()[-600:]}")
    return Job(meter.figures, running.figures, result)
