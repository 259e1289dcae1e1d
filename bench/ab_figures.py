"""One run of one A/B figure in this checkout, printed as one JSON line::

    python -m bench.ab_figures recordpath [--quick]

``bench/ab.py`` runs it alternately in the checkout under test and in an older commit's
tree (exported with ``git archive``, with this file and the drivers it needs copied in),
each with its own ``PYTHONPATH``, so each side runs its own runtime. It therefore uses only
what every checkout back to 3a1b1da offers: ``bench.workloads.run_w1`` / ``run_w2``,
``bench.nexmark.run.run`` and the copied ``bench.profile`` (which switches on whether
``runtime.columns`` imports) and ``bench.overhead``.

The line holds ``values`` (metric name to number; a metric missing means the run did not
produce it), ``exact`` (whether the run's output was exact; ``null`` where nothing is
checked), ``runtime`` (the directory the runtime was imported from) and ``foreign`` (the
project's modules this process imported from outside its tree: ``bench/ab.py`` discards a
run that has any).

An editable install (``pip install -e .``) puts a finder on ``sys.meta_path`` that resolves
any module of the project's packages that ``PYTHONPATH``'s tree lacks from the installed
checkout: an old tree would import ``runtime.columns`` from the new one, and the copied
``bench.profile`` would drive the old runtime through the new API. This process removes
that finder before it imports the project. (The cluster's processes keep it; code of a
commit imports only modules that commit has, except for such switches in copied drivers.)
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import inspect
import json
import os
import pstats
import shutil
import sys
import tempfile
from typing import Any

PACKAGES = ("bench", "cli", "examples", "injectors", "master", "runtime", "spark_bridge", "worker")
# Issue 29's figures. W1, W2 and q0 "as a user writes them" (issue 29's table): each tree's
# own way, a flow where the tree has runtime.flows and its classic computations where not
# (3a1b1da), W2 and q0 fed by a user's loop (see _w2_user). W1's classic figures stay beside
# them: there the sink is its own hop (a flow fuses it into the stage, runtime/dataflow.py).
DEFAULT_FIGURES = ("recordpath", "w1-1stage", "w1-3stages", "w1-user-1stage", "w1-user-3stages", "w2-user",
                   "nexmark-q0-user")
# The classic computations on both sides (as the bench writes W2: two closed-loop injectors).
CLASSIC_FIGURES = ("w2", "nexmark-q0")
# On flows (issue 30): only against a commit that has runtime.flows (from c81c71b on), chosen
# with --ab-figures; a tree without flows yields no values and says so.
FLOW_FIGURES = ("recordpath-flow3", "w1-flow-1stage", "w1-flow-3stages", "w2-flow", "nexmark-q0-flow")
# A replicated commit's writes, encoded at the primary and applied at a follower (bench.overhead writes).
PART_FIGURES = ("replica-writes",)
FIGURES = DEFAULT_FIGURES + CLASSIC_FIGURES + FLOW_FIGURES + PART_FIGURES
USER_WATERMARK_EVERY = 4000  # records between a user loop's advance_watermark calls (bench/flows.py's)
RECORDPATH_BATCH = 1_000  # `python -m bench.overhead recordpath 1000`
W1_RATE = 10_000


def _recordpath(quick: bool, flow_steps: int = 0) -> tuple[dict[str, float], bool | None]:
    """CPU µs per record (as ``bench.overhead recordpath 1000``), then the interpreter-level
    calls per record of both threads under cProfile (as the performance study's callcount.py).
    With ``flow_steps``, W1's stage is a flow of that many fused ``process`` steps."""
    import uvloop

    from bench.overhead import record_path
    from bench.profile import _drive, flow_routing

    records = 2_000 if quick else 10_000
    cpu = record_path([RECORDPATH_BATCH], records, flow_steps)["cpu_us_per_record"][str(RECORDPATH_BATCH)]
    routing = flow_routing(flow_steps) if flow_steps else None
    with tempfile.TemporaryDirectory(prefix="millstream-ab-calls-") as tmp:
        prof, thread_prof = cProfile.Profile(), cProfile.Profile()
        uvloop.run(_drive(os.path.join(tmp, "t"), records, RECORDPATH_BATCH, prof, thread_prof, routing=routing))
    stats = pstats.Stats(prof)
    stats.add(thread_prof)
    calls = sum(v[1] for v in stats.stats.values())  # type: ignore[attr-defined]
    return {"cpu_us_per_record": cpu, "calls_per_record": round(calls / records, 1)}, None


def _w1(root: str, quick: bool, variant: str) -> tuple[dict[str, float], bool | None]:
    """W1 at 10,000 rec/s with the bench's sizes (replication 2)."""
    from bench import workloads

    cfg = workloads.BenchConfig.make(quick)
    v = next(x for x in workloads.W1_VARIANTS if x.name == variant)
    r = workloads.run_w1(root, cfg, v, W1_RATE)
    lat = r.get("latency_ms") or {}
    return {f"{p}_ms": lat[p] for p in ("p50", "p99") if lat.get(p) is not None}, bool(r["exactness"]["exact"])


def _w2(root: str, quick: bool, flow: bool = False) -> tuple[dict[str, float], bool | None]:
    from bench import workloads

    cfg = workloads.BenchConfig.make(quick)
    # (an older tree's run_w2 may have no flow switch: only flow figures pass it)
    r = workloads.run_w2(root, cfg, flow=True) if flow else workloads.run_w2(root, cfg)
    if not r.get("available") or not r.get("throughput_rps"):
        return {}, False
    return {"records_per_s": r["throughput_rps"]}, bool(r.get("oracle_equal"))


def _has_flows() -> bool:
    return importlib.util.find_spec("runtime.flows") is not None


def _w2_user(root: str, quick: bool) -> tuple[dict[str, float], bool | None]:
    """W2 as a user writes it: one ``Injector`` with its defaults, ``send()`` per record and
    ``advance_watermark`` every :data:`USER_WATERMARK_EVERY` records. On a tree with flows,
    its W2 on a flow (``run_w2(flow=True)`` sends exactly so); on an older one, its classic
    W2 computations fed by that same loop in place of the bench's two closed-loop injectors
    (``workloads._inject_fast``, which every tree back to 3a1b1da calls that way)."""
    if _has_flows():
        return _w2(root, quick, flow=True)
    from bench import workloads
    from injectors import Injector

    def as_user(masters: str, data: Any, threads: int) -> int:
        with Injector(masters, "events", "w2-user", timeout=300) as inj:
            for i, (key, ts) in enumerate(zip(data.keys, data.timestamps, strict=True)):
                inj.send(key, b"", ts)
                if i % USER_WATERMARK_EVERY == USER_WATERMARK_EVERY - 1:
                    inj.advance_watermark(data.watermark_after(i))
        return len(data.keys)

    workloads._inject_fast = as_user  # type: ignore[assignment]
    return _w2(root, quick)


def _nexmark_q0(root: str, quick: bool, flow: bool = False) -> tuple[dict[str, float], bool | None]:
    """q0's throughput phase as ``bench.nexmark.run`` measures it (200,000 events from one
    injector's loop; the CPU of the whole process tree), driven from here so that both sides
    of an A/B have the same harness: the CPU meter (bench/cpu.py, copied) spans the injection
    and the wait for the last output, which polls only the bytes appended since its last look;
    the outputs are read and checked after it. (Until 2026-11-29 each tree ran its own
    runner, whose wait re-read every output file 20 times a second and whose check parsed
    them all inside the meter: ~1 CPU-s of q0's ~4.6 was the benchmark's own work.)

    The job is the classic q0 on both sides (an older tree has only the classic queries), or,
    for ``flow``, each side's flow version."""
    from bench import workloads
    from bench.cpu import CpuMeter
    from bench.linecount import LineCounter
    from bench.nexmark import run as nexmark
    from bench.nexmark.generator import NexmarkConfig, records
    from runtime.client import Client
    from runtime.cluster import wait_until

    cfg = workloads.BenchConfig.make(quick)
    n, config, prefix = (20_000 if quick else 200_000), NexmarkConfig(), "t-"
    switch = {"classic": not flow} if "classic" in inspect.signature(nexmark._topology).parameters else {}
    with workloads.cluster(root, "nexmark-q0", cfg) as c, Client(c.masters_arg, timeout=30) as client:
        sink = os.path.join(c.data_dir, "nexmark-t")
        client.submit(nexmark._topology("q0", prefix, config, sink, cfg.key_ranges, **switch))
        nexmark._wait_open(client, prefix)
        events = list(records(config, 0, n))
        outputs = LineCounter(sink)
        with CpuMeter() as meter:
            nexmark._inject(c.masters_arg, prefix, config, events, None)
            wait_until(lambda: outputs() >= n, cfg.w2_timeout_s, f"q0's {n:,} outputs")  # one per event
        got = nexmark.read_outputs(sink)
        check = nexmark._check("q0", config, events, got, **switch)
    assert meter.figures is not None
    return {"events_per_cpu_s": round(n / max(1e-9, meter.figures.ours_s))}, bool(check["exact"])


def _isolate() -> None:
    """Drop setuptools' editable-install finders (see the module docstring)."""
    sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]


def _foreign(tree: str) -> list[str]:
    """The project's modules imported so far from outside ``tree``."""
    inside = os.path.realpath(tree) + os.sep
    files = {name: getattr(m, "__file__", None) for name, m in list(sys.modules.items())
             if name.split(".")[0] in PACKAGES}
    return sorted(name for name, file in files.items() if file and not os.path.realpath(file).startswith(inside))


def measure(figure: str, quick: bool) -> dict[str, Any]:
    """Run ``figure`` once in this process's checkout; see the module docstring for the result."""
    _isolate()
    import runtime

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # Workers and masters import this checkout's code: make it the first on their path.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    root = tempfile.mkdtemp(prefix="millstream-ab-run-")
    try:
        if figure in FLOW_FIGURES and not _has_flows():
            return {"figure": figure, "values": {}, "exact": None, "error": "this tree has no runtime.flows",
                    "runtime": os.path.dirname(os.path.abspath(runtime.__file__)), "foreign": _foreign(here)}
        if figure == "replica-writes":
            from bench.overhead import replica_writes

            w = replica_writes()
            values, exact = {k: w[k] for k in ("encode_cpu_us_per_write", "apply_cpu_us_per_write")}, None
        elif figure == "recordpath":
            values, exact = _recordpath(quick)
        elif figure == "recordpath-flow3":
            values, exact = _recordpath(quick, flow_steps=3)
        elif figure == "w1-flow-1stage":
            values, exact = _w1(root, quick, "flow-1-stage")
        elif figure == "w1-flow-3stages":
            values, exact = _w1(root, quick, "flow-3-stages")
        elif figure == "w1-1stage":
            values, exact = _w1(root, quick, "eo-strong-fsync")
        elif figure == "w1-3stages":
            values, exact = _w1(root, quick, "eo-3-stages")
        elif figure == "w1-user-1stage":
            values, exact = _w1(root, quick, "flow-1-stage" if _has_flows() else "eo-strong-fsync")
        elif figure == "w1-user-3stages":
            values, exact = _w1(root, quick, "flow-3-stages" if _has_flows() else "eo-3-stages")
        elif figure == "w2":
            values, exact = _w2(root, quick)
        elif figure == "w2-flow":
            values, exact = _w2(root, quick, flow=True)
        elif figure == "w2-user":
            values, exact = _w2_user(root, quick)
        elif figure == "nexmark-q0-user":  # as `millstream bench --nexmark` runs it in each tree
            values, exact = _nexmark_q0(root, quick, flow=_has_flows())
        elif figure == "nexmark-q0-flow":
            values, exact = _nexmark_q0(root, quick, flow=True)
        else:
            values, exact = _nexmark_q0(root, quick)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"figure": figure, "values": values, "exact": exact,
            "runtime": os.path.dirname(os.path.abspath(runtime.__file__)), "foreign": _foreign(here)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ab_figures")
    p.add_argument("figure", choices=FIGURES)
    p.add_argument("--quick", action="store_true", help="the sizes of `millstream bench --quick`")
    args = p.parse_args(argv)
    # The last line of the output (workloads print progress before it).
    print(json.dumps(measure(args.figure, args.quick)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
