"""A drain closes a job to injectors (docs/lifecycle.md): an injector's delivery admitted
before the close but still waiting for room in its tablet when the close arrives does not go
in afterwards. The leader releases the injectors once the worker reports the closing
routing, taking its tablets' reports as everything that came in; a delivery queued after
that would be late where the stream's watermark has jumped to the end of time."""

from __future__ import annotations

import asyncio

from runtime import Record
from runtime.wire import millstream_pb2 as pb
from tests.core.corekit import engine_options, make_core
from tests.core.jobs import Blocking, Collector
from tests.core.test_worker_core import _until
from worker.core import WorkerLimits
from worker.sender import NOT_OWNER, OK

BASE = 1_700_000_000_000_000


def _routing(version: int, job_state: str) -> pb.Routing:
    r = pb.Routing(version=version)
    c = r.computations.add(name="slow", topology="job", code="tests.core.jobs:Blocking", outputs=["out"],
                           key_ranges=1, exactly_once=True, productions="strong", late_records="process",
                           job_state=job_state, options=engine_options())
    c.inputs.add(stream="in")
    c.assignments.add(key_range=0, worker_id="w", address="self:1", token=1)
    c = r.computations.add(name="collect", topology="job", code="tests.core.jobs:Collector", key_ranges=1,
                           exactly_once=True, productions="strong", late_records="process", job_state=job_state,
                           options=engine_options())
    c.inputs.add(stream="out")
    c.assignments.add(key_range=0, worker_id="w", address="self:1", token=1)
    return r


def test_an_injected_delivery_waiting_for_room_when_a_drain_closes_its_input_stays_out(tmp_path: object) -> None:
    async def main() -> None:
        core = await make_core(str(tmp_path), _routing(1, ""), WorkerLimits(max_queued_records=1))
        Blocking.gate.clear()
        Blocking.started.clear()
        first = asyncio.ensure_future(core.deliver_counted(
            "slow", 0, 1, [Record(b"k", b"block", BASE, b"1".ljust(16))], injected=True))
        await _until(Blocking.started.is_set, "the first batch to start (its user code blocks)")
        queued = asyncio.ensure_future(core.deliver_counted(
            "slow", 0, 1, [Record(b"k", b"queued", BASE + 1, b"2".ljust(16))], injected=True))
        tablet = core.tablets[("slow", 0)]
        await _until(lambda: tablet.inbox.records == 1, "the second delivery in the inbox (now full)")
        waiting = asyncio.ensure_future(core.deliver_counted(
            "slow", 0, 1, [Record(b"k", b"waiting", BASE + 2, b"3".ljust(16))], injected=True))
        for _ in range(3):
            await asyncio.sleep(0)  # (loop turns: admitted, it waits for room in the full inbox)
        assert not waiting.done() and tablet.inbox.records == 1
        await core.apply_routing(_routing(2, "draining"))
        Blocking.gate.set()
        assert await asyncio.wait_for(first, 10) == (OK, 0)
        assert await asyncio.wait_for(queued, 10) == (OK, 0), "queued before the close: it is in"
        assert await asyncio.wait_for(waiting, 10) == (NOT_OWNER, 0), "it went in after the drain closed the input"
        await _until(lambda: [v for _, _, v in Collector.seen] == [b"block", b"queued"], "the two outputs")
        await core.close_all()

    asyncio.run(main())
