"""The Parquet sink: a built-in computation that writes a stream to Parquet files, exactly once.

Each tablet writes one file per committed batch, named after the tablet and
the position of the batch's first record in everything the tablet ever wrote:
``<computation>-<range>-<first record:016d>.parquet``. The write protocol,
per batch (``prepare_commit``, called right before the batch's atomic commit):

1. write the rows to a hidden temporary file (``.<name>.<random>.tmp``; Spark
   and pyarrow skip hidden files) and ``fsync`` it;
2. hard-link it to its final name -- which fails if the name exists, so no
   file is ever overwritten -- remove the temporary name, ``fsync`` the
   directory;
3. return the new record count, which the runtime commits in the same RocksDB
   ``WriteBatch`` as the batch's dedup ids.

A file is *committed* iff its first record lies below the committed count.
When the tablet opens (``restore``), every file of the tablet at or past the
committed count, and every temporary file, is deleted: they belong to a batch
whose commit never happened, and that batch is redelivered and written again
under the same name. Readers therefore see each record once, in a file whose
name is deterministic.

The directory belongs to the sink: a fresh sink (nothing committed) deletes
files a previous sink of the same computation name left there.
"""

from __future__ import annotations

import json
import logging
import os
import re
import uuid
from collections.abc import Mapping
from typing import Any

import pyarrow.parquet as pq

from runtime.computation import Computation, Context
from runtime.errors import MillstreamError, TopologyError
from runtime.record import Record
from runtime.sinks import OutputFence
from runtime.topology import Topology
from spark_bridge.codecs import Codec

log = logging.getLogger(__name__)
DESCRIPTOR = "_millstream_sink.json"
_SUFFIX = ".parquet"


def file_prefix(tablet: str) -> str:
    """``"sink/3"`` -> ``"sink-3"``: the file-name prefix of one tablet."""
    return tablet.replace("/", "-")


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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


class ParquetSink(Computation):
    """Writes each committed batch of its input to ``<path>/<tablet>-<first record>.parquet``.

    Params: ``path`` (the directory, required), ``codec`` (``bytes`` | ``text``
    | ``json``; default ``bytes``), ``key_codec`` (``text`` | ``bytes``),
    ``fields`` (``"name:type,..."`` for ``json``). See :func:`add_parquet_sink`.
    """

    def setup(self, params: Mapping[str, str]) -> None:
        super().setup(params)
        if not params.get("path"):
            raise TopologyError("ParquetSink needs params={'path': DIRECTORY}")
        self.dir = os.path.abspath(params["path"])
        self.codec = Codec.from_params(params)
        self._rows: list[dict[str, Any]] = []
        self._next = 0
        self._prefix = ""
        self._prepared = False
        self._fence = OutputFence(self.dir, "", 0)

    def restore(self, tablet: str, meta: bytes | None, token: int = 0) -> None:
        """The tablet opened: forget files (and temporaries) its committed meta does not cover.

        Only files this tablet wrote are ever removed (review E4). With nothing committed
        and files of the same name already there (an earlier cluster's output, a lost state
        directory), they are left alone and this tablet writes under a new generation,
        ``<tablet>.g<n>-...``; a ``.<prefix>.uncommitted`` marker tells its own uncommitted
        first files (a crash before the first commit) from someone else's.
        """
        base = file_prefix(tablet)
        os.makedirs(self.dir, exist_ok=True)
        write_descriptor(self.dir, self.codec)
        self._prepared = False
        if meta:
            doc = json.loads(meta)
            self._next, self._prefix = int(doc["next"]), str(doc.get("prefix", base))
        else:
            self._next, self._prefix = 0, self._free_prefix(base)
            open(self._marker(), "ab").close()
        # Claim the output first: an older owner still finishing a batch can link no file now.
        self._fence = OutputFence(self.dir, self._prefix, token)
        with self._fence.hold(claim=True):
            self._remove_uncommitted(tablet)

    def _remove_uncommitted(self, tablet: str) -> None:
        final = re.compile(re.escape(self._prefix) + r"-(\d{16})" + re.escape(_SUFFIX) + "$")
        temp = re.compile(r"^\." + re.escape(self._prefix) + r"-\d{16}" + re.escape(_SUFFIX) + r"\..*\.tmp$")
        removed = []
        for name in os.listdir(self.dir):
            m = final.fullmatch(name)
            if (m and int(m.group(1)) >= self._next) or temp.match(name):
                os.unlink(os.path.join(self.dir, name))
                removed.append(name)
        if removed:
            _fsync_dir(self.dir)
            log.info("parquet sink %s: removed %d uncommitted files: %s", tablet, len(removed), removed[:5])

    def _marker(self) -> str:
        return os.path.join(self.dir, f".{self._prefix}.uncommitted")

    def _free_prefix(self, base: str) -> str:
        """``base``, or ``base.g<n>``: the first generation with no files, or only this
        tablet's own uncommitted ones."""
        names = os.listdir(self.dir)
        n = 0
        while True:
            prefix = base + (f".g{n}" if n else "")
            ours = f".{prefix}.uncommitted" in names
            if ours or not any(x.startswith(prefix + "-") and x.endswith(_SUFFIX) for x in names):
                return prefix
            n += 1

    def process_record(self, ctx: Context, record: Record) -> None:
        # Decode first: a value that does not decode raises before anything is buffered,
        # so the runtime's retries and dead-lettering see a clean slate.
        self._rows.append(self.codec.row(record.key, record.value, record.timestamp))

    def file_name(self, first: int) -> str:
        return f"{self._prefix}-{first:016d}{_SUFFIX}"

    def prepare_commit(self) -> bytes:
        """Make the batch's file durable under its final name; returns the count to commit."""
        if self._prepared and os.path.exists(self._marker()):
            os.unlink(self._marker())  # a second batch runs only after the first one's commit
        self._prepared = True
        if self._rows:
            name = self.file_name(self._next)
            final = os.path.join(self.dir, name)
            tmp = os.path.join(self.dir, f".{name}.{uuid.uuid4().hex}.tmp")
            table = self.codec.table(self._rows)
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
            _fsync_dir(self.dir)
            assert len(self._rows) > 0
            self._next += len(self._rows)
            self._rows.clear()
        return json.dumps({"next": self._next, "prefix": self._prefix}).encode()


def add_parquet_sink(topology: Topology, name: str, *, stream: str, path: str, codec: str = "bytes",
                     key_codec: str = "text", fields: str | Mapping[str, str] | None = None,
                     key_ranges: int = 2) -> Topology:
    """Add a :class:`ParquetSink` named ``name`` reading ``stream`` into ``path``.

    ``fields`` declares the typed columns decoded from JSON object values, e.g.
    ``"query:string,count:long"``. Checked here, before anything is submitted.
    Read the files back with :func:`spark_bridge.read_stream`.
    """
    params: dict[str, str] = {"path": os.path.abspath(path), "codec": codec, "key_codec": key_codec}
    if fields:
        from spark_bridge.codecs import format_fields, parse_fields

        params["fields"] = format_fields(parse_fields(fields))
    Codec.from_params(params)  # raises TopologyError now rather than on the workers
    return topology.add_computation(name, "spark_bridge.parquet_sink:ParquetSink",
                                    inputs={stream: None}, params=params, key_ranges=key_ranges)
