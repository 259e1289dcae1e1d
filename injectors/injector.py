"""The injector client: brings external records into a stream, exactly once.

Records are batched per destination tablet and retried until the tablet has
committed them. Ids default to (injector name, position of the record in this
injector's sequence), so re-running the same injection after a crash sends the
same ids and receivers drop what they already have: each receiving tablet keeps
only the highest position it committed from this injector (worker/dedup.py), so
that holds however late the re-run comes. Ids given by the caller are opaque and
deduplicated for the receiving computation's ``dedup_retention``.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterable
from typing import Any

import grpc

from runtime.client import Client
from runtime.errors import InjectionError, MillstreamError
from runtime.record import ID_BYTES, MAX_KEY_BYTES, MAX_VALUE_BYTES, Record, producer_prefix, sequence_id
from runtime.routing import KeyExtractor, RoutingTable
from runtime.security import Security
from runtime.wire import MAX_DELIVERY_BYTES, record_bytes, to_orders, to_proto
from runtime.wire import millstream_pb2 as pb
from runtime.wire import millstream_pb2_grpc as rpc

log = logging.getLogger(__name__)
END_OF_TIME = (1 << 63) - 1
MIN = -(1 << 63)


def _check_time(t: object, what: str) -> None:
    if isinstance(t, bool) or not isinstance(t, int) or not -(1 << 63) <= t < (1 << 63):
        raise InjectionError(f"{what} {t!r} must be an int of microseconds since the epoch, "
                             "within signed 64 bits (e.g. time.time_ns() // 1000)")


class Injector:
    """Sends records to ``stream`` under the name ``name``.

    >>> with Injector("127.0.0.1:7070", "lines", "my-source") as inj:   # doctest: +SKIP
    ...     inj.send(b"k", b"hello world", timestamp=1_700_000_000_000_000)
    """

    def __init__(self, masters: str | Iterable[str], stream: str, name: str, *,
                 batch_size: int = 1000, timeout: float = 60.0, security: Security = Security(),
                 incarnation: str | None = None) -> None:
        if not isinstance(name, str) or not name:
            raise InjectionError("an injector needs a non-empty name (it seeds its record ids)")
        self.stream = stream
        self.name = name
        # Tells this object's registration apart from any other live injector under the same
        # name: the master holds the stream at the minimum of them (review W4).
        # ``incarnation`` given: a stable identity, so a restarted copy (a retried Spark task)
        # replaces the hold of the one it restarts instead of adding its own.
        self.incarnation = uuid.uuid4().hex if incarnation is None else incarnation
        self.batch_size = batch_size
        self.timeout = timeout
        self.security = security
        self.client = Client(masters, timeout=min(timeout, 10.0), security=security)
        self._prefix = producer_prefix("injector/" + name)
        self.position = 0
        self._sequenced: dict[bytes, int] = {self._prefix: 0}  # producer -> last sequence queued
        self._buffer: list[Record] = []
        self._extractors: dict[str, KeyExtractor] = {}
        self._routing = self._fetch_routing()
        self._channels: dict[str, grpc.Channel] = {}
        self.watermark = MIN
        self.finished = False
        self._reported: int | None = None
        self._held: list[tuple[int, tuple[str, int]]] = []  # (oldest ts, receipt) of committed batches
        self.confirm_timeout = 5.0
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._confirmer: threading.Thread | None = None
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
        _check_time(timestamp, "timestamp")
        if len(value) > MAX_VALUE_BYTES or len(key) > MAX_KEY_BYTES:
            raise InjectionError(
                f"a record of {len(key):,} key bytes and {len(value):,} value bytes is over the limits "
                f"({MAX_KEY_BYTES:,} and {MAX_VALUE_BYTES:,}); store large objects elsewhere and send a reference")
        if id is not None and (not isinstance(id, bytes) or len(id) != ID_BYTES):
            raise InjectionError(f"id must be {ID_BYTES} bytes, got {id!r}")
        # Checked before anything changes: a refused record leaves the injector as it was.
        self.position += 1
        if id is None:
            id = sequence_id(self._prefix, self.position)
            self._sequenced[self._prefix] = self.position
        self._queue(Record(key, value, timestamp, id))

    def send_sequenced(self, producer: str, seq: int, key: bytes, value: bytes, timestamp: int) -> None:
        """Queue one record of a source with its own order: ``seq`` is its place in
        ``producer`` (a file's line number, a partition's offset), rising with every call for
        that producer. Its id is (producer, seq), so a re-send of the same place, by this
        injector or a later one, is dropped however late it comes; dedup costs the receivers
        one number per producer."""
        prefix = producer_prefix("source\x00" + self.name + "\x00" + producer)
        last = self._sequenced.get(prefix, 0)
        if isinstance(seq, bool) or not isinstance(seq, int) or not last < seq < (1 << 64):
            raise InjectionError(f"producer {producer!r}: seq {seq!r} must be an int above the last "
                                 f"one sent for it ({last}) and below 2**64")
        self.send(key, value, timestamp, id=sequence_id(prefix, seq))
        self._sequenced[prefix] = seq

    def _queue(self, record: Record) -> None:
        self._buffer.append(record)
        if len(self._buffer) >= self.batch_size:
            self.flush()

    def advance_watermark(self, timestamp: int) -> None:
        """Promise to send nothing older than ``timestamp`` (never moves backwards).

        Reported to the master at once; the effective watermark is never later than the
        oldest record not yet confirmed (see :attr:`effective_watermark`), and rises as
        confirmations arrive (a background thread asks for them). :meth:`finish` waits.
        """
        _check_time(timestamp, "watermark")
        self.watermark = max(self.watermark, timestamp)
        self._report()

    @property
    def effective_watermark(self) -> int:
        """min(the promised watermark, the oldest record not flushed, the oldest record whose
        receiving tablet's progress report the leader does not hold yet)."""
        candidates = [self.watermark]
        if self._buffer:
            candidates.append(min(r.timestamp for r in self._buffer))
        candidates += [ts for ts, _ in self._held]
        return min(candidates)

    def _send_report(self, wm: int) -> dict[str, int]:
        report = pb.InjectorReport(name=self.name, stream=self.stream, watermark=wm,
                                   incarnation=self.incarnation)
        resp = self.client.call(lambda s: s.ReportInjector(report, timeout=self.client.timeout))
        self._reported = wm
        return dict(resp.reported)

    def _report(self, wait: bool = False) -> None:
        """Report the effective watermark if it rose (a lower one could only come from records
        below our own promise: those are late whatever we say). With ``wait``, until no
        acknowledged record holds it back (bounded by ``confirm_timeout``)."""
        with self._lock:
            self._report_locked(wait)
        if self._held and self._confirmer is None and not self._closed.is_set():
            # Receipts not confirmed yet: ask in the background until they are, so that
            # neither a paced sender waits for it nor a quiet injector holds its stream back.
            self._confirmer = threading.Thread(target=self._confirm, name=f"injector {self.name}",
                                               daemon=True)
            self._confirmer.start()

    def _confirm(self) -> None:
        try:
            while self._held and not self._closed.wait(0.02):
                with self._lock:
                    self._report_locked(wait=False, ask=True)
        except MillstreamError as e:  # the next user call reports (and raises) again
            log.info("injector %s: could not confirm its watermark: %s", self.name, e)
        finally:
            self._confirmer = None

    def _report_locked(self, wait: bool, ask: bool = False) -> None:
        deadline = time.monotonic() + self.confirm_timeout
        while True:
            wm = self.effective_watermark
            if self._reported is None or wm > self._reported or ask:
                reported = self._send_report(max(wm, self._reported) if self._reported is not None else wm)
                # Receipts whose report the leader holds (or whose worker it does not know).
                self._held = [(ts, r) for ts, r in self._held if reported.get(r[0], r[1]) < r[1]]
                ask = False
                if self.effective_watermark > wm:
                    continue  # released holds let it rise: report that at once
            if not wait or not self._held or time.monotonic() > deadline:
                return
            time.sleep(0.01)  # waiting for receivers' next progress report (every 50 ms)
            ask = True

    def flush(self) -> None:
        """Block until every queued record is committed by its tablet."""
        if not self._buffer:
            return
        deadline = time.monotonic() + self.timeout
        # One Deliver per destination and per 16 MiB of records: never over the message limit.
        pending: dict[tuple[str, int, int], list[Record]] = {}
        for (comp, r), records in self._route(self._buffer).items():
            _chunk(pending, comp, r, records)
        orders = self._orders(pending)
        delay = 0.01
        while pending:
            failed: dict[tuple[str, int, int], list[Record]] = {}
            calls = []
            for dest, records in pending.items():
                target = self._routing.destination(dest[0], dest[1])
                if not target.address:
                    failed[dest] = records
                    continue
                req = pb.DeliverRequest(computation=dest[0], key_range=dest[1], token=target.token,
                                        records=[to_proto(r) for r in records],
                                        sender="injector/" + self.name, orders=orders[dest])
                calls.append((dest, records, self._stub(target.address).Deliver.future(req, timeout=30)))
            refresh = bool(failed)
            for dest, records, fut in calls:
                try:
                    resp = fut.result()
                    status = resp.status
                except grpc.RpcError as e:
                    if e.code() in (grpc.StatusCode.INVALID_ARGUMENT,  # a bad record: retrying cannot help
                                    grpc.StatusCode.FAILED_PRECONDITION):  # its job drained: neither
                        raise InjectionError(f"injector {self.name!r}: {e.details()} (the records are still "
                                             "queued, nothing was lost)") from None
                    status = pb.DeliverResponse.NOT_OWNER
                if status != pb.DeliverResponse.OK:
                    failed[dest] = records
                    refresh = refresh or status == pb.DeliverResponse.NOT_OWNER
                elif resp.worker_id:
                    # Committed: its timestamps hold our watermark until the leader holds the
                    # receiver's report that reflects them.
                    with self._lock:
                        self._held.append((min(r.timestamp for r in records),
                                           (resp.worker_id, resp.report_seq)))
            pending = failed
            if not pending:
                break
            if time.monotonic() > deadline:
                n = sum(len(v) for v in pending.values())
                raise InjectionError(
                    f"injector {self.name!r}: {n} records to {self.stream!r} were not acknowledged "
                    f"within {self.timeout:.0f}s (tablets {sorted({d[:2] for d in pending})} busy or "
                    "unowned); they are "
                    "still queued: call flush() again once the cluster has capacity")
            time.sleep(delay)  # back-off before retrying a busy or moving tablet
            delay = min(delay * 2, 0.5)
            if refresh:
                self._routing = self._fetch_routing()
                if self._reroute(pending):
                    orders = self._orders(pending)
        self._buffer.clear()
        self._report()

    def _reroute(self, pending: dict[tuple[str, int, int], list[Record]]) -> bool:
        """Send records meant for ranges a split or merge replaced to the ranges that replaced
        them, by key, each producer's in order; true if any moved."""
        gone = [d for d in pending if d[0] in self._routing.computations
                and not self._routing.has_range(d[0], d[1])]
        if not gone:
            return False
        moved: dict[str, list[Record]] = {}
        for dest in gone:
            moved.setdefault(dest[0], []).extend(pending.pop(dest))
        for comp, records in moved.items():
            records.sort(key=lambda rec: rec.id)  # sequenced ids: by producer, then sequence
            by_range: dict[int, list[Record]] = {}
            for rec in records:
                by_range.setdefault(self._routing.range_for(comp, rec.key), []).append(rec)
            for r, recs in by_range.items():
                _chunk(pending, comp, r, recs)
        return True

    def _orders(self, pending: dict[tuple[str, int, int], list[Record]]
                ) -> dict[tuple[str, int, int], list[pb.ProducerOrder]]:
        """Each delivery's place in its producers' orders. Every earlier flush is committed,
        so a destination's first delivery follows nothing (after=0); a later one (a
        destination's records cut at 16 MiB) follows the one before it, and its tablet
        waits for that one (OUT_OF_ORDER) rather than let a re-send of it count twice."""
        out: dict[tuple[str, int, int], list[pb.ProducerOrder]] = {}
        last: dict[tuple[str, int], dict[bytes, int]] = {}
        for dest in sorted(pending):
            before = last.setdefault(dest[:2], {})
            here: dict[bytes, int] = {}
            for rec in pending[dest]:
                prefix = rec.id[:8]
                if prefix in self._sequenced:
                    here[prefix] = int.from_bytes(rec.id[8:], "big")
            out[dest] = to_orders({p: (before.get(p, 0), 0) for p in here})
            before.update(here)
        return out

    def _route(self, records: list[Record]) -> dict[tuple[str, int], list[Record]]:
        if not self._routing.has_subscribers(self.stream):
            self._routing = self._fetch_routing()
        closed = self._routing.proto.closed_streams.get(self.stream)
        if closed:
            raise InjectionError(f"injector {self.name!r}: {closed} (nothing was sent)")
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
        """Send everything, then move the watermark to the end of time; returns once the
        leader holds that promise (raises :class:`InjectionError` if it cannot within the
        injector's ``timeout``: the stream would otherwise stay held, silently; review W5)."""
        self.flush()
        self.watermark = END_OF_TIME
        deadline = time.monotonic() + self.timeout
        while True:
            self._report(wait=True)  # bounded by confirm_timeout
            if self._reported == END_OF_TIME:
                break
            if time.monotonic() > deadline:
                raise InjectionError(
                    f"injector {self.name!r}: the end of its input on {self.stream!r} was not "
                    f"confirmed within {self.timeout:.0f}s (its last records' receivers have not "
                    "reported them); call finish() again once the cluster is healthy")
        self.finished = True

    def release(self) -> None:
        """Drop every hold on this stream under this injector's name, this object's and
        those of other (crashed, stale) injectors that used the name, without waiting for
        confirmations; an operator's way out. Nothing can be sent afterwards."""
        self.client.release_injector(self.name, self.stream)
        self.finished = True

    def close(self) -> None:
        self._closed.set()
        confirmer = self._confirmer
        if confirmer is not None:
            confirmer.join(5)
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


def _chunk(pending: dict[tuple[str, int, int], list[Record]], comp: str, r: int, records: list[Record]) -> None:
    """Add ``records`` for one tablet to ``pending``, cut into deliveries of at most 16 MiB,
    after the chunks it already has for that tablet."""
    chunk = max((d[2] + 1 for d in pending if d[:2] == (comp, r)), default=0)
    size = 0
    for rec in records:
        size += record_bytes(rec)
        if size > MAX_DELIVERY_BYTES and pending.get((comp, r, chunk)):
            chunk, size = chunk + 1, record_bytes(rec)
        pending.setdefault((comp, r, chunk), []).append(rec)
