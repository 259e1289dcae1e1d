"""The shipped Grafana dashboard and Prometheus alert rules (issue 32): the committed dashboard is
what deploy/grafana/make.py writes, every panel queries something, every rule has what
Prometheus and Alertmanager need, and the alerts the issue asks for are there. (That every
metric they name exists is tests/e2e/test_dashboards.py, against real processes; promtool, where
installed, checks the PromQL and runs the rules' unit tests.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.dashboards import DASHBOARD, ROOT, RULES, dashboard_exprs, named_metrics, rules

PROMTOOL = shutil.which("promtool")


def test_the_committed_dashboard_is_what_the_script_writes() -> None:
    done = subprocess.run([sys.executable, os.path.join(ROOT, "deploy", "grafana", "make.py"), "--check"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr + " (run python deploy/grafana/make.py)"


def test_every_panel_queries_and_ids_are_unique() -> None:
    with open(DASHBOARD) as f:
        doc = json.load(f)
    panels = [p for p in doc["panels"] if p["type"] != "row"]
    assert len(panels) >= 12
    assert all(p["targets"] and all(t["expr"] for t in p["targets"]) for p in panels)
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    assert all(e.count("(") == e.count(")") for e in dashboard_exprs())


def test_the_rules_cover_lag_stuck_watermarks_replication_and_lease_losses() -> None:
    by_name = {str(r["alert"]): r for r in rules()}
    assert {"MillstreamWatermarkLagHigh", "MillstreamWatermarkStuck", "MillstreamTabletsUnderReplicated",
            "MillstreamTabletsUnavailable", "MillstreamWorkerLeaseLost"} <= set(by_name)
    for name, r in by_name.items():
        assert r["expr"] and r["labels"]["severity"] in ("info", "warning", "critical"), name  # type: ignore[index]
        assert r["annotations"]["summary"] and r["annotations"]["description"], name  # type: ignore[index]
    assert {"millstream_low_watermark_us", "millstream_under_replicated_tablets",
            "millstream_worker_lease_lost_total"} <= named_metrics()


@pytest.mark.skipif(PROMTOOL is None, reason="no promtool (Debian's prometheus package; .ci/run installs it)")
def test_promtool_accepts_the_rules_and_their_unit_tests_pass() -> None:
    assert PROMTOOL is not None
    done = subprocess.run([PROMTOOL, "check", "rules", RULES], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    tests = os.path.join(ROOT, "deploy", "prometheus", "millstream-alerts.test.yml")
    done = subprocess.run([PROMTOOL, "test", "rules", tests], capture_output=True, text=True, timeout=60,
                          cwd=os.path.dirname(tests))
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.skipif(PROMTOOL is None, reason="no promtool (Debian's prometheus package; .ci/run installs it)")
def test_promtool_parses_every_dashboard_query(tmp_path: object) -> None:
    # Grafana's variables as a dashboard would fill them in, each query as a recording rule.
    assert PROMTOOL is not None
    exprs = [e.replace("$__rate_interval", "1m").replace("$computation", ".*") for e in dashboard_exprs()
             if not e.startswith("label_values(")]
    path = os.path.join(str(tmp_path), "dashboard-rules.yml")
    with open(path, "w") as f:
        json.dump({"groups": [{"name": "dashboard", "rules": [
            {"record": f"millstream:dashboard_query_{i}", "expr": e} for i, e in enumerate(exprs)]}]}, f)
    done = subprocess.run([PROMTOOL, "check", "rules", path], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and f"SUCCESS: {len(exprs)} rules found" in done.stdout, done.stdout + done.stderr
