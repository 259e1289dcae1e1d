"""``millstream bench --against COMMIT``: both sides run, the report pairs them.

Performance is measured, never asserted here: these check the shape of the A/B, not its figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import types

import pytest

from bench import ab, ab_figures
from bench.cli import ROOT, run_bench

BASELINE = "3a1b1da"  # the commit `make bench` compares against; before columns (issue 29)


def _ab_args(out: str, against: str | None, **extra: object) -> argparse.Namespace:
    return argparse.Namespace(**{"peer": None, "quick": True, "only": "ab", "against": against, "ab_rounds": 1,
                                 "ab_figures": "recordpath", "out": out} | extra)


def _report(out: str) -> tuple[dict[str, object], str]:
    with open(os.path.join(out, "latest.json")) as f:
        report = json.load(f)
    with open(os.path.join(out, "latest.md")) as f:
        return report, f.read()


@pytest.mark.timeout(180)
def test_recordpath_ab_runs_both_sides_and_reports_a_ratio(tmp_path: object) -> None:
    """The baseline runs its own runtime through the copied driver (rows, not columns)."""
    if ab.resolve(ROOT, BASELINE) is None:
        pytest.skip(f"this checkout has no {BASELINE} (a shallow clone)")
    out = os.path.join(str(tmp_path), "results")
    assert run_bench(_ab_args(out, BASELINE)) == 0
    report, md = _report(out)
    got = report["ab"]
    assert isinstance(got, dict) and got["commit"].startswith(BASELINE)
    [fig] = got["figures"]
    assert [(r["side"], r["round"]) for r in fig["runs"]] == [("baseline", 1), ("current", 1)]
    for r in fig["runs"]:
        assert "error" not in r, r
        assert len(r["loadavg"]) == 3
        assert r["foreign"] == []
    assert fig["runs"][0]["runtime"] != fig["runs"][1]["runtime"]
    for m in fig["metrics"]:
        assert m["baseline_median"] > 0 and m["current_median"] > 0 and m["ratio"] > 0
    assert f"## A/B against {BASELINE}" in md and "current better by" in md


def test_a_missing_commit_skips_the_ab_in_one_line(tmp_path: object) -> None:
    out = os.path.join(str(tmp_path), "results")
    assert run_bench(_ab_args(out, "0" * 40)) == 0
    report, md = _report(out)
    assert report["ab"]["skipped"].startswith("A/B skipped: this checkout has no commit 0000")  # type: ignore[index]
    assert "A/B skipped" in md


def test_only_ab_needs_a_commit(tmp_path: object) -> None:
    from runtime.errors import ConfigError

    with pytest.raises(ConfigError, match="add --against COMMIT"):
        run_bench(_ab_args(str(tmp_path), None))
    with pytest.raises(ConfigError, match="--ab-figures w9: unknown figure"):
        run_bench(_ab_args(str(tmp_path), "HEAD", ab_figures="w9"))


def _run(side: str, value: float, exact: bool | None = True) -> dict[str, object]:
    return {"side": side, "round": 1, "loadavg": [1.0, 1.0, 1.0], "values": {"records_per_s": value,
            "p50_ms": value}, "exact": exact}


def test_ratios_say_better_as_more_than_one_and_skip_inexact_runs() -> None:
    runs = [_run("baseline", 10), _run("current", 40), _run("baseline", 30), _run("current", 20),
            _run("current", 1e9, exact=False)]
    [rate] = ab.summarise("w2", runs)  # higher is better: current / baseline
    assert (rate["baseline_median"], rate["current_median"], rate["ratio"]) == (20, 30, 1.5)
    assert [x["value"] for x in rate["current"]] == [40, 20]
    [cost] = ab.summarise("w1-3stages", runs)  # lower is better: baseline / current
    assert (cost["ratio"], cost["ratio_is"]) == (0.67, "baseline / current")


def test_the_driver_drops_editable_finders_and_names_foreign_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    finder = type("_EditableFinder", (), {"__module__": "__editable___millstream_0_1_0_finder"})
    monkeypatch.setattr(sys, "meta_path", [*sys.meta_path, finder])
    ab_figures._isolate()
    assert finder not in sys.meta_path
    stray = types.ModuleType("runtime.stray_for_test")
    stray.__file__ = "/elsewhere/runtime/stray_for_test.py"
    monkeypatch.setitem(sys.modules, "runtime.stray_for_test", stray)
    assert ab_figures._foreign(ROOT) == ["runtime.stray_for_test"]


def test_a_run_past_its_time_is_an_error_not_a_hang() -> None:
    assert ab.run_once(ROOT, "recordpath", True, timeout_s=0.05) == {"error": "no result within 0.05 s"}


@pytest.mark.timeout(180)
def test_a_flow_figure_against_a_tree_without_flows_says_so_and_runs_this_side(tmp_path: object) -> None:
    if ab.resolve(ROOT, BASELINE) is None:
        pytest.skip(f"this checkout has no {BASELINE} (a shallow clone)")
    out = os.path.join(str(tmp_path), "results")
    assert run_bench(_ab_args(out, BASELINE, ab_figures="recordpath-flow3")) == 0
    report, _ = _report(out)
    [fig] = report["ab"]["figures"]  # type: ignore[index]
    baseline, current = fig["runs"]
    assert baseline["error"] == "this tree has no runtime.flows" and baseline["values"] == {}
    assert "error" not in current and current["values"]["cpu_us_per_record"] > 0
    assert current["values"]["calls_per_record"] > 0
