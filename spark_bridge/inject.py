"""Injecting a Spark DataFrame into a millstream stream, exactly once across Spark retries.

The driver checks everything it can before a single record leaves: the
columns exist and have usable types, no key or timestamp (or id, or value) is
null, the masters answer and some computation reads the stream. Only then
does it register a *holding* injector named ``name`` (which keeps the stream's
low watermark where it is) and run one Spark job in which every partition
sends its rows through its own injector, ``<name>/p<partition>``.

Record ids never depend on where a row lands or in which order (review E2). With a user id
column they come from (stream, id), the record's identity in the stream whatever injection
sends it; such ids are opaque, and receivers keep them for their ``dedup_retention``.
Otherwise the rows are hash-partitioned by their content into a fixed number of partitions
(:data:`CONTENT_PARTITIONS`, whatever the cluster), and each task sorts its partition: every
partition is then a producer of its own, named by the injection and a digest of its rows,
and a row's place in the sorted partition is its sequence (``Injector.send_sequenced``). A
task that Spark retries, or an injection re-run on another cluster, sends the very same
producers and sequences, and receivers drop what they have from one number per producer,
however late the re-run; new data under a reused name makes new producers and is all sent.
When the job completes, the driver finishes the holding injector (or advances
it to a given watermark).
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import re
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from injectors.injector import DEFAULT_BATCH_SIZE, END_OF_TIME, Injector
from runtime.client import Client, parse_addresses
from runtime.errors import InjectionError, MillstreamError
from runtime.imports import CodePolicy
from runtime.record import MAX_KEY_BYTES, MAX_VALUE_BYTES, check_time, derived_id, time_unit
from runtime.routing import RoutingTable
from runtime.security import Security

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

log = logging.getLogger(__name__)
_INTEGRAL = ("tinyint", "smallint", "int", "bigint")
_ERROR_LINE = re.compile(r"^(?:[\w.]+\.)?(\w+(?:Error|Unavailable|Input)): (.+)$", re.M)
#: partitions of an injection without an id column: fixed, so that a re-run on any cluster cuts
#: the rows the same way (each partition is one producer, named by a digest of its rows)
CONTENT_PARTITIONS = 16
#: the metadata Spark attaches to a column that carries a query's event-time watermark
WATERMARK_DELAY_KEY = "spark.watermarkDelayMs"


class InvalidInputError(InjectionError):
    """The DataFrame cannot be injected as asked (a missing column, a bad type, nulls)."""


@dataclass(frozen=True)
class InjectionResult:
    """What one injection (or one micro-batch) sent."""

    name: str
    records: int
    partitions: int
    min_timestamp: int | None
    max_timestamp: int | None
    watermark: int
    seconds: float


# ------------------------------------------------------------------ checking


def _type_of(df: DataFrame, column: str, role: str) -> str:
    if not isinstance(column, str):
        raise InvalidInputError(f"{role}= must be a column name (a str), got {column!r}")
    if column not in df.columns:
        raise InvalidInputError(
            f"column {column!r} (the {role}) is not in the DataFrame; its columns are "
            f"{df.columns}. Pass {role}=<one of them>")
    return str(df.schema[column].dataType.simpleString())


def _key_expr(df: DataFrame, column: str) -> Column:
    from pyspark.sql import functions as F

    t = _type_of(df, column, "key")
    c = F.col(column)
    if t == "string":
        return F.encode(c, "UTF-8")
    if t == "binary":
        return c
    if t in _INTEGRAL:
        return F.encode(c.cast("string"), "UTF-8")
    raise InvalidInputError(
        f"column {column!r} (the key) has type {t}; keys must be string, binary or integer. "
        f"Cast it, e.g. F.col({column!r}).cast('string')")


def _value_expr(df: DataFrame, value: str | Sequence[str] | None) -> tuple[Column, str | None]:
    """The value as binary, and the column to null-check (None for composite values)."""
    from pyspark.sql import functions as F

    if value is None:
        return F.lit(b"").cast("binary"), None
    if isinstance(value, str):
        t = _type_of(df, value, "value")
        c = F.col(value)
        if t == "binary":
            return c, value
        if t == "string":
            return F.encode(c, "UTF-8"), value
        if t.startswith(("struct", "map", "array")):
            return F.encode(F.to_json(c), "UTF-8"), value
        return F.encode(c.cast("string"), "UTF-8"), value
    cols = list(value)
    if not cols:
        raise InvalidInputError("value= is an empty list; name the columns that make up the value")
    for name in cols:
        _type_of(df, name, "value")
    return F.encode(F.to_json(F.struct(*[F.col(name) for name in cols])), "UTF-8"), None


def _timestamp_expr(df: DataFrame, column: str) -> Column:
    from pyspark.sql import functions as F

    t = _type_of(df, column, "timestamp")
    c = F.col(column)
    if t == "timestamp":
        return F.unix_micros(c)
    if t == "timestamp_ntz":  # wall-clock time without a zone: read as UTC, whatever the session's
        return F.expr(f"unix_date(cast(`{column}` as date)) * 86400000000 + hour(`{column}`) * 3600000000"
                      f" + minute(`{column}`) * 60000000"
                      f" + cast(date_part('SECOND', `{column}`) * 1000000 as bigint)")
    if t in _INTEGRAL:
        return c.cast("bigint")
    raise InvalidInputError(
        f"column {column!r} (the timestamp) has type {t}, which is not a time: use a timestamp "
        "column or an integer column of microseconds since the Unix epoch, e.g. "
        f"F.to_timestamp(F.col({column!r})) or F.col({column!r}).cast('long') * 1_000_000")


def _id_expr(df: DataFrame, column: str) -> Column:
    from pyspark.sql import functions as F

    t = _type_of(df, column, "id")
    c = F.col(column)
    if t == "binary":
        return c
    if t == "string":
        return F.encode(c, "UTF-8")
    if t in _INTEGRAL:
        return F.encode(c.cast("string"), "UTF-8")
    raise InvalidInputError(f"column {column!r} (the id) has type {t}; ids must be string, binary or integer")


@dataclass(frozen=True)
class Plan:
    """The checked projection a DataFrame is injected through."""

    columns: list[Column]
    null_checked: dict[str, str]  # column -> role
    has_id: bool
    integer_time: str | None = None  # the timestamp column, if it holds integers (unit unknown)
    sizes: tuple[Column, ...] = ()   # the longest key and value, in bytes, as sent


def plan(df: DataFrame, *, key: str, value: str | Sequence[str] | None, timestamp: str,
         id: str | None = None) -> Plan:
    """Check the columns and their types (no Spark job) and build the projection."""
    from pyspark.sql import functions as F

    k = _key_expr(df, key)
    cols = [k.alias("k")]
    v, v_col = _value_expr(df, value)
    cols += [v.alias("v"), _timestamp_expr(df, timestamp).alias("t")]
    checked = {key: "key", timestamp: "timestamp"}
    if v_col is not None:
        checked.setdefault(v_col, "value")
    if id is not None:
        cols.append(_id_expr(df, id).alias("i"))
        checked.setdefault(id, "id")
    integer = timestamp if _type_of(df, timestamp, "timestamp") in _INTEGRAL else None
    return Plan(cols, checked, id is not None, integer, (F.max(F.octet_length(k)), F.max(F.octet_length(v))))


# What turns each into microseconds: widened first (an int column of seconds times a million
# overflows), and nanoseconds divided as integers (a Column has no //; a double loses them).
_FIX = {"seconds": "F.col({c!r}).cast('long') * 1_000_000", "milliseconds": "F.col({c!r}).cast('long') * 1_000",
        "nanoseconds": "F.expr('`{c}` div 1000')"}


def refuse_time_unit(column: str, lowest: int | None, highest: int | None) -> None:
    """Refuse an integer timestamp column whose values (``lowest`` to ``highest``) look like
    seconds, milliseconds or nanoseconds since the epoch, not microseconds (review B35: every
    record stamped in 1970, or past the year 5000)."""
    biggest = max(abs(lowest or 0), abs(highest or 0))
    unit = time_unit(biggest)
    if unit is not None:
        when = "in 1970 and be late" if unit != "nanoseconds" else "thousands of years from now"
        raise InvalidInputError(
            f"column {column!r} (the timestamp) looks like {unit} since the epoch (largest value "
            f"{biggest}), not microseconds: every record would be stamped {when}. Nothing was "
            f"injected. Convert it: {_FIX[unit].format(c=column)}, or pass a timestamp column")


def check_rows(df: DataFrame, p: Plan, extra: Iterable[Column] = ()) -> list[Any]:
    """Count nulls in the checked columns, find the longest key and value as they would be
    sent and an integer timestamp column's range (one Spark job); raise if any is null or
    too long, or the timestamps look like another unit than microseconds. Returns
    ``extra``'s values."""
    from pyspark.sql import functions as F

    checked = p.null_checked
    aggs = [F.sum(F.col(c).isNull().cast("long")).alias(f"n{i}") for i, c in enumerate(checked)]
    extra = list(extra)
    # An integer timestamp column's range, in the same job: its unit (not abs(): ANSI mode
    # raises on the 64 bits' lowest value)
    if p.integer_time is not None:
        extra += [F.min(F.col(p.integer_time)), F.max(F.col(p.integer_time))]
    row = df.agg(*aggs, *p.sizes, *extra).collect()[0]
    bad = [(c, role, int(row[i] or 0)) for i, (c, role) in enumerate(checked.items()) if row[i]]
    if bad:
        what = "; ".join(f"column {c!r} (the {role}) is null in {n} row{'s' * (n != 1)}"
                         for c, role, n in bad)
        raise InvalidInputError(
            f"{what}. Nothing was injected: every record needs a key and a timestamp; filter "
            f"those rows out (df.dropna(subset=[...])) or fill them (df.fillna(...)) first")
    sizes = [int(row[len(checked) + i] or 0) for i in range(len(p.sizes))]
    for what, longest, limit in zip(("key", "value"), sizes, (MAX_KEY_BYTES, MAX_VALUE_BYTES), strict=True):
        if longest > limit:
            raise InvalidInputError(
                f"the longest {what} is {longest:,} bytes as sent, over the limit of {limit:,}. Nothing was "
                f"injected; filter those rows out (F.octet_length(...) <= {limit}) or store large objects "
                "elsewhere and send a reference")
    values = [row[len(checked) + len(p.sizes) + i] for i in range(len(extra))]
    if p.integer_time is not None:
        *values, lowest, highest = values
        refuse_time_unit(p.integer_time, lowest, highest)
    return values


def check_stream(masters: str | Iterable[str], stream: str, timeout: float, security: Security = Security()) -> None:
    """Raise unless a master answers and some running computation reads ``stream``."""
    with Client(masters, timeout=timeout, security=security) as client:
        table = RoutingTable(client.routing())
    if not table.has_subscribers(stream):
        raise InjectionError(
            f"stream {stream!r} is unknown: no running computation reads it; submit a topology "
            "with it among its inputs first (nothing was sent)")


# --------------------------------------------------------------- the tasks


@dataclass(frozen=True)
class PartitionInjection:
    """What every Spark task runs: send its partition through its own injector, then finish it.

    A module-level class (not a closure) so tasks import it rather than unpickle code.
    """

    masters: list[str]
    stream: str
    name: str       # the injection: names the partition injectors
    id_name: str    # seeds positional ids (the injection name, plus the micro-batch id)
    has_id: bool
    batch_size: int
    timeout: float
    incarnation: str  # the run's (run_incarnation): a retried task replaces its failed attempt
    allow_code: tuple[str, ...] = ()  # where the stream's key extractors may come from
    # TLS, token and injector credential, as the driver's (its file paths must hold on executors)
    security: Security = Security()

    def __call__(self, index: int, rows: Iterable[Any]) -> Iterator[tuple[int, int, int | None, int | None]]:
        # One incarnation per partition and run: a retried task replaces the failed attempt's
        # hold (it sends the same ids), rather than leaving it behind for ever.
        inj = Injector(self.masters, self.stream, f"{self.name}/p{index}",
                       batch_size=self.batch_size, timeout=self.timeout, incarnation=self.incarnation,
                       allow_code=self.allow_code, security=self.security)
        inj.check_units = False  # (on executors, unread; the driver checks an integer column: check_rows)
        n, lo, hi = 0, None, None
        try:
            if self.has_id:
                stream_b = self.stream.encode()
                for row in rows:
                    ts = int(row[2])
                    inj.send(bytes(row[0]), bytes(row[1]), ts, id=derived_id(b"spark-id", stream_b, bytes(row[3])))
                    n += 1
                    lo = ts if lo is None or ts < lo else lo
                    hi = ts if hi is None or ts > hi else hi
            else:
                # The partition, sorted, is one producer: its name says which rows it holds.
                content = sorted((bytes(row[0]), bytes(row[1]), int(row[2])) for row in rows)
                digest = hashlib.blake2b(digest_size=16)
                for key, value, ts in content:
                    digest.update(b"%d %d %d " % (len(key), len(value), ts) + key + value)
                producer = f"{self.id_name}|{digest.hexdigest()}"
                for n, (key, value, ts) in enumerate(content, start=1):
                    inj.send_sequenced(producer, n, key, value, ts)
                    lo = ts if lo is None or ts < lo else lo
                    hi = ts if hi is None or ts > hi else hi
            inj.finish()  # this partition no longer holds the watermark
        finally:
            inj.close()
        yield index, n, lo, hi


def code_prefixes(allow_code: str | Sequence[str]) -> tuple[str, ...]:
    """``allow_code`` as a tuple (checked here, on the driver, before any task starts)."""
    given = allow_code.split(",") if isinstance(allow_code, str) else allow_code
    prefixes = tuple(p.strip() for p in given if p.strip())
    CodePolicy.parse(",".join(prefixes))
    return prefixes


_PARTITION = re.compile(r"/p\d+")  # a partition injector's name after the injection's


def run_incarnation(given: str | None) -> str:
    """The incarnation a run's injectors register under: ``given``, or one of its own that
    nobody else can guess. Another holder of the injector token reporting under a known
    incarnation would replace this run's hold (review N9: the bridge's fixed ones let any
    loader jump another team's stream to the end of time)."""
    return uuid.uuid4().hex if given is None else given


def _task_error(e: BaseException) -> str:
    text = str(e)
    found = _ERROR_LINE.findall(text)
    if found:
        cls, msg = found[-1]
        return f"{cls}: {msg.strip()}"
    return text.strip().splitlines()[0][:500] if text.strip() else type(e).__name__


def run_partitions(df: DataFrame, p: Plan, task: PartitionInjection) -> list[tuple[int, int, int | None, int | None]]:
    """Run the injection job; a failed job becomes an :class:`InjectionError` (no Py4J trace)."""
    selected = df.select(*p.columns)
    if not task.has_id:
        # Partitions that hold the same rows whatever the cluster, the input's partitioning or
        # a retry: hash partitioning by the row's content (Spark's Murmur3 of the values,
        # stable across runs) into a fixed number of partitions.
        selected = selected.repartition(CONTENT_PARTITIONS, *selected.columns)
    try:
        return list(selected.rdd.mapPartitionsWithIndex(task).collect())
    except MillstreamError:
        raise
    except Exception as e:  # Py4JJavaError / PythonException from the executors
        err = InjectionError(
            f"injection {task.id_name!r} into {task.stream!r} failed in a Spark task after Spark's "
            f"retries: {_task_error(e)}. Records already sent stay (once each); run the same "
            "injection again (same name, same data) to complete it exactly once -- until then it "
            "holds the stream's watermark (pass the same incarnation= for the re-run to take over "
            "this run's hold, else release it: spark_bridge.release)")
        err.spark_error = e  # type: ignore[attr-defined]
        raise err from None


def _summary(name: str, parts: list[tuple[int, int, int | None, int | None]], watermark: int,
             t0: float) -> InjectionResult:
    los = [p[2] for p in parts if p[2] is not None]
    his = [p[3] for p in parts if p[3] is not None]
    return InjectionResult(name, sum(p[1] for p in parts), len(parts), min(los) if los else None,
                           max(his) if his else None, watermark, time.monotonic() - t0)


# -------------------------------------------------------------- the driver


def inject(df: DataFrame, *, stream: str, key: str, value: str | Sequence[str] | None,
           timestamp: str, name: str, masters: str | Iterable[str], id: str | None = None,
           watermark: int | datetime.datetime | str = "finish", batch_size: int = DEFAULT_BATCH_SIZE,
           timeout: float = 60.0, incarnation: str | None = None,
           allow_code: str | Sequence[str] = (), security: Security = Security()) -> InjectionResult:
    """Send every row of ``df`` to ``stream`` as one record, exactly once.

    - ``key``: a string, binary or integer column; ``timestamp``: a timestamp
      column, or an integer column of microseconds since the epoch (event time).
    - ``value``: a column (string and binary as they are, others as text or
      JSON), a list of columns (sent as one JSON object), or ``None`` (empty).
    - ``name`` names the injection: record ids derive from it and the content
      of the row's partition (the rows are hash-partitioned by content into 16,
      and each partition, sorted, is one producer), or from the ``id`` column.
      Re-running the same injection on the same rows -- or Spark retrying a
      task, on any partitioning -- sends nothing twice, while new data under the
      same name is all sent. A re-run on rows that changed (a file added to the
      input, a sample) sends every row of each partition that changed again,
      old rows included: give such inputs an ``id`` column.
    - ``watermark``: after the job, ``"finish"`` releases the stream (nothing
      more will come from this injection); ``"max"`` advances it to the
      largest timestamp sent, an int to that time, and the run then retires
      (``Injector.retire``): the stream is held there while no next injection
      under ``name`` runs, whose promises count while it does.
    - ``incarnation``: what this run's holds are registered under (at most 64
      printable characters). By default a fresh, unguessable one per run, so a
      failed run's hold stays until :func:`release`; pass a value of your own,
      kept secret and the same on a re-run, for a re-run to replace the failed
      run's holds instead.
    - ``allow_code``: module prefixes the stream's key extractors may be loaded
      from on the executors besides millstream's own (as ``Injector``).
    - ``security``: TLS, the injector token and the injector credential, as for
      an ``Injector`` (a credential for ``name`` covers the partitions'
      injectors, ``name/p<i>``); the executors use the same, so certificate
      paths must be readable on them.

    Raises :class:`InvalidInputError` (before sending anything) for a missing
    column, an unusable type or nulls; :class:`~runtime.errors.MasterUnavailableError`
    naming the addresses if no master answers; :class:`InjectionError` if the
    stream has no reader or the Spark job fails.
    """
    t0 = time.monotonic()
    if not isinstance(name, str) or not name:
        raise InvalidInputError("name= must be a non-empty string: it names the injection and seeds its ids")
    addresses = parse_addresses(masters)
    p = plan(df, key=key, value=value, timestamp=timestamp, id=id)
    until = None if watermark in ("finish", "max") else check_time(watermark, "watermark=", InvalidInputError)
    check_stream(addresses, stream, min(timeout, 10.0), security)
    check_rows(df, p)
    # From here on this injection holds the stream's watermark (until finished below).
    run = run_incarnation(incarnation)
    holder = Injector(addresses, stream, name, timeout=timeout, incarnation=run, allow_code=allow_code,
                      security=security)
    try:
        task = PartitionInjection(addresses, stream, name, name, p.has_id, batch_size, timeout, run,
                                  code_prefixes(allow_code), security)
        parts = run_partitions(df, p, task)
        result = _summary(name, parts, 0, t0)
        if watermark == "finish":
            holder.finish()
            wm = END_OF_TIME
        else:
            target = result.max_timestamp if until is None else until  # (an int of microseconds, or a datetime)
            if target is not None:
                holder.advance_watermark(target)
            wm = holder.watermark
            holder.retire()  # the run is over: its promise holds until the next run under the name
        log.debug("injected %d records from %d partitions into %s as %r",
                 result.records, result.partitions, stream, name)
        return InjectionResult(result.name, result.records, result.partitions, result.min_timestamp,
                               result.max_timestamp, wm, time.monotonic() - t0)
    finally:
        holder.close()


def release(*, stream: str, name: str, masters: str | Iterable[str], timeout: float = 10.0,
            security: Security = Security()) -> list[str]:
    """Give up on an injection that failed: stop it (and its partitions) holding ``stream``.

    Records it sent stay; records it did not send, and any sent later under the
    same name, may then arrive late. Returns the injector names released.
    """
    with Client(masters, timeout=timeout, security=security) as client:
        known = [i["name"] for i in client.status().get("injectors", [])
                 if i.get("stream") == stream and i["name"].startswith(name)
                 and (i["name"] == name or _PARTITION.fullmatch(i["name"][len(name):]))]
        released = []
        for n in dict.fromkeys(known):
            client.release_injector(n, stream)  # every incarnation under the name
            released.append(n)
    return released
