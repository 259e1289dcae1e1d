"""Injecting DataFrames: exact under Spark task retries, and bad input refused before anything is sent."""

from __future__ import annotations

import datetime
import os
import re
from typing import Any

import pytest

import spark_bridge
from injectors import Injector
from injectors.checks import MIN
from runtime import Topology
from runtime.errors import ConfigError, InjectionError, MasterUnavailableError
from spark_bridge import InvalidInputError, add_parquet_sink, read_rows
from spark_bridge.inject import CONTENT_PARTITIONS
from tests.harness import Cluster, metric, wait_until

BASE = 1_700_000_000_000_000


def _sink(cluster: Cluster, name: str) -> tuple[str, str]:
    """A stream ``<name>.in`` read by a Parquet sink; returns (stream, sink directory)."""
    stream, out = f"{name}.in", os.path.join(cluster.data_dir, f"out-{name}")
    topo = Topology(name)
    add_parquet_sink(topo, f"{name}.sink", stream=stream, path=out, codec="text")
    cluster.client.submit(topo)
    cluster.wait_assigned()
    return stream, out


def _only_marker_arrives(cluster: Cluster, stream: str, out: str) -> None:
    """Nothing of a refused injection arrived: a marker sent afterwards is all the sink holds."""
    with Injector(cluster.masters_arg, stream, f"marker-{stream}") as inj:
        inj.send(b"marker", b"marker", BASE)
    wait_until(lambda: os.path.isdir(out) and spark_bridge.count_rows(out) >= 1, 60, "the marker")
    assert [r["key"] for r in read_rows(out)] == ["marker"]


def test_a_retried_task_sends_nothing_twice(spark: Any, shared_cluster: Cluster) -> None:
    """Partition 0's first attempt crashes after sending part of its rows; Spark retries it.

    The crash comes from the sink's key extractor, which injectors run as they route each
    batch: it ends the task's process at the 750th row, when most of the rows before it were
    sent (in batches of 100) and committed. The rows were hash-partitioned by content first
    into 16 partitions, each sorted, so a retry sends the same producer and sequences: what
    the first attempt committed comes back as duplicates.
    """
    from pyspark.sql import functions as F

    stream, out = "retry.in", os.path.join(shared_cluster.data_dir, "out-retry")
    topo = Topology("retry")
    topo.add_computation("retry.sink", "spark_bridge.parquet_sink:ParquetSink",
                         inputs={stream: "tests.spark.jobs:flaky_key"},
                         params={"path": out, "codec": "text"}, key_ranges=2)
    shared_cluster.client.submit(topo)
    shared_cluster.wait_assigned()
    n = 20_000
    df = (spark.range(n, numPartitions=2)
          .select(F.col("id").cast("string").alias("k"), F.concat(F.lit("v"), F.col("id")).alias("v"),
                  (F.lit(BASE) + F.col("id")).alias("ts")))
    before = sum(metric(w, "millstream_duplicates_dropped") for w in shared_cluster.workers)
    result = spark_bridge.inject(df, stream=stream, key="k", value="v", timestamp="ts",
                                 name="retry", masters=shared_cluster.masters_arg, batch_size=100,
                                 allow_code="tests.spark")
    assert result.records == n and result.partitions == CONTENT_PARTITIONS
    wait_until(lambda: spark_bridge.count_rows(out) >= n, 60, f"{n} rows in the sink")
    rows = read_rows(out)
    assert sorted(r["key"] for r in rows) == sorted(str(i) for i in range(n))
    assert all(r["value"] == f"v{r['key']}" and r["timestamp"] == BASE + int(r["key"]) for r in rows)
    # The first attempt had sent part of partition 0: its retry re-sent those ids, dropped as
    # duplicates. Up to 4 rounds of 100 may still have been in flight when its process ended.
    dups = sum(metric(w, "millstream_duplicates_dropped") for w in shared_cluster.workers) - before
    assert dups >= 300, f"the failed attempt should have committed 350-750 rows before it crashed ({dups})"
    # Re-running the whole injection under the same name sends nothing new either.
    spark_bridge.inject(df, stream=stream, key="k", value="v", timestamp="ts", name="retry",
                        masters=shared_cluster.masters_arg, allow_code="tests.spark")
    with Injector(shared_cluster.masters_arg, stream, "retry-marker", allow_code="tests.spark") as inj:
        inj.send(b"zz-marker", b"", BASE)
    wait_until(lambda: spark_bridge.count_rows(out) >= n + 1, 60, "the marker")
    assert spark_bridge.count_rows(out) == n + 1


def test_ids_do_not_depend_on_partitioning_and_new_data_under_a_reused_name_counts(
        spark: Any, shared_cluster: Cluster) -> None:
    """Review E2: positional ids changed with the partitioning (a shuffle, a re-run on another
    cluster size), losing some rows and doubling others; and a reused name dropped new data."""
    stream, out = _sink(shared_cluster, "content-ids")
    rows = [(f"k{i % 50}", f"v{i % 7}", BASE + i % 13) for i in range(600)]  # many identical rows
    df = spark.createDataFrame(rows, "k string, v string, ts long")
    m = shared_cluster.masters_arg
    spark_bridge.inject(df.repartition(3), stream=stream, key="k", value="v", timestamp="ts",
                        name="daily", masters=m)
    # The same data again under the same name, partitioned differently: nothing new.
    spark_bridge.inject(df.coalesce(1).orderBy("v"), stream=stream, key="k", value="v", timestamp="ts",
                        name="daily", masters=m)
    # New data under the same name (tomorrow's run of a job with a fixed name): all of it counts.
    new = spark.createDataFrame([(f"n{i}", "x", BASE + i) for i in range(40)], "k string, v string, ts long")
    spark_bridge.inject(new, stream=stream, key="k", value="v", timestamp="ts", name="daily", masters=m)
    with Injector(m, stream, "content-ids-marker") as inj:
        inj.send(b"zz-marker", b"", BASE)
    wait_until(lambda: spark_bridge.count_rows(out) >= 641, 60, "641 rows")
    got = read_rows(out)
    assert len(got) == 641
    from collections import Counter

    assert Counter((r["key"], r["value"], r["timestamp"]) for r in got if r["key"].startswith("k")) == \
        Counter(rows)


def test_user_id_column_makes_ids(spark: Any, shared_cluster: Cluster) -> None:
    """With id=, two injections of the same rows under different names and partitionings count once."""
    stream, out = _sink(shared_cluster, "userid")
    rows = [(f"k{i}", f"v{i}", BASE + i, f"event-{i}") for i in range(300)]
    df = spark.createDataFrame(rows, "k string, v string, ts long, eid string")
    m = shared_cluster.masters_arg
    spark_bridge.inject(df.repartition(3), stream=stream, key="k", value="v", timestamp="ts", id="eid",
                        name="first", masters=m)
    spark_bridge.inject(df.coalesce(1), stream=stream, key="k", value="v", timestamp="ts", id="eid",
                        name="second", masters=m)
    with Injector(m, stream, "userid-marker") as inj:
        inj.send(b"zz-marker", b"", BASE)
    wait_until(lambda: spark_bridge.count_rows(out) >= 301, 60, "301 rows")
    assert spark_bridge.count_rows(out) == 301


def test_streaming_query_through_foreach_batch(spark: Any, shared_cluster: Cluster, tmp_path: Any) -> None:
    """Micro-batches inject exactly once; the watermark follows Spark's event-time watermark."""
    from pyspark.sql import functions as F

    stream, out = _sink(shared_cluster, "fb")
    src = str(tmp_path / "src")
    for part in range(3):
        (spark.range(part * 100, part * 100 + 100, numPartitions=2)
         .select(F.col("id").cast("string").alias("k"), F.col("id").cast("string").alias("v"),
                 F.timestamp_micros(F.lit(BASE) + F.col("id") * 1_000_000).alias("ts"))
         .write.mode("append").parquet(src))
    injection = spark_bridge.inject_stream(stream=stream, key="k", value="v", timestamp="ts", name="fb",
                                           masters=shared_cluster.masters_arg)
    try:
        q = (spark.readStream.schema("k string, v string, ts timestamp").option("maxFilesPerTrigger", 2)
             .parquet(src).withWatermark("ts", "10 seconds")
             .writeStream.foreachBatch(injection)
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
        q.awaitTermination(120)
        assert q.exception() is None
        assert sum(r.records for r in injection.results) == 300
        assert len(injection.results) >= 2
        # Spark's watermark after the last batch: the latest event time minus the 10 s delay.
        assert injection.holder.watermark == BASE + 299 * 1_000_000 - 10_000_000
        injector = next(i for i in shared_cluster.client.status()["injectors"] if i["name"] == "fb")
        assert injector["watermark"] == injection.holder.watermark
    finally:
        injection.finish()
        injection.close()
    wait_until(lambda: spark_bridge.count_rows(out) >= 300, 60, "300 rows")
    assert sorted(int(r["key"]) for r in read_rows(out)) == list(range(300))


def _w3_query(spark: Any, cluster: Cluster, tmp_path: Any, name: str,
              watermark_on: str | None) -> tuple[Any, Any]:
    """A streaming query over 50 rows (event time ``ts``, another clock ``ingest``) that
    injects through foreachBatch; returns (injection, started query)."""
    from pyspark.sql import functions as F

    stream, _ = _sink(cluster, name)
    src = str(tmp_path / "src")
    (spark.range(0, 50, numPartitions=1)
     .select(F.col("id").cast("string").alias("k"), F.col("id").cast("string").alias("v"),
             F.timestamp_micros(F.lit(BASE) + F.col("id") * 1_000_000).alias("ts"),
             F.timestamp_micros(F.lit(BASE) - F.col("id") * 1_000_000).alias("ingest"))
     .write.parquet(src))
    injection = spark_bridge.inject_stream(stream=stream, key="k", value="v", timestamp="ts", name=name,
                                           masters=cluster.masters_arg)
    df = spark.readStream.schema("k string, v string, ts timestamp, ingest timestamp").parquet(src)
    if watermark_on is not None:
        df = df.withWatermark(watermark_on, "10 seconds")
    q = (df.writeStream.foreachBatch(injection).option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(availableNow=True).start())
    return injection, q


def test_w3_a_spark_watermark_on_another_column_is_refused(spark: Any, shared_cluster: Cluster,
                                                           tmp_path: Any) -> None:
    """Review W3: the promise would follow the wrong clock. Nothing of the batch is sent."""
    injection, q = _w3_query(spark, shared_cluster, tmp_path, "w3-col", watermark_on="ingest")
    try:
        with pytest.raises(Exception, match=r"watermark is on column 'ingest' but records are stamped "
                                            r"with timestamp='ts'.*withWatermark\('ts', \.\.\.\)"):
            q.awaitTermination(120)
        assert injection.results == [] and injection.holder.watermark == MIN
    finally:
        injection.holder.release()
        injection.close()


def test_w3_without_a_spark_watermark_nothing_is_promised(spark: Any, shared_cluster: Cluster,
                                                          tmp_path: Any) -> None:
    """The batch's largest timestamp is no promise: later batches may hold older rows."""
    injection, q = _w3_query(spark, shared_cluster, tmp_path, "w3-none", watermark_on=None)
    try:
        q.awaitTermination(120)
        assert q.exception() is None
        assert sum(r.records for r in injection.results) == 50
        assert injection.holder.watermark == MIN  # held until finish()
    finally:
        injection.finish()
        injection.close()


# ---------------------------------------------------------------- bad input


@pytest.fixture
def bad_df(spark: Any) -> Any:
    rows = [("a", "x", BASE, "2024-01-01"), ("b", "y", BASE + 1, "2024-01-02"), (None, "z", None, "x"),
            ("c", "w", None, "y")]
    return spark.createDataFrame(rows, "k string, v string, ts long, day string")


def test_missing_column(bad_df: Any, shared_cluster: Cluster) -> None:
    stream, out = _sink(shared_cluster, "missing")
    with pytest.raises(InvalidInputError, match=r"column 'key_col' \(the key\) is not in the DataFrame; "
                                           r"its columns are \['k', 'v', 'ts', 'day'\]"):
        spark_bridge.inject(bad_df, stream=stream, key="key_col", value="v", timestamp="ts", name="m",
                            masters=shared_cluster.masters_arg)
    with pytest.raises(InvalidInputError, match=r"column 'when' \(the timestamp\)"):
        spark_bridge.inject(bad_df, stream=stream, key="k", value="v", timestamp="when", name="m",
                            masters=shared_cluster.masters_arg)
    _only_marker_arrives(shared_cluster, stream, out)


def test_null_key_and_timestamp_counted_before_sending(bad_df: Any, shared_cluster: Cluster) -> None:
    stream, out = _sink(shared_cluster, "nulls")
    with pytest.raises(InvalidInputError, match=r"column 'k' \(the key\) is null in 1 row; "
                                           r"column 'ts' \(the timestamp\) is null in 2 rows\. "
                                           r"Nothing was injected"):
        spark_bridge.inject(bad_df, stream=stream, key="k", value="v", timestamp="ts", name="n",
                            masters=shared_cluster.masters_arg)
    with pytest.raises(InvalidInputError, match=r"^column 'ts' \(the timestamp\) is null in 1 row\. "):
        spark_bridge.inject(bad_df.where("k is not null"), stream=stream, key="k", value="v",
                            timestamp="ts", name="n", masters=shared_cluster.masters_arg)
    # Nothing holds the stream either: the refused injections never registered.
    assert not [i for i in shared_cluster.client.status()["injectors"] if i["name"] == "n" or i["name"].startswith("n/")]
    _only_marker_arrives(shared_cluster, stream, out)


def test_non_numeric_timestamp(bad_df: Any, shared_cluster: Cluster) -> None:
    stream, out = _sink(shared_cluster, "tstype")
    with pytest.raises(InvalidInputError, match=r"column 'day' \(the timestamp\) has type string, which is "
                                           r"not a time"):
        spark_bridge.inject(bad_df, stream=stream, key="k", value="v", timestamp="day", name="t",
                            masters=shared_cluster.masters_arg)
    with pytest.raises(InvalidInputError, match=r"column 'v' \(the timestamp\) has type string"):
        spark_bridge.inject(bad_df, stream=stream, key="k", value="v", timestamp="v", name="t",
                            masters=shared_cluster.masters_arg)
    _only_marker_arrives(shared_cluster, stream, out)


def test_unreachable_master_names_the_address(bad_df: Any, spark: Any) -> None:
    from runtime.cluster import free_port

    address = f"127.0.0.1:{free_port()}"
    good = bad_df.dropna()
    with pytest.raises(MasterUnavailableError, match=re.escape(f"cannot reach a millstream master at {address}")):
        spark_bridge.inject(good, stream="s", key="k", value="v", timestamp="ts", name="u",
                            masters=address, timeout=1.0)
    with pytest.raises(ConfigError, match="'nowhere' is not HOST:PORT"):
        spark_bridge.inject(good, stream="s", key="k", value="v", timestamp="ts", name="u",
                            masters="nowhere")


def test_unknown_stream_sends_nothing(bad_df: Any, shared_cluster: Cluster) -> None:
    with pytest.raises(InjectionError, match="stream 'nobody-reads-this' is unknown"):
        spark_bridge.inject(bad_df.dropna(), stream="nobody-reads-this", key="k", value="v",
                            timestamp="ts", name="u", masters=shared_cluster.masters_arg)


def test_timestamp_types(spark: Any, shared_cluster: Cluster) -> None:
    """Timestamps, zone-less timestamps (read as UTC) and integer microseconds all mean the same."""
    stream, out = _sink(shared_cluster, "tstypes")
    df = spark.sql("select 'a' as k, 'x' as v, timestamp'2024-01-01 00:00:01.5' as t, "
                   "timestamp_ntz'2024-01-01 00:00:01.5' as n, 1704067201500000L as us")
    m = shared_cluster.masters_arg
    for col in ["t", "n", "us"]:
        spark_bridge.inject(df.selectExpr(f"'{col}' as k", "v", col), stream=stream, key="k", value="v", timestamp=col, name=f"ts-{col}",
                            masters=m)
    wait_until(lambda: spark_bridge.count_rows(out) >= 3, 60, "3 rows")
    assert {r["key"]: r["timestamp"] for r in read_rows(out)} == dict.fromkeys(["t", "n", "us"], 1704067201500000)


def test_timestamps_in_seconds_or_milliseconds_are_refused_before_sending(spark: Any,
                                                                         shared_cluster: Cluster) -> None:
    """Review B35: they used to be taken as microseconds, every record stamped in 1970 (or,
    for nanoseconds, thousands of years from now). A negative one counts by its size. The
    conversion the error suggests runs, and gives microseconds (an int column of seconds too,
    widened before it is multiplied)."""
    from pyspark.sql import functions as F

    stream, out = _sink(shared_cluster, "units")
    m = shared_cluster.masters_arg
    for unit, ts, kind, us in (("seconds", 1_700_000_000, "int", 1_700_000_000_000_000),
                               ("milliseconds", -1_700_000_000_000, "long", -1_700_000_000_000_000),
                               ("nanoseconds", 1_700_000_000_123_456_789, "long", 1_700_000_000_123_456)):
        df = spark.createDataFrame([("k", "v", ts)], f"k string, v string, ts {kind}")
        with pytest.raises(InvalidInputError, match=rf"column 'ts' \(the timestamp\) looks like {unit} .*"
                                                    r"Nothing was injected. Convert it: (.*), or pass") as refused:
            spark_bridge.inject(df, stream=stream, key="k", value="v", timestamp="ts", name=f"u-{unit}",
                                masters=m)
        fix = re.search(r"Convert it: (.*), or pass", str(refused.value)).group(1)  # type: ignore[union-attr]
        assert df.withColumn("ts", eval(fix, {"F": F})).collect()[0]["ts"] == us, (unit, fix)
    _only_marker_arrives(shared_cluster, stream, out)


def test_a_stream_of_timestamps_in_seconds_is_refused_before_its_micro_batch_is_sent(
        spark: Any, shared_cluster: Cluster, tmp_path: Any) -> None:
    """The streaming bridge checks an integer timestamp column's unit too, in the job that
    checks each micro-batch's rows: the query stops with the reason, and nothing is sent."""
    from pyspark.sql import functions as F

    stream, out = _sink(shared_cluster, "sunits")
    src = str(tmp_path / "src")
    (spark.range(0, 20, numPartitions=1)
     .select(F.col("id").cast("string").alias("k"), F.col("id").cast("string").alias("v"),
             (F.lit(1_700_000_000) + F.col("id")).alias("ts"))
     .write.parquet(src))
    injection = spark_bridge.inject_stream(stream=stream, key="k", value="v", timestamp="ts", name="sunits",
                                           masters=shared_cluster.masters_arg)
    try:
        q = (spark.readStream.schema("k string, v string, ts long").parquet(src)
             .writeStream.foreachBatch(injection).option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
        with pytest.raises(Exception, match=r"column 'ts' \(the timestamp\) looks like seconds since the epoch"):
            q.awaitTermination(120)
        assert injection.results == []
    finally:
        injection.holder.release()
        injection.close()
    _only_marker_arrives(shared_cluster, stream, out)


def test_a_dataframe_reaches_a_cluster_with_role_tokens_and_required_credentials(
        spark: Any, tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """``security=`` goes from the driver to every task's injector: on a cluster with one token
    per role whose workers require injector credentials, a DataFrame sent with no token is
    refused at the driver's first call, one sent with the injector token but no credential
    is refused by the workers (the job fails with their reason, nothing reaches the sink), and
    one sent with the credential of its name (which covers the partitions' ``name/p<i>``)
    arrives exactly once."""
    from pyspark.sql import functions as F

    from runtime.errors import MillstreamError
    from runtime.security import Security, injector_credential

    tokens = {"worker": "w-token", "injector": "i-token", "operator": "o-token"}
    for role, token in tokens.items():
        monkeypatch.setenv(f"MILLSTREAM_{role.upper()}_TOKEN", token)
    monkeypatch.setenv("MILLSTREAM_REQUIRE_INJECTOR_CREDENTIALS", "1")
    n = 500
    df = (spark.range(n, numPartitions=2)
          .select(F.col("id").cast("string").alias("k"), F.concat(F.lit("v"), F.col("id")).alias("v"),
                  (F.lit(BASE) + F.col("id")).alias("ts")))
    with Cluster(str(tmp_path), workers=2, security=Security(token=tokens["operator"])).running() as c:
        stream, out = _sink(c, "secured")

        def send(security: Security) -> spark_bridge.InjectionResult:
            return spark_bridge.inject(df, stream=stream, key="k", value="v", timestamp="ts", name="secured",
                                       masters=c.masters_arg, timeout=20, security=security)

        with pytest.raises(MillstreamError, match="missing or wrong token"):
            send(Security())
        with pytest.raises(MillstreamError, match="millstream credential NAME"):
            send(Security(token=tokens["injector"]))
        credential = injector_credential(tokens["worker"], "secured")
        result = send(Security(token=tokens["injector"], injector_credential=credential))
        assert result.records == n
        wait_until(lambda: os.path.isdir(out) and spark_bridge.count_rows(out) >= n, 60, f"{n} rows in the sink")
        rows = read_rows(out)
        assert sorted(r["key"] for r in rows) == sorted(str(i) for i in range(n))


def test_daily_loads_with_watermark_max_move_the_stream_on_each_day(spark: Any, shared_cluster: Cluster) -> None:
    """Review of the Spark bridge: each run with watermark="max" left its driver's hold at its
    own end (a fresh incarnation per run, closed, not finished), so the next day's run could
    never move its name, nor the stream, past the first day's last timestamp."""
    stream, _ = _sink(shared_cluster, "daily-max")
    m = shared_cluster.masters_arg
    for day in range(2):
        rows = [(f"k{i}", "v", BASE + day * 10_000 + i) for i in range(20)]
        df = spark.createDataFrame(rows, "k string, v string, ts long")
        result = spark_bridge.inject(df, stream=stream, key="k", value="v", timestamp="ts", name="daily-max",
                                     masters=m, watermark="max")
        assert result.watermark == BASE + day * 10_000 + 19
    [held] = [i for i in shared_cluster.client.status()["injectors"] if i["name"] == "daily-max"]
    assert held["watermark"] == BASE + 10_019, "the second day's run did not move the stream past the first's"


def test_a_watermark_given_as_a_datetime_moves_the_stream_to_its_instant(spark: Any, shared_cluster: Cluster) -> None:
    """``watermark=`` takes an aware ``datetime`` as ``Injector.advance_watermark`` does; one
    without a time zone is refused before anything is sent."""
    stream, out = _sink(shared_cluster, "wm-datetime")
    m = shared_cluster.masters_arg
    df = spark.createDataFrame([("a", "v", BASE)], "k string, v string, ts long")
    with pytest.raises(InvalidInputError, match="watermark= .* has no time zone"):
        spark_bridge.inject(df, stream=stream, key="k", value="v", timestamp="ts", name="wm-dt",
                            masters=m, watermark=datetime.datetime(2023, 11, 14, 22, 15))
    _only_marker_arrives(shared_cluster, stream, out)
    until = datetime.datetime(2023, 11, 14, 22, 15, tzinfo=datetime.UTC)
    result = spark_bridge.inject(df, stream=stream, key="k", value="v", timestamp="ts", name="wm-dt",
                                 masters=m, watermark=until)
    assert result.records == 1 and result.watermark == 1_700_000_100_000_000
    [held] = [i for i in shared_cluster.client.status()["injectors"] if i["name"] == "wm-dt"]
    assert held["watermark"] == 1_700_000_100_000_000


def test_a_value_too_long_is_refused_before_anything_is_sent(spark: Any, shared_cluster: Cluster) -> None:
    """Review of the Spark bridge: an oversized value failed inside its task after the
    partition's earlier rows were sent, and the message said to run the same injection again."""
    stream, out = _sink(shared_cluster, "too-long")
    df = spark.createDataFrame([("a", "x", BASE), ("b", "y" * (16 * 1024 * 1024 + 1), BASE)],
                               "k string, v string, ts long")
    with pytest.raises(InvalidInputError, match="longest value is 16,777,217 bytes as sent, over the limit"):
        spark_bridge.inject(df, stream=stream, key="k", value="v", timestamp="ts", name="too-long",
                            masters=shared_cluster.masters_arg)
    _only_marker_arrives(shared_cluster, stream, out)
