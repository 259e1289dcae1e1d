"""One concept per module (issue 31): no module of the project over ~500 lines without a reason
stated here. A module listed below may grow to its limit (about 5 % over its size when it was
listed, so that growth is a decision); a module not listed fails at 500."""

from __future__ import annotations

import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGES = ("millstream", "cli", "runtime", "master", "worker", "injectors", "spark_bridge", "examples", "bench")
MAX_LINES = 500

# path -> (limit, why it is one room)
OVERSIZE: dict[str, tuple[int, str]] = {
    "worker/core.py": (710, "the hosted tablets' lifecycle (open, follow, close, forget split and merge parents, "
                            "drop copies) is one state machine over one map of tablets; the lease and the "
                            "checkpoint and state-reading bodies are the next to move out"),
    "worker/batch.py": (615, "one batch from dedup through user code to one commit, with the undo when user code "
                             "raises; what it produces on its way out is already worker/outgoing.py; raised from "
                             "680 for the TTL firing's bound by the timers its batch set; lowered when the record "
                             "loop moved to worker/recordloop.py"),
    "worker/tablet.py": (680, "one tablet's run loop and the hand-offs between its event loop and its thread; "
                              "batch, outgoing, replication, runner and timers are already rooms of their own"),
    "worker/storage.py": (547, "the RocksDB key layout and the commit that writes it are one contract: the layout "
                               "table at the top is what every reader of a tablet checks"),
    "injectors/injector.py": (601, "the public Injector class: its docstrings are the user's reference "
                                   "(routing is injectors/routes.py, delivery injectors/tablets.py, checks "
                                   "injectors/checks.py); raised from 560 for an interrupted flush and a fork, "
                                   "and from 585 for finish() refusing other threads' sends under the lock"),
}


def _sizes() -> dict[str, int]:
    sizes = {}
    for package in PACKAGES:
        for d, _, files in os.walk(os.path.join(ROOT, package)):
            for f in files:
                if f.endswith(".py") and not f.endswith(("_pb2.py", "_pb2_grpc.py", "_pb2.pyi")):
                    path = os.path.join(d, f)
                    with open(path) as fh:
                        sizes[os.path.relpath(path, ROOT)] = sum(1 for _ in fh)
    return sizes


def test_no_module_is_over_its_limit() -> None:
    over = {path: n for path, n in _sizes().items() if n > OVERSIZE.get(path, (MAX_LINES, ""))[0]}
    assert not over, (f"modules over {MAX_LINES} lines (or their stated limit): {over}; split the second "
                      f"concept out, or state why it is one room in OVERSIZE ({__file__})")


@pytest.mark.parametrize("path", sorted(OVERSIZE))
def test_a_stated_module_is_still_over_500(path: str) -> None:
    """A listed module that shrank below 500 leaves the list (it no longer needs a reason)."""
    assert _sizes()[path] > MAX_LINES, f"{path} is back under {MAX_LINES} lines: remove it from OVERSIZE"
