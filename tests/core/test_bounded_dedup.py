"""Bounded dedup data (issue 11), in-process: real RocksDB, the worker core, injected clocks.

Sequenced ids cost a tablet one mark per producer however many records it sent, and a
re-send counts once however late; opaque ids are kept for the computation's retention.
"""

from __future__ import annotations

import asyncio
import os

from runtime import Record
from runtime.record import producer_prefix, sequence_id
from runtime.wire import millstream_pb2 as pb
from tests.core.corekit import engine_options, make_core
from tests.core.jobs import Count
from worker.core import WorkerCore, WorkerLimits
from worker.sender import OK, OUT_OF_ORDER

BASE = 1_700_000_000_000_000
P = producer_prefix("injector/src")


def routing(retention_s: float | None = None) -> pb.Routing:
    r = pb.Routing(version=1)
    c = r.computations.add(name="count", code="tests.core.jobs:Count", key_ranges=1, exactly_once=True,
                           productions="strong", late_records="process",
                           options=engine_options(dedup_retention_s=retention_s or 600.0))
    c.inputs.add(stream="in")
    c.assignments.add(key_range=0, worker_id="w", address="self:1", token=1)
    return r


def seq_records(lo: int, hi: int) -> list[Record]:
    return [Record(b"k%d" % (i % 100), b"", BASE + i, sequence_id(P, i)) for i in range(lo, hi)]


async def deliver(core: WorkerCore, records: list[Record], after: int = 0, sequenced: bool = True) -> int:
    return await core.deliver("count", 0, 1, records, {P: (after, 0)} if sequenced else None)


def test_a_replay_from_the_start_counts_once_also_after_reopening(tmp_path: object) -> None:
    async def run(replay_only: bool) -> None:
        core = await make_core(str(tmp_path), routing())
        if not replay_only:
            assert await deliver(core, seq_records(1, 501)) == OK
            assert await deliver(core, seq_records(501, 1001)) == OK
        # The injection re-run from the beginning, in other cuts, and a little further.
        assert await deliver(core, seq_records(1, 700)) == OK
        assert await deliver(core, seq_records(700, 1101)) == OK
        await core.close_all()

    Count.n = 0
    asyncio.run(run(False))
    assert Count.n == 1100
    asyncio.run(run(True))  # a new worker process on the same state, much later
    assert Count.n == 1100


def test_a_delivery_waits_for_the_one_it_follows(tmp_path: object) -> None:
    """A second chunk of a producer overtaking the first is refused until the first commits:
    committing it first would make the first look like a duplicate."""
    async def main() -> None:
        Count.n = 0
        core = await make_core(str(tmp_path), routing())
        assert await deliver(core, seq_records(11, 21), after=10) == OUT_OF_ORDER
        assert Count.n == 0
        assert await deliver(core, seq_records(1, 11)) == OK
        assert await deliver(core, seq_records(11, 21), after=10) == OK
        assert Count.n == 20
        await core.close_all()

    asyncio.run(main())


def test_opaque_ids_count_once_within_the_retention_and_are_then_collected(tmp_path: object) -> None:
    clock = [BASE]
    opaque = [Record(b"k", b"", BASE, i.to_bytes(16, "big")) for i in range(50)]

    async def main() -> None:
        Count.n = 0
        core = await make_core(str(tmp_path), routing(retention_s=400), clock=lambda: clock[0])
        assert await deliver(core, opaque, sequenced=False) == OK
        clock[0] += 300_000_000  # five minutes on: still within the retention
        assert await deliver(core, opaque[::-1], sequenced=False) == OK
        assert Count.n == 50
        store = core.tablets[("count", 0)].store
        assert len(list(store.opaque_ids(0))) == 50
        clock[0] += 300_000_000  # ten minutes after the first copy: past 400 s and its bucket
        assert await deliver(core, [Record(b"k", b"", BASE, b"n" * 16)], sequenced=False) == OK
        assert [rid for _, rid in store.opaque_ids(0)] == [b"n" * 16]  # the old ids are gone
        await core.close_all()

    asyncio.run(main())


def test_a_million_records_from_one_injector_leave_a_few_bytes_of_dedup_data(tmp_path: object) -> None:
    """Measured from the tablet's store (keys and values of its dedup data)."""
    limits = WorkerLimits(max_queued_records=100_000, max_batch_records=20_000)

    async def main() -> None:
        Count.n = 0
        core = await make_core(str(tmp_path), routing(), limits)
        step = 50_000
        for lo in range(1, 1_000_001, step):
            assert await deliver(core, seq_records(lo, lo + step)) == OK
        store = core.tablets[("count", 0)].store
        assert Count.n == 1_000_000
        assert store.dedup_bytes() <= 4096, store.dedup_bytes()
        assert store.dedup_bytes() == 1 + 8 + 24  # one producer's mark
        await core.close_all()

    asyncio.run(main())


def test_outputs_of_a_weak_tablet_are_sequenced_by_their_input(tmp_path: object) -> None:
    """A weak production of input (P, s) is (this tablet and P, s * 2**20 + index): its
    receiver keeps one mark for it, no opaque ids."""
    from runtime.record import derived_id, worker_producer
    from tests.core.jobs import Collector

    r = pb.Routing(version=1)
    for name, code, inputs, outputs, productions in (
            ("echo", "tests.core.jobs:Echo", ["in"], ["out"], "weak"),
            ("collect", "tests.core.jobs:Collector", ["out"], [], "strong")):
        c = r.computations.add(name=name, code=code, outputs=outputs, key_ranges=1, exactly_once=True,
                               productions=productions, late_records="process", options=engine_options())
        c.inputs.add(stream=inputs[0])
        c.assignments.add(key_range=0, worker_id="w", address="self:1", token=1)

    async def main() -> bytes:
        core = await make_core(str(tmp_path), r)
        records = [Record(b"k", b"v%d" % i, BASE + i, sequence_id(P, i)) for i in range(1, 6)]
        assert await core.deliver("echo", 0, 1, records, {P: (0, 0)}) == OK
        assert await core.deliver("echo", 0, 1, records, {P: (0, 0)}) == OK  # all duplicates
        await _until_seen(lambda: len(Collector.seen) >= 5)
        weak_producer = worker_producer(derived_id(core.tablets[("echo", 0)].prefix, P))
        await core.close_all()
        assert [v for _, _, v in Collector.seen] == [b"v%d" % i for i in range(1, 6)]
        return weak_producer

    weak_producer = asyncio.run(main())
    from worker.storage import TabletStore

    store = TabletStore(os.path.join(str(tmp_path), "collect", "0"), 2, sync=False)
    try:
        assert list(store.opaque_ids(0)) == []
        assert {p: m.seq for p, m in store.marks().items()} == {weak_producer: 5 * 2**20 + 1}
    finally:
        store.close()


async def _until_seen(cond: object, timeout: float = 10) -> None:
    async def poll() -> None:
        while not cond():  # type: ignore[operator]
            await asyncio.sleep(0.01)  # poll interval of this deadline-bounded wait
    await asyncio.wait_for(poll(), timeout)
