"""What a batch's fired timers hold, on a real tablet (RocksDB, its own thread): the tablet's
oldest work, reported to the leader for its watermark."""

from __future__ import annotations

import asyncio
from typing import Any

from runtime import Record
from tests.core.corekit import make_core
from tests.core.jobs import HookedTimerSink
from tests.core.test_worker_core import BASE, _queue, _until, routing


def test_a_sinks_committed_hook_does_not_let_the_watermark_pass_a_timer_its_batch_set(tmp_path: Any) -> None:
    """Review of watermarks (2): the timers a batch fired stopped holding the tablet's oldest
    work before the sink's committed() hook ran, and what their firing set again (a window
    step's leftover, a deferred timer) entered the timer index only after it: a report taken
    meanwhile said the tablet held nothing, and its watermark could pass those timers; and the
    tablet said it was quiet (TestRun.run_until_idle could return before they were in)."""
    async def run() -> None:
        HookedTimerSink.block = False
        HookedTimerSink.in_hook.clear()
        HookedTimerSink.release.clear()
        core = await make_core(str(tmp_path), routing(("hs", "tests.core.jobs:HookedTimerSink", ["in"], [], {})))
        try:
            _queue(core, ("hs", 0), Record(b"k", b"1", BASE, (1000).to_bytes(16, "big")))
            await _until(lambda: (t := core.tablets.get(("hs", 0))) is not None and t.oldest_work() == BASE + 1_000_000,
                         "the record's timer t, pending")
            tablet = core.tablets[("hs", 0)]
            HookedTimerSink.block = True
            core.set_watermarks({"hs": BASE + 1_000_000})  # t fires, and sets u a second later
            await _until(HookedTimerSink.in_hook.is_set, "the hook of the batch that fired t")
            assert tablet.oldest_work() == BASE + 1_000_000, "t still holds the tablet while u is not in the index"
            assert not tablet.quiet(), "the batch still runs (an in-process run is not idle)"
            HookedTimerSink.block = False
            HookedTimerSink.release.set()
            await _until(lambda: tablet.oldest_work() == BASE + 2_000_000, "u, in the index")
        finally:
            HookedTimerSink.block = False
            HookedTimerSink.release.set()
            await core.close_all()

    asyncio.run(run())
