"""The Parquet sink: a built-in computation that writes a stream to Parquet files, exactly once.

Rows are buffered across commits and *rolled* into one Parquet file per tablet once there
are ``roll_rows`` of them, once the oldest has waited ``roll_s`` seconds (a wall-clock
timer), or when the sink's low watermark reaches the end of time (an event-time timer just
below it, so a finished job's output is complete when its watermark is). A file is named
after the tablet and the position of its first row in everything the tablet ever wrote:
``<computation>-<range>-<first record:016d>.parquet``.

Per batch (``prepare_commit``, right before the batch's atomic commit):

1. unless the batch rolls, its rows are appended to the tablet's hidden *staging file*
   ``.<prefix>.staging-<next>`` as one length-prefixed Arrow IPC stream, then ``fsync``;
2. a roll writes the staged rows and the batch's as one file: a hidden temporary file
   (``.<name>.<random>.tmp``; Spark and pyarrow skip hidden files), ``fsync``, a hard link
   to the final name (which fails if the name exists: no file is ever overwritten), an
   ``fsync`` of the directory; the next staging file is ``.<prefix>.staging-<new next>``;
3. the meta returned -- ``next`` (rows in rolled files), ``prefix``, ``staged`` (committed
   length of the staging file), ``rows`` (rows in it), ``since`` (when its first row came)
   -- is committed in the same RocksDB ``WriteBatch`` as the batch's dedup ids.

When the tablet opens (``restore``) it claims its output (an :class:`OutputFence`, which every
later write checks: an older owner can write nothing more) and forgets what its committed
meta does not cover: files at or past ``next``, temporary files, staging files of other
generations, and the staging file's tail past ``staged``. That all belongs to a batch whose
commit never happened; the batch is redelivered and written again, under the same names.
A staging file made stale by a roll is removed by the next batch (the roll's commit is then
known) or the next open.

A fresh sink (nothing committed) leaves files an earlier sink of the same name left in the
directory alone and writes under a new generation of its prefix (see ``restore``).
A merge of the sink's key ranges keeps only the left range's staged rows (docs/spark.md).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from injectors import END_OF_TIME
from runtime.computation import Context, TimeDomain
from runtime.durable import sync_dir
from runtime.errors import MillstreamError, TopologyError
from runtime.outputfiles import OutputFence, fence_token, uncommitted_runs
from runtime.record import Record
from runtime.sinks import Sink
from runtime.topology import Topology
from spark_bridge.codecs import Codec

log = logging.getLogger(__name__)
DESCRIPTOR = "_millstream_sink.json"
_SUFFIX = ".parquet"
DEFAULT_ROLL_ROWS = 1_000_000
DEFAULT_ROLL_S = 5.0
ROLL_TAG = "parquet-sink.roll"  # wall clock: the oldest staged row has waited roll_s
END_TAG = "parquet-sink.end"    # event time: the sink's input is finished
_LEN = 8                        # bytes of a staged entry's length prefix


def file_prefix(tablet: str) -> str:
    """``"sink/3"`` -> ``"sink-3"``: the file-name prefix of one tablet."""
    return tablet.replace("/", "-")


def roll_policy(roll_rows: object, roll_s: object) -> tuple[int, float]:
    """``roll_rows`` and ``roll_s`` (numbers, or their text in params), checked."""
    try:
        rows = int(str(roll_rows))
    except ValueError:
        rows = 0
    if rows < 1:
        raise TopologyError(f"parquet sink: roll_rows={roll_rows!r} is not a whole number of rows >= 1; "
                            f"pass e.g. roll_rows={DEFAULT_ROLL_ROWS} (1 writes one file per batch)")
    try:
        seconds = float(str(roll_s))
    except ValueError:
        seconds = math.nan
    if not 0 < seconds < math.inf:
        raise TopologyError(f"parquet sink: roll_s={roll_s!r} is not a number of seconds > 0; pass e.g. "
                            f"roll_s={DEFAULT_ROLL_S:g} (rows become visible at most about that long after they come)")
    return rows, seconds


def _concat(tables: list[pa.Table]) -> pa.Table:
    """The staged batches as one table. Fields inferred from JSON may differ from batch to
    batch: a field holding longs and doubles becomes double, any other mix text (as within
    one batch, see Codec), and a batch without the field has nulls there."""
    if all(t.schema.equals(tables[0].schema) for t in tables):
        return pa.concat_tables(tables)
    fields: dict[str, pa.Field] = {}
    kinds: dict[str, set[pa.DataType]] = {}
    for t in tables:
        for f in t.schema:
            fields.setdefault(f.name, f)
            seen = kinds.setdefault(f.name, set())
            if t.column(f.name).null_count < t.num_rows:
                seen.add(f.type)
    for name, seen in kinds.items():
        if all(t.schema.field(name) == fields[name] for t in tables if name in t.column_names):
            continue  # the same everywhere it is
        typ = seen.pop() if len(seen) == 1 else pa.float64() if seen == {pa.int64(), pa.float64()} else pa.string()
        fields[name] = pa.field(name, typ)
    schema = pa.schema(list(fields.values()))
    return pa.concat_tables([
        pa.Table.from_arrays([t.column(f.name).cast(f.type) if f.name in t.column_names
                              else pa.nulls(t.num_rows, f.type) for f in schema], schema=schema)
        for t in tables])


def write_descriptor(directory: str, codec: Codec, stream: str | None = None) -> None:
    """Record the sink's codec next to its files, so readers know the columns' types."""
    doc = {"format": 1, **codec.params(), "spark_schema": codec.spark_ddl()}
    if stream:
        doc["stream"] = stream
    path = os.path.join(directory, DESCRIPTOR)
    data = json.dumps(doc, sort_keys=True)
    try:
        with open(path) as f:
            if f.read() == data:
                return
    except OSError:
        pass
    tmp = os.path.join(directory, f".{DESCRIPTOR}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "w") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class ParquetSink(Sink):
    """Writes its input to ``<path>/<tablet>-<first record>.parquet`` files of many batches each.

    Params: ``path`` (the directory, required), ``codec`` (``bytes`` | ``text``
    | ``json``; default ``bytes``), ``key_codec`` (``text`` | ``bytes``),
    ``fields`` (``"name:type,..."`` for ``json``), ``roll_rows`` and ``roll_s``
    (when rows buffered so far go to a file). See :func:`add_parquet_sink`.
    """

    local_paths = ("path",)

    def setup(self, params: Mapping[str, str]) -> None:
        super().setup(params)
        if not params.get("path"):
            raise TopologyError("ParquetSink needs params={'path': DIRECTORY}")
        self.dir = os.path.abspath(params["path"])
        self.codec = Codec.from_params(params)
        self.roll_rows, roll_s = roll_policy(params.get("roll_rows", DEFAULT_ROLL_ROWS),
                                             params.get("roll_s", DEFAULT_ROLL_S))
        self.roll_us = int(roll_s * 1e6)
        self._rows: list[dict[str, Any]] = []
        self._next = 0             # rows in rolled files: the next file's first record
        self._prefix = ""
        self._staged = 0           # committed bytes of the staging file
        self._staged_rows = 0      # ... and the rows they hold
        self._since: int | None = None  # wall clock (µs) of the first row not rolled yet
        self._due = False          # a timer says: roll what there is at this batch's commit
        self._armed = False        # the roll timer of the current staging generation is set
        self._end_armed = False    # the end-of-time timer is set (once per open)
        self._stale: str | None = None  # a staging file a roll made stale, once that commits
        self._prepared = False
        self._fence = OutputFence(self.dir, "", 0)

    def restore(self, tablet: str, meta: bytes | None, token: int = 0, absorbed: Sequence[bytes] = (),
                uncommitted: Mapping[str, int] | None = None) -> None:
        """The tablet opened: forget output its committed meta does not cover.

        Only files this tablet wrote are ever removed (review E4). With nothing committed
        and files of the same name already there (an earlier cluster's output, a lost state
        directory), they are left alone and this tablet writes under a new generation,
        ``<tablet>.g<n>-...``; a ``.<prefix>.uncommitted`` marker tells its own uncommitted
        first files (a crash before the first commit) from someone else's.
        """
        base = file_prefix(tablet)
        os.makedirs(self.dir, exist_ok=True)
        write_descriptor(self.dir, self.codec)
        for other, last in (uncommitted or {}).items():
            self._take_back(other, last, token)
        self._rows = []
        self._prepared = self._due = self._armed = self._end_armed = False
        self._stale = None
        doc = json.loads(meta) if meta else {}
        if meta:
            self._next, self._prefix = int(doc["next"]), str(doc.get("prefix", base))
        else:
            self._next, self._prefix = 0, self._free_prefix(base, token)
            open(self._marker(), "ab").close()
        self._staged, self._staged_rows = int(doc.get("staged", 0)), int(doc.get("rows", 0))
        self._since = doc.get("since")
        # Claim the output first: an older owner still finishing a batch can write nothing now.
        self._fence = OutputFence(self.dir, self._prefix, token)
        with self._fence.hold(claim=True):
            if meta:  # committed: its marker says nothing true any more (an idle tablet kept it)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._marker())
            self._cut_staging(tablet)
            self._remove_uncommitted(tablet)
        for settled in absorbed:
            self._settle(tablet, settled, token)
        base = file_prefix(tablet)
        if self._staged_rows and self._prefix != base and not self._prefix.startswith(base + ".g"):
            # This range was made by a split or merge and goes on with an older range's output:
            # the timers that would roll the rows it inherited staged may have gone with their
            # keys to the other half, so they go to a file now. The file is exactly the
            # committed staged rows; if the tablet opens again before a commit, it is removed
            # (past ``next``) and made again.
            self._roll(self._read_staged(), self._staged_rows)

    def _settle(self, tablet: str, meta: bytes, token: int) -> None:
        """A range merged into this one had committed rows staged, not rolled: roll them into
        the file its meta names (``<its prefix>-<its next>``), under its prefix's fence, which
        this tablet's token now holds. The merged range goes on under this tablet's prefix and
        that meta never changes, so settling again on a later open finds the file made and
        keeps it (:meth:`_cut_staging`)."""
        other = ParquetSink()
        other.setup(self.params)
        other.restore(tablet, meta, token)  # (rolls them itself: its prefix is not this tablet's)
        rows = int(json.loads(meta).get("rows", 0))
        if other._staged_rows:
            other._roll(other._read_staged(), other._staged_rows)
        if other._stale:  # the staging file rolled: gone, so that a later open keeps the file
            with other._fence.hold(), contextlib.suppress(FileNotFoundError):
                os.unlink(other._stale)
            log.info("parquet sink %s: wrote the %d rows a merged range had staged as %s", tablet, rows,
                     other.file_name(other._next - rows))

    def _take_back(self, tablet: str, last: int, token: int) -> None:
        """A range this one replaced that never committed (a first batch written, its commit
        failed, then split or merged before it opened again; ``last``: the token it last held):
        its marked first files, as its own reopen would take them back, go under its fence
        claimed with this tablet's token. Its records come here again."""
        other = ParquetSink()
        other.setup(self.params)
        for prefix in uncommitted_runs(self.dir, file_prefix(tablet), last):
            other._prefix, other._next = prefix, 0
            with OutputFence(self.dir, prefix, token).hold(claim=True):
                other._remove_uncommitted(tablet)
                for path in (other._staging(), other._marker()):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
                sync_dir(self.dir)

    def _remove_uncommitted(self, tablet: str) -> None:
        final = re.compile(re.escape(self._prefix) + r"-(\d{16})" + re.escape(_SUFFIX) + "$")
        temp = re.compile(r"^\." + re.escape(self._prefix) + r"-\d{16}" + re.escape(_SUFFIX) + r"\..*\.tmp$")
        staging = re.compile(r"\." + re.escape(self._prefix) + r"\.staging-(\d+)")
        removed = []
        for name in os.listdir(self.dir):
            m = final.fullmatch(name)
            s = staging.fullmatch(name)
            if (m and int(m.group(1)) >= self._next) or temp.match(name) or (s and int(s.group(1)) != self._next):
                os.unlink(os.path.join(self.dir, name))
                removed.append(name)
        if removed:
            sync_dir(self.dir)
            log.info("parquet sink %s: removed %d uncommitted files: %s", tablet, len(removed), removed[:5])

    def _cut_staging(self, tablet: str) -> None:
        """Cut the staging file back to its committed length: the tail is a batch to be redelivered."""
        path = self._staging()
        size = os.path.getsize(path) if os.path.exists(path) else 0
        if size < self._staged:
            self._take_back_rolled(tablet)
        elif size > self._staged:
            with open(path, "r+b") as f:
                f.truncate(self._staged)
                os.fsync(f.fileno())

    def _take_back_rolled(self, tablet: str) -> None:
        """The committed staging file is gone: it was rolled after this meta was committed (a
        savepoint restored over later output). Its rows are the first rows of the file it was
        rolled into, in order: that file is cut to just them and counts as rolled now (again
        on a later open at the same meta: the cut file then holds exactly those rows)."""
        rolled = os.path.join(self.dir, self.file_name(self._next))
        table = pq.read_table(rolled) if os.path.exists(rolled) else None
        if table is None or table.num_rows < self._staged_rows:
            log.error("parquet sink %s: the staging file %s is missing or short, and no file holds its "
                      "%d committed rows: they are lost", tablet, self._staging(), self._staged_rows)
        else:
            if table.num_rows > self._staged_rows:
                tmp = os.path.join(self.dir, f".{os.path.basename(rolled)}.{uuid.uuid4().hex}.tmp")
                with open(tmp, "wb") as f:
                    pq.write_table(table.slice(0, self._staged_rows), f)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, rolled)
                sync_dir(self.dir)
            log.warning("parquet sink %s: rows staged at the committed meta were rolled since; kept "
                        "them as %s", tablet, rolled)
            self._next += self._staged_rows
        self._staged = self._staged_rows = 0
        self._since = None

    def _marker(self) -> str:
        return os.path.join(self.dir, f".{self._prefix}.uncommitted")

    def _staging(self) -> str:
        return os.path.join(self.dir, f".{self._prefix}.staging-{self._next}")

    def _free_prefix(self, base: str, token: int) -> str:
        """``base``, or ``base.g<n>``: the first generation with no files, or only this
        tablet's own uncommitted ones (its marker, under a fence no newer owner claimed: an
        earlier cluster's range that never committed leaves a marker and a fence of its own)."""
        names = os.listdir(self.dir)
        n = 0
        while True:
            prefix = base + (f".g{n}" if n else "")
            if token and fence_token(self.dir, prefix) > token:
                n += 1  # a newer owner's: not ours to claim
                continue
            if f".{prefix}.uncommitted" in names or not any((x.startswith(prefix + "-") and x.endswith(_SUFFIX))
                                                          or x.startswith(f".{prefix}.staging-") for x in names):
                return prefix
            n += 1

    def process_record(self, ctx: Context, record: Record) -> None:
        # Decode first: a value that does not decode raises before anything is buffered,
        # so the runtime's retries and dead-lettering see a clean slate.
        row = self.codec.row(record.key, record.value, record.timestamp)
        if ctx is not None:  # None in unit tests: rolls by roll_rows only
            now = ctx.now()
            if self._since is None:
                self._since = now
            if not self._armed:  # on this record's key; it fires even if no record follows
                ctx.set_timer(ROLL_TAG, min(self._since + self.roll_us, END_OF_TIME - 1), TimeDomain.WALL_TIME)
                self._armed = True
            if not self._end_armed:  # holds the sink's watermark just below the end of time
                ctx.set_timer(END_TAG, END_OF_TIME - 1, TimeDomain.EVENT_TIME)
                self._end_armed = True
            self._due = self._due or now >= self._since + self.roll_us
        self._rows.append(row)

    def process_timer(self, ctx: Context, tag: str, time: int) -> None:
        if tag == END_TAG:
            self._end_armed = False
            self._due = True
        elif tag == ROLL_TAG and self._since is not None and time >= self._since + self.roll_us:
            self._due = True  # (a timer of an earlier generation, rolled by rows, is ignored)

    def file_name(self, first: int) -> str:
        return f"{self._prefix}-{first:016d}{_SUFFIX}"

    def prepare_commit(self) -> bytes:
        """Stage the batch's rows, or roll them with the staged ones into a file; returns the
        meta to commit."""
        if self._prepared:  # a second batch runs only after the first one's commit
            self.committed()
        self._prepared = True
        batch = [self.codec.table(self._rows)] if self._rows else []
        rows = self._staged_rows + len(self._rows)
        self._rows.clear()
        if rows and (rows >= self.roll_rows or self._due):
            self._roll(self._read_staged() + batch, rows)
        elif batch:
            self._stage(batch[0])
        self._due = False
        return json.dumps({"next": self._next, "prefix": self._prefix, "staged": self._staged,
                           "rows": self._staged_rows, "since": self._since}).encode()

    def committed(self) -> None:
        """The last batch's meta is committed and replicated: this tablet's first files are no
        longer only its uncommitted output (a marker left beside committed files made a later
        cluster writing to the same directory remove them), and the staging file it replaced
        is stale."""
        if os.path.exists(self._marker()):
            os.unlink(self._marker())
        if self._stale is not None:
            with self._fence.hold(), contextlib.suppress(FileNotFoundError):
                os.unlink(self._stale)
            self._stale = None

    def _stage(self, table: pa.Table) -> None:
        out = pa.BufferOutputStream()
        with pa.ipc.new_stream(out, table.schema) as writer:
            writer.write_table(table)
        data = out.getvalue().to_pybytes()
        path = self._staging()
        new = self._staged == 0
        with self._fence.hold():
            with open(path, "wb" if new else "ab") as f:
                f.write(len(data).to_bytes(_LEN, "big") + data)
                f.flush()
                os.fsync(f.fileno())
        if new:
            sync_dir(self.dir)
        self._staged += _LEN + len(data)
        self._staged_rows += table.num_rows

    def _read_staged(self) -> list[pa.Table]:
        if not self._staged:
            return []
        with open(self._staging(), "rb") as f:
            data = pa.py_buffer(f.read(self._staged))
        tables, at = [], 0
        while at + _LEN <= data.size:
            n = int.from_bytes(data[at:at + _LEN].to_pybytes(), "big")
            tables.append(pa.ipc.open_stream(data.slice(at + _LEN, n)).read_all())
            at += _LEN + n
        if at != self._staged or sum(t.num_rows for t in tables) != self._staged_rows:
            raise MillstreamError(f"parquet sink: staging file {self._staging()} does not hold the "
                                  f"{self._staged_rows} committed rows in {self._staged} bytes")
        return tables

    def _roll(self, tables: list[pa.Table], rows: int) -> None:
        """Write ``tables`` (``rows`` rows) as the file ``<prefix>-<next>``; start a new staging file."""
        name = self.file_name(self._next)
        final = os.path.join(self.dir, name)
        tmp = os.path.join(self.dir, f".{name}.{uuid.uuid4().hex}.tmp")
        table = _concat(tables)
        assert table.num_rows == rows
        try:
            with open(tmp, "wb") as f:
                pq.write_table(table, f)
                f.flush()
                os.fsync(f.fileno())
            try:
                with self._fence.hold():
                    os.link(tmp, final)
            except FileExistsError:
                # Only a writer that lost the tablet (a zombie past its lease) can have put a
                # file here since restore(); fail the batch, the reopened tablet removes it.
                raise MillstreamError(
                    f"parquet sink: {final} already exists but is not committed; "
                    "the tablet reopens and removes it") from None
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        sync_dir(self.dir)
        if os.path.exists(self._staging()):
            self._stale = self._staging()  # still needed if this commit fails: goes after it
        self._next += rows
        self._staged = self._staged_rows = 0
        self._since = None
        self._armed = False


def add_parquet_sink(topology: Topology, name: str, *, stream: str, path: str, codec: str = "bytes",
                     key_codec: str = "text", fields: str | Mapping[str, str] | None = None,
                     key_ranges: int = 2, roll_rows: int = DEFAULT_ROLL_ROWS,
                     roll_s: float = DEFAULT_ROLL_S) -> Topology:
    """Add a :class:`ParquetSink` named ``name`` reading ``stream`` into ``path``.

    ``fields`` declares the typed columns decoded from JSON object values, e.g.
    ``"query:string,count:long"``. A tablet writes a file once it holds ``roll_rows``
    rows, once its oldest row has waited ``roll_s`` seconds, or when the sink's input
    ends; rows are visible to readers only then. Checked here, before anything is
    submitted. Read the files back with :func:`spark_bridge.read_stream`.
    """
    rows, seconds = roll_policy(roll_rows, roll_s)
    params: dict[str, str] = {"path": os.path.abspath(path), "codec": codec, "key_codec": key_codec,
                              "roll_rows": str(rows), "roll_s": repr(seconds)}
    if fields:
        from spark_bridge.codecs import format_fields, parse_fields

        params["fields"] = format_fields(parse_fields(fields))
    Codec.from_params(params)  # raises TopologyError now rather than on the workers
    return topology.add_computation(name, "spark_bridge.parquet_sink:ParquetSink",
                                    inputs={stream: None}, params=params, key_ranges=key_ranges)
