"""Injecting a Structured Streaming query, one micro-batch at a time, through ``foreachBatch``.

>>> injection = inject_stream(stream="queries", key="query", value=["query", "user"],   # doctest: +SKIP
...                           timestamp="event_time", name="query-log", masters="127.0.0.1:7070")
>>> q = spark.readStream...withWatermark("event_time", "5 seconds") \\                   # doctest: +SKIP
...         .writeStream.foreachBatch(injection).option("checkpointLocation", ck).start()

Each micro-batch is injected like :func:`~spark_bridge.inject` with ids
seeded by ``<name>/b<batch id>``, so a micro-batch that Spark re-runs after a
failure (same batch id, same rows from its checkpoint) sends nothing twice.
After each batch the injection's watermark advances to Spark's own event-time
watermark (the largest event time seen so far minus the ``withWatermark``
delay: what Spark itself will use for the next batch). The query's watermark
must be on the ``timestamp`` column. Spark's watermark is not a promise: a
row older than it in a later micro-batch is late in millstream (counted, and
processed or dropped as its readers' ``late_records`` says). A query without
``withWatermark`` promises nothing, and the stream stays held until
:meth:`StreamInjection.finish`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from injectors.injector import DEFAULT_BATCH_SIZE, Injector
from runtime.client import parse_addresses
from runtime.security import Security
from spark_bridge.inject import (
    WATERMARK_DELAY_KEY,
    InjectionResult,
    InvalidInputError,
    PartitionInjection,
    check_rows,
    check_stream,
    code_prefixes,
    plan,
    run_incarnation,
    run_partitions,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)


def spark_watermark_column(df: DataFrame) -> tuple[str, int] | None:
    """``(column, delay in microseconds)`` of the query's event-time watermark, if it has one."""
    for f in df.schema.fields:
        delay = (f.metadata or {}).get(WATERMARK_DELAY_KEY)
        if delay is not None:
            return f.name, int(delay) * 1000
    return None


class StreamInjection:
    """A ``foreachBatch`` function that injects every micro-batch (see :func:`inject_stream`)."""

    def __init__(self, *, stream: str, key: str, value: str | Sequence[str] | None, timestamp: str,
                 name: str, masters: str | Iterable[str], id: str | None = None,
                 batch_size: int = DEFAULT_BATCH_SIZE, timeout: float = 60.0, incarnation: str | None = None,
                 allow_code: str | Sequence[str] = (), security: Security = Security()) -> None:
        self.stream = stream
        self.security = security
        self.allow_code = code_prefixes(allow_code)
        self.key = key
        self.value = value
        self.timestamp = timestamp
        self.name = name
        self.id = id
        self.addresses = parse_addresses(masters)
        self.batch_size = batch_size
        self.timeout = timeout
        check_stream(self.addresses, stream, min(timeout, 10.0), security)
        # Created now, before the query starts: from here on the stream's watermark waits for us.
        self.incarnation = run_incarnation(incarnation)
        self.holder = Injector(self.addresses, stream, name, timeout=timeout, incarnation=self.incarnation,
                               allow_code=self.allow_code, security=security)
        self.event_time_max: int | None = None  # of Spark's watermark column, over all batches
        self.results: list[InjectionResult] = []
        self._warned_no_watermark = False
        self._lock = threading.Lock()

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        from pyspark.sql import functions as F

        with self._lock:  # foreachBatch calls come one at a time; be safe anyway
            t0 = time.monotonic()
            p = plan(df, key=self.key, value=self.value, timestamp=self.timestamp, id=self.id)
            spark_wm = spark_watermark_column(df)
            if spark_wm is not None and spark_wm[0] != self.timestamp:
                # Review W3: the promise would follow another clock than the records' times.
                raise InvalidInputError(
                    f"the query's event-time watermark is on column {spark_wm[0]!r} but records "
                    f"are stamped with timestamp={self.timestamp!r}; millstream's watermark would "
                    f"follow the wrong clock. Call withWatermark({self.timestamp!r}, ...) on the "
                    f"timestamp column (nothing of micro-batch {batch_id} was sent)")
            if spark_wm is None and not self._warned_no_watermark:
                self._warned_no_watermark = True
                log.warning("stream %s: the query has no withWatermark(%r, ...), so injection %r "
                            "promises nothing: the stream's watermark stays where it is until "
                            "finish() (docs/spark.md)", self.stream, self.timestamp, self.name)
            extra = []
            if spark_wm is not None:
                col = F.col(spark_wm[0])
                dtype = df.schema[spark_wm[0]].dataType.simpleString()
                extra.append(F.max(F.unix_micros(col) if dtype == "timestamp" else col.cast("bigint")))
            (batch_max, *_) = check_rows(df, p, extra) or [None]
            id_name = f"{self.name}/b{batch_id}"
            task = PartitionInjection(self.addresses, self.stream, self.name, id_name, p.has_id,
                                      self.batch_size, self.timeout, self.incarnation, self.allow_code,
                                      self.security)
            parts = run_partitions(df, p, task)
            n = sum(x[1] for x in parts)
            his = [x[3] for x in parts if x[3] is not None]
            # Spark's watermark (latest event time seen minus the delay) is where Spark's own
            # stateful operators stop waiting; it is not a promise that no older row will
            # come (review W3): one that does is late in millstream, counted and handled as its
            # readers' late_records says. Without withWatermark there is no promise at all:
            # the stream is held until finish() (the largest time sent so far would be a
            # promise Spark never made).
            if spark_wm is not None:
                if batch_max is not None:
                    self.event_time_max = max(self.event_time_max or batch_max, int(batch_max))
                if self.event_time_max is not None:
                    self.holder.advance_watermark(self.event_time_max - spark_wm[1])
            los = [x[2] for x in parts if x[2] is not None]
            result = InjectionResult(id_name, n, len(parts), min(los) if los else None,
                                     max(his) if his else None, self.holder.watermark,
                                     time.monotonic() - t0)
            self.results.append(result)
            log.info("micro-batch %d: injected %d records into %s; watermark %d",
                     batch_id, n, self.stream, self.holder.watermark)

    def finish(self) -> None:
        """The query is over for good: release the stream's watermark (to the end of time)."""
        self.holder.finish()

    def close(self) -> None:
        self.holder.close()


def inject_stream(*, stream: str, key: str, value: str | Sequence[str] | None, timestamp: str,
                  name: str, masters: str | Iterable[str], id: str | None = None,
                  batch_size: int = DEFAULT_BATCH_SIZE, timeout: float = 60.0,
                  incarnation: str | None = None, allow_code: str | Sequence[str] = (),
                  security: Security = Security()) -> StreamInjection:
    """A ``foreachBatch`` function injecting a streaming query into ``stream`` exactly once.

    Arguments (``security`` included) as for :func:`~spark_bridge.inject`. Create it before starting
    the query (it checks the masters and the stream, and starts holding the
    stream's watermark); call :meth:`StreamInjection.finish` when the query
    ends for good, so the stream's readers can flush their last timers.
    """
    return StreamInjection(stream=stream, key=key, value=value, timestamp=timestamp, name=name,
                           masters=masters, id=id, batch_size=batch_size, timeout=timeout,
                           incarnation=incarnation, allow_code=allow_code, security=security)
