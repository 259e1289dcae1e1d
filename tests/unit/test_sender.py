"""The worker's sender re-routes what it holds for a split or merged range (worker/sender.py):
by key, to the new ranges, ahead of newer records and in each producer's order."""

from __future__ import annotations

import asyncio
from typing import Any

from runtime.keyspace import HASH_SPACE, key_hash
from runtime.record import Record, sequence_id
from runtime.routing import RoutingTable
from runtime.wire import millstream_pb2 as pb
from worker.sender import NOT_OWNER, OK, Sender
from worker.storage import Production

HALF = HASH_SPACE // 2
PRODUCER = b"producer"


def _routing(version: int, ranges: list[tuple[int, int, int]]) -> RoutingTable:
    r = pb.Routing(version=version)
    c = r.computations.add(name="c")
    for rid, lo, hi in ranges:
        c.assignments.add(key_range=rid, address="w", token=2, start=lo, end=0 if hi == HASH_SPACE else hi)
    return RoutingTable(r)


class Owner:
    closing = False
    token = 2

    def __init__(self) -> None:
        self.done: list[int] = []

    def acked(self, productions: list[Production], receipt: Any) -> None:
        self.done += [int.from_bytes(p.record.id[8:], "big") for p in productions]


def _keys(n: int) -> list[bytes]:
    return [b"k%d" % i for i in range(n)]


def test_a_split_range_s_queue_goes_to_the_halves_in_order_before_newer_records() -> None:
    async def run() -> dict[int, list[int]]:
        table = {"now": _routing(1, [(0, 0, HASH_SPACE)])}
        got: dict[int, list[int]] = {}
        gate, all_in = asyncio.Event(), asyncio.Event()

        async def deliver(address: str, comp: str, rid: int, token: int, records: list[Record],
                          orders: Any) -> tuple[int, Any]:
            if rid == 0:
                await gate.wait()
                return NOT_OWNER, None  # split away meanwhile
            got.setdefault(rid, []).extend(int.from_bytes(r.id[8:], "big") for r in records)
            if sum(len(v) for v in got.values()) == 40:
                all_in.set()
            return OK, None

        async def changed(version: int, timeout: float) -> None:
            await asyncio.sleep(0)  # the fake routing wait: yield, no time passes

        sender = Sender(lambda: table["now"], deliver, changed, max_batch=7)
        owner = Owner()
        keys = _keys(40)

        def prods(seqs: range) -> list[Production]:
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

        async def deliver(address: str, comp: str, rid: int, token: int, records: list[Record],
                          orders: Any) -> tuple[int, Any]:
            if rid != 2:
                return NOT_OWNER, None
            got.extend(int.from_bytes(r.id[8:], "big") for r in records)
            if len(got) == 40:
                all_in.set()
            return OK, None

        async def changed(version: int, timeout: float) -> None:
            await asyncio.sleep(0)  # the fake routing wait: yield, no time passes

        sender = Sender(lambda: table["now"], deliver, changed)
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


def test_merged_ranges_queues_keep_the_order_they_were_given_in() -> None:
    """A weak tablet's outputs carry sequences of several producers (one per input producer)
    and opaque ids: their ids do not say the order the tablet made them in, which each key's
    records must keep (DESIGN.md §2). The re-route keeps the order the sender was given."""
    async def run() -> list[bytes]:
        table = {"now": _routing(1, [(0, 0, HALF), (1, HALF, HASH_SPACE)])}
        got: list[bytes] = []
        all_in = asyncio.Event()

        async def deliver(address: str, comp: str, rid: int, token: int, records: list[Record],
                          orders: Any) -> tuple[int, Any]:
            if rid != 2:
                return NOT_OWNER, None
            got.extend(r.value for r in records)
            if len(got) == 40:
                all_in.set()
            return OK, None

        async def changed(version: int, timeout: float) -> None:
            await asyncio.sleep(0)  # the fake routing wait: yield, no time passes

        sender = Sender(lambda: table["now"], deliver, changed)
        owner = Owner()
        keys = _keys(4)

        def made(i: int) -> Production:
            key = keys[i % 4]
            r = 0 if key_hash(key) < HALF else 1
            if i % 3 == 2:  # an opaque id (a timer's output)
                return Production("c", r, Record(key, b"%d" % i, 0, bytes([200 - i]) * 16))
            producer = b"weak-%03d" % (i % 3)  # two weak producers: one far ahead of the other
            seq = (1000 - i if i % 3 else i) << 20
            return Production("c", r, Record(key, b"%d" % i, 0, sequence_id(producer, seq)), producer=producer)

        sender.send([made(i) for i in range(40)], owner)  # type: ignore[arg-type]
        await asyncio.sleep(0)
        table["now"] = _routing(2, [(2, 0, HASH_SPACE)])
        sender.routing_applied()
        await asyncio.wait_for(all_in.wait(), 10)
        await sender.close()
        return got

    assert asyncio.run(run()) == [b"%d" % i for i in range(40)]
