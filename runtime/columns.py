"""Records as columns: what a delivery carries and a batch works on (DESIGN.md §4a).

A delivery's records travel as parallel lists (keys, values, timestamps) plus their ids,
packed: a sequenced producer's records as that producer's 8-byte prefix and one sequence
number each (the id is the prefix and the sequence, runtime/record.py), other ids as 16
bytes each. Decoding, dedup and routing read the lists; a :class:`~runtime.record.Record`
is made only where user code is called (:meth:`Columns.record`). The wire form is the
``Columns`` message of proto/millstream.proto; a tablet's checkpoint of an outgoing delivery
is that same message.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from runtime.errors import MillstreamError
from runtime.kernels import take, total_len
from runtime.record import ID_BYTES, Record
from runtime.wire import millstream_pb2 as pb

PREFIX_BYTES = 8
RECORD_OVERHEAD_BYTES = 48  # a record's id, timestamp and framing in a message, about


class MalformedColumns(MillstreamError, ValueError):
    """A ``Columns`` message whose columns do not line up (the sender's bug, or not ours)."""


@dataclass(slots=True)
class Columns:
    """Records as columns. Sequenced form: ``producer`` and ``seqs`` (record i's id is
    ``producer + seqs[i]``); otherwise ``ids`` holds every record's 16-byte id. ``streams``:
    the stream every record arrived on (one name), or each record's (a list), or None (not
    known)."""

    keys: list[bytes]
    values: list[bytes]
    timestamps: list[int]
    producer: bytes | None = None
    seqs: list[int] | None = None
    ids: list[bytes] | None = None
    streams: str | list[str] | None = None
    _message: pb.Columns | None = field(default=None, init=False, repr=False, compare=False)

    def stream(self, i: int) -> str:
        s = self.streams
        return s if type(s) is str else s[i] if s else ""  # type: ignore[index]

    def stream_column(self) -> list[str]:
        """Every record's stream, as a list."""
        s = self.streams
        if s is None or type(s) is str:
            return [s or ""] * len(self.keys)
        return s  # type: ignore[return-value]

    def _streams_of(self, indexes: Sequence[int]) -> str | list[str] | None:
        s = self.streams
        if s is None or type(s) is str:
            return s
        return take(s, indexes)

    def __len__(self) -> int:
        return len(self.keys)

    def id(self, i: int) -> bytes:
        if self.producer is not None:
            assert self.seqs is not None
            return self.producer + self.seqs[i].to_bytes(8, "big")
        assert self.ids is not None
        return self.ids[i]

    def all_ids(self) -> list[bytes]:
        if self.ids is not None:
            return self.ids
        assert self.producer is not None and self.seqs is not None
        p = self.producer
        return [p + s.to_bytes(8, "big") for s in self.seqs]

    def record(self, i: int) -> Record:
        return Record(self.keys[i], self.values[i], self.timestamps[i], self.id(i), self.stream(i))

    def records(self) -> list[Record]:
        return list(map(Record, self.keys, self.values, self.timestamps, self.all_ids(), self.stream_column()))

    def nbytes(self, start: int = 0) -> int:
        """About what records ``start:`` cost in a message (payload plus framing)."""
        return (total_len(self.keys, start) + total_len(self.values, start)
                + RECORD_OVERHEAD_BYTES * max(0, len(self.keys) - start))

    def oldest(self, start: int = 0) -> int | None:
        """The lowest timestamp of records ``start:`` (None: there are none)."""
        if start >= len(self.timestamps):
            return None
        return min(self.timestamps[start:]) if start else min(self.timestamps)

    def select(self, indexes: Sequence[int]) -> Columns:
        """The records at ``indexes``, in that order."""
        k, v, t = take(self.keys, indexes), take(self.values, indexes), take(self.timestamps, indexes)
        if self.producer is not None:
            assert self.seqs is not None
            return Columns(k, v, t, self.producer, take(self.seqs, indexes), streams=self._streams_of(indexes))
        assert self.ids is not None
        return Columns(k, v, t, ids=take(self.ids, indexes), streams=self._streams_of(indexes))

    # ------------------------------------------------------------------ building

    @classmethod
    def of_records(cls, records: Sequence[Record], producer: bytes | None = None) -> Columns:
        """Columns of ``records``; in the sequenced form if ``producer`` is given and every id
        is one of its sequences."""
        keys = [r.key for r in records]
        values = [r.value for r in records]
        timestamps = [r.timestamp for r in records]
        ids = [r.id for r in records]
        streams = compact_streams([r.stream for r in records])
        if producer is not None and all(len(i) == ID_BYTES and i.startswith(producer) for i in ids):
            return cls(keys, values, timestamps, producer, [int.from_bytes(i[PREFIX_BYTES:], "big") for i in ids],
                       streams=streams)
        return cls(keys, values, timestamps, ids=ids, streams=streams)

    @classmethod
    def concat(cls, parts: Sequence[Columns]) -> Columns:
        """One after the other; sequenced if every part is, of the same producer."""
        if len(parts) == 1:
            return parts[0]
        keys: list[bytes] = []
        values: list[bytes] = []
        timestamps: list[int] = []
        for p in parts:
            keys += p.keys
            values += p.values
            timestamps += p.timestamps
        first = parts[0].streams
        if all(p.streams == first and type(p.streams) is not list for p in parts):
            streams: str | list[str] | None = first
        else:
            column: list[str] = []
            for p in parts:
                column += p.stream_column()
            streams = compact_streams(column)
        producer = parts[0].producer
        if producer is not None and all(p.producer == producer for p in parts):
            seqs: list[int] = []
            for p in parts:
                assert p.seqs is not None
                seqs += p.seqs
            return cls(keys, values, timestamps, producer, seqs, streams=streams)
        ids: list[bytes] = []
        for p in parts:
            ids += p.all_ids()
        return cls(keys, values, timestamps, ids=ids, streams=streams)

    # ---------------------------------------------------------------------- wire

    def to_proto(self) -> pb.Columns:
        """The message, built once: a strong production's checkpoint and the delivery it is
        sent as share it. A ``Columns`` is not changed once its message is made: re-routing
        and cutting make copies (``select``, ``concat``), and the injector's buffer grows in
        place only a block it has not handed out (injectors/buffer.py). An unacknowledged
        shipment holds its lists and this message both."""
        if self._message is None:
            self._message = self._build()
        return self._message

    def checkpoint(self, producers: Sequence[bytes]) -> bytes:
        """The message serialized with ``producers`` (those its delivery lists in its orders):
        a second message's field appended, as the wire format allows."""
        return self.to_proto().SerializeToString() + pb.Columns(producers=producers).SerializeToString()

    def _build(self) -> pb.Columns:
        s = self.streams
        names: list[str] = []
        index: list[int] = []
        if type(s) is str:
            names = [s]
        elif s:
            at = {name: i for i, name in enumerate(dict.fromkeys(s))}  # type: ignore[arg-type]
            names = list(at)
            if len(names) > 1:
                index = [at[name] for name in s]  # type: ignore[union-attr]
        if self.producer is not None:
            return pb.Columns(keys=self.keys, values=self.values, timestamps=self.timestamps,
                              producer=self.producer, seqs=self.seqs, stream_names=names, stream_index=index)
        assert self.ids is not None
        return pb.Columns(keys=self.keys, values=self.values, timestamps=self.timestamps,
                          ids=b"".join(self.ids), stream_names=names, stream_index=index)

    @classmethod
    def from_proto(cls, c: pb.Columns) -> Columns:
        """The columns of ``c``; :class:`MalformedColumns` says what does not line up."""
        keys, values, timestamps = list(c.keys), list(c.values), list(c.timestamps)
        n = len(keys)
        if len(values) != n or len(timestamps) != n:
            raise MalformedColumns(f"columns of different lengths: {n} keys, {len(values)} values, "
                                   f"{len(timestamps)} timestamps")
        streams: str | list[str] | None = None
        if c.stream_names:
            names = list(c.stream_names)
            if c.stream_index:
                if len(c.stream_index) != n or max(c.stream_index) >= len(names):
                    raise MalformedColumns(f"{len(c.stream_index)} stream indexes into {len(names)} names for "
                                           f"{n} records")
                streams = [names[i] for i in c.stream_index]
            else:
                streams = names[0]
        if c.producer:
            if len(c.producer) != PREFIX_BYTES:
                raise MalformedColumns(f"producer {c.producer.hex()[:40]} is {len(c.producer)} bytes long; "
                                       f"producers are {PREFIX_BYTES} bytes")
            seqs = list(c.seqs)
            if len(seqs) != n:
                raise MalformedColumns(f"{len(seqs)} sequence numbers for {n} records")
            return cls(keys, values, timestamps, c.producer, seqs, streams=streams)
        raw = c.ids
        if len(raw) != ID_BYTES * n:
            raise MalformedColumns(f"{len(raw)} bytes of ids for {n} records; record ids are {ID_BYTES} bytes")
        return cls(keys, values, timestamps, ids=[raw[i:i + ID_BYTES] for i in range(0, len(raw), ID_BYTES)],
                   streams=streams)


def compact_streams(column: list[str]) -> str | list[str] | None:
    """A stream column as one name when every record has it (None when none is known)."""
    if not column:
        return None
    first = column[0]
    if column.count(first) == len(column):
        return first or None
    return column


def of_request(request: pb.DeliverRequest) -> Columns:
    """A delivery's records, sent as columns or (by an older sender) as rows."""
    if request.HasField("columns"):
        if request.records:
            raise MalformedColumns("a delivery carries rows or columns, not both")
        return Columns.from_proto(request.columns)
    rows = request.records
    ids = [r.id for r in rows]
    return Columns([r.key for r in rows], [r.value for r in rows], [r.timestamp for r in rows], ids=ids)
