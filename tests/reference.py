"""The pure-Python references of the compiled cores (worker/_loop.c, runtime/flows/_steps.c),
run in a process of their own: ``MILLSTREAM_PURE_PYTHON=1`` is read at import, so a test
comparing a compiled core with its reference gets the reference's traces from here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def reference_traces(test_module: str, core_module: str) -> list[list[str]]:
    """``[trace(seed) for seed in SEEDS]`` of ``test_module`` (e.g. ``tests.unit.test_step_core``)
    in a process on the pure-Python references; ``core_module`` (e.g. ``runtime.flows.steps``)
    must say there that it is not over its compiled core (``COMPILED``)."""
    code = (f"import importlib, json, sys; t = importlib.import_module({test_module!r}); "
            f"assert not importlib.import_module({core_module!r}).COMPILED; "
            "json.dump([t.trace(s) for s in t.SEEDS], sys.stdout)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "MILLSTREAM_PURE_PYTHON": "1", "PYTHONPATH": ROOT})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)  # type: ignore[no-any-return]
