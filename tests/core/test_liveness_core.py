"""Liveness of the worker core in-process (issue 9): user code runs off the event loop,
batches are bounded in time and retried smaller, a call that never returns holds up only
its own key range. Real RocksDB, no network."""

from __future__ import annotations

import asyncio
import json
import time

from runtime import Record
from tests.core.corekit import make_core
from tests.core.jobs import BigBatchFails, Blocking, Collector
from tests.core.test_worker_core import BASE, _until, routing
from worker.core import WorkerCore, WorkerLimits
from worker.sender import OK
from worker.tablet import NOT_OWNER


async def _core(tmp: str, limits: WorkerLimits, *comps: tuple[str, str, list[str], list[str], dict[str, str]]
                ) -> WorkerCore:
    return await make_core(tmp, routing(*comps, ("collect", "tests.core.jobs:Collector", ["out"], [],
                                                 {"name": "out"})), limits)


def _recs(values: list[bytes], key: bytes = b"k", first: int = 0) -> list[Record]:
    return [Record(key, v, BASE + first + i, (first + i).to_bytes(16, "big")) for i, v in enumerate(values)]


def _out() -> list[bytes]:
    return [v for n, _, v in Collector.seen if n == "out"]


def test_a_batch_stops_at_its_time_budget_and_the_rest_follows_in_order(tmp_path: object) -> None:
    async def main() -> None:
        core = await _core(str(tmp_path), WorkerLimits(batch_budget_ms=20),
                           ("slow", "tests.core.jobs:Blocking", ["in"], ["out"], {}))
        tablet = core.tablets[("slow", 0)]
        commits = []
        store_commit = tablet.proc.store.commit
        tablet.proc.store.commit = lambda c: (commits.append(len(c.opaque_ids)), store_commit(c))[1]  # type: ignore[method-assign]
        values = [b"sleep 5"] * 40 + [b"last"]
        assert await core.deliver("slow", 0, 1, _recs(values)) == OK  # one delivery of 41 records
        # 41 records of >= 5 ms against a 20 ms budget: several batches, each of a few records.
        assert len(commits) >= 8 and sum(commits) == 41 and max(commits) <= 5, commits
        await _until(lambda: len(_out()) == 41, "41 outputs")
        assert _out() == values  # in order, each once
        await core.close_all()

    asyncio.run(main())


def test_user_code_that_never_returns_holds_up_only_its_key_range(tmp_path: object) -> None:
    Blocking.gate.clear()
    Blocking.started.clear()

    async def main() -> None:
        core = await _core(str(tmp_path), WorkerLimits(),
                           ("stuck", "tests.core.jobs:Blocking", ["in"], ["out"], {}),
                           ("free", "tests.core.jobs:Blocking", ["other"], ["out"], {}))
        blocked = asyncio.ensure_future(core.deliver("stuck", 0, 1, _recs([b"block"], key=b"hung")))
        await _until(Blocking.started.is_set, "the call to start")
        # The event loop is free: another tablet commits, the stuck one is named with its key.
        assert await core.deliver("free", 0, 1, _recs([b"a", b"b"], first=10)) == OK
        await _until(lambda: _out() == [b"a", b"b"], "the free tablet's outputs")
        stuck = core.tablets[("stuck", 0)]
        await _until(lambda: (stuck.calls.running() or (b"", 0.0))[1] > 0.05, "a measurable running time")
        report = stuck.progress()
        assert [(s.key, s.running) for s in report.slow] == [(b"hung", True)]
        assert not blocked.done()
        # Shutting down does not wait forever for it.
        t0 = time.monotonic()
        await core.close_all(timeout=0.5)
        assert time.monotonic() - t0 < 5
        assert core.stuck() == ["stuck/0"]
        Blocking.gate.set()  # the call returns; the tablet's thread closes its storage and ends
        assert await blocked in (OK, NOT_OWNER)
        await _until(lambda: stuck.thread is not None and not stuck.thread.alive, "the tablet's thread to end")

    asyncio.run(main())


def test_a_batch_that_fails_is_retried_smaller_until_it_commits(tmp_path: object) -> None:
    async def main() -> None:
        core = await _core(str(tmp_path), WorkerLimits(),
                           ("big", "tests.core.jobs:BigBatchFails", ["in"], ["out"], {}))
        values = [b"v%d" % i for i in range(20)]
        attempts = 0
        while (status := await core.deliver("big", 0, 1, _recs(values))) != OK:
            attempts += 1  # as a sender does: NOT_OWNER or BUSY, then retry
            assert attempts < 100, "the batch is retried identically forever"
            await core.reconcile()
        await _until(lambda: len(_out()) == 20, "20 outputs")
        assert sorted(_out()) == sorted(values) and status == OK
        assert core.tablets[("big", 0)].batch_limit <= 2 * BigBatchFails.max + 2
        await core.close_all()

    asyncio.run(main())


def test_sys_exit_in_user_code_is_dead_lettered_not_the_worker_exiting(tmp_path: object) -> None:
    async def main() -> None:
        core = await _core(str(tmp_path), WorkerLimits(),
                           ("ex", "tests.core.jobs:Blocking", ["in"], ["out"], {}),
                           ("dead", "tests.core.jobs:Collector", ["ex.dead_letter"], [], {"name": "dead"}))
        assert await core.deliver("ex", 0, 1, _recs([b"a", b"exit", b"b"])) == OK
        await _until(lambda: len(Collector.seen) == 3, "2 outputs and a dead letter")
        dead = [json.loads(v) for n, _, v in Collector.seen if n == "dead"]
        assert _out() == [b"a", b"b"] and dead[0]["error"] == "SystemExit: 3"
        await core.close_all()

    asyncio.run(main())


def test_a_burst_of_due_timers_fires_over_several_batches_each_once(tmp_path: object) -> None:
    clock = [BASE]

    async def main() -> None:
        core = await make_core(str(tmp_path), routing(
            ("timers", "tests.core.jobs:TimerJob", ["in"], ["out"], {}),
            ("collect", "tests.core.jobs:Collector", ["out"], [], {"name": "out"})),
            WorkerLimits(max_batch_records=7), clock=lambda: clock[0])
        for i in range(50):  # 50 keys, each with a timer at BASE + 10 + i
            rec = Record(b"key%d" % i, b"set %d" % (10 + i), BASE, i.to_bytes(16, "big"))
            assert await core.deliver("timers", 0, 1, [rec]) == OK
        clock[0] = BASE + 1000  # all 50 fall due at once; batches hold at most 7
        core.tablets[("timers", 0)]._wake.set()
        await _until(lambda: len(_out()) == 50, "50 firings")
        assert sorted(_out()) == sorted(b"fired %d" % (10 + i) for i in range(50))
        assert len(core.tablets[("timers", 0)].timers) == 0
        await core.close_all()

    asyncio.run(main())
