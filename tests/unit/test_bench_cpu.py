"""bench/cpu.py counts the CPU of the benchmark's process tree, a detached session included."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from bench.cpu import CpuMeter, cpu_ticks

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\n"


def test_a_child_and_a_process_in_a_session_it_started_both_count() -> None:
    # A child in a session of its own starts a grandchild and exits first: the grandchild is
    # re-parented to init, as a JVM is when its Python launcher exits before it.
    launcher = ("import subprocess, sys, time\n"
                f"subprocess.Popen([sys.executable, '-c', {BURN!r}])\n"
                "time.sleep(0.2)\n")
    with CpuMeter(interval_s=0.05) as meter:
        subprocess.run([sys.executable, "-c", BURN], check=True)
        p = subprocess.Popen([sys.executable, "-c", launcher], start_new_session=True)
        p.wait()
        subprocess.run([sys.executable, "-c", "import time; time.sleep(0.8)"], check=True)
    figures = meter.figures
    assert figures is not None
    assert figures.ours_s >= 0.6, figures  # two burns of 0.4 s, sampled
    assert figures.machine_s >= figures.ours_s * 0.9



def test_a_workers_cpu_is_told_apart_from_the_rest(tmp_path: Path) -> None:
    # A process started as the cluster starts a worker (python -m cli worker ...) counts as
    # "worker", whatever its cli module does (here: it burns CPU); any other as "other".
    (tmp_path / "cli").mkdir()
    (tmp_path / "cli" / "__main__.py").write_text(BURN)
    with CpuMeter(interval_s=0.05) as meter:
        # -S and PYTHONPATH: no site, so the project's own cli (installed editable) does not shadow this one.
        subprocess.run([sys.executable, "-S", "-m", "cli", "worker", "--listen", "x"], check=True, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(tmp_path)})
        subprocess.run([sys.executable, "-c", BURN], check=True)
    figures = meter.figures
    assert figures is not None
    assert figures.by_role["worker"] >= 0.2 and figures.by_role["other"] >= 0.2, figures.by_role
    assert abs(sum(figures.by_role.values()) - figures.ours_s) < 1e-6


def test_a_worker_a_launcher_execs_counts_as_a_worker(tmp_path: Path) -> None:
    # The cluster starts its daemons through runtime/die_with_parent.py, which execs them: the
    # meter first sees the launcher's command line (here for 0.3 s), then the worker's.
    (tmp_path / "cli").mkdir()
    (tmp_path / "cli" / "__main__.py").write_text(BURN)
    launcher = ("import os, sys, time\n"
                "time.sleep(0.3)\n"  # the launcher's own work before it execs
                "os.execv(sys.executable, [sys.executable, '-S', '-m', 'cli', 'worker', '--listen', 'x'])\n")
    with CpuMeter(interval_s=0.05) as meter:
        subprocess.run([sys.executable, "-S", "-c", launcher], check=True, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(tmp_path)})
    figures = meter.figures
    assert figures is not None
    assert figures.by_role.get("worker", 0.0) >= 0.2, figures.by_role


def test_time_the_hypervisor_stole_is_told_apart_from_the_machines_work() -> None:
    # /proc/stat's cpu line: user nice system idle iowait irq softirq steal guest guest_nice
    assert cpu_ticks("cpu  1000 5 200 9000 30 0 10 80 0 0\n") == (1215, 80)


def test_the_meters_own_sampling_is_not_counted_as_the_benchmarks() -> None:
    # Sampling every millisecond, the meter's thread is the only CPU this process spends over
    # the window (a fixed measurement window, not a wait for a condition).
    with CpuMeter(interval_s=0.001) as meter:
        threading.Event().wait(0.5)
    figures = meter.figures
    assert figures is not None
    assert figures.meter_s > 0.02, figures
    assert figures.by_role.get("bench", 0.0) < figures.meter_s / 2, figures
