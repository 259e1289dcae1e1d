"""Nexmark on the Flink peer: the events millstream's run injects, pre-generated as files, and
each query as Flink SQL (bench/flink/nexmark_job.py), checked against the same oracle.

Flink's output is compared with the oracle's ``(key, value)`` multiset: the timestamps are
millstream's own stamps, which Flink's rows do not carry. q12 groups by processing time, so
as for millstream only each bidder's total is checked. Reported per query: events per second
of Flink's net runtime (from RUNNING to FINISHED: the figure most favourable to Flink), of the
job's wall time from submission, and events per CPU-second of the whole process tree (the JVM
included: bench/cpu.py), the figure the millstream run reports. Starting the JVM, planning
the SQL and starting the MiniCluster cost Flink ~19 CPU-seconds per job, more than a whole
query over 200,000 events, and millstream's figure leaves its cluster's start and the
topology's submission out. So the CPU compared is metered from the moment the job reports
RUNNING to the moment it reports its end (``events_per_cpu_s_running``, over the same span
as Flink's net runtime); the figure with the start included is in the report too.

q12 is not run: Flink fires no processing-time window when a bounded input ends (a job over
these files finishes in seconds, before a 10 s pane closes, and its output is empty).
"""

from __future__ import annotations

import csv
import datetime
import os
import shutil
from collections import Counter
from collections.abc import Sequence
from typing import Any

from bench.flink_env import ROOT, run_job
from bench.nexmark import oracle
from bench.nexmark.generator import Auction, Bid, NexmarkConfig, Person, decode, records
from bench.nexmark.queries import QUERIES

JOB = os.path.join(ROOT, "bench", "flink", "nexmark_job.py")
OFFSET_MS = 1_000_000_000  # bench/flink/nexmark_job.py: where its stretched timeline starts
WINDOW_KEYED = ("q5", "q7")  # their key is a window start


def disorder_s(config: NexmarkConfig) -> float:
    """How far behind the newest event one may come (a whole out-of-order group), plus one
    event's spacing: the watermark's delay."""
    return config.out_of_order_group_size / config.events_per_second


def write_events(config: NexmarkConfig, n: int, directory: str, files: int = 2) -> None:
    """Stream positions [0, n) as ``files`` CSV files, position p in file p % files: each
    file in event-time order, all of them advancing together (as two source tasks would)."""
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    outs = [open(os.path.join(directory, f"part-{i}.csv"), "w", newline="") for i in range(files)]
    try:
        writers = [csv.writer(f, lineterminator="\n") for f in outs]
        for p, (key, value, _) in enumerate(records(config, 0, n)):
            writers[p % files].writerow(_row(config, int(key), value))
    finally:
        for f in outs:
            f.close()


def _row(config: NexmarkConfig, n: int, value: bytes) -> list[object]:
    """The job's COLUMNS for one event (fields of the other kinds 0 or empty)."""
    e = decode(value)
    t = e.date_time - config.base_time_us + OFFSET_MS  # µs read as ms: the stretched timeline
    if isinstance(e, Person):
        return [n, 0, e.id, e.name, e.email, e.credit_card, e.city, e.state, "", 0, 0, 0, 0, 0, 0, 0, 0,
                e.date_time, t, e.extra]
    if isinstance(e, Auction):
        return [n, 1, e.id, e.item_name, "", "", "", "", e.description, e.initial_bid, e.reserve, e.expires,
                e.seller, e.category, 0, 0, 0, e.date_time, t, e.extra]
    assert isinstance(e, Bid)
    return [n, 2, 0, "", "", "", "", "", "", 0, 0, 0, 0, 0, e.auction, e.bidder, e.price, e.date_time, t, e.extra]


def read_results(directory: str) -> list[tuple[str, str]]:
    """Committed ``(k, v)`` rows (Flink hides files still in progress as ``.part-*``)."""
    rows: list[tuple[str, str]] = []
    for d, _, names in os.walk(directory):
        for name in sorted(names):
            if not name.startswith((".", "_")):
                with open(os.path.join(d, name), newline="") as f:
                    rows += [(r[0], r[1] if len(r) > 1 else "") for r in csv.reader(f) if r]
    return rows


def window_start_us(config: NexmarkConfig, text: str) -> int:
    """A window start as Flink wrote it (a UTC timestamp on the stretched timeline) in µs."""
    at = datetime.datetime.fromisoformat(text).replace(tzinfo=datetime.UTC)
    stretched_ms = round(at.timestamp() * 1000)
    return config.base_time_us + stretched_ms - OFFSET_MS


def check(query: str, config: NexmarkConfig, events: Sequence[tuple[bytes, bytes, int]],
          rows: list[tuple[str, str]]) -> dict[str, Any]:
    """Flink's rows against the oracle: lost and doubled ``(key, value)`` pairs."""
    want: Counter[Any]
    have: Counter[Any] = Counter()
    if query == "q12":
        want = oracle.q12_totals(config, events)
        for k, v in rows:
            have[k.encode()] += int(v)
        checked = "bids per bidder (processing-time panes)"
    else:
        want = Counter()
        for (key, value, _), n in oracle.ORACLES[query](config, events).items():
            want[(key, value)] += n
        for k, v in rows:
            k = str(window_start_us(config, k)) if query in WINDOW_KEYED else k
            have[(k.encode(), v.encode())] += 1
        checked = "every output (key, value)"
    lost, doubled = sum((want - have).values()), sum((have - want).values())
    return {"expected": sum(want.values()), "observed": sum(have.values()), "lost": lost, "doubled": doubled,
            "exact": lost == doubled == 0, "checked": checked}


def run_query(python: str, root: str, query: str, config: NexmarkConfig, src: str,
              events: Sequence[tuple[bytes, bytes, int]], timeout_s: float) -> dict[str, Any]:
    out, ckpt = (os.path.join(root, f"flink-nexmark-{query}-{d}") for d in ("out", "ckpt"))
    for d in (out, ckpt):
        shutil.rmtree(d, ignore_errors=True)
    argv = [JOB, query, src, out, ckpt, str(config.window_size_sec), str(config.window_period_sec),
            str(config.auction_skip), str(config.max_auctions_waiting_sec), str(disorder_s(config))]
    job = run_job(python, argv, root, f"nexmark-{query}", timeout_s)
    if job.error is not None:
        return {"query": query, "error": job.error, "cpu": job.cpu.as_dict()}
    timing, running = job.timing, job.running
    assert running is not None
    n = len(events)
    return {"query": query, "events": n, "flink_version": timing["flink_version"],
            "jvm_start_s": timing["jvm_start_s"], "job_s": timing["job_s"], "net_runtime_s": timing["net_runtime_s"],
            "events_per_s": round(n / timing["net_runtime_s"]), "events_per_s_job": round(n / timing["job_s"]),
            "events_per_cpu_s": round(n / max(1e-9, job.cpu.ours_s)),
            "events_per_cpu_s_running": round(n / max(1e-9, running.ours_s)),
            "cpu": job.cpu.as_dict(), "cpu_running": running.as_dict(),
            "exactness": check(query, config, events, read_results(out))}


NOT_RUN = {"q12": "Flink fires no processing-time window when a bounded input ends: its panes are dropped"}
# The Flink job (bench/flink/nexmark_job.py) has the queries of the classic versions only.
NO_FLINK_JOB = "no Flink SQL version in bench/flink/nexmark_job.py (only the classic queries')"


def not_run(queries: Sequence[str]) -> dict[str, str]:
    """The queries of ``queries`` Flink does not run, and why."""
    return {q: NOT_RUN.get(q, NO_FLINK_JOB) for q in queries if q in NOT_RUN or q not in QUERIES}


def run(python: str, root: str, config: NexmarkConfig, n: int, queries: Sequence[str],
        timeout_s: float) -> dict[str, Any]:
    """Every query of ``queries`` over event positions [0, n), each as its own Flink job."""
    src = os.path.join(root, "flink-nexmark-in")
    skipped = not_run(queries)
    result: dict[str, Any] = {"events": n, "queries": [], "not_run": skipped}
    try:
        write_events(config, n, src)
        events = list(records(config, 0, n))
        for q in queries:
            if q not in skipped:
                print(f"  Flink Nexmark {q}", flush=True)
                result["queries"].append(run_query(python, root, q, config, src, events, timeout_s))
    finally:
        shutil.rmtree(src, ignore_errors=True)
    return result


def compare(millstream: dict[str, Any], flink: dict[str, Any]) -> list[dict[str, str]]:
    """Rows of (query, millstream, Flink, ratio) in events per CPU-second; a ratio > 1 means
    millstream does more work per CPU-second."""
    ours = {q["query"]: q for q in millstream.get("queries", []) if "throughput" in q}
    rows = []
    for f in flink.get("queries", []):
        m = ours.get(f["query"], {}).get("throughput", {})
        mc, fc = m.get("events_per_cpu_s"), f.get("events_per_cpu_s_running")
        e = f.get("exactness") or {}
        rows.append({"what": f["query"], "millstream": f"{mc:,}" if mc else "–",
                     "peer": f"{fc:,}" if fc else f.get("error", "–")[:80],
                     "peer_exact": f"{e['lost']} / {e['doubled']}" + ("" if e["exact"] else " NOT EXACT") if e else "–",
                     "peer_raw": f"{f['events_per_cpu_s']:,}" if f.get("events_per_cpu_s") else "–",
                     "peer_rate": f"{f['events_per_s']:,}" if f.get("events_per_s") else "–",
                     "ratio": f"{mc / fc:.2f}×" if mc and fc else "–"})
    return rows
