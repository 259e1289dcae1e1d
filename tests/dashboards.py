"""What the shipped dashboards and alert rules name (deploy/grafana, deploy/prometheus): shared by
the unit test of their shape and the end-to-end test against real /metrics pages."""

from __future__ import annotations

import json
import os
import re

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "millstream.json")
RULES = os.path.join(ROOT, "deploy", "prometheus", "millstream-alerts.yml")
METRIC = re.compile(r"\bmillstream_[a-z0-9_]+\b")


def dashboard_exprs() -> list[str]:
    with open(DASHBOARD) as f:
        doc = json.load(f)
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in doc["templating"]["list"] if "definition" in v]
    return exprs


def rules() -> list[dict[str, object]]:
    with open(RULES) as f:
        return [r for g in yaml.safe_load(f)["groups"] for r in g["rules"]]


def named_metrics() -> set[str]:
    """Every metric name the dashboard and the rules use (as exposed: ``_total``, ``_bucket``...)."""
    return {m for e in dashboard_exprs() + [str(r["expr"]) for r in rules()] for m in METRIC.findall(e)}
