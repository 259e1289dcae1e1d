"""The Deliver protocol (``Worker.Deliver`` in proto/millstream.proto), in one place for both
of its senders: a worker delivering its productions (worker/sender.py) and an injector
delivering records from outside (injectors/injector.py); the receiving side answers with
the same :class:`Status` (worker/tablet.py, worker/batch.py).

A delivery carries records for one tablet (computation, key range) under the token the
sender believes current. The receiver commits them and answers ``OK`` with a receipt (its
worker id and the progress report that will reflect them), or refuses the whole delivery:

- ``NOT_OWNER``: wrong token or range; fetch the routing again and re-route.
- ``BUSY``: the tablet is full or paused; back off and retry the same delivery.
- ``OUT_OF_ORDER``: an earlier delivery of one of its producers is not committed yet
  (``orders``, worker/dedup.py); back off and retry.
- ``UNREACHABLE`` (never sent by a worker): no answer at all; retry after the next routing.

A refusal by status code rather than by status (a malformed record, a drained stream) will
not heal by retrying: :func:`failed` says so in :attr:`Outcome.refused`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import grpc

from runtime.columns import Columns
from runtime.record import Record
from runtime.wire import millstream_pb2 as pb
from runtime.wire import to_proto

# A delivery (one Deliver call) is cut at this many bytes of records, so a batch of large
# values never exceeds the 64 MiB message bound; one record may be up to 16 MiB
# (worker/context.py).
MAX_DELIVERY_BYTES = 16 * 1024 * 1024
# Deliveries to one worker may travel together in one ``DeliverMany`` (a stream's frame) up to
# about this many bytes of records: half a stream's credit (runtime/streams.py), so a full
# frame goes while other frames are in flight; at the whole grant it went only once none
# was, which steady smaller frames could put off until its time ran out.
BUNDLE_BYTES = MAX_DELIVERY_BYTES

# {producer prefix: (after, token)}: each producer's place in its order (worker/dedup.py).
Orders = dict[bytes, tuple[int, int]]
# (worker id, report seq): the receiver's progress report that will reflect a commit.
Receipt = tuple[str, int]


class Status(enum.IntEnum):
    OK = pb.DeliverResponse.OK
    NOT_OWNER = pb.DeliverResponse.NOT_OWNER
    BUSY = pb.DeliverResponse.BUSY
    OUT_OF_ORDER = pb.DeliverResponse.OUT_OF_ORDER
    UNREACHABLE = -1


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one delivery."""

    status: Status
    receipt: Receipt | None = None
    refused: str | None = None  # a permanent refusal: the receiver's reason
    routing_version: int = 0    # the receiver's routing version (0: unknown)
    duplicates: int = 0         # with OK: records the receiver dropped as already committed

    @property
    def retry_after_routing(self) -> bool:
        """Whether the next attempt should wait for (or fetch) a newer routing."""
        return self.status in (Status.NOT_OWNER, Status.UNREACHABLE)


# Status codes a retry cannot cure: a record the receiver rejects, a stream closed by a drain,
# a caller the receiver does not let deliver (its token's role, a tablet producer's records
# from outside the worker role, no or a wrong injector credential: review N4).
_PERMANENT = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION,
              grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED)


RECORD_OVERHEAD_BYTES = 48  # a record's id, timestamp and framing in a message, about


def record_bytes(r: Record) -> int:
    """About what ``r`` costs in a message (payload plus framing)."""
    return len(r.key) + len(r.value) + RECORD_OVERHEAD_BYTES


def to_orders(orders: Orders | None) -> list[pb.ProducerOrder]:
    return [pb.ProducerOrder(producer=p, after=a, token=t) for p, (a, t) in (orders or {}).items()]


def request(computation: str, key_range: int, token: int, records: Sequence[Record],
            orders: Orders | None = None, sender: str = "",
            kind: pb.SenderKind = pb.SENDER_INJECTOR) -> pb.DeliverRequest:
    """A delivery of ``records`` in the row form; ``kind``: who sends it (an injector unless
    said otherwise: these helpers are the senders' outside the cluster)."""
    return pb.DeliverRequest(computation=computation, key_range=key_range, token=token,
                             records=[to_proto(r) for r in records], orders=to_orders(orders),
                             sender=sender, sender_kind=kind)


def columns_request(computation: str, key_range: int, token: int, columns: Columns,
                    orders: Orders | None = None, sender: str = "",
                    kind: pb.SenderKind = pb.SENDER_INJECTOR) -> pb.DeliverRequest:
    """A delivery of ``columns`` in the columnar wire form (``DeliverRequest.columns``)."""
    return pb.DeliverRequest(computation=computation, key_range=key_range, token=token,
                             columns=columns.to_proto(), orders=to_orders(orders), sender=sender,
                             sender_kind=kind)


def from_outside(req: pb.DeliverRequest, worker_role: bool) -> bool:
    """Whether a delivery comes from outside the cluster (an injector's, a client's): only a
    caller holding the worker role (``worker_role``) that says it is a worker
    (``SENDER_WORKER``) is inside. A drained job's streams refuse deliveries from outside, and
    a savepoint's pause answers them BUSY; a tablet's productions pass."""
    return not worker_role or req.sender_kind != pb.SENDER_WORKER


def answered(resp: pb.DeliverResponse) -> Outcome:
    status = Status(resp.status)
    ok = status == Status.OK
    return Outcome(status, (resp.worker_id, resp.report_seq) if ok else None,
                   routing_version=resp.routing_version, duplicates=resp.duplicates if ok else 0)


def failed(e: grpc.RpcError) -> Outcome:
    """The outcome of a call that raised: unreachable, or a permanent refusal."""
    code = e.code()
    if code in _PERMANENT:
        return Outcome(Status.UNREACHABLE, refused=f"{e.details()}")
    return Outcome(Status.UNREACHABLE)


def bundles(sizes: Sequence[int]) -> Iterator[range]:
    """Consecutive deliveries of these sizes (bytes), grouped into calls of at most
    :data:`BUNDLE_BYTES` (a larger delivery travels alone), in order."""
    start, total = 0, 0
    for i, n in enumerate(sizes):
        if i > start and total + n > BUNDLE_BYTES:
            yield range(start, i)
            start, total = i, 0
        total += n
    if start < len(sizes):
        yield range(start, len(sizes))


def cut(records: Sequence[Record], max_records: int | None = None) -> Iterator[list[Record]]:
    """``records`` in deliveries of at most :data:`MAX_DELIVERY_BYTES` (and ``max_records``),
    in order; a single larger record travels alone."""
    if (not max_records or len(records) <= max_records) and (
            sum([len(r.key) + len(r.value) for r in records]) + RECORD_OVERHEAD_BYTES * len(records)
            <= MAX_DELIVERY_BYTES):
        if records:
            yield list(records)  # all in one: what nearly every round is, summed without a call per record
        return
    chunk: list[Record] = []
    size = 0
    for r in records:
        n = record_bytes(r)
        if chunk and (size + n > MAX_DELIVERY_BYTES or (max_records and len(chunk) >= max_records)):
            yield chunk
            chunk, size = [], 0
        chunk.append(r)
        size += n
    if chunk:
        yield chunk


def cut_columns(columns: Columns) -> list[Columns]:
    """:func:`cut` of records in columns: deliveries of at most :data:`MAX_DELIVERY_BYTES`,
    in order (nearly every round's columns whole, sized without a call per record); a single
    larger record travels alone."""
    if columns.nbytes() <= MAX_DELIVERY_BYTES:
        return [columns] if len(columns) else []
    out: list[Columns] = []
    start = size = 0
    for i, n in enumerate(map(len, columns.keys)):
        n += len(columns.values[i]) + RECORD_OVERHEAD_BYTES
        if i > start and size + n > MAX_DELIVERY_BYTES:
            out.append(columns.select(range(start, i)))
            start, size = i, 0
        size += n
    out.append(columns.select(range(start, len(columns))))
    return out
