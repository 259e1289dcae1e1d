"""A classic stage's ``ctx.state`` reads of keys its read cache does not hold: once one
delivery's reads missed (each one a RocksDB read), the next deliveries' keys are read
together first (worker/batch.py ``_run_records``, worker/readcache.py ``prefetch``), and
what user code reads is the same as without: committed state, the batch's own writes over
it, and nothing for a key never written."""

from __future__ import annotations

import asyncio
import tempfile

from runtime.columns import Columns
from runtime.computation import Computation, Context
from runtime.record import Record, producer_prefix
from runtime.wire import millstream_pb2 as pb
from tests.core.corekit import engine_options, make_core
from worker.core import WorkerLimits
from worker.sender import OK

P = producer_prefix("injector/prefetch")


class RareReader(Computation):
    """Reads its key's state for one record in ten."""

    def process_record(self, ctx: Context, record: Record) -> None:
        if record.value.endswith(b"0"):
            ctx.state.set((ctx.state.get() or b"") + b"x")


def _routing(code: str = "tests.core.jobs:Tally") -> pb.Routing:
    r = pb.Routing(version=1)
    c = r.computations.add(name="tally", code=code, key_ranges=1, exactly_once=True,
                           productions="strong", late_records="process", options=engine_options())
    c.inputs.add(stream="in")
    c.assignments.add(key_range=0, worker_id="w", address="self:1", token=1)
    return r


def _deliver(deliveries: list[list[bytes]], code: str = "tests.core.jobs:Tally"
             ) -> tuple[dict[bytes, bytes | None], int, int]:
    """The state of every key after the deliveries, the reads that missed the cache, and how
    many keys it holds."""

    async def go(tmp: str) -> tuple[dict[bytes, bytes | None], int, int]:
        core = await make_core(tmp, _routing(code), WorkerLimits(max_batch_records=1000))
        seq = 0
        try:
            for keys in deliveries:
                cols = Columns(keys, [b"%d" % (seq + i) for i in range(len(keys))], [1] * len(keys), P,
                               list(range(seq + 1, seq + 1 + len(keys))))
                seq += len(keys)
                assert await core.deliver("tally", 0, 1, cols, {P: (0, 0)}) == OK
            tablet = core.tablets[("tally", 0)]
            cache = tablet.store.state_cache
            state = {k: tablet.store.get_state(k) for k in {k for keys in deliveries for k in keys}}
            return state, cache.misses, len(cache.values)
        finally:
            await core.close_all()

    with tempfile.TemporaryDirectory() as tmp:
        return asyncio.run(go(tmp))


def test_keys_new_to_the_cache_are_read_together_and_read_the_same() -> None:
    deliveries = [[b"k%d" % ((d * 37 + i) % 150) for i in range(100)] for d in range(8)]
    state, misses, held = _deliver(deliveries)
    expected: dict[bytes, bytes] = {}
    seq = 0
    for keys in deliveries:
        for i, k in enumerate(keys):
            expected[k] = expected.get(k, b"") + b"%d;" % (seq + i)
        seq += len(keys)
    assert state == expected
    # The first delivery's keys were read one by one (up to 100 misses); every later key
    # new to the cache was read in a prefetch, not missed.
    assert misses <= 100, misses
    assert held == len(expected)


def test_a_stage_that_reads_state_for_few_records_reads_no_others() -> None:
    """Prefetching every key of a delivery for a stage that reads one in ten would read nine
    keys for nothing (and push hot ones out of the cache): it reads only what it asks for."""
    deliveries = [[b"r%d-%d" % (d, i) for i in range(100)] for d in range(6)]
    state, misses, held = _deliver(deliveries, "tests.core.test_state_prefetch:RareReader")
    assert {k: v for k, v in state.items() if v is not None} == {
        k: b"x" for d, keys in enumerate(deliveries) for i, k in enumerate(keys) if str(d * 100 + i).endswith("0")}
    assert misses == held == 60
