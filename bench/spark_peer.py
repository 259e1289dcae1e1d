"""The same workloads on PySpark Structured Streaming (``local[2]``), for the ratios.

- **W1**: the same Zipf keys, paced at the same rate by the same open-loop
  schedule, are written as lines ``key,scheduled_ns`` to a TCP socket that
  Spark's ``socket`` source reads; a per-key running count runs in
  ``applyInPandasWithState`` (update mode) and ``foreachBatch`` collects the
  output on the driver, where the arrival time is read. Latency is arrival
  minus the scheduled time, exactly as for millstream.
- **W2**: the same 2,000,000 records (written first as Parquet files, 20 of
  100,000 rows, read one file per micro-batch) go through
  ``withWatermark("ts", "2 seconds")`` + ``groupBy(window(ts, "1 second"), key).count()``
  in append mode; the spike stage runs in ``foreachBatch`` on the driver (append
  mode emits each key's windows in window order across batches, so a dict of
  EWMAs is exact). A last file with one far-future record moves the watermark
  past every window. Throughput is records over the time from the query's start
  to the last window's arrival; the windows and spikes are checked against the oracle.

Spark is tuned the way anyone would for one small machine: 2 shuffle
partitions (not 200), no UI, Arrow on.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import sys
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from bench import generator, latency

if TYPE_CHECKING:
    from bench.workloads import BenchConfig

log = logging.getLogger(__name__)


def _session(root: str) -> Any:
    from pyspark.sql import SparkSession

    # Spark's Python workers must be this interpreter (the one with this checkout's deps).
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    spark = (SparkSession.builder.master("local[2]").appName("millstream-bench-peer")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.execution.arrow.pyspark.enabled", "true")
            .config("spark.sql.streaming.checkpointLocation", os.path.join(root, "spark-ckpt"))
            .config("spark.driver.memory", "2g")
            .config("spark.sql.session.timeZone", "UTC")
            .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")  # stopping a query logs an InterruptedException
    return spark


# ---------------------------------------------------------------------- W1


class _LineServer:
    """A one-client TCP server Spark's socket source connects to."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1)
        self.port = self.sock.getsockname()[1]
        self.conn: socket.socket | None = None
        self._accepted = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self.conn, _ = self.sock.accept()
        self.conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._accepted.set()

    def wait(self, timeout: float) -> None:
        if not self._accepted.wait(timeout):
            raise TimeoutError("Spark's socket source did not connect")

    def send(self, data: bytes) -> None:
        assert self.conn is not None
        self.conn.sendall(data)

    def close(self) -> None:
        for s in (self.conn, self.sock):
            if s is not None:
                s.close()


def _count_state(key: Any, pdfs: Any, state: Any) -> Any:
    import pandas as pd

    n = state.get[0] if state.exists else 0
    for pdf in pdfs:
        counts = range(n + 1, n + 1 + len(pdf))
        n += len(pdf)
        yield pd.DataFrame({"key": pdf["key"].values, "sched": pdf["sched"].values, "n": list(counts)})
    state.update((n,))


def run_w1(spark: Any, root: str, rate: int, seconds: float, warmup_s: float) -> dict[str, Any]:
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    keys = generator.w1_keys(rate, seconds)
    server = _LineServer()
    arrivals: list[latency.Arrival] = []
    lock = threading.Lock()

    def each_batch(df: Any, batch_id: int) -> None:
        rows = df.collect()
        now = time.time_ns()
        with lock:
            arrivals.extend(latency.Arrival(r["key"].encode(), int(r["n"]), int(r["sched"]), now) for r in rows)

    lines = (spark.readStream.format("socket").option("host", "127.0.0.1").option("port", server.port).load())
    parsed = lines.select(F.split("value", ",").alias("p")).select(
        F.col("p")[0].alias("key"), F.col("p")[1].cast("long").alias("sched"))
    counted = parsed.groupBy("key").applyInPandasWithState(
        _count_state, "key string, sched long, n long", "n long", "update", GroupStateTimeout.NoTimeout)
    ckpt = os.path.join(root, f"spark-w1-{rate}")
    shutil.rmtree(ckpt, ignore_errors=True)
    query = counted.writeStream.outputMode("update").option("checkpointLocation", ckpt) \
        .foreachBatch(each_batch).start()
    try:
        server.wait(60)
        warm = 64
        server.send(b"".join(b"warm%d,%d\n" % (i, time.time_ns()) for i in range(warm)))
        deadline = time.monotonic() + 120
        while len(arrivals) < warm and time.monotonic() < deadline:
            time.sleep(0.05)  # polling Spark's output (a benchmark, not a test)
        with lock:
            arrivals.clear()
        sent = _paced_lines(server, keys, rate)
        deadline = time.monotonic() + 120
        while len(arrivals) < len(keys) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        query.stop()
        server.close()
    start_ns = sent["start_ns"]
    steady = [a.latency_ms for a in arrivals if a.sched_ns >= start_ns + warmup_s * 1e9]
    check = latency.check_exact(arrivals, Counter(keys))
    return {"rate": rate, "seconds": seconds, "records": len(keys), "latency_ms": latency.percentiles(steady),
            "exactness": check.__dict__ | {"exact": check.exact},
            "max_behind_ms": round(sent["max_behind_ms"], 1)}


def _paced_lines(server: _LineServer, keys: list[bytes], rate: int) -> dict[str, float]:
    """The same open-loop schedule as :func:`bench.latency.paced_send`, over the socket."""
    period = 1_000_000_000 / rate
    t0 = time.time_ns() + 50_000_000
    i, n, behind = 0, len(keys), 0.0
    while i < n:
        now = time.time_ns()
        due = t0 + int(i * period)
        if due > now:
            time.sleep(min((due - now) / 1e9, 0.0005))
            continue
        start = i
        parts = []
        while i < n and t0 + int(i * period) <= now:
            parts.append(b"%s,%d\n" % (keys[i], t0 + int(i * period)))
            i += 1
        server.send(b"".join(parts))
        behind = max(behind, (now - (t0 + int(start * period))) / 1e6)
    return {"start_ns": t0, "max_behind_ms": behind}


# ---------------------------------------------------------------------- W2


def run_w2(spark: Any, root: str, data: generator.W2Data, oracle: generator.W2Oracle,
           timeout_s: float) -> dict[str, Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import functions as F

    src = os.path.join(root, "spark-w2-in")
    shutil.rmtree(src, ignore_errors=True)
    os.makedirs(src)
    per_file = max(1, len(data.keys) // 20)
    schema = pa.schema([("key", pa.string()), ("ts", pa.timestamp("us", tz="UTC"))])
    for n, lo in enumerate(range(0, len(data.keys), per_file)):
        tbl = pa.table({"key": [k.decode() for k in data.keys[lo:lo + per_file]],
                        "ts": pa.array(data.timestamps[lo:lo + per_file], pa.timestamp("us", tz="UTC"))},
                       schema=schema)
        pq.write_table(tbl, os.path.join(src, f"part-{n:04d}.parquet"))
    end_ts = max(data.timestamps) + 10 * generator.SECOND_US
    windows: dict[tuple[bytes, int], int] = {}
    spikes: set[tuple[bytes, int]] = set()
    ewma: dict[bytes, float | None] = {}
    last_arrival = [0]

    def each_batch(df: Any, batch_id: int) -> None:
        rows = sorted((r["key"].encode(), r["w"], int(r["count"])) for r in df.collect())
        for k, w, c in rows:
            if k == b"__end__":
                continue
            windows[(k, w)] = c
            spike, ewma[k] = generator.spike_step(ewma.get(k), c)
            if spike:
                spikes.add((k, w))
        if rows:
            last_arrival[0] = time.time_ns()

    stream = (spark.readStream.schema("key string, ts timestamp").option("maxFilesPerTrigger", 1).parquet(src)
              .withWatermark("ts", "2 seconds")
              .groupBy(F.window("ts", "1 second"), "key").count()
              .select("key", (F.unix_micros(F.col("window.start"))).alias("w"), "count"))
    ckpt = os.path.join(root, "spark-w2-ckpt")
    shutil.rmtree(ckpt, ignore_errors=True)
    t0 = time.time_ns()
    query = stream.writeStream.outputMode("append").option("checkpointLocation", ckpt) \
        .foreachBatch(each_batch).trigger(processingTime="0 seconds").start()
    try:
        expected = len(oracle.windows)
        wrote_end = False
        deadline = time.monotonic() + timeout_s
        while len(windows) < expected and time.monotonic() < deadline:
            if not wrote_end and query.lastProgress is not None and _files_done(query, src):
                pq.write_table(pa.table({"key": ["__end__"], "ts": pa.array([end_ts], pa.timestamp("us", tz="UTC"))},
                                        schema=schema), os.path.join(src, "part-9999-end.parquet"))
                wrote_end = True
            time.sleep(0.1)  # polling Spark's progress (a benchmark, not a test)
    finally:
        query.stop()
    elapsed = (last_arrival[0] - t0) / 1e9 if last_arrival[0] else None
    done = len(windows) >= len(oracle.windows)
    return {
        "records": len(data.keys), "windows_observed": len(windows), "windows_expected": len(oracle.windows),
        "spikes_observed": len(spikes), "spikes_expected": len(oracle.spikes),
        "elapsed_s": None if elapsed is None else round(elapsed, 2),
        "throughput_rps": round(len(data.keys) / elapsed) if (elapsed and done) else None,
        "oracle_equal": windows == oracle.windows and spikes == oracle.spikes,
        "error": None if done else f"only {len(windows):,} of {len(oracle.windows):,} windows within {timeout_s:.0f}s",
    }


def _files_done(query: Any, src: str) -> bool:
    """Has the query read every input file (so the end marker can go in)?"""
    n_files = len([f for f in os.listdir(src) if f.endswith(".parquet")])
    progress = query.recentProgress or []
    read = sum(int(p.get("numInputRows", 0)) > 0 for p in progress)
    return read >= n_files


# -------------------------------------------------------------------- driver


def run(root: str, cfg: BenchConfig, report: dict[str, Any], w2_data: generator.W2Data | None,
        w2_oracle: generator.W2Oracle | None) -> dict[str, Any]:
    """Run W1 (each rate) and W2 on Spark; compare with the millstream figures in ``report``."""
    out: dict[str, Any] = {"config": {"master": "local[2]", "shuffle_partitions": 2,
                                      "w1": "socket source -> applyInPandasWithState -> foreachBatch",
                                      "w2": "parquet files (maxFilesPerTrigger=1) -> withWatermark 2s + "
                                            "window 1s count (append) -> foreachBatch spike stage"}}
    try:
        spark = _session(root)
    except Exception as e:  # no Java, no pyspark: report, do not fail the millstream figures
        out["error"] = f"cannot start Spark: {e}"
        return out
    try:
        out["w1"] = []
        for rate in cfg.w1_rates:
            print(f"  Spark W1 at {rate:,} rec/s", flush=True)
            try:
                out["w1"].append(run_w1(spark, root, rate, cfg.w1_seconds, cfg.warmup_s))
            except Exception as e:
                log.exception("Spark W1 failed")
                out["w1"].append({"rate": rate, "error": f"{type(e).__name__}: {e}"})
        if w2_data is not None and w2_oracle is not None:
            print(f"  Spark W2 over {len(w2_data.keys):,} records", flush=True)
            try:
                out["w2"] = run_w2(spark, root, w2_data, w2_oracle, cfg.w2_timeout_s)
            except Exception as e:
                log.exception("Spark W2 failed")
                out["w2"] = {"error": f"{type(e).__name__}: {e}"}
    finally:
        spark.stop()
    out["comparison"] = compare(report, out)
    return out


def _ratio(a: float | None, b: float | None) -> str:
    if not a or not b:
        return "–"
    return f"{a / b:.1f}×"


def compare(report: dict[str, Any], spark: dict[str, Any]) -> list[dict[str, str]]:
    """Rows of (what, millstream, Spark, ratio); a ratio > 1 means millstream is better."""
    from bench.report import w1_find, w2_as_user

    rows = []
    for s in spark.get("w1", []):
        m = w1_find(report, "eo-strong-fsync", s["rate"])
        for p in ("p50", "p99"):
            mv = ((m or {}).get("latency_ms") or {}).get(p)
            sv = (s.get("latency_ms") or {}).get(p)
            rows.append({"what": f"W1 {s['rate']:,} rec/s latency {p} (ms; lower is better)",
                         "millstream": "–" if mv is None else f"{mv:.2f}",
                         "spark": "–" if sv is None else f"{sv:.1f}" + ("" if s.get("exactness", {}).get("exact") else " (inexact)"),
                         "ratio": _ratio(sv, mv)})
    mw2, how = w2_as_user(report)
    sw2 = spark.get("w2") or {}
    mv, sv = mw2.get("throughput_rps"), sw2.get("throughput_rps")
    rows.append({"what": f"W2 throughput, {how} (rec/s; higher is better)",
                 "millstream": "not available" if not mw2.get("available") else f"{mv or 0:,}",
                 "spark": "–" if sv is None else f"{sv:,}" + ("" if sw2.get("oracle_equal") else " (not equal to oracle)"),
                 "ratio": _ratio(mv, sv)})
    return rows
