"""``millstream bench --against COMMIT``: the headline figures of this checkout against an
older commit's, measured alternately on the same machine.

The older commit is exported with ``git archive`` into a temporary directory; the figure
driver (``bench/ab_figures.py``) and the drivers it copies from this checkout
(:data:`DRIVERS`, written to work against both shapes of the record path's API) are copied
in, as ``bench/ab_commits.sh`` does for W1. Each run is its own process,
``python -m bench.ab_figures FIGURE`` with ``PYTHONPATH`` set to one tree only, so the
baseline runs its own runtime (the run lists the project modules it imported from outside
its tree, and a run with any is discarded). For each figure, each round runs the baseline and then
this checkout; the load average is recorded before every run. Per metric the report gives
every run's value and load, the medians and the ratio of the medians, oriented so that
> 1 always means this checkout is better: baseline / current for costs (µs, calls, ms),
current / baseline for rates.

A checkout without the commit (a shallow clone) skips the A/B with one line in the report;
a run that fails is recorded with its error and the others go on.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from bench.ab_figures import DEFAULT_FIGURES, FIGURES

DRIVERS = ("bench/ab_figures.py", "bench/profile.py", "bench/overhead.py", "bench/cpu.py", "bench/linecount.py")
ROUNDS = 3
SIDES = ("baseline", "current")


@dataclass(frozen=True)
class Metric:
    """One number a figure yields, and which way is better."""

    name: str
    label: str
    better: Literal["lower", "higher"]


TITLES = {
    "recordpath": "in-process record path, batches of 1,000 (bench.overhead recordpath 1000)",
    "w1-1stage": "W1, one exactly-once stage, 10,000 rec/s, replication 2 (eo-strong-fsync)",
    "w1-3stages": "W1, three stages, 10,000 rec/s, replication 2 (eo-3-stages)",
    "w1-user-1stage": ("W1, one exactly-once stage as a user writes it, 10,000 rec/s, replication 2: on a flow "
                       "(its sink fused into the stage) where the tree has flows, else eo-strong-fsync"),
    "w1-user-3stages": ("W1, three stages as a user writes them, 10,000 rec/s, replication 2: a flow of three "
                        "fused steps where the tree has flows, else eo-3-stages"),
    "w2": "W2 throughput, every window exact",
    "nexmark-q0": "Nexmark q0",
    "recordpath-flow3": "in-process record path, W1's stage as a flow of three fused process steps, batches of 1,000",
    "w1-flow-1stage": "W1 on a flow, one process step, 10,000 rec/s, replication 2 (flow-1-stage)",
    "w1-flow-3stages": "W1 on a flow, three fused process steps, 10,000 rec/s, replication 2 (flow-3-stages)",
    "w2-flow": "W2 on a flow (bench.jobs.w2_flow, one injector's send() loop), every window exact",
    "nexmark-q0-flow": "Nexmark q0 on a flow (bench/nexmark/flows.py, as `millstream bench --nexmark` runs it)",
    "w2-user": ("W2 as a user writes it (one Injector, send() per record, a watermark every 4,000): "
                "on a flow where the tree has flows, else its classic computations; every window exact"),
    "nexmark-q0-user": "Nexmark q0 as `millstream bench --nexmark` runs it: on a flow where the tree has flows",
    "replica-writes": "a replicated commit's 870 writes (W2's window step's shape), in process (bench.overhead writes)",
}
METRICS: dict[str, tuple[Metric, ...]] = {
    "recordpath": (Metric("cpu_us_per_record", "CPU µs per record", "lower"),
                   Metric("calls_per_record", "calls per record", "lower")),
    "w1-1stage": (Metric("p50_ms", "p50 ms", "lower"), Metric("p99_ms", "p99 ms", "lower")),
    "w1-3stages": (Metric("p50_ms", "p50 ms", "lower"),),
    "w1-user-1stage": (Metric("p50_ms", "p50 ms", "lower"), Metric("p99_ms", "p99 ms", "lower")),
    "w1-user-3stages": (Metric("p50_ms", "p50 ms", "lower"), Metric("p99_ms", "p99 ms", "lower")),
    "w2": (Metric("records_per_s", "rec/s", "higher"),),
    "nexmark-q0": (Metric("events_per_cpu_s", "events per CPU-second", "higher"),),
    "recordpath-flow3": (Metric("cpu_us_per_record", "CPU µs per record", "lower"),
                         Metric("calls_per_record", "calls per record", "lower")),
    "w1-flow-1stage": (Metric("p50_ms", "p50 ms", "lower"), Metric("p99_ms", "p99 ms", "lower")),
    "w1-flow-3stages": (Metric("p50_ms", "p50 ms", "lower"), Metric("p99_ms", "p99 ms", "lower")),
    "w2-flow": (Metric("records_per_s", "rec/s", "higher"),),
    "nexmark-q0-flow": (Metric("events_per_cpu_s", "events per CPU-second", "higher"),),
    "w2-user": (Metric("records_per_s", "rec/s", "higher"),),
    "nexmark-q0-user": (Metric("events_per_cpu_s", "events per CPU-second", "higher"),),
    "replica-writes": (Metric("encode_cpu_us_per_write", "primary's encode, CPU µs per write", "lower"),
                       Metric("apply_cpu_us_per_write", "follower's decode and WriteBatch, CPU µs per write", "lower")),
}
assert set(METRICS) == set(TITLES) == set(FIGURES)

Progress = Callable[[str], None]


def resolve(repo: str, commit: str) -> str | None:
    """The full hash of ``commit`` if this checkout has it (a shallow clone may not)."""
    r = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"], cwd=repo,
                       capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 and r.stdout.strip() else None


def export(repo: str, sha: str, dest: str) -> None:
    """``git archive`` of ``sha`` into ``dest``, with this checkout's :data:`DRIVERS` in it."""
    tar = subprocess.run(["git", "archive", "--format=tar", sha], cwd=repo, capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(tar.stdout)) as t:
        t.extractall(dest, filter="data")
    for path in DRIVERS:
        shutil.copyfile(os.path.join(repo, path), os.path.join(dest, path))
    if os.path.exists(os.path.join(dest, "runtime", "_kernels.c")):
        # Its compiled kernels, as installing it builds them; where they cannot be built, it
        # runs their pure-Python reference, as such an install would (runtime/kernels.py).
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=dest,
                       capture_output=True, check=False)


def run_once(tree: str, figure: str, quick: bool, timeout_s: float) -> dict[str, Any]:
    """One run of ``figure`` in ``tree``, in a process session of its own (so a timeout or an
    interrupt takes its cluster down with it): the figure driver's result, or ``error``."""
    env = dict(os.environ, PYTHONPATH=tree)
    cmd = [sys.executable, "-m", "bench.ab_figures", figure, *(["--quick"] if quick else [])]
    p = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {timeout_s:g} s"}
    finally:  # whatever of the session is left: the driver on a timeout, a process it left behind
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.communicate()
    lines = out.strip().splitlines()
    try:
        result: dict[str, Any] = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = " | ".join(err.strip().splitlines()[-3:])
        return {"error": f"exit status {p.returncode}, no result: {tail}"}
    if result.get("foreign"):
        return {"error": f"imported {', '.join(result['foreign'][:5])} from outside {tree}"}
    return result


def _ratio(baseline: float | None, current: float | None, better: str) -> float | None:
    if not baseline or not current:
        return None
    return round(baseline / current if better == "lower" else current / baseline, 2)


def summarise(figure: str, runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per metric of ``figure``: each side's values with the load before each run (runs whose
    output was not exact left out), the medians, and the ratio of the medians (> 1: the
    current checkout is better)."""
    rows = []
    for m in METRICS[figure]:
        row: dict[str, Any] = {"metric": m.name, "label": m.label, "better": m.better,
                               "ratio_is": "baseline / current" if m.better == "lower" else "current / baseline"}
        for side in SIDES:
            got = [(r["values"][m.name], r["loadavg"][0]) for r in runs  # an inexact run's figure is none
                   if r["side"] == side and r.get("exact") is not False and m.name in r.get("values", {})]
            row[side] = [{"value": v, "load": load} for v, load in got]
            # (the mean of the middle two for an even count: rounded, as the runs' figures are)
            row[f"{side}_median"] = round(statistics.median(v for v, _ in got), 3) if got else None
        row["ratio"] = _ratio(row["baseline_median"], row["current_median"], m.better)
        rows.append(row)
    return rows


def run(repo: str, against: str, *, rounds: int = ROUNDS, quick: bool = False,
        figures: Sequence[str] = DEFAULT_FIGURES, progress: Progress = print) -> dict[str, Any]:
    """The A/B of ``figures`` between ``repo`` as it is and ``against``; never raises for a
    missing commit or a failed run (the report says so)."""
    out: dict[str, Any] = {"against": against, "rounds": rounds, "quick": quick, "figures": []}
    sha = resolve(repo, against)
    if sha is None:
        out["skipped"] = (f"A/B skipped: this checkout has no commit {against} (a shallow clone? "
                          "`git fetch --unshallow` brings it)")
        progress(out["skipped"])
        return out
    out["commit"] = sha
    timeout_s = 900.0 if quick else 3600.0
    with tempfile.TemporaryDirectory(prefix="millstream-ab-") as baseline:
        export(repo, sha, baseline)
        trees = {"baseline": baseline, "current": repo}
        for figure in figures:
            runs: list[dict[str, Any]] = []
            for n in range(1, rounds + 1):
                for side in SIDES:
                    load = os.getloadavg()
                    progress(f"A/B {figure}, round {n}/{rounds}: {side} (load {load[0]:.2f})")
                    result = run_once(trees[side], figure, quick, timeout_s)
                    runs.append({"side": side, "round": n, "loadavg": [round(x, 2) for x in load]} | result)
                    progress(f"  {result.get('values') or result.get('error')}")
            out["figures"].append({"figure": figure, "title": TITLES[figure], "runs": runs,
                                   "metrics": summarise(figure, runs)})
    return out


def current_exact(ab: dict[str, Any]) -> bool:
    """Whether every run of the current checkout produced exact output and a result."""
    return all("error" not in r and r.get("exact") is not False
               for f in ab.get("figures", []) for r in f["runs"] if r["side"] == "current")
