"""Review N9: the Spark bridge registered every injection under the fixed incarnations
"spark-holder" and "spark-partition", so any holder of the injector token could replace an
injection's hold with a report at the end of time. Each run now has its own (no Spark needed)."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

bridge = importlib.import_module("spark_bridge.inject")  # the module (the package exports the function)


class _Registered:
    """Stands for Injector: records the incarnation each one registers under."""

    made: list[tuple[str, str]] = []

    def __init__(self, masters: Any, stream: str, name: str, **kw: Any) -> None:
        _Registered.made.append((name, kw["incarnation"]))

    def send_sequenced(self, *args: Any) -> None:
        pass

    def finish(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_n9_each_run_registers_under_an_incarnation_nobody_else_can_guess(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = {bridge.run_incarnation(None) for _ in range(3)}
    assert len(runs) == 3 and all(len(r) >= 32 for r in runs)
    assert bridge.run_incarnation("kept-by-the-team") == "kept-by-the-team"

    monkeypatch.setattr(bridge, "Injector", _Registered)
    _Registered.made = []
    run = bridge.run_incarnation(None)
    task = bridge.PartitionInjection(["m:1"], "in", "load", "load", False, 10, 1.0, run)
    for index in (0, 1, 0):  # partition 0 retried: its attempt replaces the failed one's hold
        list(task(index, [(b"k", b"v", 1)]))
    assert _Registered.made == [("load/p0", run), ("load/p1", run), ("load/p0", run)]
    assert "spark-partition" not in {i for _, i in _Registered.made}
