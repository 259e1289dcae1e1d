"""Instructions per record of the in-process record path, counted by valgrind's callgrind:
a figure of the code that does not move with the machine's load, as CPU time does (on this
shared machine one side of an A/B spreads widely from one round to the next)::

    python -m bench.instructions                          # W1's stage (bench.jobs:ChainedCounter)
    python -m bench.instructions --code bench.overhead:Nothing   # a stage that does nothing
    python -m bench.instructions --tree /path/to/other/checkout  # another checkout's runtime
    python -m bench.instructions --workload w2-flow --records 30000  # W2 on a flow, per input record
    python -m bench.instructions --workload recordpath-flow3  # W1's stage as three fused process steps

It runs ``bench.profile``'s driver (``bench.overhead recordpath``'s: one exactly-once stage on
a real RocksDB, fsync per commit, fed serialized deliveries in batches of 1,000, its
productions serialized) under callgrind at N and 2N records, and the driver's making of its
requests alone at N and 2N. The difference of the first pair less that of the second, over N,
is what the record path itself executes per record: the interpreter's start, the imports, the
tablet's opening and the driver's own work cancel out. The deliveries after the first N hit
keys the first N made (W1's keys are Zipf-distributed over 10,000), so the figure is of a
warm stage. Instructions are not time (a RocksDB write's cost is mostly memory stalls), but
two commits' figures compare without noise. ``--workload recordpath-flow3`` runs the same
driver with W1's stage written as a flow of three fused ``process`` steps
(``bench.profile.flow_routing(3)``, as ``bench.overhead recordpath --flow-steps 3``). ``--workload w2-flow`` counts W2 on a flow the
same way: ``bench.w2_inprocess``'s window, spike step and fused sink at N and 2N records, less
the making of its input (the W2 data and its deliveries) at N and 2N. Needs ``valgrind`` on the PATH (a system
package, not a Python dependency); each run takes about a minute.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The driver is this checkout's bench/profile.py (written to run older runtimes too, as
# bench/ab.py copies it into them); the runtime is the tree's.
_CHILD = """
import asyncio, importlib.util, os, sys, tempfile
sys.path.insert(0, {tree!r})
spec = importlib.util.spec_from_file_location("bench_profile", {driver!r})
profile = importlib.util.module_from_spec(spec)
spec.loader.exec_module(profile)
n, code = {records}, {code!r}
if {requests_only}:
    profile.requests(n, 1000)
else:
    routing = profile.flow_routing({flow_steps}) if {flow_steps} else profile._routing()
    if code:
        routing.computations[0].code = code
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(profile._drive(os.path.join(tmp, "t"), n, 1000, None, routing=routing))
"""

# W2 on a flow (``--workload w2-flow``): this checkout's bench/w2_inprocess.py drives the
# tree's window, spike and sink stages in one process, its input made apart (``requests``).
_CHILD_W2 = """
import asyncio, importlib.util, os, sys, tempfile
sys.path.insert(0, {tree!r})
spec = importlib.util.spec_from_file_location("bench_w2", {driver!r})
w2 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(w2)
n = {records}
if {requests_only}:
    w2.requests(n, 1000)
else:
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(w2.drive(tmp, n, 1000, None, flow=True))
"""
WORKLOADS = ("recordpath", "recordpath-flow3", "w2-flow")


def _count(tree: str, records: int, code: str | None, requests_only: bool, workload: str = "recordpath") -> int:
    """Instructions the whole child process executed (callgrind's total)."""
    if workload == "w2-flow":
        child = _CHILD_W2.format(tree=tree, driver=os.path.join(ROOT, "bench", "w2_inprocess.py"), records=records,
                                 requests_only=requests_only)
    else:
        child = _CHILD.format(tree=tree, driver=os.path.join(ROOT, "bench", "profile.py"), records=records,
                              code=code, requests_only=requests_only,
                              flow_steps=3 if workload == "recordpath-flow3" else 0)
    run = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-c",
                          child], cwd=tree, capture_output=True, text=True, timeout=1800,
                         env={**os.environ, "PYTHONPATH": tree})
    found = re.search(r"Collected : (\d+)", run.stderr)
    if run.returncode != 0 or found is None:
        raise RuntimeError(f"callgrind run failed ({run.returncode}): {run.stderr[-2000:]}")
    return int(found.group(1))


def instructions(records: int = 10_000, code: str | None = None, tree: str = ROOT,
                 workload: str = "recordpath") -> dict[str, Any]:
    """Instructions per record of the record path (module doc), or of W2 on a flow in one
    process (``workload="w2-flow"``: window, spike step and fused sink, per input record), or of
    W1's stage as three fused ``process`` steps (``"recordpath-flow3"``), with the counts it
    comes from."""
    if shutil.which("valgrind") is None:
        raise SystemExit("bench.instructions needs valgrind on the PATH (e.g. apt-get install valgrind)")
    whole = [_count(tree, n, code, False, workload) for n in (records, 2 * records)]
    making = [_count(tree, n, code, True, workload) for n in (records, 2 * records)]
    per_record = ((whole[1] - whole[0]) - (making[1] - making[0])) / records
    return {"instructions_per_record": round(per_record), "workload": workload,
            "code": code or {"w2-flow": "bench.jobs:w2_flow", "recordpath-flow3": "bench.flows:w1_flow_topology(3)"}.get(
                workload, "bench.jobs:ChainedCounter"),
            "records": [records, 2 * records], "driver": whole, "requests_alone": making, "tree": tree,
            "loadavg": os.getloadavg()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.instructions", description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=10_000, help="N (the runs take N and 2N records)")
    p.add_argument("--code", default=None, help="the stage's computation, module:Class (default: W1's)")
    p.add_argument("--tree", default=ROOT, help="the checkout whose runtime to count (its .venv's build)")
    p.add_argument("--workload", choices=WORKLOADS, default="recordpath",
                   help="recordpath (default); recordpath-flow3: its stage as three fused process steps; or "
                        "w2-flow: W2 on a flow in one process (bench.w2_inprocess --flow)")
    args = p.parse_args(argv)
    if args.workload != "recordpath" and args.code:
        p.error(f"--code is for the record path's stage; {args.workload} runs a stage of its own")
    print(json.dumps(instructions(args.records, args.code, os.path.abspath(args.tree), args.workload)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
