"""Reading a Parquet sink's committed output back into Spark (or into plain Python)."""

from __future__ import annotations

import json
import os
import re
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq

from runtime.errors import MillstreamError
from spark_bridge.parquet_sink import DESCRIPTOR

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

_FILE = re.compile(r"^[^._].*-\d{16}\.parquet$")


class SinkNotFoundError(MillstreamError):
    """A directory holds no Parquet sink output."""


def _descriptor(path: str) -> dict[str, Any]:
    try:
        with open(os.path.join(path, DESCRIPTOR)) as f:
            return dict(json.load(f))
    except FileNotFoundError:
        raise SinkNotFoundError(
            f"{path} is not a Parquet sink directory (no {DESCRIPTOR}); point read_stream at the "
            "path= of a ParquetSink that has started") from None


def sink_files(path: str) -> list[str]:
    """The sink's data files (committed, or written by a batch whose commit is in flight)."""
    return sorted(os.path.join(path, n) for n in os.listdir(path) if _FILE.match(n))


def read_stream(spark: SparkSession, path: str) -> DataFrame:
    """The records a :class:`~spark_bridge.ParquetSink` wrote under ``path``, as a DataFrame.

    Columns: ``key`` (string, or binary with ``key_codec="bytes"``), ``value``
    (binary, or string for the ``text`` and ``json`` codecs), ``timestamp``
    (a Spark timestamp; ``F.unix_micros("timestamp")`` gives millstream's
    microseconds), then the decoded JSON fields, typed. Files of a batch whose
    commit has not happened yet may be visible for an instant; read after the
    sink's low watermark has passed the event times you need (``millstream
    status``) for a settled answer.
    """
    path = os.path.abspath(path)
    desc = _descriptor(path)
    files = sink_files(path)
    if not files:
        return spark.createDataFrame([], desc["spark_schema"])
    if desc.get("codec") == "json" and not desc.get("fields"):
        # Inferred fields may differ from file to file: let Spark merge them.
        try:
            return spark.read.option("mergeSchema", "true").parquet(*files)
        except Exception as e:  # pyspark's AnalysisException: one line, with what to do
            if "merge" not in str(e).lower():
                raise
            raise MillstreamError(
                f"the sink at {path} infers its JSON fields per file, and its files disagree on a field's "
                f"type (a field null in one file, or int in one and float in another): Spark cannot merge "
                "them. Give the sink its fields (ParquetSink fields=, docs/spark.md) for new files, or read "
                "these with spark_bridge.read_rows") from None
    return spark.read.schema(desc["spark_schema"]).parquet(*files)


def read_rows(path: str) -> list[dict[str, Any]]:
    """The same records as plain Python dicts (``timestamp`` in microseconds), without Spark."""
    path = os.path.abspath(path)
    _descriptor(path)
    rows: list[dict[str, Any]] = []
    for name in sink_files(path):
        table = pq.read_table(name)
        ts = table.column("timestamp").cast("int64").to_pylist()
        # (without the timestamp column: as datetimes, times past the year 9999 do not convert)
        for row, t in zip(table.drop_columns(["timestamp"]).to_pylist(), ts, strict=True):
            row["timestamp"] = t
            rows.append(row)
    return rows


def count_rows(path: str) -> int:
    """How many records the sink's files hold (from Parquet footers; cheap)."""
    if not os.path.isdir(path):
        return 0
    return sum(pq.ParquetFile(f).metadata.num_rows for f in sink_files(path))
