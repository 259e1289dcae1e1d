"""Exactly-once dedup data, bounded: one mark per producer, and opaque ids for a retention.

Most record ids are *sequenced*: an 8-byte producer prefix and that producer's sequence
number (injectors, each file of ``inject-files``, each partition of a Spark injection,
producer tablets). A delivery lists its producers (``ProducerOrder``); it carries each one's
records in ascending order and says which of that producer's earlier sequences it follows.
A tablet commits a producer's records to it in that order, so "already have it" is a
comparison with one number per producer, its *mark* (the highest sequence committed): dedup
data is bounded by producers, not by records, and a replay counts once however late.

Ids of no listed producer are *opaque* (``Injector.send(id=...)``, a Spark id column, weak
productions). They are kept, in wall-time buckets, for the computation's
``dedup_retention`` and then dropped whole (one range delete); each live bucket has Bloom
filters in memory so a new id rarely touches the disk.

A merged tablet (docs/rescaling.md) starts from the higher of its two parents' marks per
producer and keeps the other parent's as a *lower mark* for that part of its hash range,
until the producer's next record here (senders deliver each producer's records in order,
re-routed ones included, so nothing older can follow it).

Producers silent for longer than ``producer_expiry`` lose their mark (a finished injector, a
tablet that was dropped): a replay after that would count again, and docs/exactly-once.md
says so.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import operator
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from rbloom import Bloom

from runtime.keyspace import key_hash
from runtime.record import ID_BYTES, is_worker_producer

log = logging.getLogger(__name__)

SEQUENCED_ID_PREFIX = 8


@dataclass(frozen=True, slots=True)
class Mark:
    """What a tablet keeps of one producer: its highest committed sequence, the newest token
    it came under (tablets only; older owners are refused) and when it was last heard of."""

    seq: int
    token: int
    seen_us: int

    def pack(self) -> bytes:
        return struct.pack(">QQq", self.seq, self.token, self.seen_us)

    @classmethod
    def unpack(cls, raw: bytes) -> Mark:
        return cls(*struct.unpack(">QQq", raw))


def delivery_problem(ids: list[bytes], orders: dict[bytes, tuple[int, int]] | None) -> str | None:
    """What is wrong with the shape of a delivery from outside, or None: every record id is 16
    bytes and every listed producer 8. (Its order is not checked: a record sent again under
    an earlier id of its producer is a duplicate, dropped, not an error.)"""
    for i, rid in enumerate(ids):
        if len(rid) != ID_BYTES:
            return f"record {i} has an id of {len(rid)} bytes; record ids are {ID_BYTES} bytes"
    for producer in orders or ():
        if len(producer) != SEQUENCED_ID_PREFIX:
            return (f"producer {producer.hex()[:40]} is {len(producer)} bytes long; producers are "
                    f"{SEQUENCED_ID_PREFIX} bytes (the first {SEQUENCED_ID_PREFIX} of their records' ids)")
    return None


def outside_problem(orders: dict[bytes, tuple[int, int]] | None) -> str | None:
    """What a caller without the worker role may not send, or None: records of a producer
    inside the cluster (a tablet's, runtime/record.py). Their marks are the receivers' only
    record of what a tablet delivered, and one record far ahead would make every later one
    of that tablet read as a duplicate (review N4)."""
    for producer in orders or ():
        if is_worker_producer(producer):
            return (f"producer {producer.hex()} is a producer inside the cluster (a tablet's); only "
                    "the worker role sends its records. Injectors name their producers with "
                    "runtime.record.producer_prefix (Injector.send, send_sequenced)")
    return None


class Lower(NamedTuple):
    """A producer's mark over the hashes ``[start, end)`` of a merged range, below its mark."""

    start: int
    end: int
    seq: int


def split_sequenced(rid: bytes) -> tuple[bytes, int]:
    """(producer prefix, sequence) of a sequenced id."""
    return rid[:SEQUENCED_ID_PREFIX], int.from_bytes(rid[SEQUENCED_ID_PREFIX:], "big")


class MarkView:
    """The marks as one batch sees them: committed marks plus the batch's own advances."""

    def __init__(self, committed: dict[bytes, Mark], lower: dict[bytes, list[Lower]] | None = None) -> None:
        self.committed = committed
        self.changed: dict[bytes, Mark] = {}
        self.lower_committed = lower if lower is not None else {}
        self.lower_changed: dict[bytes, list[Lower]] = {}

    def get(self, producer: bytes) -> Mark | None:
        m = self.changed.get(producer)
        return m if m is not None else self.committed.get(producer)

    def _lows(self, producer: bytes) -> list[Lower]:
        lows = self.lower_changed.get(producer)
        return lows if lows is not None else self.lower_committed.get(producer, [])

    def seen(self, producer: bytes, seq: int, key: bytes) -> bool:
        """Whether record ``seq`` of ``producer``, for ``key``, is committed here."""
        mark = self.get(producer)
        if mark is None or seq > mark.seq:
            return False
        lows = self._lows(producer)
        if lows:
            h = key_hash(key)
            for low in lows:
                if low.start <= h < low.end:
                    return seq <= low.seq
        return True

    def top(self, producer: bytes) -> int:
        """The highest sequence of ``producer`` committed here (0: none)."""
        mark = self.get(producer)
        return mark.seq if mark is not None else 0

    def has_lower(self, producer: bytes) -> bool:
        """Whether part of the range has a lower mark of ``producer`` (after a merge)."""
        return bool(self._lows(producer))

    def floor(self, producer: bytes) -> int:
        """The sequence below which every record of ``producer`` is committed here."""
        mark = self.get(producer)
        return min([mark.seq if mark is not None else 0, *(low.seq for low in self._lows(producer))])

    def passed(self, producer: bytes, seq: int) -> None:
        """A duplicate ``seq`` of ``producer`` arrived: nothing older of it can follow (records
        come in order), so its lower marks rise to ``seq`` too."""
        lows = self._lows(producer)
        mark = self.get(producer)
        if lows and mark is not None:
            self.lower_changed[producer] = [Lower(lo.start, lo.end, max(lo.seq, seq)) for lo in lows
                                            if max(lo.seq, seq) < mark.seq]

    def restart(self, producer: bytes, token: int, now_us: int) -> None:
        """Forget what ``producer`` sent so far: its mark starts again at 0 under ``token``."""
        self.changed[producer] = Mark(0, token, now_us)
        if self._lows(producer):
            self.lower_changed[producer] = []

    def advance(self, producer: bytes, seq: int, token: int, now_us: int) -> None:
        old = self.get(producer)
        if old is not None:
            top, token = max(seq, old.seq), max(token, old.token)
        else:
            top = seq
        self.changed[producer] = Mark(top, token, now_us)
        lows = self._lows(producer)
        if lows and seq:  # nothing older than seq can follow it: raise the lower marks to it
            self.lower_changed[producer] = [Lower(lo.start, lo.end, max(lo.seq, seq)) for lo in lows
                                            if max(lo.seq, seq) < top]

    def admit(self, orders: dict[bytes, tuple[int, int]], now_us: int, tablet: str) -> tuple[bytes, int, int] | None:
        """Whether a delivery whose producers sent ``orders`` (producer -> (the sequence it
        follows, the producer tablet's token)) may be committed now: None, and each producer
        with a newer token restarts its order here (its predecessor is refused from now on).
        Otherwise (producer, token, its mark's token): a stale producer tablet when the token
        is older than its mark's (ids it sends may collide with its successor's), or an
        earlier delivery of that producer not committed here yet when it is not. (``tablet``
        names this tablet in the log.)"""
        for producer, (after, token) in orders.items():
            mark = self.get(producer)
            if mark is not None and token < mark.token:
                return producer, token, mark.token
            if after > self.floor(producer):
                return producer, token, token
        for producer, (_, token) in orders.items():
            mark = self.get(producer)
            if mark is not None and token > mark.token:
                if mark.token == 0 and is_worker_producer(producer):
                    # A tablet's mark no owner of it set (every tablet token is at least 1):
                    # written by a caller without the worker role before review N4's check
                    # existed. Its sequence would make the real records read as duplicates.
                    log.warning("tablet %s dropped a mark of producer %s set under no token (seq %d)",
                                tablet, producer.hex(), mark.seq)
                    self.restart(producer, token, now_us)
                else:
                    self.advance(producer, 0, token, now_us)
        return None


class OpaqueIds:
    """Opaque ids of the last ``retention_us`` of wall time: Bloom filters per time bucket.

    A bucket spans a quarter of the retention; ids are kept for five buckets (the current
    one and four full ones), so at least ``retention_us`` and at most 1.25 times that.
    """

    BUCKETS_KEPT = 5

    def __init__(self, retention_us: int, capacity: int = 100_000) -> None:
        self.retention_us = retention_us
        self.bucket_us = max(1_000_000, retention_us // (self.BUCKETS_KEPT - 1))
        self.capacity = capacity
        self._blooms: dict[int, list[tuple[Bloom, int]]] = {}  # bucket -> [(filter, capacity)]
        self._counts: dict[int, int] = {}

    def bucket(self, now_us: int) -> int:
        return now_us // self.bucket_us

    def oldest_kept(self, now_us: int) -> int:
        return self.bucket(now_us) - (self.BUCKETS_KEPT - 1)

    def add(self, bucket: int, ids: Iterable[bytes]) -> None:
        gens = self._blooms.setdefault(bucket, [])
        count = self._counts.get(bucket, 0)
        for rid in ids:
            if not gens or count >= gens[-1][1]:
                cap = self.capacity * (2 ** len(gens))  # grows with the rate, never rebuilt
                gens.append((Bloom(cap, 0.01), cap))
                count = 0
            gens[-1][0].add(rid)
            count += 1
        self._counts[bucket] = count

    def candidates(self, rid: bytes) -> list[int]:
        """The buckets that may hold ``rid`` (confirm on disk)."""
        return [b for b, gens in self._blooms.items() if any(rid in g for g, _ in gens)]

    def expire(self, below: int) -> None:
        for b in [b for b in self._blooms if b < below]:
            del self._blooms[b]
            self._counts.pop(b, None)

    @property
    def buckets(self) -> int:
        return len(self._blooms)

    def memory_bytes(self) -> int:
        """About the filters' size: 9.6 bits per planned id at a 1 % error rate."""
        return sum(cap * 12 // 10 for gens in self._blooms.values() for _, cap in gens)


def ascending(seqs: list[int]) -> bool:
    """Whether ``seqs`` rise strictly: what lets one range check stand for a check per record."""
    return all(map(operator.lt, seqs, itertools.islice(seqs, 1, None)))


def first_new(seqs: list[int], start: int, mark: int) -> int:
    """The first index from ``start`` whose sequence is above ``mark`` (``seqs`` ascending):
    the records before it are duplicates, it and the rest are new."""
    return bisect.bisect_right(seqs, mark, start)
