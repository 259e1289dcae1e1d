"""The injector client: brings external records into a stream, exactly once.

Records are batched per destination tablet and retried until the tablet has
committed them. Ids default to (injector name, position of the record in this
injector's sequence), so re-running the same injection after a crash sends the
same ids and receivers drop what they already have.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

import grpc

from runtime.client import Client
from runtime.errors import InjectionError
from runtime.record import ID_BYTES, Record, producer_prefix, sequence_id
from runtime.routing import KeyExtractor, RoutingTable
from runtime.security import Security
from runtime.wire import millstream_pb2 as pb
from runtime.wire import millstream_pb2_grpc as rpc
from runtime.wire import to_proto

log = logging.getLogger(__name__)
END_OF_TIME = (1 << 63) - 1
MIN = -(1 << 63)


class Injector:
    """Sends records to ``stream`` under the name ``name``.

    >>> with Injector("127.0.0.1:7070", "lines", "my-source") as inj:   # doctest: +SKIP
    ...     inj.send(b"k", b"hello world", timestamp=1_700_000_000_000_000)
    """

    def __init__(self, masters: str | Iterable[str], stream: str, name: str, *,
                 batch_size: int = 1000, timeout: float = 60.0, security: Security = Security()) -> None:
        if not isinstance(name, str) or not name:
            raise InjectionError("an injector needs a non-empty name (it seeds its record ids)")
        self.stream = stream
        self.name = name
        self.batch_size = batch_size
        self.timeout = timeout
        self.security = security
        self.client = Client(masters, timeout=min(timeout, 10.0), security=security)
        self._prefix = producer_prefix("injector/" + name)
        self.position = 0
        self._buffer: list[Record] = []
        self._extractors: dict[str, KeyExtractor] = {}
        self._routing = self._fetch_routing()
        self._channels: dict[str, grpc.Channel] = {}
        self.watermark = MIN
        self.finished = False
        self._reported: int | None = None
        self._report()  # registers: from now on this injector holds its stream's watermark

    def _fetch_routing(self) -> RoutingTable:
        table = RoutingTable(self.client.routing())
        table.load_extractors(self._extractors)
        return table

    # --------------------------------------------------------------- sending

    def send(self, key: bytes, value: bytes, timestamp: int, id: bytes | None = None) -> None:
        """Queue one record; sent when the batch fills, on :meth:`flush` or :meth:`finish`."""
        if self.finished:
            raise InjectionError(f"injector {self.name!r} is finished; create a new one to send more")
        if not isinstance(key, bytes):
            raise InjectionError(f"key must be bytes, got {type(key).__name__} {key!r}; encode it")
        if not isinstance(value, bytes):
            raise InjectionError(f"value must be bytes, got {type(value).__name__}; encode it")
        if isinstance(timestamp, bool) or not isinstance(timestamp, int):
            raise InjectionError(
                f"timestamp must be an int of microseconds since the epoch, got {timestamp!r}")
        self.position += 1
        if id is None:
            id = sequence_id(self._prefix, self.position)
        elif not isinstance(id, bytes) or len(id) != ID_BYTES:
            raise InjectionError(f"id must be {ID_BYTES} bytes, got {id!r}")
        self._buffer.append(Record(key, value, timestamp, id))
        if len(self._buffer) >= self.batch_size:
            self.flush()

    def advance_watermark(self, timestamp: int) -> None:
        """Promise to send nothing older than ``timestamp`` (never moves backwards).

        Reported to the master at once; the effective watermark is never later than the
        oldest record not yet acknowledged (records sent but not flushed hold it back).
        """
        if isinstance(timestamp, bool) or not isinstance(timestamp, int):
            raise InjectionError(f"watermark must be an int of microseconds, got {timestamp!r}")
        self.watermark = max(self.watermark, timestamp)
        self._report()

    @property
    def effective_watermark(self) -> int:
        """min(the promised watermark, the oldest unacknowledged record's timestamp)."""
        if self._buffer:
            return min(self.watermark, min(r.timestamp for r in self._buffer))
        return self.watermark

    def _report(self) -> None:
        wm = self.effective_watermark
        if wm == self._reported:
            return
        report = pb.InjectorReport(name=self.name, stream=self.stream, watermark=wm)
        self.client.call(lambda s: s.ReportInjector(report, timeout=self.client.timeout))
        self._reported = wm

    def flush(self) -> None:
        """Block until every queued record is committed by its tablet."""
        if not self._buffer:
            return
        deadline = time.monotonic() + self.timeout
        pending = self._route(self._buffer)
        delay = 0.01
        while pending:
            failed: dict[tuple[str, int], list[Record]] = {}
            calls = []
            for dest, records in pending.items():
                target = self._routing.destination(*dest)
                if not target.address:
                    failed[dest] = records
                    continue
                req = pb.DeliverRequest(computation=dest[0], key_range=dest[1], token=target.token,
                                        records=[to_proto(r) for r in records],
                                        sender="injector/" + self.name)
                calls.append((dest, records, self._stub(target.address).Deliver.future(req, timeout=30)))
            refresh = bool(failed)
            for dest, records, fut in calls:
                try:
                    status = fut.result().status
                except grpc.RpcError:
                    status = pb.DeliverResponse.NOT_OWNER
                if status != pb.DeliverResponse.OK:
                    failed[dest] = records
                    refresh = refresh or status == pb.DeliverResponse.NOT_OWNER
            pending = failed
            if not pending:
                break
            if time.monotonic() > deadline:
                n = sum(len(v) for v in pending.values())
                raise InjectionError(
                    f"injector {self.name!r}: {n} records to {self.stream!r} were not acknowledged "
                    f"within {self.timeout:.0f}s (tablets {sorted(pending)} busy or unowned); they are "
                    "still queued: call flush() again once the cluster has capacity")
            time.sleep(delay)  # back-off before retrying a busy or moving tablet
            delay = min(delay * 2, 0.5)
            if refresh:
                self._routing = self._fetch_routing()
        self._buffer.clear()
        self._report()

    def _route(self, records: list[Record]) -> dict[tuple[str, int], list[Record]]:
        if not self._routing.has_subscribers(self.stream):
            self._routing = self._fetch_routing()
            if not self._routing.has_subscribers(self.stream):
                raise InjectionError(
                    f"stream {self.stream!r} is unknown: no running computation reads it; "
                    "submit a topology with it among its inputs first (nothing was sent)")
        out: dict[tuple[str, int], list[Record]] = {}
        for r in records:
            for comp, kr, key in self._routing.route(self.stream, r):
                out.setdefault((comp, kr), []).append(Record(key, r.value, r.timestamp, r.id))
        return out

    def _stub(self, address: str) -> rpc.WorkerStub:
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = self.security.channel(address)
        return rpc.WorkerStub(ch)

    def finish(self) -> None:
        """Send everything, then move the watermark to the end of time."""
        self.flush()
        self.advance_watermark(END_OF_TIME)
        self.finished = True

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()
        self.client.close()

    def __enter__(self) -> Injector:
        return self

    def __exit__(self, exc_type: Any, *rest: object) -> None:
        try:
            if exc_type is None:
                self.finish()
        finally:
            self.close()
