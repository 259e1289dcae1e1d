"""W2 on Flink, as a Flink user writes it: Flink SQL (all in the JVM, no Python UDF), a local
MiniCluster with parallelism 2, exactly-once checkpoints every second.

Runs in the Flink virtualenv (bench/flink_peer.py makes it; PyFlink pins protobuf and grpcio
versions this project cannot use), not in the project's: it imports only PyFlink and the
standard library. Reads ``key,ts_us`` CSV files from INPUT (one split per file, so give it
one file per source task), counts per key and one-second tumbling event-time window with a
2-second bounded-out-of-orderness watermark (the disorder W2's generator adds, and what the
Spark peer's ``withWatermark`` allows), and writes ``key,first_ts_us,count`` CSV rows to OUT.
Prints ``RUNNING`` once the job runs (the peer meters CPU from there), then one JSON line: timings (planning + MiniCluster start + run, and Flink's own net
runtime of the job) and the version.

Usage: python w2_job.py INPUT_DIR OUT_DIR CHECKPOINT_DIR
"""

from __future__ import annotations

import json
import sys
import time


def main(inp: str, out: str, checkpoints: str) -> int:
    from pyflink.table import EnvironmentSettings, TableEnvironment  # type: ignore[import-not-found]
    from pyflink.version import __version__  # type: ignore[import-not-found]

    t0 = time.time()
    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    started = time.time()
    conf = env.get_config()
    for key, value in (("parallelism.default", "2"), ("table.local-time-zone", "UTC"),
                       ("pipeline.name", "millstream-bench-w2"),
                       ("execution.checkpointing.interval", "1 s"),
                       ("execution.checkpointing.mode", "EXACTLY_ONCE"),
                       ("execution.checkpointing.storage", "filesystem"),
                       ("execution.checkpointing.dir", "file://" + checkpoints)):
        conf.set(key, value)
    env.execute_sql(f"""
        CREATE TABLE events (
            k STRING,
            ts_us BIGINT,
            ts AS TO_TIMESTAMP_LTZ(CAST(ts_us / 1000 AS BIGINT), 3),
            WATERMARK FOR ts AS ts - INTERVAL '2' SECOND
        ) WITH ('connector' = 'filesystem', 'path' = 'file://{inp}', 'format' = 'csv')""")
    env.execute_sql(f"""
        CREATE TABLE counts (k STRING, first_ts_us BIGINT, cnt BIGINT)
        WITH ('connector' = 'filesystem', 'path' = 'file://{out}', 'format' = 'csv')""")
    submitted = time.time()
    result = env.execute_sql("""
        INSERT INTO counts
        SELECT k, MIN(ts_us), COUNT(*)
        FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(ts), INTERVAL '1' SECOND))
        GROUP BY k, window_start, window_end""")
    client = result.get_job_client()
    while client.get_job_status().result().name in ("INITIALIZING", "CREATED"):
        time.sleep(0.01)  # polling the job's status: the peer meters CPU from RUNNING on
    print("RUNNING", flush=True)
    result.wait()
    done = time.time()
    net_ms = result.get_job_client().get_job_execution_result().result().get_net_runtime()
    print(json.dumps({"flink_version": __version__, "jvm_start_s": round(started - t0, 3),
                      "job_s": round(done - submitted, 3), "net_runtime_s": round(net_ms / 1000, 3)}),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
