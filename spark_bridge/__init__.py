"""Connecting PySpark to millstream (DESIGN.md §9).

- :func:`inject` sends a DataFrame's rows to a stream, exactly once across
  Spark task retries, holding the stream's watermark until the job completes;
- :func:`inject_stream` does the same for each micro-batch of a Structured
  Streaming query (``foreachBatch``);
- :class:`ParquetSink` (added with :func:`add_parquet_sink`) writes a stream
  to Parquet files exactly once, and :func:`read_stream` reads them back;
- :func:`read_state` returns a computation's per-key state in a savepoint.

See ``docs/spark.md``. Needs the ``spark`` extra: ``pip install 'millstream[spark]'``.
"""

from runtime.extras import require

require("pyarrow", "spark", "the Spark bridge (spark_bridge)")

from spark_bridge.codecs import ValueDecodeError
from spark_bridge.inject import InjectionResult, InvalidInputError, inject, release
from spark_bridge.parquet_sink import ParquetSink, add_parquet_sink
from spark_bridge.read import SinkNotFoundError, count_rows, read_rows, read_stream
from spark_bridge.state import read_state
from spark_bridge.stream import StreamInjection, inject_stream

__all__ = [
    "InjectionResult",
    "InvalidInputError",
    "ParquetSink",
    "SinkNotFoundError",
    "StreamInjection",
    "ValueDecodeError",
    "add_parquet_sink",
    "count_rows",
    "inject",
    "inject_stream",
    "read_rows",
    "read_state",
    "read_stream",
    "release",
]
