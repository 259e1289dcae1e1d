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
# Issue 29's figures. W2 and q0 "as a user writes them" (issue 29's wording): each tree's
# own way, a flow where the tree has runtime.flows and its classic computations where not
# (3a1b1da), both fed by a user's loop (see _w2_user).
DEFAULT_FIGURES = ("recordpath", "w1-1stage", "w1-3stages", "w2-user", "nexmark-q0-user")
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
    from bench import workloads
    from bench.nexmark import run as nexmark

    # The same job on both sides: the classic q0 (a checkout's runner defaults to the flow
    # versions; an older tree's has only the classic ones and no such switch), or, for
    # ``flow``, each side's flow version as its bench runs it.
    switch = {"classic": True} if not flow and "classic" in inspect.signature(nexmark.run).parameters else {}
    q = nexmark.run(root, workloads.BenchConfig.make(quick), only=["q0"], **switch)["queries"][0]
    t = q.get("throughput") or {}
    if t.get("events_per_cpu_s") is None:
        return {}, False
    values = {"events_per_cpu_s": t["events_per_cpu_s"]}
    p50 = ((q.get("latency") or {}).get("ms") or {}).get("p50")
    if flow and p50 is not None:
        values["p50_ms"] = p50
    exact = all(((q.get(k) or {}).get("exactness") or {}).get("exact") for k in ("throughput", "latency"))
    return values, exact


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
