"""One destination tablet as the delivery core (runtime/courier.py) keeps it: a *lane*. Its
queue of parcels, its deliveries in flight (one, or a chain of them), its back-off, and the
one door every parcel enters its queue through.

The door keeps each owner's records in the queue in that owner's order (runtime/parcels.py):
a record of known order must not follow a later one of its owner; one of unknown order (re-sent
from a checkpoint) must not follow a known one, nor a higher sequence of its producer among
the unknown. :meth:`Lane.enter` says which owners it found out of order; the core re-arranges
their queued parcels (:func:`~runtime.parcels.arrange`). The check costs two comparisons per
parcel on the common path (a commit's shipments arrive in order).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic

from runtime.columns import PREFIX_BYTES, Columns
from runtime.delivery import Orders, Outcome
from runtime.parcels import UNKNOWN, OwnerT, ParcelT, first_key, in_order, last_key, unknown_sequences

Dest = tuple[str, int]  # (computation, key range)

MIN_BACKOFF_S = 0.005


@dataclass(eq=False, slots=True)
class Flight(Generic[ParcelT, OwnerT]):
    """A delivery in flight: its parcels and the producers its orders list."""

    id: int
    items: list[tuple[ParcelT, OwnerT]]
    producers: frozenset[bytes]
    outcome: Outcome | None = None  # a failure, kept until the lane's other flights are answered


@dataclass(eq=False, slots=True)
class Lane(Generic[ParcelT, OwnerT]):
    """One destination tablet's queue, flights and state (see the module docstring)."""

    dest: Dest
    queue: deque[tuple[ParcelT, OwnerT]] = field(default_factory=deque)
    flights: dict[int, Flight[ParcelT, OwnerT]] = field(default_factory=dict)  # in the order sent (the chain)
    tail: dict[bytes, int] = field(default_factory=dict)  # producer -> its last sequence in flight
    tops: dict[int, tuple[OwnerT, int]] = field(default_factory=dict)  # id(owner) -> (it, its last order key queued)
    # (id(owner), producer) -> (it, that producer's last sequence among its records of unknown
    # order queued here)
    seq_tops: dict[tuple[int, bytes], tuple[OwnerT, int]] = field(default_factory=dict)
    ready_at: float = 0.0             # backing off until then
    after_version: int | None = None  # waiting for a routing newer than this (or ``ready_at``)
    backoff: float = MIN_BACKOFF_S
    retired: bool = False             # its range is gone: staged once nothing is in flight
    dropping: bool = False            # its computation is gone: dropped once nothing is in flight

    @property
    def broken(self) -> bool:
        """A delivery in flight failed: nothing more goes until the others are answered."""
        return any(f.outcome is not None for f in self.flights.values())

    def enter(self, items: Sequence[tuple[ParcelT, OwnerT]], front: bool = False) -> list[OwnerT]:
        """``items`` into the queue, at its end (or its front); the owners whose queued
        records are now out of their order."""
        bad: dict[int, OwnerT] = {}
        if front:
            self.queue.extendleft(reversed(items))
            for key, o in {id(o): o for _, o in items}.items():
                if not self._owner_in_order(o):
                    bad[key] = o
            return list(bad.values())
        tops = self.tops
        queue = self.queue
        for item in items:
            p, o = item
            key = id(o)
            entry = tops.get(key)
            lo, hi = first_key(p), last_key(p)
            if entry is None or entry[0] is not o:
                tops[key] = (o, hi)
            else:
                top = entry[1]
                if lo < top:
                    bad[key] = o
                if hi > top:
                    tops[key] = (o, hi)
            if lo == UNKNOWN and self._unknown_falls(p, o):
                bad[key] = o
            queue.append(item)
        return list(bad.values())

    def forget_owners(self) -> None:
        """Nothing of anyone is queued: what the door knew of each owner goes."""
        self.tops.clear()
        self.seq_tops.clear()

    def _unknown_falls(self, p: ParcelT, o: OwnerT) -> bool:
        """Count ``p``'s records of unknown order in; whether a producer's sequence among them
        falls below one already queued for ``o``."""
        falls = False
        seq_tops = self.seq_tops
        for producer, (first, last) in unknown_sequences(p).items():
            key = (id(o), producer)
            entry = seq_tops.get(key)
            if entry is None or entry[0] is not o:
                seq_tops[key] = (o, last)
                continue
            falls = falls or first < entry[1]
            if last > entry[1]:
                seq_tops[key] = (o, last)
        return falls

    def _owner_in_order(self, o: OwnerT) -> bool:
        """Whether ``o``'s queued parcels are in its order (and count them in)."""
        keys: list[int] = []
        last: dict[bytes, int] = {}
        ok = True
        for p, q in self.queue:
            if q is not o:
                continue
            keys += (first_key(p), last_key(p))
            for producer, (first, high) in unknown_sequences(p).items():
                prev = last.get(producer)
                ok = ok and (prev is None or first > prev)
                last[producer] = high if prev is None else max(high, prev)
        self.tops[id(o)] = (o, max(keys, default=UNKNOWN))
        for producer, high in last.items():
            self.seq_tops[(id(o), producer)] = (o, high)
        return ok and in_order(keys)

    def batch(self, max_bytes: int, max_records: int) -> tuple[int, list[tuple[ParcelT, OwnerT]]]:
        """The next delivery's parcels from the front of the queue (skipping closing owners'),
        and how many queue entries that takes."""
        items: list[tuple[ParcelT, OwnerT]] = []
        size = count = taken = 0
        for item in self.queue:
            p, o = item
            if not o.closing:
                size += p.cols.nbytes()
                count += len(p.cols)
                if items and (size > max_bytes or count > max_records):
                    break  # bounded in bytes too: large values never exceed a message
                items.append(item)
            taken += 1
        return taken, items

    def chains(self, producers: frozenset[bytes], exactly_once: bool) -> bool:
        """Whether a delivery listing ``producers`` may go behind those in flight: the tablet
        holds it behind the last of them (each holds behind the one before)."""
        last = next(reversed(self.flights.values()))
        return exactly_once and not producers.isdisjoint(last.producers)

    def orders(self, items: list[tuple[ParcelT, OwnerT]], chained: bool) -> Orders:
        """Each producer's place: after the last of its sequences in flight to the tablet (0:
        nothing is, or ``chained`` is off), under its owner's token."""
        orders: Orders = {}
        tail = self.tail
        for p, o in items:
            for producer in p.producers:
                token = o.token
                old = orders.get(producer)
                orders[producer] = (tail.get(producer, 0) if chained else 0, token if old is None else max(old[1], token))
        if chained:
            for p, _ in items:
                tail.update(last_sequences(p.cols, p.producers))
        return orders


def last_sequences(cols: Columns, producers: Sequence[bytes]) -> dict[bytes, int]:
    """The last sequence of each of ``producers`` among ``cols``' records: one look in the
    sequenced form, a scan from the end of the ids otherwise."""
    if not producers:
        return {}
    seqs = cols.seqs
    if cols.producer is not None and seqs is not None:
        return {cols.producer: seqs[-1]} if seqs and cols.producer in producers else {}
    wanted = set(producers)
    here: dict[bytes, int] = {}
    for rid in reversed(cols.all_ids()):
        prefix = rid[:PREFIX_BYTES]
        if prefix in wanted and prefix not in here:
            here[prefix] = int.from_bytes(rid[PREFIX_BYTES:], "big")
            if len(here) == len(wanted):
                break
    return here
