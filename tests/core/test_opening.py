"""What happens around a tablet's opening on a worker (worker/core.py): a routing that comes
while it opens, and an opening that keeps failing. Two workers in process, real RocksDB, the
network between them played by the test."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import pytest

from runtime.wire import millstream_pb2 as pb
from tests.core.corekit import engine_options, nowhere
from tests.core.jobs import FailingSetup, SlowSetup
from tests.core.test_sink_handover import _pair, _until
from worker.core import WorkerCore
from worker.openings import OPEN_RETRY_MAX_S

KEY = ("slow", 0)


def _routing(version: int, code: str, follower: bool) -> pb.Routing:
    """One tablet on w; with ``follower``, f is given a copy to catch up (a move's target)."""
    r = pb.Routing(version=version)
    c = r.computations.add(name="slow", code=code, outputs=[], key_ranges=1, exactly_once=True,
                           productions="strong", late_records="process", options=engine_options(replication=1))
    c.inputs.add(stream="in")
    a = c.assignments.add(key_range=0, worker_id="w", address="w:1", token=1)
    if follower:
        a.followers.add(worker_id="f", address="f:1")
    a.in_sync.append("w")
    return r


@pytest.mark.timeout(60)
def test_a_follower_given_while_the_tablet_opens_gets_its_copy_without_waiting_for_traffic(tmp_path: Any) -> None:
    """Review of 8b1813d: the routing reaches only open tablets, so one applied while the
    tablet opened was never passed on; an idle tablet then kept one copy until the next
    routing change."""
    async def run() -> None:
        SlowSetup.gate.clear()
        _, w, f = _pair(str(tmp_path))
        code = "tests.core.jobs:SlowSetup"
        opening = asyncio.ensure_future(w.apply_routing(_routing(1, code, follower=False)))
        await _until(lambda: KEY in w._opening, "the tablet to start opening")
        for core in (f, w):
            await core.apply_routing(_routing(2, code, follower=True))
        assert KEY not in w.tablets, "opened before the follower was given: the test proves nothing"
        SlowSetup.gate.set()
        await opening
        deadline = time.monotonic() + 10
        while KEY not in w.tablets:  # the worker's loop reconciles every 200 ms; here the test does
            assert time.monotonic() < deadline, "the tablet did not open"
            await w.reconcile()
        await _until(lambda: KEY in f.replicas.copies, "the follower's copy, with no record sent")
        await w.close_all()
        await f.close_all()
    asyncio.run(run())


def test_an_opening_that_keeps_failing_is_tried_less_and_less_often(tmp_path: Any) -> None:
    """Each try reopens the tablet's storage and runs its code's ``setup``: every reconcile
    (200 ms, and every routing change) for as long as it fails, before the backoff."""
    async def run() -> None:
        clock = [0.0]
        w = WorkerCore(str(tmp_path), "w:1", nowhere, now_ms=lambda: clock[0])  # type: ignore[arg-type]
        w.worker_id = "w"
        w.renewed(0, 10**9)
        FailingSetup.tries = 0
        await w.apply_routing(_routing(1, "tests.core.jobs:FailingSetup", follower=False))

        tried_at = [0.0]
        while clock[0] < 10_000:
            clock[0] += 50
            before = FailingSetup.tries
            await w.reconcile()
            deadline = time.monotonic() + 30
            while not w.quiet():  # an opening slower than reconcile's wait (a loaded machine) ends first
                assert time.monotonic() < deadline, "an opening did not end"
                await w.reconcile()
            if FailingSetup.tries > before:
                tried_at.append(clock[0])
        gaps = [b - a for a, b in itertools.pairwise(tried_at)]
        # At the next two reconciles, then after 0.2 s, 0.4 s, ... up to OPEN_RETRY_MAX_S.
        assert gaps == [50, 50, 200, 400, 800, 1600, *[OPEN_RETRY_MAX_S * 1000] * (len(gaps) - 6)], gaps
        assert "no connection to the lookup table" in w.open_failures()["slow/0"]
        await w.close_all()
    asyncio.run(run())
