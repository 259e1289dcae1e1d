"""Nexmark on the Flink peer (bench/nexmark/on_flink.py): the event files Flink reads, the
stretched timeline, and the check of Flink's rows against the oracle. The Flink jobs
themselves run in ``millstream bench --nexmark --peer flink`` (a JVM and a virtualenv of
their own); with ``MILLSTREAM_FLINK_TESTS=1`` the last test here runs two of them."""

from __future__ import annotations

import csv
import datetime
import os
import sys

import pytest

from bench.nexmark import flows, on_flink, oracle, queries
from bench.nexmark.generator import SECOND_US, Auction, Bid, NexmarkConfig, decode, records

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench", "flink"))
import nexmark_job  # noqa: E402  (runs in the Flink virtualenv; its helpers are plain Python)

CONFIG = NexmarkConfig()
N = 2000


def _flink_time(config: NexmarkConfig, us: int) -> str:
    """How Flink writes a window start: the stretched timeline's UTC wall time."""
    ms = us - config.base_time_us + on_flink.OFFSET_MS
    return str(datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).replace(tzinfo=None))


def test_the_stretched_timeline_keeps_every_microsecond_and_every_window_boundary() -> None:
    assert on_flink.OFFSET_MS == nexmark_job.OFFSET_MS
    # Every window size and period divides the offset: windows start where millstream's do.
    for seconds in (CONFIG.window_size_sec, CONFIG.window_period_sec):
        assert on_flink.OFFSET_MS % (seconds * SECOND_US) == 0
    assert nexmark_job.interval(10) == "INTERVAL '0 02:46:40.000' DAY TO SECOND"
    assert nexmark_job.interval(600) == "INTERVAL '6 22:40:00.000' DAY TO SECOND"
    assert nexmark_job.interval(0.0001) == "INTERVAL '0 00:00:00.100' DAY TO SECOND"
    start = CONFIG.base_time_us + 7 * CONFIG.window_size_sec * SECOND_US
    assert on_flink.window_start_us(CONFIG, _flink_time(CONFIG, start)) == start
    assert on_flink.window_start_us(CONFIG, _flink_time(CONFIG, start + 300)) == start + 300


def test_event_files_hold_every_event_once_each_file_in_order(tmp_path: object) -> None:
    d = os.path.join(str(tmp_path), "in")
    on_flink.write_events(CONFIG, N, d)
    rows = []
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name), newline="") as f:
            part = list(csv.reader(f))
        times = [int(r[18]) for r in part]
        assert times == sorted(times), f"{name} is out of order"
        rows += part
    columns = [c.split()[0] for c in nexmark_job.COLUMNS.split(", ")]
    assert all(len(r) == len(columns) for r in rows)
    by_n = {int(r[0]): dict(zip(columns, r, strict=True)) for r in rows}
    assert sorted(by_n) == list(range(N))
    for key, value, ts in records(CONFIG, 0, N):
        row, e = by_n[int(key)], decode(value)
        assert int(row["date_time"]) == ts == e.date_time
        assert int(row["t"]) == ts - CONFIG.base_time_us + on_flink.OFFSET_MS
        assert int(row["kind"]) == (2 if isinstance(e, Bid) else 1 if isinstance(e, Auction) else 0)
        assert row["extra"] == e.extra


def _flink_rows(query: str, config: NexmarkConfig, events: list[tuple[bytes, bytes, int]]) -> list[tuple[str, str]]:
    """What a correct Flink job writes for ``query``: the oracle's keys and values, window
    starts as Flink timestamps."""
    rows = []
    for (k, v, _), n in oracle.ORACLES[query](config, events).items():
        key = _flink_time(config, int(k)) if query in on_flink.WINDOW_KEYED else k.decode()
        rows += [(key, v.decode())] * n
    return rows


@pytest.mark.parametrize("query", ["q2", "q5", "q7", "q11"])
def test_the_check_counts_lost_and_doubled_outputs(query: str) -> None:
    events = list(records(CONFIG, 0, 30_000 if query in ("q5", "q7") else N))
    rows = _flink_rows(query, CONFIG, events)
    assert rows, "the check needs outputs to lose"
    assert on_flink.check(query, CONFIG, events, rows) | {"checked": ""} == {
        "expected": len(rows), "observed": len(rows), "lost": 0, "doubled": 0, "exact": True, "checked": ""}
    wrong = on_flink.check(query, CONFIG, events, rows + rows[:1])
    assert (wrong["lost"], wrong["doubled"], wrong["exact"]) == (0, 1, False)
    lost = on_flink.check(query, CONFIG, events, rows[1:])
    assert (lost["lost"], lost["doubled"], lost["exact"]) == (1, 0, False)


def test_q12_is_checked_by_totals_per_bidder() -> None:
    events = list(records(CONFIG, 0, N))
    totals = oracle.q12_totals(CONFIG, events)
    # Two panes per bidder, as processing-time windows may cut them.
    rows = [(k.decode(), str(n - n // 2)) for k, n in totals.items()] + [(k.decode(), str(n // 2))
                                                                          for k, n in totals.items()]
    assert on_flink.check("q12", CONFIG, events, rows)["exact"]
    assert not on_flink.check("q12", CONFIG, events, rows[1:])["exact"]


@pytest.mark.skipif(os.environ.get("MILLSTREAM_FLINK_TESTS") != "1",
                    reason="runs Flink jobs (a JVM and .venv-flink, ~850 MB): MILLSTREAM_FLINK_TESTS=1")
def test_flink_runs_nexmark_exactly(tmp_path: object) -> None:
    from bench.flink_env import ensure_venv

    disordered = NexmarkConfig(out_of_order_group_size=25, window_size_sec=1, window_period_sec=1)
    r = on_flink.run(ensure_venv(), str(tmp_path), disordered, 20_000, ["q5", "q11", "q12"], 300)
    assert r["not_run"] == {"q12": on_flink.NOT_RUN["q12"]}
    assert [q["query"] for q in r["queries"]] == ["q5", "q11"]
    for q in r["queries"]:
        assert q["exactness"]["exact"], q
        assert q["exactness"]["expected"] > 0
        assert 0 < q["cpu_running"]["cpu_s"] < q["cpu"]["cpu_s"]  # the JVM's start is left out


def test_flink_is_given_only_the_queries_its_job_has() -> None:
    """The bench runs the flow versions (q0-q12) by default; Flink's job has the classic nine
    less q12, so the rest are reported as not run, with the reason."""
    skipped = on_flink.not_run(list(flows.FLOWS))
    assert skipped == {"q12": on_flink.NOT_RUN["q12"]} | {q: on_flink.NO_FLINK_JOB for q in ("q4", "q6", "q9", "q10")}
    assert set(flows.FLOWS) - set(skipped) == set(queries.QUERIES) - {"q12"}
