"""The worker's sender re-routes what it holds for a split or merged range (worker/sender.py):
by key, to the new ranges, ahead of newer records and in each producer's order; and drops what
it holds for a computation the routing no longer has."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from runtime.columns import Columns
from runtime.keyspace import HASH_SPACE, key_hash
from runtime.record import Record, sequence_id
from runtime.routing import RoutingTable
from runtime.wire import millstream_pb2 as pb
from worker.outbox import Outbox
from worker.sender import NOT_OWNER, OK, Sender
from worker.storage import Shipment

HALF = HASH_SPACE // 2
PRODUCER = b"producer"


def Production(computation: str, key_range: int, record: Record, producer: bytes | None = None,
               order: int | None = None) -> Shipment:
    """A shipment of one record (what one production was before shipments)."""
    return Shipment(computation, key_range, Columns.of_records([record], producer),
                    (producer,) if producer else (), order=None if order is None else [order])


def _ids(shipments: list[Shipment]) -> list[int]:
    return [int.from_bytes(rid[8:], "big") for s in shipments for rid in s.cols.all_ids()]


def _routing(version: int, ranges: list[tuple[int, int, int]]) -> RoutingTable:
    r = pb.Routing(version=version)
    c = r.computations.add(name="c")
    for rid, lo, hi in ranges:
        c.assignments.add(key_range=rid, address="w", token=2, start=lo, end=0 if hi == HASH_SPACE else hi)
    return RoutingTable(r)


class Owner:
    closing = False
    token = 2
    name = "producer/0"

    def __init__(self) -> None:
        self.done: list[int] = []

    def acked(self, productions: list[Shipment], receipt: Any) -> None:
        self.done += _ids(productions)

    def rerouted(self, old: list[Shipment], new: list[Shipment], parts: Any) -> None:
        pass


def _keys(n: int) -> list[bytes]:
    return [b"k%d" % i for i in range(n)]


def test_a_split_range_s_queue_goes_to_the_halves_in_order_before_newer_records() -> None:
    async def run() -> dict[int, list[int]]:
        table = {"now": _routing(1, [(0, 0, HASH_SPACE)])}
        got: dict[int, list[int]] = {}
        gate, all_in = asyncio.Event(), asyncio.Event()

        async def deliver(address: str, comp: str, rid: int, token: int, records: Columns,
                          orders: Any) -> tuple[int, Any]:
            if rid == 0:
                await gate.wait()
                return NOT_OWNER, None  # split away meanwhile
            got.setdefault(rid, []).extend(int.from_bytes(rid[8:], "big") for rid in records.all_ids())
            if sum(len(v) for v in got.values()) == 40:
                all_in.set()
            return OK, None

        sender = Sender(lambda: table["now"], deliver, max_batch=7)
        owner = Owner()
        keys = _keys(40)

        def prods(seqs: range) -> list[Shipment]:
            return [Production("c", 0, Record(keys[s % 40], b"", 0, sequence_id(PRODUCER, s)), producer=PRODUCER)
                    for s in seqs]

        sender.send(prods(range(1, 31)), owner)  # type: ignore[arg-type]
        await asyncio.sleep(0)  # its delivery starts (and waits at the gate)
        table["now"] = _routing(2, [(1, 0, HALF), (2, HALF, HASH_SPACE)])
        sender.routing_applied()
        # Produced under the new routing while the old queue is still in flight:
        sender.send([Production("c", 1 if key_hash(keys[s % 40]) < HALF else 2,
                                Record(keys[s % 40], b"", 0, sequence_id(PRODUCER, s)), producer=PRODUCER)
                     for s in range(31, 41)], owner)  # type: ignore[arg-type]
        for _ in range(10):
            await asyncio.sleep(0)  # the new queues' tasks run, and must wait
        assert got == {}  # nothing goes to the halves before the old range's records
        gate.set()
        await asyncio.wait_for(all_in.wait(), 10)
        await sender.close()
        return got

    got = asyncio.run(run())
    assert sorted(got[1] + got[2]) == list(range(1, 41))
    for rid, lo, hi in ((1, 0, HALF), (2, HALF, HASH_SPACE)):
        assert got[rid] == sorted(got[rid])  # each producer's records in order
        assert all(lo <= key_hash(b"k%d" % (s % 40)) < hi for s in got[rid])


def test_two_merged_ranges_queues_are_interleaved_by_sequence() -> None:
    async def run() -> list[int]:
        table = {"now": _routing(1, [(0, 0, HALF), (1, HALF, HASH_SPACE)])}
        got: list[int] = []
        all_in = asyncio.Event()

        async def deliver(address: str, comp: str, rid: int, token: int, records: Columns,
                          orders: Any) -> tuple[int, Any]:
            if rid != 2:
                return NOT_OWNER, None
            got.extend(int.from_bytes(rid[8:], "big") for rid in records.all_ids())
            if len(got) == 40:
                all_in.set()
            return OK, None

        sender = Sender(lambda: table["now"], deliver)
        owner = Owner()
        keys = _keys(40)
        sender.send([Production("c", 0 if key_hash(keys[s]) < HALF else 1,
                                Record(keys[s], b"", 0, sequence_id(PRODUCER, s + 1)), producer=PRODUCER)
                     for s in range(40)], owner)  # type: ignore[arg-type]
        await asyncio.sleep(0)
        table["now"] = _routing(2, [(2, 0, HASH_SPACE)])
        sender.routing_applied()
        await asyncio.wait_for(all_in.wait(), 10)
        await sender.close()
        return got

    assert asyncio.run(run()) == list(range(1, 41))



def test_shipments_made_for_merged_ranges_and_sent_together_arrive_in_sequence() -> None:
    """Regression (the chaos suite's reshard seed 4): a tablet reopened after a merge re-sends
    its checkpoints, shipments made for the two ranges the merge replaced, whose sequences
    interleave. Re-routed one shipment at a time they reached the merged range as [2, 4, 6,
    1, 3, 5] in one delivery, and the receiver took 1, 3 and 5 for duplicates of a delivery
    that had passed them: lost."""
    async def run() -> list[list[int]]:
        table = {"now": _routing(2, [(2, 0, HASH_SPACE)])}  # the merge is done: only range 2
        deliveries: list[list[int]] = []
        all_in = asyncio.Event()

        async def deliver(address: str, comp: str, rid: int, token: int, records: Columns,
                          orders: Any) -> tuple[int, Any]:
            assert rid == 2
            deliveries.append([int.from_bytes(i[8:], "big") for i in records.all_ids()])
            if sum(map(len, deliveries)) == 40:
                all_in.set()
            return OK, None

        sender = Sender(lambda: table["now"], deliver)
        keys = _keys(40)
        by_range: dict[int, list[Record]] = {0: [], 1: []}
        for s in range(40):
            by_range[0 if key_hash(keys[s]) < HALF else 1].append(Record(keys[s], b"", 0, sequence_id(PRODUCER, s + 1)))
        shipments = [Shipment("c", r, Columns.of_records(recs, PRODUCER), (PRODUCER,)) for r, recs in by_range.items()]
        sender.send(shipments, Owner())  # type: ignore[arg-type]
        await asyncio.wait_for(all_in.wait(), 10)
        await sender.close()
        return deliveries

    deliveries = asyncio.run(run())
    seqs = [s for d in deliveries for s in d]
    assert seqs == list(range(1, 41)), deliveries

def test_merged_ranges_queues_keep_the_order_they_were_given_in() -> None:
    """A weak tablet's outputs carry sequences of several producers (one per input producer)
    and opaque ids: their ids do not say the order the tablet made them in, which each key's
    records must keep (DESIGN.md §2). The re-route keeps the tablet's production order."""
    async def run() -> list[bytes]:
        table = {"now": _routing(1, [(0, 0, HALF), (1, HALF, HASH_SPACE)])}
        got: list[bytes] = []
        all_in = asyncio.Event()

        async def deliver(address: str, comp: str, rid: int, token: int, records: Columns,
                          orders: Any) -> tuple[int, Any]:
            if rid != 2:
                return NOT_OWNER, None
            got.extend(records.values)
            if len(got) == 40:
                all_in.set()
            return OK, None

        sender = Sender(lambda: table["now"], deliver)
        owner = Owner()
        keys = _keys(4)

        def made(i: int) -> Shipment:
            key = keys[i % 4]
            r = 0 if key_hash(key) < HALF else 1
            if i % 3 == 2:  # an opaque id (a timer's output)
                return Production("c", r, Record(key, b"%d" % i, 0, bytes([200 - i]) * 16), order=i)
            producer = b"weak-%03d" % (i % 3)  # two weak producers: one far ahead of the other
            seq = (1000 - i if i % 3 else i) << 20
            return Production("c", r, Record(key, b"%d" % i, 0, sequence_id(producer, seq)), producer=producer,
                              order=i)

        sender.send([made(i) for i in range(40)], owner)  # type: ignore[arg-type]
        await asyncio.sleep(0)
        table["now"] = _routing(2, [(2, 0, HASH_SPACE)])
        sender.routing_applied()
        await asyncio.wait_for(all_in.wait(), 10)
        await sender.close()
        return got

    assert asyncio.run(run()) == [b"%d" % i for i in range(40)]


TS = 1_700_000_000_000_000


async def _until(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0)


class Producer(Owner):
    """Keeps its productions' timestamps in an Outbox, as a Tablet does."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped_ids: list[int] = []
        self.outbox = Outbox()

    def send(self, sender: Sender, productions: list[Shipment]) -> None:
        self.outbox.sent(productions)
        sender.send(productions, self)  # type: ignore[arg-type]

    def acked(self, productions: list[Shipment], receipt: Any) -> None:
        super().acked(productions, receipt)
        self.outbox.acked(productions, None)

    def dropped(self, productions: list[Shipment]) -> None:
        self.dropped_ids += _ids(productions)
        self.outbox.acked(productions, None)

    def rerouted(self, old: list[Shipment], new: list[Shipment], parts: Any) -> None:
        self.outbox.replaced(old, new)


def _prods(computation: str, seqs: range) -> list[Shipment]:
    return [Production(computation, 0, Record(b"k%d" % s, b"", TS + s, sequence_id(PRODUCER, s)),
                       producer=PRODUCER) for s in seqs]


def test_productions_for_a_computation_the_routing_no_longer_has_are_dropped() -> None:
    """Review 3, N3: they were retried for ever, holding their producer's oldest work (so its
    watermark, its drain and its savepoints) for good."""
    async def run() -> None:
        r = pb.Routing(version=7)
        r.computations.add(name="c").assignments.add(key_range=0, address="w", token=2, start=0, end=0)
        table = {"now": RoutingTable(pb.Routing(version=7))}  # the reader's job was cancelled
        calls: list[str] = []

        async def deliver(address: str, comp: str, rid: int, token: int, records: Columns,
                          orders: Any) -> tuple[int, Any]:
            calls.append(comp)
            return OK, None

        sender = Sender(lambda: table["now"], deliver)
        owner = Producer()
        owner.send(sender, _prods("gone", range(1, 4)))
        assert sender.pending() == 0 and owner.dropped_ids == [1, 2, 3]
        assert owner.outbox.oldest() is None and owner.outbox.unacked == 0, "it holds the producer no more"
        # A computation that is still there is delivered to as ever.
        table["now"] = RoutingTable(r)
        sender.routing_applied()
        owner.send(sender, _prods("c", range(4, 6)))
        await _until(lambda: owner.done == [4, 5], "the delivery to c")
        assert calls == ["c"] and owner.outbox.oldest() is None
        await sender.close()

    asyncio.run(run())


def test_a_queue_whose_computation_leaves_the_routing_is_dropped_after_its_delivery_in_flight() -> None:
    async def run() -> None:
        table = {"now": _routing(1, [(0, 0, HASH_SPACE)])}
        gate, in_flight = asyncio.Event(), asyncio.Event()
        delivered: list[int] = []

        async def deliver(address: str, comp: str, rid: int, token: int, records: Columns,
                          orders: Any) -> tuple[int, Any]:
            if not delivered:
                in_flight.set()
                await gate.wait()  # committed just before the cancel
                delivered.extend(int.from_bytes(rid[8:], "big") for rid in records.all_ids())
                return OK, None
            return NOT_OWNER, None  # never reached: the routing no longer has "c"

        sender = Sender(lambda: table["now"], deliver, max_batch=3)
        owner = Producer()
        owner.send(sender, _prods("c", range(1, 11)))
        await asyncio.wait_for(in_flight.wait(), 10)
        table["now"] = RoutingTable(pb.Routing(version=2))  # the reader's job is cancelled
        sender.routing_applied()
        gate.set()
        await _until(lambda: not sender.pending(), "the queues dropped")
        assert delivered == [1, 2, 3] and owner.done == [1, 2, 3], "what was in flight ends as it ends"
        assert owner.dropped_ids == list(range(4, 11))
        assert owner.outbox.oldest() is None and owner.outbox.unacked == 0
        await sender.close()

    asyncio.run(run())


def test_a_computation_removed_while_a_range_of_it_is_being_re_routed_is_dropped_whole() -> None:
    async def run() -> None:
        table = {"now": _routing(1, [(0, 0, HALF), (1, HALF, HASH_SPACE)])}

        async def deliver(address: str, comp: str, rid: int, token: int, records: Columns,
                          orders: Any) -> tuple[int, Any]:
            return NOT_OWNER, None

        sender = Sender(lambda: table["now"], deliver)
        owner = Producer()
        owner.send(sender, [Production("c", 0 if key_hash(p.cols.keys[0]) < HALF else 1, p.cols.record(0),
                                       producer=PRODUCER) for p in _prods("c", range(1, 21))])
        await asyncio.sleep(0)
        table["now"] = _routing(2, [(2, 0, HASH_SPACE)])  # merged...
        sender.routing_applied()
        await asyncio.sleep(0)
        table["now"] = RoutingTable(pb.Routing(version=3))  # ... and then removed
        sender.routing_applied()
        await _until(lambda: not sender.pending(), "the queues dropped")
        assert sorted(owner.dropped_ids) == list(range(1, 21)) and owner.done == []
        assert owner.outbox.oldest() is None
        await sender.close()

    asyncio.run(run())


def test_records_re_sent_from_checkpoints_go_first_and_a_re_routed_shipment_keeps_its_order() -> None:
    """Review of issue 29: a weak tablet's records re-sent at open carry no production order
    and are older than anything it made since; and a shipment re-routed once must keep the
    order of its records for the next re-route (else a newer record of a weak producer goes
    ahead of an older one, and the receiver drops the older one as a duplicate)."""
    async def run() -> list[bytes]:
        table = {"now": _routing(1, [(0, 0, HASH_SPACE)])}
        got: list[bytes] = []
        all_in = asyncio.Event()

        async def deliver(address: str, comp: str, rid: int, token: int, records: Columns,
                          orders: Any) -> tuple[int, Any]:
            if rid != 3:
                return NOT_OWNER, None
            got.extend(records.values)
            if len(got) == 12:
                all_in.set()
            return OK, None

        sender = Sender(lambda: table["now"], deliver)
        owner = Owner()
        keys = _keys(12)
        weak = b"weak-001"
        resent = Production("c", 0, Record(keys[0], b"0", 0, bytes([9]) * 16))  # from a checkpoint: no order
        made = [Production("c", 0, Record(keys[i], b"%d" % i, 0, sequence_id(weak, 100 - i)), producer=weak,
                           order=i) for i in range(1, 12)]
        sender.send([resent, *made], owner)  # type: ignore[arg-type]
        await asyncio.sleep(0)
        table["now"] = _routing(2, [(1, 0, HALF), (2, HALF, HASH_SPACE)])  # split...
        sender.routing_applied()
        for _ in range(5):
            await asyncio.sleep(0)
        table["now"] = _routing(3, [(3, 0, HASH_SPACE)])  # ... and merged again before delivery
        sender.routing_applied()
        await asyncio.wait_for(all_in.wait(), 10)
        await sender.close()
        return got

    assert asyncio.run(run()) == [b"%d" % i for i in range(12)]
