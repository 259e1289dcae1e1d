"""A batch's productions on their way out (worker/batch.py): each routed to its readers'
tablets, given its id (the tablet's next sequence, or for weak productions an id a retry
repeats), and gathered per destination tablet into the batch's shipments (worker/storage.py),
cut at the delivery bound.

Strong productions are routed once per batch, when its user code is done (:meth:`Outgoing.
add_batch`): a batch's productions to one stream whose readers take the record's own key go
as columns (their keys hashed, their ranges found, and their columns cut per range by the
compiled kernels of runtime/kernels.py), with no Python step per production. Weak
productions are routed after each call (:meth:`Outgoing.add`): their ids derive from the
record that made them.

A production a reader's key extractor fails on goes to that reader's dead letters
(``<reader>.dead_letter``), and to every other reader as usual (review N5).
"""

from __future__ import annotations

import base64
import json
import logging
from bisect import bisect_right
from typing import Any

from runtime import metrics
from runtime.columns import Columns, compact_streams
from runtime.delivery import cut_columns
from runtime.kernels import columns_of, group, key_hash, key_hashes, ranges_of, take
from runtime.record import derived_id, sequence_id, worker_producer
from runtime.routing import RoutingTable
from runtime.topology import dead_letter_stream
from worker.context import Produced
from worker.storage import Commit, Shipment, production_key

log = logging.getLogger(__name__)
# A weak output's place in its producer's order: the input's sequence times this, plus the
# output's index (so at most 2**20 - 1 sequenced outputs per input, inputs below 2**44).
WEAK_MAX_OUTPUTS = 1 << 20
WEAK_MAX_SOURCE_SEQ = 1 << 44


class Outgoing:
    """The productions of the batch running now, per destination tablet: columns of (keys,
    values, timestamps, seqs, one stream) from :meth:`add_batch`'s columnar path, or rows of
    (key, value, timestamp, seq, stream) (strong, one by one) or (key, value, timestamp, id,
    stream, production order) (weak), made columns at the end of the batch (:meth:`shipments`)."""

    def __init__(self, name: str, computation: str, prefix: bytes, weak: bool, routing: RoutingTable) -> None:
        self.name = name
        self.computation = computation
        self.prefix = prefix
        self.weak = weak
        self._routing = routing  # the batch's routing: one version for all its productions
        # stream -> plain_readers(stream) of that routing (None: a reader has a key extractor)
        self._plain: dict[str, list[tuple[str, list[int], list[int]]] | None] = {}
        self._rows: dict[tuple[str, int], list[tuple[Any, ...]]] = {}
        # strong, from add_batch's columnar path: (keys, values, timestamps, seqs, stream) per tablet
        self._cols: dict[tuple[str, int], tuple[list[bytes], list[bytes], list[int], list[int], str]] = {}
        self._weak_producers: dict[tuple[str, int], dict[bytes, None]] = {}  # a weak tablet's sequenced producers
        self._produced = 0  # weak: productions made so far, for their order (worker/sender.py)
        self._extractor_failures: dict[str, int] = {}  # reader -> records its key extractor failed on

    def start(self, routing: RoutingTable) -> None:
        """A batch starts, under ``routing``."""
        self._rows = {}
        self._cols = {}
        self._weak_producers = {}
        if routing is not self._routing:  # a new routing: what is known of its streams goes
            self._routing = routing
            self._plain = {}

    def add_batch(self, commit: Commit, out: list[Produced]) -> None:
        """Route a strong batch's productions, ``out`` (all of them, in the order they were
        made), once its user code is done: each gets the tablet's next sequence. All to one
        stream whose readers take the record's own key (the common case): as columns, cut per
        destination tablet by the compiled kernels. Otherwise one by one (:meth:`add`)."""
        assert not self.weak and commit.seq is not None
        n = len(out)
        if not n:
            return
        streams, keys, values, stamps = columns_of(out, 4)  # rows to columns, in C
        stream: str = streams[0]
        plain = self._plain
        if stream in plain:
            dests = plain[stream]
        else:
            dests = plain[stream] = self._routing.plain_readers(stream)
        if dests is None or streams.count(stream) != n:
            self.add(commit, out, 0, n, 0, b"", None)
            return
        seq = commit.seq
        commit.seq = seq + n
        seqs = list(range(seq + 1, seq + n + 1))
        hashes: list[int] | None = None
        # Destinations that take every production share these lists (nothing changes a
        # shipment's columns in place: re-routing and acknowledgement select copies).
        for comp, starts, ids in dests:
            if len(ids) == 1 and starts[0] == 0:  # one range: every production goes there
                self._cols[(comp, ids[0])] = (keys, values, stamps, seqs, stream)
                continue
            if hashes is None:
                hashes = key_hashes(keys)
            for r, ix in group(ranges_of(hashes, starts, ids)).items():
                if len(ix) == n:
                    self._cols[(comp, r)] = (keys, values, stamps, seqs, stream)
                else:
                    self._cols[(comp, r)] = (take(keys, ix), take(values, ix), take(stamps, ix), take(seqs, ix), stream)

    def add(self, commit: Commit, out: list[Produced], mark: int, n: int, low: int, source_id: bytes,
            source: tuple[bytes, int] | None) -> int:
        """Route ``out[mark:n]`` (what one call produced, or for a strong batch that
        :meth:`add_batch` does not take as columns, all it produced) into the batch; returns
        ``low`` lowered to the oldest of them (the watermark holds there)."""
        if not self.weak:
            # Strong productions to readers that take the record's own key (no key extractor):
            # straight onto the outgoing rows, one hash each. The general path below takes
            # the rest from the first one that is not so (a key extractor may fail: dead letters).
            plain = self._plain
            outgoing = self._rows
            seq = commit.seq
            assert seq is not None
            while mark < n:
                stream, key, value, pts = out[mark]
                if stream in plain:
                    dests = plain[stream]
                else:
                    dests = plain[stream] = self._routing.plain_readers(stream)
                if dests is None:
                    break
                mark += 1
                seq += 1
                if pts < low:
                    low = pts
                h = key_hash(key)
                for comp, starts, ids in dests:
                    dest = (comp, ids[bisect_right(starts, h) - 1])
                    rows = outgoing.get(dest)
                    if rows is None:
                        rows = outgoing[dest] = []
                    rows.append((key, value, pts, seq, stream))
            commit.seq = seq
        if n > mark:
            routed = self._route(out, mark, n)
            for *_, produced in routed:
                if produced[3] < low:
                    low = produced[3]
            self._merge(commit, routed, source_id, source)
        return low

    def _route(self, out: list[Produced], mark: int, n: int) -> list[tuple[str, int, bytes, Produced]]:
        """``(computation, range, key, production)`` for each reader of each production of
        ``out[mark:n]``; ids are given by _merge. A production a reader's key
        extractor fails on goes to that reader's dead letters instead (``<reader>.dead_letter``)."""
        route = self._routing.route_fields  # the batch's routing: one version for all its productions
        routed = []
        errors: list[tuple[str, BaseException]] = []

        def fail(reader: str, error: BaseException) -> None:
            errors.append((reader, error))

        letters: list[Produced] = []
        for i in range(mark, n):
            produced = out[i]
            stream, key, value, ts = produced
            for comp, r, k in route(stream, key, value, ts, None, fail):
                routed.append((comp, r, k, produced))
            if errors:
                letters += [self._reader_dead_letter(reader, produced, error) for reader, error in errors]
                errors.clear()
        for letter in letters:
            for comp, r, k in route(*letter, None, self._unroutable_dead_letter):
                routed.append((comp, r, k, letter))
        return routed

    def _reader_dead_letter(self, reader: str, produced: Produced, error: BaseException) -> Produced:
        stream, key, value, ts = produced
        text = f"{type(error).__name__}: {error}"
        n = self._extractor_failures[reader] = self._extractor_failures.get(reader, 0) + 1
        log.log(logging.WARNING if str(n).rstrip("0") == "1" else logging.DEBUG,
                "tablet %s: the key extractor of %r on %r failed (%d times): %s; the record goes to %s",
                self.name, reader, stream, n, text, dead_letter_stream(reader))
        metrics.tablet(reader).dead_lettered.inc()
        doc = {"error": text, "computation": reader, "stream": stream, "producer": self.computation,
               "value": base64.b64encode(value).decode()}
        return dead_letter_stream(reader), key, json.dumps(doc).encode(), ts

    def _unroutable_dead_letter(self, reader: str, error: BaseException) -> None:
        log.error("tablet %s: a dead letter is lost: the key extractor of %r, a reader of dead letters, "
                  "failed: %s: %s", self.name, reader, type(error).__name__, error)

    def _merge(self, commit: Commit, routed: list[tuple[str, int, bytes, Produced]],
                           source_id: bytes, source: tuple[bytes, int] | None) -> None:
        """Give each production its id and append it, for each of its readers, to the batch's
        outgoing delivery to that reader's tablet."""
        assert commit.seq is not None
        last: Produced | None = None
        index = 0
        rid = b""
        producer: bytes | None = None
        weak_producer = None
        weak = self.weak
        if weak and source is not None and source[1] < WEAK_MAX_SOURCE_SEQ:
            weak_producer = worker_producer(derived_id(self.prefix, source[0]))
        outgoing = self._rows
        for comp, r, rkey, produced in routed:
            if produced is not last:  # one id per produced record, shared by its readers
                last = produced
                index += 1
                if not weak:
                    commit.seq += 1
                # Weak: sent before the commit, so a retry must mint the same ids. An output of
                # a sequenced input (P, s) is sequenced too: producer (this tablet, P), place
                # s * 2**20 + index, in the order this tablet commits P's records. Others (of
                # timers, of opaque inputs, the 2**20-th output of one record) are opaque.
                elif weak_producer is not None and source is not None and index < WEAK_MAX_OUTPUTS:
                    producer = weak_producer
                    rid = sequence_id(producer, source[1] * WEAK_MAX_OUTPUTS + index)
                else:
                    producer = None
                    rid = derived_id(self.prefix, source_id, index.to_bytes(4, "big"))
            rows = outgoing.get((comp, r))
            if rows is None:
                rows = outgoing[(comp, r)] = []
            if not weak:
                rows.append((rkey, produced[2], produced[3], commit.seq, produced[0]))
            else:
                rows.append((rkey, produced[2], produced[3], rid, produced[0], self._produced))
                if producer is not None:
                    self._weak_producers.setdefault((comp, r), {})[producer] = None
            self._produced += 1

    def shipments(self) -> list[Shipment]:
        """The batch's outgoing deliveries, one per destination tablet (cut where one would
        pass :data:`~runtime.delivery.MAX_DELIVERY_BYTES`); strong ones with their checkpoint."""
        made: list[tuple[str, int, Columns, tuple[bytes, ...], list[int] | None]] = [
            (comp, r, Columns(keys, values, stamps, self.prefix, seqs, streams=stream or None), (self.prefix,), None)
            for (comp, r), (keys, values, stamps, seqs, stream) in self._cols.items()]
        for (comp, r), rows in self._rows.items():
            columns = columns_of(rows, 6 if self.weak else 5)  # rows to columns, in C
            if self.weak:
                keys, values, stamps, ids, streams, made_order = columns
                made.append((comp, r, Columns(keys, values, stamps, ids=ids, streams=compact_streams(streams)),
                             tuple(self._weak_producers.get((comp, r), ())), made_order))
            else:
                keys, values, stamps, seqs, streams = columns
                made.append((comp, r, Columns(keys, values, stamps, self.prefix, seqs, streams=compact_streams(streams)),
                             (self.prefix,), None))
        out = []
        for comp, r, cols, producers, order in made:
            start = 0
            for part in cut_columns(cols):
                s = Shipment(comp, r, part, producers)
                if order is not None:
                    s.order = order[start:start + len(part)]
                else:
                    assert part.seqs is not None
                    s.ckey = production_key(part.seqs[0], comp, r)
                start += len(part)
                out.append(s)
        self._rows = {}
        self._cols = {}
        self._weak_producers = {}
        return out
