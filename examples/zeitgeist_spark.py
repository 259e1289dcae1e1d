"""The Spark side of the Zeitgeist demo: generate the query log, and compute the answer in batch.

:func:`generate_log` writes a deterministic search-query log (Zipf-distributed
queries, uniform event times, bounded disorder between event time and arrival
order, planted spikes and dips) as Parquet. :func:`batch_windows` and
:func:`batch_alerts` compute, with Spark SQL alone, the per-second counts and
the alerts that ``examples.zeitgeist`` computes as a stream -- the same rule,
written independently, so the demo can check one against the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from examples.zeitgeist import (
    DIP_DIVISOR,
    DIP_MIN_EXPECTED,
    HISTORY_SECONDS,
    SECOND,
    SPIKE_FACTOR,
    SPIKE_MIN,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

TOPICS = ("weather", "news", "football scores", "stock market", "recipes", "movie times",
          "flights", "election results", "traffic", "lottery numbers", "horoscope", "maps",
          "translate", "music charts", "earthquake", "concert tickets", "olympics", "tax forms",
          "flu symptoms", "world cup", "solar eclipse", "hurricane", "new phone", "gold price",
          "marathon", "train delays", "power outage", "snow day", "box office", "book awards")


@dataclass(frozen=True)
class Anomaly:
    """A planted change of a query's traffic: ``kind`` "spike" (``rate`` extra queries per
    second) or "dip" (only ``rate`` percent of its queries kept), for ``seconds`` seconds
    from ``offset`` seconds into the log."""

    kind: str
    rank: int
    offset: int
    seconds: int
    rate: int


@dataclass(frozen=True)
class LogSpec:
    """Everything that determines the log (same spec, same log, on any machine)."""

    queries: int = 300_000          # before planted spikes and dips
    seconds: int = 120
    vocabulary: int = 400
    zipf_s: float = 1.1
    max_disorder_us: int = 2 * SECOND
    start_second: int = 1_700_000_000
    seed: int = 42
    partitions: int = 4
    anomalies: Sequence[Anomaly] = field(default_factory=lambda: (
        Anomaly("spike", 20, 25, 3, 60),
        Anomaly("spike", 35, 50, 3, 60),
        Anomaly("spike", 60, 75, 3, 60),
        Anomaly("spike", 120, 100, 3, 60),
        Anomaly("dip", 1, 40, 4, 5),
        Anomaly("dip", 3, 65, 4, 5),
        Anomaly("dip", 8, 90, 4, 5),
    ))

    def query_name(self, rank: int) -> str:
        return TOPICS[rank - 1] if rank <= len(TOPICS) else f"topic {rank}"

    def small(self, queries: int, seconds: int, vocabulary: int = 60) -> LogSpec:
        """A smaller log with anomalies scaled into it (for tests)."""
        scale = seconds / self.seconds
        keep = [a for a in self.anomalies if a.rank <= vocabulary]
        return LogSpec(queries=queries, seconds=seconds, vocabulary=vocabulary, zipf_s=self.zipf_s,
                       max_disorder_us=self.max_disorder_us, start_second=self.start_second,
                       seed=self.seed, partitions=self.partitions,
                       anomalies=tuple(Anomaly(a.kind, a.rank, max(HISTORY_SECONDS + 1, int(a.offset * scale)),
                                               a.seconds, a.rate) for a in keep))


def _uniform(seed: int, salt: int):  # noqa: ANN202 - a pyspark Column
    """A deterministic uniform [0, 1) per row id (independent of partitioning)."""
    from pyspark.sql import functions as F

    h = F.xxhash64(F.col("id"), F.lit(seed), F.lit(salt))
    return h.bitwiseAND(F.lit((1 << 53) - 1)).cast("double") / float(1 << 53)


def query_counts(spec: LogSpec) -> list[tuple[int, str, int]]:
    """``(rank, query, rows)``: the Zipf law, rounded so the rows add up to ``spec.queries``."""
    weights = [1.0 / (r ** spec.zipf_s) for r in range(1, spec.vocabulary + 1)]
    total = sum(weights)
    out, given, acc = [], 0, 0.0
    for r, w in enumerate(weights, start=1):
        acc += w / total
        upto = round(acc * spec.queries)
        out.append((r, spec.query_name(r), upto - given))
        given = upto
    return out


def generate_log(spark: SparkSession, path: str, spec: LogSpec = LogSpec()) -> int:
    """Write the log to ``path`` (Parquet, in arrival order); returns its number of rows.

    Query ``r`` (1-based rank) gets ``spec.queries / r**s`` rows, normalised
    (Zipf); each row's event time is uniform over the log's span and its
    arrival is up to ``max_disorder_us`` later. Columns: ``query`` (string),
    ``user`` (long), ``event_time`` (timestamp), ``event_us`` (long,
    microseconds), ``arrival_us`` (long).
    """
    from pyspark.sql import functions as F

    start_us = spec.start_second * SECOND
    span_us = spec.seconds * SECOND
    # Row ids: rows [offset_r, offset_r + n_r) belong to query r.
    ranges, offset = [], 0
    for r, q, n in query_counts(spec):
        ranges.append((r, q, offset, offset + n))
        offset += n
    qdf = spark.createDataFrame(ranges, "rank int, query string, lo long, hi long")
    rows = (qdf.select("rank", "query", F.explode(F.sequence(F.col("lo"), F.col("hi") - 1)).alias("id"))
            .where(F.col("hi") > F.col("lo"))
            .repartition(spec.partitions, "id")
            .withColumn("event_us", F.lit(start_us) + (_uniform(spec.seed, 2) * span_us).cast("long")))
    keep = F.lit(True)
    for a in spec.anomalies:
        if a.kind == "dip":
            lo, hi = start_us + a.offset * SECOND, start_us + (a.offset + a.seconds) * SECOND
            inside = (F.col("rank") == a.rank) & (F.col("event_us") >= lo) & (F.col("event_us") < hi)
            keep = keep & ~(inside & (_uniform(spec.seed, 3) * 100 >= a.rate))
    rows = rows.where(keep).select("id", "query", "event_us")
    next_id = offset
    for i, a in enumerate(spec.anomalies):
        if a.kind != "spike":
            continue
        n = a.rate * a.seconds
        lo = start_us + a.offset * SECOND
        extra = (spark.range(next_id, next_id + n, numPartitions=1)
                 .withColumn("query", F.lit(spec.query_name(a.rank)))
                 .withColumn("event_us", F.lit(lo) + (_uniform(spec.seed, 10 + i) * a.seconds * SECOND)
                             .cast("long")))
        rows = rows.unionByName(extra)
        next_id += n
    log = (rows
           .withColumn("user", (_uniform(spec.seed, 4) * 100_000).cast("long"))
           .withColumn("arrival_us", F.col("event_us")
                       + (_uniform(spec.seed, 5) * spec.max_disorder_us).cast("long"))
           .withColumn("event_time", F.timestamp_micros("event_us"))
           .select("query", "user", "event_time", "event_us", "arrival_us", "id"))
    # In arrival order (ties broken by id, so the file contents are the same on every run).
    log.repartitionByRange(spec.partitions, "arrival_us", "id") \
        .sortWithinPartitions("arrival_us", "id") \
        .drop("id").write.mode("overwrite").parquet(path)
    return int(spark.read.parquet(path).count())


def batch_windows(log: DataFrame) -> DataFrame:
    """``query, second, count``: queries per second of event time."""
    from pyspark.sql import functions as F

    return (log.groupBy("query", F.floor(F.col("event_us") / SECOND).cast("long").alias("second"))
            .agg(F.count("*").alias("count")))


def batch_alerts(windows: DataFrame) -> DataFrame:
    """``query, second, kind, count, expected``: the alert rule over a dense per-second grid."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    bounds = windows.groupBy("query").agg(F.min("second").alias("first"), F.max("second").alias("last"))
    grid = bounds.select("query", "first",
                         F.explode(F.sequence(F.col("first"), F.col("last"))).alias("second"))
    dense = (grid.join(windows, ["query", "second"], "left")
             .withColumn("count", F.coalesce(F.col("count"), F.lit(0)).cast("long")))
    w = Window.partitionBy("query").orderBy("second").rowsBetween(-HISTORY_SECONDS, -1)
    judged = (dense.withColumn("hist", F.collect_list("count").over(w))
              .where(F.col("second") >= F.col("first") + HISTORY_SECONDS)
              .withColumn("expected",
                          F.element_at(F.sort_array("hist"), HISTORY_SECONDS // 2 + 1).cast("long")))
    kind = (F.when(F.col("count") >= SPIKE_FACTOR * F.col("expected") + SPIKE_MIN, F.lit("spike"))
            .when((F.col("expected") >= DIP_MIN_EXPECTED)
                  & (DIP_DIVISOR * F.col("count") < F.col("expected")), F.lit("dip")))
    return (judged.withColumn("kind", kind).where(F.col("kind").isNotNull())
            .select("query", "second", "kind", "count", "expected"))


def planted_found(spec: LogSpec, alerts: Sequence[tuple[str, int, str]]) -> list[tuple[Anomaly, bool]]:
    """For each planted anomaly: is there an alert of its kind, for its query, inside it?"""
    found = set()
    for query, second, kind in alerts:
        found.add((query, second, kind))
    out = []
    for a in spec.anomalies:
        first = spec.start_second + a.offset
        hit = any((spec.query_name(a.rank), s, a.kind) in found for s in range(first, first + a.seconds))
        out.append((a, hit))
    return out
