"""``millstream demo``: Zeitgeist end to end on an embedded local cluster, fed and checked by Spark.

1. A PySpark job generates a search-query log (Zipf-distributed queries,
   bounded disorder, planted spikes and dips; seeded) and writes it as Parquet.
2. A local cluster (etcd, a master, workers) starts; the Zeitgeist topology
   (``examples/zeitgeist.py``) is submitted.
3. ``spark_bridge.inject`` sends the log into the ``queries`` stream, exactly
   once, holding the stream's watermark until the Spark job completes.
4. The windows and alerts are written to Parquet by the built-in sink, as
   event-time timers fire behind the low watermark.
5. A PySpark batch job computes the same windows and alerts from the log
   (``examples/zeitgeist_spark.py``); the two answers must be equal.
"""

from __future__ import annotations

import collections
import logging
import os
import random
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cli.up import console_of
from examples import zeitgeist
from examples.zeitgeist_spark import LogSpec, batch_alerts, batch_windows, generate_log, planted_found
from runtime.client import Client
from runtime.cluster import LocalCluster, wait_until
from runtime.record import END_OF_TIME

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# The word-count sample the end-to-end tests drive (tests/e2e) -- the demo before Zeitgeist.
WORDS = ("stream state timer watermark record tablet worker master etcd spark "
         "exactly once key range token batch commit").split()


def sample_lines(n: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8))) for _ in range(n)]


def oracle(lines: list[str]) -> dict[str, int]:
    return dict(collections.Counter(w.lower() for line in lines for w in line.split()))


STREAM = "queries"


def spark_session(cores: int = 2, app: str = "millstream-demo") -> SparkSession:
    """A local SparkSession that runs this interpreter for its Python workers."""
    from pyspark.sql import SparkSession

    # PySpark reads its workers' interpreter from the environment only; this one has millstream.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # loopback only; also quiets a start-up warning
    session = (SparkSession.builder
               .master(f"local[{cores}]")
               .appName(app)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", str(cores * 2))
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.pyspark.python", sys.executable)
               .config("spark.pyspark.driver.python", sys.executable)
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    return session


@dataclass
class PipelineResult:
    """What the stream computed, next to what Spark's batch job computed."""

    records_in: int
    windows: list[tuple[str, int, int]]
    alerts: list[tuple[str, int, str, int, int]]
    batch_windows: list[tuple[str, int, int]]
    batch_alerts: list[tuple[str, int, str, int, int]]
    inject_seconds: float
    stream_seconds: float
    windows_dir: str
    alerts_dir: str

    @property
    def equal(self) -> bool:
        return self.windows == self.batch_windows and self.alerts == self.batch_alerts

    def differences(self, limit: int = 5) -> str:
        out = []
        for what, got, want in (("windows", self.windows, self.batch_windows),
                                ("alerts", self.alerts, self.batch_alerts)):
            g, w = set(got), set(want)
            if len(got) != len(g):
                out.append(f"{what}: {len(got) - len(g)} duplicated rows")
            if g - w:
                out.append(f"{what} only in the stream: {sorted(g - w)[:limit]}")
            if w - g:
                out.append(f"{what} only in Spark batch: {sorted(w - g)[:limit]}")
        return "; ".join(out) or "none"


def _computations_done(client: Client, names: list[str]) -> bool:
    comps = client.status()["computations"]
    return all(comps.get(n, {}).get("low_watermark") == END_OF_TIME for n in names)


def run_pipeline(spark: SparkSession, masters: str, log_dir: str, out_dir: str, *, name: str = "zeitgeist",
                 stream: str = STREAM, spec: LogSpec = LogSpec(), timeout: float = 600.0,
                 progress: Callable[[str], None] = lambda s: None,
                 during: Callable[[Client], None] | None = None) -> PipelineResult:
    """Submit Zeitgeist, inject the log at ``log_dir``, wait for the end of time, compare with Spark.

    ``during`` runs in a thread while the stream works (tests kill workers there).
    """
    import spark_bridge

    topo = zeitgeist.topology(out_dir, name=name, stream=stream)
    names = list(topo.computations)
    windows_dir, alerts_dir = os.path.join(out_dir, "windows"), os.path.join(out_dir, "alerts")
    with Client(masters, timeout=30) as client:
        n = client.submit(topo)
        progress(f"submitted {name}: {len(names)} computations, {n} tablets")
        log = spark.read.parquet(log_dir)
        start_us = spec.start_second * zeitgeist.SECOND
        stop = threading.Event()
        disturber = None
        if during is not None:
            disturber = threading.Thread(target=during, args=(client,), daemon=True)

        def report() -> None:
            while not stop.wait(2.0):
                try:
                    comps = client.status()["computations"]
                except Exception:  # a status hiccup must not stop the demo
                    continue
                wc = comps.get(f"{name}.window_counter", {})
                model = comps.get(f"{name}.model", {})
                wm = model.get("low_watermark", 0)
                done = (min(spec.seconds, max(0, (wm - start_us) // zeitgeist.SECOND))
                        if wm != END_OF_TIME else spec.seconds)
                progress(f"  {wc.get('processed', 0):>8} queries counted; model watermark at second "
                         f"{done}/{spec.seconds}; {spark_bridge.count_rows(windows_dir)} windows, "
                         f"{spark_bridge.count_rows(alerts_dir)} alerts written")

        reporter = threading.Thread(target=report, daemon=True)
        reporter.start()
        try:
            t0 = time.monotonic()
            if disturber is not None:
                disturber.start()
            result = spark_bridge.inject(log, stream=stream, key="query", value=["query", "user"],
                                         timestamp="event_time", name=f"{name}-log", masters=masters)
            t_inject = time.monotonic() - t0
            progress(f"injected {result.records} queries from {result.partitions} Spark partitions "
                     f"in {t_inject:.1f}s; the stream's watermark is released")
            wait_until(lambda: _computations_done(client, names), timeout,
                       "every Zeitgeist computation's low watermark to reach the end of time",
                       interval=0.25)
            t_stream = time.monotonic() - t0
            if disturber is not None:
                disturber.join(timeout)
        finally:
            stop.set()
            reporter.join()
    progress(f"the stream is done ({t_stream:.1f}s); computing the same answer in Spark batch")
    from pyspark.sql import functions as F

    bw = batch_windows(log)
    ba = batch_alerts(bw)
    got_w = spark_bridge.read_stream(spark, windows_dir)
    got_a = spark_bridge.read_stream(spark, alerts_dir)

    def rows(df: Any, cols: list[str]) -> list[tuple[Any, ...]]:
        return sorted(tuple(r) for r in df.select(*[F.col(c) for c in cols]).collect())

    wcols, acols = ["query", "second", "count"], ["query", "second", "kind", "count", "expected"]
    return PipelineResult(result.records, rows(got_w, wcols), rows(got_a, acols), rows(bw, wcols),
                          rows(ba, acols), t_inject, t_stream, windows_dir, alerts_dir)


class _QuietPy4J(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        chatter = record.name.startswith("py4j") or "while sending command" in str(record.msg)
        return record.levelno >= logging.WARNING or not chatter


def run_demo(data_dir: str, workers: int = 2, spec: LogSpec | None = None, etcd_binary: str | None = None) -> int:
    """The main job (see the module docstring); returns the process exit code."""
    spec = spec or LogSpec()
    data_dir = os.path.abspath(data_dir)
    log_dir = os.path.join(data_dir, "query-log")
    out_dir = os.path.join(data_dir, "output")
    t0 = time.monotonic()

    def say(msg: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {msg}", flush=True)

    quiet = _QuietPy4J()  # py4j's reconnection chatter (some of it on the root logger) is not news
    for handler in logging.getLogger().handlers:
        handler.addFilter(quiet)
    say(f"Zeitgeist demo under {data_dir}")
    say("starting Spark (local[2])")
    spark = spark_session()
    try:
        say(f"generating the query log: {spec.queries} queries over {spec.seconds}s of event time, "
            f"{spec.vocabulary} distinct queries (Zipf s={spec.zipf_s}), up to "
            f"{spec.max_disorder_us / 1e6:.0f}s disorder, {len(spec.anomalies)} planted anomalies")
        n_log = generate_log(spark, log_dir, spec)
        say(f"wrote {n_log} log rows to {log_dir}")
        say(f"starting a local cluster (etcd, 1 master, {workers} workers)")
        with LocalCluster(os.path.join(data_dir, "cluster"), workers=workers, etcd_binary=etcd_binary) as cluster:
            cluster.wait_ready(60)
            say(f"cluster up; master at {cluster.masters_arg}; console {console_of(cluster) or '(none)'} "
                "(open it to watch throughput, lag and watermarks while the demo runs)")
            res = run_pipeline(spark, cluster.masters_arg, log_dir, out_dir, spec=spec, progress=say)
        say("cluster stopped")
        found = planted_found(spec, [(q, s, k) for q, s, k, _, _ in res.alerts])
    finally:
        spark.stop()
    planted = {(spec.query_name(a.rank), a.kind) for a, _ in found}
    other = [a for a in res.alerts if (a[0], a[2]) not in planted]
    elapsed = time.monotonic() - t0
    print()
    print("Zeitgeist report")
    print(f"  records in            {res.records_in} queries (log: {n_log} rows)")
    print(f"  windows               {len(res.windows)} (query, second) counts")
    print(f"  alerts                {len(res.alerts)} "
          f"({sum(a[2] == 'spike' for a in res.alerts)} spike seconds, "
          f"{sum(a[2] == 'dip' for a in res.alerts)} dip seconds; {len(other)} outside planted anomalies)")
    print(f"  planted anomalies     {sum(hit for _, hit in found)}/{len(found)} found")
    for a, hit in found:
        first = a.offset
        print(f"    {'found ' if hit else 'MISSED'} {a.kind:<5} {spec.query_name(a.rank)!r:<20} "
              f"seconds {first}-{first + a.seconds - 1}")
    print(f"  equal to Spark batch  {'yes' if res.equal else 'NO: ' + res.differences()}")
    print(f"  time                  {elapsed:.1f}s total; injection {res.inject_seconds:.1f}s, "
          f"stream done {res.stream_seconds:.1f}s after injection began")
    print(f"  outputs               {res.windows_dir}")
    print(f"                        {res.alerts_dir}")
    print("                        read them with spark_bridge.read_stream(spark, path)")
    return 0 if res.equal and all(hit for _, hit in found) else 1


if __name__ == "__main__":
    sys.exit(run_demo(sys.argv[1] if len(sys.argv) > 1 else "/tmp/millstream-demo"))
