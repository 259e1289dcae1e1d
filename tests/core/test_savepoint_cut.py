"""A savepoint's pause on the worker (review N1): while a job's input is paused its tablets
fire no timers, wall-clock or event-time, but still take records from other tablets (so what
is in flight drains), and a running batch counts as in flight; once the pause ends the held
timers fire."""

from __future__ import annotations

import asyncio

from runtime import Record
from runtime.wire import millstream_pb2 as pb
from tests.core.corekit import engine_options, make_core
from tests.core.jobs import Blocking, Collector
from tests.core.test_worker_core import _until
from worker.core import WorkerCore
from worker.sender import OK

BASE = 1_700_000_000_000_000
JOB = (("echo", "tests.core.jobs:Echo"), ("events", "tests.core.jobs:EventTimers"),
       ("slow", "tests.core.jobs:Blocking"))


def routing(version: int, paused: bool) -> pb.Routing:
    r = pb.Routing(version=version)
    for name, code in JOB:
        c = r.computations.add(name=name, topology="job", code=code, outputs=["out"], key_ranges=1,
                               exactly_once=True, productions="strong", late_records="process",
                               input_paused=paused, options=engine_options())
        c.inputs.add(stream=f"in.{name}")
        c.assignments.add(key_range=0, worker_id="w", address="self:1", token=1)
    c = r.computations.add(name="collect", topology="job", code="tests.core.jobs:Collector", key_ranges=1,
                           exactly_once=True, productions="strong", late_records="process", input_paused=paused,
                           options=engine_options())
    c.inputs.add(stream="out")
    c.assignments.add(key_range=0, worker_id="w", address="self:1", token=1)
    return r


def record(value: bytes, n: int) -> Record:
    return Record(b"k", value, BASE, value.ljust(16, b".") + n.to_bytes(4, "big"))


def outputs() -> list[bytes]:
    return [v for _, _, v in Collector.seen]


async def through(core: WorkerCore, computation: str, value: bytes, n: int) -> None:
    """Deliver ``value`` as another tablet would and wait for it downstream: the tablet ran a
    batch after it (and fired whatever timer it would fire then)."""
    assert await core.deliver(computation, 0, 1, [record(value, n)]) == OK
    await _until(lambda: value in outputs(), f"{value!r} downstream")


def test_a_paused_jobs_tablets_hold_their_timers_and_fire_them_when_the_pause_ends(tmp_path: object) -> None:
    now = [BASE]

    async def main() -> None:
        core = await make_core(str(tmp_path), routing(1, False), clock=lambda: now[0])
        assert await core.deliver("echo", 0, 1, [record(b"later", 1)]) == OK  # a wall timer at +1 s
        assert await core.deliver("events", 0, 1, [record(b"at 5", 2)]) == OK  # an event timer at +5 µs
        await through(core, "echo", b"before", 3)
        assert outputs() == [b"later", b"before"]
        await core.apply_routing(routing(2, True))  # a savepoint pauses the job
        now[0] += 2_000_000
        core.set_watermarks({"events": BASE + 10})
        # Both timers are due now; the tablets still take records (in flight from other
        # tablets), and fire neither timer in those batches.
        await through(core, "echo", b"paused 1", 4)
        await through(core, "events", b"paused 2", 5)
        assert not [v for v in outputs() if v.startswith((b"timer", b"event"))], outputs()
        core.release({"w": 1 << 62})  # the leader holds the reports that confirm every receipt
        held = {(t.computation, t.key_range): t for t in core.next_report()[1]}
        commits = {k: t.commits for k, t in held.items()}
        assert all(t.in_flight == 0 for t in held.values())
        # At rest: checkpoints taken one after another see the same job (nothing commits).
        for key in (("events", 0), ("echo", 0), ("collect", 0)):
            path, _ = await core.checkpoint(*key, 1)
            assert path
        assert {(t.computation, t.key_range): t.commits for t in core.next_report()[1]} == commits
        await core.apply_routing(routing(3, False))  # the savepoint is done
        await _until(lambda: f"timer t at {BASE + 1_000_000}".encode() in outputs()
                     and b"event 5" in outputs(), "the held timers to fire")
        await core.close_all()

    asyncio.run(main())


def test_a_running_batch_counts_as_in_flight(tmp_path: object) -> None:
    Blocking.gate.clear()
    Blocking.started.clear()

    async def main() -> None:
        core = await make_core(str(tmp_path), routing(1, True))
        done = asyncio.ensure_future(core.deliver("slow", 0, 1, [record(b"block", 1)]))
        await asyncio.to_thread(Blocking.started.wait, 10)
        slow = next(t for t in core.next_report()[1] if t.computation == "slow")
        assert slow.in_flight >= 1 and slow.commits == 0  # not at rest: its batch may still commit
        Blocking.gate.set()
        assert await done == OK
        slow = next(t for t in core.next_report()[1] if t.computation == "slow")
        assert slow.commits == 1
        await _until(lambda: b"block" in outputs(), "the output")
        await core.close_all()

    asyncio.run(main())
