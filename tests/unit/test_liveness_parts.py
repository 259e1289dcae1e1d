"""Pure logic behind the liveness of a worker: the inbox that batches may stop part-way
through, the watch on slow user code, and the tablet thread."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from runtime.columns import Columns
from runtime.errors import UserCodeError
from runtime.record import Record
from worker.inbox import NOT_OWNER, OK, Inbox
from worker.runner import TabletThread
from worker.slowcalls import CallWatch


def _records(n: int, base: int = 100) -> Columns:
    return Columns.of_records([Record(b"k", b"", base + i, i.to_bytes(16, "big")) for i in range(n)])


def test_an_inbox_answers_finished_deliveries_and_puts_the_rest_back_in_order() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        inbox = Inbox()
        futs = [loop.create_future() for _ in range(3)]
        inbox.put(_records(4, 100), futs[0])
        inbox.put(_records(4, 50), futs[1])
        inbox.put(_records(4, 200), futs[2])
        assert inbox.oldest() == 50 and inbox.records == 12
        taken = inbox.take(8)
        assert len(taken) == 2 and inbox.records == 4
        inbox.committed(taken, [4, 1])  # the batch stopped one record into the second delivery
        assert futs[0].result() == OK and not futs[1].done()
        assert inbox.records == 7 and inbox.oldest() == 51  # record 50 committed: no longer held
        again = inbox.take(100)
        assert [len(d.cols) - d.done for d in again] == [3, 4]  # the rest, in order
        inbox.failed(again)
        assert futs[1].result() == NOT_OWNER and futs[2].result() == NOT_OWNER
        assert inbox.oldest() is None and not inbox

    asyncio.run(main())


def test_an_inbox_always_takes_at_least_one_delivery() -> None:
    async def main() -> None:
        inbox = Inbox()
        inbox.put(_records(10), asyncio.get_running_loop().create_future())
        assert len(inbox.take(1)) == 1 and inbox.records == 0

    asyncio.run(main())


def test_a_call_watch_names_the_running_key_and_keeps_the_slowest(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    slow: list[float] = []
    watch = CallWatch("c/0", warn_after=1.0, keep=2, clock=lambda: now[0], on_slow=slow.append)
    for key, seconds in ((b"a", 0.2), (b"b", 0.5), (b"c", 0.001), (b"d", 0.3)):
        watch.begin(key)
        now[0] += seconds
        watch.end()
    assert [(k, round(s, 3), r) for k, s, r in watch.snapshot()] == [(b"b", 0.5, False), (b"d", 0.3, False)]
    watch.begin(b"hot")
    now[0] += 1.5
    with caplog.at_level(logging.WARNING):
        watch.check()
        watch.check()  # warned once until the running time doubles
        now[0] += 2
        watch.check()
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2 and "'hot' has been running for 1.5 s" in warnings[0]
    key, seconds, running = watch.snapshot()[0]
    assert (key, running) == (b"hot", True) and seconds == pytest.approx(3.5)
    assert watch.end() == pytest.approx(3.5) and slow == [pytest.approx(3.5)]
    now[0] += 61  # past the window: forgotten
    assert watch.snapshot() == []


def test_a_tablet_thread_runs_calls_in_order_off_the_loop_and_hands_back_errors() -> None:
    async def main() -> None:
        thread = TabletThread("t/0")
        loop_thread = threading.get_ident()
        ran: list[int] = []
        first = thread.run(lambda: ran.append(threading.get_ident()) or 1)
        second = thread.run(lambda: ran.append(threading.get_ident()) or 2)
        assert await asyncio.gather(first, second) == [1, 2]
        assert len(set(ran)) == 1 and ran[0] != loop_thread

        def boom() -> None:
            raise SystemExit(3)

        with pytest.raises(UserCodeError, match="raised SystemExit: 3"):
            await thread.run(boom)  # never SystemExit on the event loop: it would end the worker
        thread.stop()

    asyncio.run(main())


def test_calls_handed_over_in_one_turn_are_waited_for_together_and_never_hold_the_loop() -> None:
    """Several tablets' short calls of one loop turn run side by side and are settled by the
    loop's one wait; a call that turns out long is waited for at most HANDOFF_WAIT_MAX_S,
    after which the loop runs on and the call's thread settles it when it returns."""
    from worker.runner import HANDOFF_WAIT_MAX_S

    async def main() -> None:
        threads = [TabletThread(f"t/{i}") for i in range(3)]
        for t in threads:
            t.typical_s = HANDOFF_WAIT_MAX_S / 2  # short calls: the loop waits for them
        release = threading.Event()
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while not release.is_set():
                ticks += 1
                await asyncio.sleep(0.005)

        tick = asyncio.ensure_future(ticker())
        long = threads[0].run(lambda: release.wait(60) and "long")
        quick = [t.run(lambda i=i: i * 10) for i, t in enumerate(threads[1:], 1)]
        assert await asyncio.gather(*quick) == [10, 20]
        seen = ticks
        while ticks < seen + 3:  # the loop runs on while the long call is still running
            await asyncio.sleep(0.005)
        assert not long.done()
        release.set()
        assert await long == "long"
        await tick
        for t in threads:
            t.stop()

    asyncio.run(main())


def test_a_timestamp_bag_stays_small_while_one_old_timestamp_is_pinned() -> None:
    from runtime.receipts import TimestampBag

    bag = TimestampBag()
    bag.add(1)  # pinned: never removed
    for ts in range(2, 100_002):
        bag.add(ts)
        bag.remove(ts)
    assert bag.min() == 1 and bag.size == 1
    assert len(bag._heap) < 200  # not one entry per timestamp ever added (review finding G3)


def test_user_code_seconds_are_exported_as_one_histogram_per_computation() -> None:
    from prometheus_client import REGISTRY

    from runtime import metrics

    a, b = metrics.tablet("hist-test").user_seconds, metrics.tablet("hist-test").user_seconds
    a.observe(0.00002)
    b.observe(2.0)
    count = REGISTRY.get_sample_value("millstream_user_code_seconds_count", {"computation": "hist-test"})
    under_1ms = REGISTRY.get_sample_value("millstream_user_code_seconds_bucket",
                                          {"computation": "hist-test", "le": "0.001"})
    assert count == 2 and under_1ms == 1
