"""Regressions for findings of the November 2026 review (../shared/reviews), in-process:
real RocksDB, no network. Each test names its finding."""

from __future__ import annotations

import asyncio

from runtime import Record
from tests.core.corekit import make_core
from tests.core.jobs import Collector
from tests.core.test_worker_core import BASE, _until, routing
from worker.core import WorkerCore
from worker.sender import OK


async def _core(tmp: str, clock: list[int], r: object) -> WorkerCore:
    return await make_core(tmp, r, clock=lambda: clock[0])  # type: ignore[arg-type]


def test_e1_a_weak_timer_firing_again_at_the_same_time_gets_new_output_ids(tmp_path: object) -> None:
    """A timer that re-arms itself at its own time fires three times; with weak productions
    each firing's output used to carry the first firing's id and two were dropped."""
    clock = [BASE]

    async def main() -> None:
        r = routing(("timers", "tests.core.jobs:TimerJob", ["in"], ["out"], {"repeat": "1"}),
                    ("collect", "tests.core.jobs:Collector", ["out"], [], {"name": "out"}))
        r.computations[0].productions = "weak"
        core = await _core(str(tmp_path), clock, r)
        assert await core.deliver("timers", 0, 1, [Record(b"k", b"set 10", BASE, b"1".ljust(16))]) == OK
        clock[0] = BASE + 20
        core.tablets[("timers", 0)]._wake.set()
        await _until(lambda: len(Collector.seen) == 3, "three firings' outputs")
        assert [v for _, _, v in Collector.seen] == [b"fired 10"] * 3
        await core.close_all()

    asyncio.run(main())


def test_e5_a_late_ack_of_a_weak_production_does_not_fail_the_next_commit(tmp_path: object) -> None:
    """A receiver slower than weak_ack_ms: the stragglers are checkpointed, and their late
    acknowledgement used to raise KeyError on the next commit, answer NOT_OWNER for a
    committed batch and reopen the tablet once per straggler."""
    clock = [BASE]

    async def main() -> None:
        r = routing(("echo", "tests.core.jobs:Echo", ["in"], ["out"], {}),
                    ("collect", "tests.core.jobs:SlowCollector", ["out"], [], {"name": "out", "sleep_ms": "60"}))
        r.computations[0].productions = "weak"
        core = await _core(str(tmp_path), clock, r)
        echo = core.tablets[("echo", 0)]
        statuses = []
        for i in range(5):
            rec = Record(b"k", b"v%d" % i, BASE + i, i.to_bytes(16, "big"))
            statuses.append(await core.deliver("echo", 0, 1, [rec]))
        assert statuses == [OK] * 5
        await _until(lambda: len(Collector.seen) == 5, "5 outputs")
        assert core.tablets[("echo", 0)] is echo and not echo.closing  # never reopened
        await _until(lambda: echo.outbox.unacked == 0, "every straggler acknowledged")
        core.release({"w": 1 << 62})  # the leader holds the receiver's reports (review N21)
        await _until(lambda: not echo.proc.store.productions(), "their checkpoints deleted")
        await core.close_all()

    asyncio.run(main())


def test_e9_a_computation_named_injector_does_not_share_ids_with_an_injector(tmp_path: object) -> None:
    """Tablet "injector/0" and an injector named "0" used to mint the same ids."""
    from runtime.record import producer_prefix

    async def main() -> None:
        core = await _core(str(tmp_path), [BASE], routing(("injector", "tests.core.jobs:Echo", ["in"], ["out"], {})))
        assert core.tablets[("injector", 0)].prefix != producer_prefix("injector/" + "0")
        await core.close_all()

    asyncio.run(main())
