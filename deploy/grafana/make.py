"""Writes deploy/grafana/millstream.json, the Grafana dashboard of a millstream cluster.

    python deploy/grafana/make.py            # rewrite the dashboard
    python deploy/grafana/make.py --check    # exit 1 if the committed file differs

The dashboard is generated so that its panels stay few lines each here; tests/unit/
test_dashboards.py checks the committed JSON is what this script writes, and tests/e2e/
test_dashboards.py that every metric it names is on a real master's or worker's /metrics.

Queries assume Prometheus scrapes every master and worker (deploy/README.md, "Metrics"). A
master's watermark gauges are read only where ``millstream_master_is_leader`` is 1: a former
leader keeps the values it last set.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "millstream.json")

LEADER = "on(instance) group_left() (millstream_master_is_leader == 1)"
# A watermark at the start (no input yet) or the end of time (inputs finished) has no lag.
LIVE_WM = f'(millstream_low_watermark_us{{computation=~"$computation"}} > 0 < 9e18) * {LEADER}'


def p99(metric: str) -> str:
    return (f'histogram_quantile(0.99, sum by (computation, le) '
            f'(rate({metric}_bucket{{computation=~"$computation"}}[$__rate_interval])))')


def per_computation(metric: str) -> str:
    return f'sum by (computation) (rate({metric}_total{{computation=~"$computation"}}[$__rate_interval]))'


ROWS: list[tuple[str, list[tuple[str, str, list[tuple[str, str]]]]]] = [
    ("Throughput and time", [
        ("Records processed per second", "ops", [(per_computation("millstream_records_processed"), "{{computation}}")]),
        ("Watermark lag (wall clock minus low watermark)", "s",
         [(f"time() - max by (computation) ({LIVE_WM}) / 1e6", "{{computation}}")]),
        ("Low watermark (event time)", "dateTimeAsIso",
         [(f"max by (computation) ({LIVE_WM}) / 1e3", "{{computation}}")]),
        ("Late and dead-lettered records per second", "ops", [
            (per_computation("millstream_late_records"), "late {{computation}}"),
            (per_computation("millstream_dead_lettered"), "dead-lettered {{computation}}")]),
    ]),
    ("Latency", [
        ("Batch, user code to durable commit (p99)", "s", [(p99("millstream_batch_seconds"), "{{computation}}")]),
        ("One call of user code (p99)", "s", [(p99("millstream_user_code_seconds"), "{{computation}}")]),
        ("Commit (p99)", "s", [(p99("millstream_commit_seconds"), "{{computation}}")]),
        ("Replication to every in-sync follower (p99)", "s",
         [(p99("millstream_replication_seconds"), "{{computation}}")]),
        ("Garbage collector pauses of the older generations (p99): every thread waits", "s",
         [("histogram_quantile(0.99, sum by (instance, generation, le) "
           "(rate(millstream_gc_pause_seconds_bucket[$__rate_interval])))", "{{instance}} generation {{generation}}")]),
    ]),
    ("Backpressure and exactly-once", [
        ("BUSY refusals per second (backpressure)", "ops", [(per_computation("millstream_busy_refusals"), "{{computation}}")]),
        ("Duplicates dropped per second", "ops", [(per_computation("millstream_duplicates_dropped"), "{{computation}}")]),
        ("Slow calls of user code (over 1 s) per second", "ops",
         [(per_computation("millstream_slow_user_calls"), "{{computation}}")]),
        ("Stale-token refusals per second", "ops",
         [("sum by (action) (rate(millstream_stale_refusals_total[$__rate_interval]))", "{{action}}")]),
    ]),
    ("Cluster", [
        ("Live workers (leader)", "short", [(f"max(millstream_workers * {LEADER})", "workers")]),
        ("Tablets short of copies (leader)", "short", [
            (f"max(millstream_under_replicated_tablets * {LEADER})", "under-replicated"),
            (f"max(millstream_unavailable_tablets * {LEADER})", "unavailable")]),
        ("Leases lost and workers dropped", "short", [
            ("sum(increase(millstream_worker_lease_lost_total[$__rate_interval]))", "self-fenced workers"),
            ("sum(increase(millstream_worker_lease_expiries_total[$__rate_interval]))", "workers dropped by the leader"),
            ("sum(increase(millstream_worker_reregistrations_total[$__rate_interval]))", "re-registrations")]),
        ("Tablet moves per minute", "short",
         [("sum by (reason) (increase(millstream_tablet_moves_total[1m]))", "{{reason}}")]),
        ("etcd database size (leader)", "bytes", [(f"max(millstream_etcd_db_bytes * {LEADER})", "etcd")]),
        ("Masters leading", "short", [("sum(millstream_master_is_leader)", "leaders")]),
    ]),
]


def _panel(pid: int, title: str, unit: str, targets: list[tuple[str, str]], x: int, y: int) -> dict[str, Any]:
    return {
        "id": pid, "type": "timeseries", "title": title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": unit, "custom": {"lineWidth": 2, "fillOpacity": 0}},
                        "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                    "tooltip": {"mode": "multi", "sort": "desc"}},
        "targets": [{"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend,
                     "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                    for i, (expr, legend) in enumerate(targets)],
    }


def dashboard() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    y, pid = 0, 1
    for row, charts in ROWS:
        panels.append({"id": pid, "type": "row", "title": row, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        pid, y = pid + 1, y + 1
        for i, (title, unit, targets) in enumerate(charts):
            panels.append(_panel(pid, title, unit, targets, 12 * (i % 2), y + 8 * (i // 2)))
            pid += 1
        y += 8 * ((len(charts) + 1) // 2)
    return {
        "title": "millstream", "uid": "millstream", "tags": ["millstream"], "editable": True,
        "schemaVersion": 39, "version": 1, "timezone": "utc", "refresh": "10s",
        "time": {"from": "now-30m", "to": "now"},
        "description": "A millstream cluster: throughput, watermarks, latency, backpressure and the cluster's "
                       "health. Generated by deploy/grafana/make.py.",
        "templating": {"list": [
            {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
             "current": {}, "hide": 0},
            {"name": "computation", "label": "computation", "type": "query",
             "datasource": {"type": "prometheus", "uid": "${datasource}"},
             "query": {"query": "label_values(millstream_records_processed_total, computation)", "refId": "A"},
             "definition": "label_values(millstream_records_processed_total, computation)",
             "includeAll": True, "multi": True, "allValue": ".*", "refresh": 2, "sort": 1,
             "current": {"selected": True, "text": ["All"], "value": ["$__all"]}},
        ]},
        "annotations": {"list": []},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        with open(OUT) as f:
            same = f.read() == text
        print(f"{OUT}: {'up to date' if same else 'differs from what deploy/grafana/make.py writes'}")
        return 0 if same else 1
    with open(OUT, "w") as f:
        f.write(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
