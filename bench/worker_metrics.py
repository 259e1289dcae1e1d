"""What the workers' ``/metrics`` say at the end of a benchmark run, read before the cluster
stops (the figures live in the worker processes).

- :func:`scrape` reads every live worker's page.
- :func:`batch_breakdown` turns the per-batch histograms into means per computation, summed
  over workers: how long a batch took from user code to acknowledgement, how much of that
  was the local commit and how much the wait for the followers, and what one Replicate call
  to a follower took. W1 reports it (``bench/w1_single.py``, ``millstream bench``) so the
  latency of a round can be read as its parts.
- :func:`received` counts the deliveries and replications the workers received, by carrier
  (unary calls, stream frames): what a round costs in messages.
"""

from __future__ import annotations

import re
import urllib.request
from typing import Any

from runtime.cluster import LocalCluster

# name in the breakdown -> histogram (seconds, labelled by computation)
BATCH_PARTS = {
    "batch": "millstream_batch_seconds",                  # user code to durable here and on the followers
    "commit": "millstream_commit_seconds",                # the local write (with its fsync)
    "replication_wait": "millstream_replication_seconds",  # from the local write to the followers' answer
    "replicate_call": "millstream_replication_rpc_seconds",  # one Replicate call, as its sender timed it
}
_RECEIVED = re.compile(r'^millstream_(?P<what>deliver|replicate)_calls_total\{carrier="(?P<carrier>[^"]*)"\} '
                       r'(?P<value>\S+)$', re.M)
_SERIES = re.compile(r'^(?P<name>\w+)_(?P<kind>sum|count)\{computation="(?P<comp>[^"]*)"\} (?P<value>\S+)$', re.M)


def scrape(c: LocalCluster) -> tuple[dict[str, str], list[str]]:
    """``({worker name: its /metrics page}, [why a worker could not be read])``."""
    pages: dict[str, str] = {}
    errors = []
    for w in c.workers:
        port = next((line.rsplit(":", 1)[1] for line in w.lines if " metrics on " in line), None)
        if port is None or not w.alive():
            errors.append(f"{w.name}: no metrics endpoint (not running)")
            continue
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                pages[w.name] = r.read().decode()
        except OSError as e:
            errors.append(f"{w.name}: {e}")
    return pages, errors


def batch_breakdown(pages: list[str]) -> dict[str, dict[str, Any]]:
    """``{computation: {"batches": n, "<part>_ms": mean ms, ...}}`` over every page, for the
    parts of :data:`BATCH_PARTS` that were observed (a tablet without followers has no
    replication figures)."""
    sums: dict[tuple[str, str, str], float] = {}
    wanted = {metric: part for part, metric in BATCH_PARTS.items()}
    for text in pages:
        for m in _SERIES.finditer(text):
            part = wanted.get(m["name"])
            if part is not None:
                key = (m["comp"], part, m["kind"])
                sums[key] = sums.get(key, 0.0) + float(m["value"])
    out: dict[str, dict[str, Any]] = {}
    for (comp, part, kind), count in sorted(sums.items()):
        if kind != "count" or not count:
            continue
        mine = out.setdefault(comp, {})
        if part == "batch":
            mine["batches"] = int(count)
        mine[f"{part}_ms"] = round(1000 * sums.get((comp, part, "sum"), 0.0) / count, 3)
    return out


def received(pages: list[str]) -> dict[str, int]:
    """``{"deliver frame": n, "replicate frame": n, ...}``: the deliveries and replications every
    page's worker received (``millstream_deliver_calls``, ``millstream_replicate_calls``)."""
    out: dict[str, int] = {}
    for text in pages:
        for m in _RECEIVED.finditer(text):
            key = f"{m['what']} {m['carrier']}"
            out[key] = out.get(key, 0) + int(float(m["value"]))
    return out
