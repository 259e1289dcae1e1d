"""A commit's writes as they are replicated: encoded by the primary, decoded by a follower,
and there coalesced over several commits before they reach its RocksDB.

A primary's commit is one ``WriteBatch`` of puts, deletes and range deletes, in order
(worker/storage.py). Its followers get exactly those writes, encoded (:func:`encode_ops`).
A follower logs each commit whole (one put of the encoded writes) and applies the log
every few commits as :class:`Coalesced` writes: the last write of each key, after the range
deletes. A window accumulator or a producer's mark that every commit rewrites is then written
to the follower's memtable once per few commits, not once per commit. Inserting a key into
a memtable of hash-ordered keys costs more than a microsecond here (``python -m
bench.overhead writes``), and on W2 a follower's applies were half of the writes that
held a worker's interpreter lock (docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from google.protobuf.message import DecodeError
from rocksdict import Rdict, WriteBatch

from runtime.errors import MillstreamError
from runtime.kernels import columns_of
from runtime.wire import millstream_pb2 as pb

PUT, DELETE, DELETE_RANGE = 0, 1, 2
_PUT_BYTE, _RANGE_BYTE = bytes([PUT]), bytes([DELETE_RANGE])
LOG, LOG_END = b"L", b"M"  # L<index:8>: a follower's logged commit (worker/storage.py's layout)
# A follower applies its log once it holds this many commits or bytes of writes (what a
# copy keeps in memory: the last write of each key they touched).
APPLY_EVERY_COMMITS, APPLY_EVERY_BYTES = 16, 4 << 20
# A log is applied in writes of at most this many keys. rocksdict holds the interpreter lock
# through a write, about 1.2 µs per hash-ordered key here: one write of a W2 follower's whole
# log (~15,000 keys) held it 12.6-23.4 ms of CPU, and every other thread of its worker waited;
# a piece of 2,000 holds it 1-4 ms (docs/performance.md, "A follower's log applied in pieces").
APPLY_CHUNK = 2_000


class Writes:
    """A primary's commit as one ``WriteBatch`` that also records its writes when they are to
    be replicated (:func:`encode_ops` encodes them)."""

    def __init__(self, record: bool) -> None:
        self.wb = WriteBatch(raw_mode=True)
        self.ops: list[tuple[int, bytes, bytes]] | None = [] if record else None

    def put(self, k: bytes, v: bytes) -> None:
        self.wb.put(k, v)
        if self.ops is not None:
            self.ops.append((PUT, k, v))

    def delete(self, k: bytes) -> None:
        self.wb.delete(k)
        if self.ops is not None:
            self.ops.append((DELETE, k, b""))

    def delete_range(self, start: bytes, end: bytes) -> None:
        self.wb.delete_range(start, end)
        if self.ops is not None:
            self.ops.append((DELETE_RANGE, start, end))

    def cells(self, cells: dict[bytes, bytes | None]) -> None:
        """:meth:`put` (None: :meth:`delete`) of each of ``cells``: a batch's typed state,
        without a call of this class per write (a W2 batch writes one per window it touched)."""
        put, delete = self.wb.put, self.wb.delete
        for k, v in cells.items():
            if v is None:
                delete(k)
            else:
                put(k, v)
        if self.ops is not None:
            self.ops += [(PUT, k, v) if v is not None else (DELETE, k, b"") for k, v in cells.items()]


def encode_ops(ops: list[tuple[int, bytes, bytes]]) -> bytes:
    """A commit's writes ``(kind, key, value or range end)`` as a serialized ``pb.Writes``:
    three columns, so that a follower decodes them in protobuf's C code."""
    if not ops:
        return b""
    kinds, keys, values = columns_of(ops, 3)  # rows to columns, in C
    return pb.Writes(kinds=bytes(kinds), keys=keys, values=values).SerializeToString()


def decode_ops(data: bytes) -> tuple[bytes, Sequence[bytes], Sequence[bytes]]:
    """The columns :func:`encode_ops` made: kinds, keys, values (or range ends); checked."""
    try:
        w = pb.Writes.FromString(data)
    except DecodeError as e:
        raise MillstreamError(f"replicated commit's writes do not decode: {e}") from None
    kinds, keys, values = w.kinds, w.keys, w.values
    if not len(kinds) == len(keys) == len(values):
        raise MillstreamError(f"replicated commit has {len(kinds)} write kinds, {len(keys)} keys and "
                              f"{len(values)} values: they must line up")
    unknown = kinds.translate(None, bytes([PUT, DELETE, DELETE_RANGE]))
    if unknown:
        raise MillstreamError(f"replicated commit has an unknown write kind {unknown[0]}")
    if has_ranges(kinds):
        for kind, k, v in zip(kinds, keys, values, strict=True):
            if kind == DELETE_RANGE and v < k:
                raise MillstreamError(f"replicated commit deletes a range whose end {v!r} comes before its "
                                      f"start {k!r}")
    return kinds, keys, values


def has_ranges(kinds: bytes) -> bool:
    return _RANGE_BYTE in kinds


def apply_ops(wb: WriteBatch, data: bytes) -> None:
    """Add the writes :func:`encode_ops` encoded to ``wb``, in their order."""
    write_ops(wb, *decode_ops(data))


def write_ops(wb: WriteBatch, kinds: bytes, keys: Sequence[bytes], values: Sequence[bytes]) -> None:
    """Add decoded writes (:func:`decode_ops`) to ``wb``, in their order."""
    if not kinds.strip(_PUT_BYTE):  # a batch of puts only (most): no test per write
        put = wb.put
        for k, v in zip(keys, values, strict=True):
            put(k, v)
        return
    for kind, k, v in zip(kinds, keys, values, strict=True):
        if kind == PUT:
            wb.put(k, v)
        elif kind == DELETE:
            wb.delete(k)
        else:
            wb.delete_range(k, v)


class Coalesced:
    """The writes of consecutive commits, reduced to what they leave behind: the range
    deletes, in order, and then the last put or delete of each key (a key's earlier writes,
    and those a later range delete covers, are dropped). Applied in that order (in one
    ``WriteBatch`` or in several, :meth:`batches`), they leave a RocksDB as the commits
    applied one by one would have; applied again over part of themselves, too.
    A range delete scans the writes held so far: a follower logs only commits without
    range deletes, and applies those with them at once (:class:`~worker.replicastore.ReplicaStore`).

    Why that holds, for each key: if its last write is a put or a delete, no later range
    covers it, so it is in :attr:`last` and is applied after every range; if its last write
    is a range delete, :attr:`last` lost it then, so a range deletes it; untouched, it stays."""

    def __init__(self) -> None:
        self.ranges: list[tuple[bytes, bytes]] = []
        self.last: dict[bytes, bytes | None] = {}  # key -> its last value (None: deleted)
        self.commits = 0

    def take(self, kinds: bytes, keys: Sequence[bytes], values: Sequence[bytes]) -> None:
        """Take the next commit's writes, as :func:`decode_ops` gives them."""
        last = self.last
        if not kinds.strip(_PUT_BYTE):
            last.update(zip(keys, values, strict=True))
        else:
            for kind, k, v in zip(kinds, keys, values, strict=True):
                if kind == PUT:
                    last[k] = v
                elif kind == DELETE:
                    last[k] = None
                else:
                    for gone in [key for key in last if k <= key < v]:
                        del last[gone]
                    self.ranges.append((k, v))
        self.commits += 1

    def batches(self, size: int) -> Iterator[WriteBatch]:
        """The writes, in order, in batches of at most ``size`` keys (the range deletes in
        the first); at least one batch, empty if there is nothing to write."""
        items = list(self.last.items())
        for i in range(0, max(len(items), 1), size):
            wb = WriteBatch(raw_mode=True)
            if i == 0:
                for start, end in self.ranges:
                    wb.delete_range(start, end)
            for k, v in items[i:i + size]:
                if v is None:
                    wb.delete(k)
                else:
                    wb.put(k, v)
            yield wb

    def clear(self) -> None:
        self.ranges = []
        self.last = {}
        self.commits = 0


def replay_log(db: Rdict) -> None:
    """Apply the commits a follower logged and had not yet applied when it stopped (a crash):
    whoever opens the copy next, as a follower, a primary or a split's parent, finds them
    applied. A no-op (one seek) when there are none."""
    pending, _ = read_log(db)
    if pending.commits:
        apply_log(db, pending)


def read_log(db: Rdict) -> tuple[Coalesced, int]:
    """The log on disk, coalesced, and its size in bytes."""
    pending, size = Coalesced(), 0
    it = db.iter()
    it.seek(LOG)
    while it.valid() and it.key().startswith(LOG):
        data = it.value()
        pending.take(*decode_ops(data))
        size += len(data)
        it.next()
    del it
    return pending, size


def apply_log(db: Rdict, pending: Coalesced) -> None:
    """Write ``pending`` (the whole log, coalesced) in writes of at most :data:`APPLY_CHUNK`
    keys, the last of which deletes the log; then clear it. Neither atomic nor synced, and
    neither need be: until the log's deletion is on disk, the log is there to apply again,
    and applying it again writes each key the same last value."""
    *filled, last = pending.batches(APPLY_CHUNK)
    for wb in filled:  # the interpreter lock is free between writes
        db.write(wb)
    last.delete_range(LOG, LOG_END)
    db.write(last)
    pending.clear()
