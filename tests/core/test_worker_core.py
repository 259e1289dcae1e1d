"""The worker core in-process: real RocksDB, no network, injected clocks.

Covers what is awkward to provoke through processes: backpressure (a wait for room, then BUSY),
poison records, wall-clock timers on a fake clock, and self-fencing at commit.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import pytest

from runtime import Record, TimeDomain
from runtime.columns import Columns
from runtime.wire import millstream_pb2 as pb
from tests.core.corekit import engine_options
from tests.core.jobs import Collector
from worker import tablet as tablet_module
from worker.core import WATERMARK_MIN, WorkerCore, WorkerLimits
from worker.sender import OK
from worker.tablet import BUSY, NOT_OWNER

BASE = 1_700_000_000_000_000


def routing(*comps: tuple[str, str, list[str], list[str], dict[str, str]]) -> pb.Routing:
    r = pb.Routing(version=1)
    for name, code, inputs, outputs, params in comps:
        c = r.computations.add(name=name, code=code, outputs=outputs, key_ranges=1, exactly_once=True,
                               productions="strong", late_records="process", options=engine_options())
        c.params.update(params)
        for s in inputs:
            c.inputs.add(stream=s)
        c.assignments.add(key_range=0, worker_id="w", address="self:1", token=1)
    return r


def rec(i: int, value: bytes) -> Record:
    return Record(b"k%d" % (i % 3), value, BASE + i, i.to_bytes(16, "big"))


async def _core(tmp: str, limits: WorkerLimits, clock: Callable[[], int], *,
                await_watermarks: bool = False) -> WorkerCore:
    async def nowhere(*args: object) -> int:
        raise AssertionError("everything is local in these tests")

    core = WorkerCore(tmp, "self:1", nowhere, limits, wall_us=clock, await_watermarks=await_watermarks)
    core.worker_id = "w"
    core.renewed(core.now_ms(), 60_000)
    Collector.seen = []
    await core.apply_routing(routing(
        ("echo", "tests.core.jobs:Echo", ["in"], ["out"], {}),
        ("collect", "tests.core.jobs:Collector", ["out"], [], {"name": "out"}),
        ("dead", "tests.core.jobs:Collector", ["echo.dead_letter"], [], {"name": "dead"}),
    ))
    assert set(core.tablets) == {("echo", 0), ("collect", 0), ("dead", 0)}
    return core


async def _until(cond: Callable[[], bool], what: str, timeout: float = 10) -> None:
    """Wait until ``cond`` holds, failing after ``timeout`` seconds."""
    async def poll() -> None:
        while not cond():
            await asyncio.sleep(0.01)  # poll interval of this deadline-bounded wait
    try:
        await asyncio.wait_for(poll(), timeout)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


def _queue(core: WorkerCore, tablet_key: tuple[str, int], record: Record) -> asyncio.Future[int]:
    """Put ``record`` in a tablet's input queue synchronously (what Tablet.deliver does before
    it awaits), so a test controls exactly what the next batch holds."""
    tablet = core.tablets[tablet_key]
    fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    tablet.inbox.put(Columns.of_records([record]), fut)
    tablet._wake.set()
    return fut


def test_a_delivery_to_a_full_queue_waits_for_room_instead_of_bouncing_busy(tmp_path: object) -> None:
    """Issue 29: the sixth delivery to a tablet whose queue holds five waits on the receiver
    until a commit makes room, and is taken: no BUSY for its sender to back off on."""
    async def main() -> None:
        core = await _core(str(tmp_path), WorkerLimits(max_queued_records=5, max_batch_records=5),
                           lambda: BASE)
        first = [_queue(core, ("echo", 0), rec(i, b"v%d" % i)) for i in range(5)]
        tablet = core.tablets[("echo", 0)]
        assert tablet.queued_records == 5
        busy = tablet.metrics.busy._value.get()  # type: ignore[attr-defined]
        # Awaited at once: it finds the queue full before the tablet has run.
        assert await core.deliver("echo", 0, 1, [rec(99, b"over")]) == OK
        assert all(f.done() for f in first)  # it was taken once the first five committed
        assert tablet.metrics.busy._value.get() == busy  # type: ignore[attr-defined]
        await _until(lambda: len(Collector.seen) == 6, "6 outputs")
        await core.close_all()

    asyncio.run(main())


def test_a_full_queue_answers_busy_once_the_wait_is_over_and_nothing_is_lost(
        tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tablet_module, "ROOM_WAIT_S", 0.0)  # no wait: the old answer at once

    async def main() -> None:
        core = await _core(str(tmp_path), WorkerLimits(max_queued_records=5, max_batch_records=5),
                           lambda: BASE)
        # Queued with no await in between: the tablet has not run when the sixth arrives.
        first = [_queue(core, ("echo", 0), rec(i, b"v%d" % i)) for i in range(5)]
        assert core.tablets[("echo", 0)].queued_records == 5
        over = await core.deliver("echo", 0, 1, [rec(99, b"over")])
        assert over == BUSY  # the queue was full: the sender must back off and retry
        assert await asyncio.gather(*first) == [OK] * 5
        assert await core.deliver("echo", 0, 1, [rec(99, b"over")]) == OK  # the retry is taken
        await _until(lambda: len(Collector.seen) == 6, "6 outputs")
        assert sorted(v for _, _, v in Collector.seen) == sorted([b"v%d" % i for i in range(5)] + [b"over"])
        await core.close_all()

    asyncio.run(main())


def test_input_queued_in_one_tablet_counts_against_the_whole_workers_bound(
        tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review S8: each tablet's queue is bounded, and so is the worker's total, or a worker
    given many tablets holds many times one tablet's bound. A delivery to an empty tablet is
    answered BUSY while another tablet's queue holds the worker's bound; once that queue is
    committed, the retry is taken, and nothing is lost."""
    monkeypatch.setattr(tablet_module, "ROOM_WAIT_S", 0.0)  # no wait: the answer at once

    async def main() -> None:
        one = Columns.of_records([rec(0, b"v0")]).nbytes()
        core = await _core(str(tmp_path), WorkerLimits(max_worker_queued_bytes=3 * one), lambda: BASE)
        first = [_queue(core, ("echo", 0), rec(i, b"v%d" % i)) for i in range(3)]
        assert core.queued_bytes() >= 3 * one
        assert core.tablets[("collect", 0)].queued_records == 0  # its own queue is empty
        assert await core.deliver("collect", 0, 1, [rec(99, b"over")]) == BUSY
        assert await asyncio.gather(*first) == [OK] * 3
        await _until(lambda: core.queued_bytes() == 0, "the queues to be committed")
        assert await core.deliver("collect", 0, 1, [rec(99, b"over")]) == OK  # the retry is taken
        await _until(lambda: len(Collector.seen) == 4, "4 outputs")
        assert sorted(v for _, _, v in Collector.seen) == [b"over", b"v0", b"v1", b"v2"]
        await core.close_all()

    asyncio.run(main())


def test_deliveries_waiting_for_room_are_bounded_for_the_whole_worker(
        tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review of the delivery path (D3): a delivery to a full tablet waits there for room,
    outside every queue's bound, so a worker fed by many senders (an injector per Spark
    partition, each with a stream's credit) held more the more senders it had. Past
    ``max_worker_waiting_bytes`` a delivery is answered BUSY at once; the one waiting is taken
    once there is room, the refused one on its retry, and nothing is lost."""
    monkeypatch.setattr(tablet_module, "ROOM_WAIT_S", 60.0)  # the waiting one waits as long as the test

    async def main() -> None:
        one = Columns.of_records([rec(1, b"v1")]).nbytes()
        core = await _core(str(tmp_path), WorkerLimits(max_queued_records=1, max_worker_waiting_bytes=one),
                           lambda: BASE, await_watermarks=True)  # no batch runs yet: the queue stays full
        first = _queue(core, ("echo", 0), rec(0, b"v0"))
        waiting = asyncio.ensure_future(core.deliver("echo", 0, 1, [rec(1, b"v1")]))
        await _until(lambda: core.waiting_bytes == one, "the second delivery to wait for room")
        elsewhere = asyncio.ensure_future(core.deliver("collect", 0, 1, [rec(2, b"v2")]))  # room there
        assert await asyncio.wait_for(core.deliver("echo", 0, 1, [rec(3, b"v3")]), 5) == BUSY  # at once
        assert core.tablets[("collect", 0)].queued_records == 1  # queued, not waiting: not bounded
        core.watermarks_known = True
        for t in core.tablets.values():
            t.wake()
        assert await first == OK and await waiting == OK and await elsewhere == OK
        assert core.waiting_bytes == 0
        assert await core.deliver("echo", 0, 1, [rec(3, b"v3")]) == OK  # the retry is taken
        await _until(lambda: len(Collector.seen) == 4, "4 outputs")
        assert sorted(v for _, _, v in Collector.seen) == [b"v0", b"v1", b"v2", b"v3"]
        await core.close_all()

    asyncio.run(main())


def test_a_poison_record_is_dead_lettered_and_the_range_moves_on(tmp_path: object) -> None:
    async def main() -> None:
        core = await _core(str(tmp_path), WorkerLimits(max_attempts=3), lambda: BASE)
        batch = [rec(1, b"a"), rec(2, b"boom"), rec(3, b"b")]
        assert await core.deliver("echo", 0, 1, batch) == OK
        await _until(lambda: len(Collector.seen) == 3, "2 outputs and 1 dead letter")
        outs = [v for n, _, v in Collector.seen if n == "out"]
        dead = [json.loads(v) for n, _, v in Collector.seen if n == "dead"]
        assert outs == [b"a", b"b"]
        assert len(dead) == 1 and dead[0]["error"] == "RuntimeError: cannot digest boom"
        assert core.tablets[("echo", 0)].dead_lettered == 1
        await core.close_all()

    asyncio.run(main())


_marks = [0]


async def _mark(core: WorkerCore, computation: str) -> None:
    """Deliver a marker and wait for its output: whatever the tablet produced before it has
    arrived too (productions reach a tablet in the order they were committed)."""
    _marks[0] += 1
    value = b"mark %d" % _marks[0]
    marker = Record(b"k1", value, BASE, value.ljust(16, b"."))
    assert await core.deliver(computation, 0, 1, [marker]) == OK
    await _until(lambda: any(v == value for _, _, v in Collector.seen), "the marker")


def _outputs() -> list[bytes]:
    return [v for _, _, v in Collector.seen if not v.startswith(b"mark")]


def test_wall_clock_timers_fire_on_the_injected_clock_exactly_once(tmp_path: object) -> None:
    now = [BASE]

    async def main() -> None:
        core = await _core(str(tmp_path), WorkerLimits(), lambda: now[0])
        assert await core.deliver("echo", 0, 1, [rec(1, b"later")]) == OK
        await _mark(core, "echo")
        assert _outputs() == [b"later"]  # the clock has not moved: no timer yet
        now[0] += 1_000_000
        core.tablets[("echo", 0)]._wake.set()  # the run loop sleeps on the real clock
        await _until(lambda: len(_outputs()) == 2, "the timer")
        assert _outputs()[1] == f"timer t at {BASE + 1_000_000}".encode()
        await core.close_all()

    asyncio.run(main())
    # Reopened from disk: the fired timer's deletion was committed with its output.
    async def reopen() -> None:
        core = await _core(str(tmp_path), WorkerLimits(), lambda: now[0] + 10_000_000)
        await _mark(core, "echo")
        assert _outputs() == []  # the timer fired once, before the restart
        await core.close_all()

    asyncio.run(reopen())


def test_due_timers_wait_while_the_outbox_is_at_its_bound(tmp_path: object) -> None:
    """Review 3's list: ``max_unacked`` held back a tablet's deliveries but not its timers, so
    a stage firing windows over a stalled reader grew its outbox without bound. A timer due
    while two productions wait for a remote reader (the bound: two) does not fire; the
    acknowledgement that makes room lets it fire."""
    now = [BASE]
    released = asyncio.Event()
    sent: list[bytes] = []

    async def reader(address: str, computation: str, key_range: int, token: int, cols: Columns,
                     orders: object) -> tuple[int, None]:
        await released.wait()  # a reader that has stalled, until the test lets it answer
        sent.extend(cols.values)
        return OK, None

    async def main() -> None:
        core = WorkerCore(str(tmp_path), "self:1", reader, WorkerLimits(max_unacked=2), wall_us=lambda: now[0])
        core.worker_id = "w"
        core.renewed(core.now_ms(), 60_000)
        r = routing(("timer", "tests.core.jobs:TimerJob", ["in"], ["out"], {}),
                    ("far", "tests.core.jobs:Collector", ["out"], [], {}))
        r.computations[1].assignments[0].address, r.computations[1].assignments[0].worker_id = "other:1", "x"
        await core.apply_routing(r)
        assert await core.deliver("timer", 0, 1, [rec(0, b"set 1000")]) == OK
        for i in (1, 2):
            assert await core.deliver("timer", 0, 1, [rec(i, b"mark %d" % i)]) == OK
        tablet = core.tablets[("timer", 0)]
        assert tablet.outbox.unacked == 2 and not sent
        now[0] += 1000  # the timer is due
        await tablet._process_once()  # (the run loop's next batch; it waits itself, on its wake)
        assert tablet.outbox.unacked == 2, "a due timer fired over the outbox's bound"
        assert tablet.timers.peek(TimeDomain.WALL_TIME) is not None
        released.set()
        await _until(lambda: b"fired 1000" in sent, "the timer to fire once the reader answered")
        assert sent == [b"mark 1", b"mark 2", b"fired 1000"]
        await core.close_all()

    asyncio.run(main())


def test_a_worker_whose_lease_lapsed_refuses_to_commit(tmp_path: object) -> None:
    async def main() -> None:
        core = await _core(str(tmp_path), WorkerLimits(), lambda: BASE)
        core.lost_lease()
        assert await core.deliver("echo", 0, 1, [rec(1, b"a")]) == NOT_OWNER
        assert Collector.seen == []  # refused before its commit: nothing of it can follow
        await core.reconcile()
        assert core.tablets == {}  # self-fenced: every tablet closed
        await core.close_all()

    asyncio.run(main())


def test_a_stale_producer_is_refused_once_its_successor_was_heard(tmp_path: object) -> None:
    """A producer tablet's newest owner moves its mark; an older owner (a zombie) re-sending
    must be refused, not compared with marks its successor set - also after a restart."""
    from runtime.record import producer_prefix, sequence_id

    p = producer_prefix("up/0")

    def from_p(seq: int, value: bytes) -> Record:
        return Record(b"k", value, BASE + seq, sequence_id(p, seq))

    async def main() -> None:
        core = await _core(str(tmp_path), WorkerLimits(), lambda: BASE)
        assert await core.deliver("echo", 0, 1, [from_p(1, b"one")], {p: (0, 1)}) == OK
        # The producer's new owner (token 2) sends on.
        assert await core.deliver("echo", 0, 1, [from_p(2, b"two")], {p: (0, 2)}) == OK
        assert await core.deliver("echo", 0, 1, [from_p(3, b"three")], {p: (0, 2)}) == OK
        assert core.tablets[("echo", 0)].store.marks()[p].token == 2
        # The old owner wakes up and sends: refused.
        assert await core.deliver("echo", 0, 1, [from_p(4, b"four")], {p: (0, 1)}) == NOT_OWNER
        # The productions of one, two and three committed downstream (else the reopened run
        # re-sends a checkpoint, which is not what this test is about).
        await _until(lambda: not core.sender.pending(), "the productions delivered")
        await core.close_all()

    asyncio.run(main())

    async def reopened() -> None:
        Collector.seen = []
        core = await _core(str(tmp_path), WorkerLimits(), lambda: BASE)
        assert await core.deliver("echo", 0, 1, [from_p(4, b"four")], {p: (0, 1)}) == NOT_OWNER
        await core.close_all()

    asyncio.run(reopened())
    assert [v for n, _, v in Collector.seen if n == "out"] == []  # the reopened run emitted nothing


def test_a_producers_records_count_once_within_and_across_deliveries(tmp_path: object) -> None:
    """A tablet moves a producer's mark once per delivery (worker/batch.py): a redelivery's
    duplicates are dropped, its new records count, and a record a delivery repeats (or puts
    after a later one of its producer) counts once, as against a mark moved per record."""
    from runtime.record import producer_prefix, sequence_id

    p = producer_prefix("up/0")

    def batch(*seqs: int) -> list[Record]:
        return [Record(b"k%d" % s, b"r%d" % s, BASE + s, sequence_id(p, s)) for s in seqs]

    async def main() -> None:
        core = await _core(str(tmp_path), WorkerLimits(), lambda: BASE)
        marks = core.tablets[("echo", 0)].store.marks
        assert await core.deliver("echo", 0, 1, batch(1, 2, 3), {p: (0, 1)}) == OK
        assert marks()[p].seq == 3
        assert await core.deliver("echo", 0, 1, batch(2, 3, 4), {p: (1, 1)}) == OK  # a resend and one new
        assert marks()[p].seq == 4
        assert await core.deliver("echo", 0, 1, batch(5, 5, 6, 5), {p: (4, 1)}) == OK  # 5 repeated
        assert await core.deliver("echo", 0, 1, batch(5, 6), {p: (4, 1)}) == OK  # all seen
        assert marks()[p].seq == 6
        await _until(lambda: len(_outputs()) >= 6, "six outputs")
        await core.close_all()

    asyncio.run(main())
    assert sorted(_outputs()) == [b"r%d" % s for s in range(1, 7)]


def test_a_delivery_answer_counts_the_duplicates_it_dropped(tmp_path: object) -> None:
    """The answer to a delivery says how many of its records were dropped as already
    committed (review 3, E3: an injector warns when a re-used name makes all it sends
    duplicates): repeats within the delivery, records below the producer's mark, opaque ids
    seen before."""
    from runtime.record import producer_prefix, sequence_id

    p = producer_prefix("injector/nightly")

    def batch(*seqs: int) -> list[Record]:
        return [Record(b"k%d" % s, b"r%d" % s, BASE + s, sequence_id(p, s)) for s in seqs]

    async def main() -> None:
        core = await _core(str(tmp_path), WorkerLimits(), lambda: BASE)
        assert await core.deliver_counted("echo", 0, 1, batch(1, 2, 3), {p: (0, 0)}) == (OK, 0)
        assert await core.deliver_counted("echo", 0, 1, batch(1, 2, 3), {p: (0, 0)}) == (OK, 3)
        assert await core.deliver_counted("echo", 0, 1, batch(2, 3, 4, 4), {p: (0, 0)}) == (OK, 3)
        opaque = [rec(7, b"o")]
        assert await core.deliver_counted("echo", 0, 1, opaque) == (OK, 0)
        assert await core.deliver_counted("echo", 0, 1, opaque) == (OK, 1)
        await core.close_all()

    asyncio.run(main())


async def _timer_core(tmp: str, clock: list[int], repeat: bool = False) -> WorkerCore:
    async def nowhere(*args: object) -> int:
        raise AssertionError("everything is local in these tests")

    core = WorkerCore(tmp, "self:1", nowhere, WorkerLimits(), wall_us=lambda: clock[0])
    core.worker_id = "w"
    core.renewed(core.now_ms(), 60_000)
    Collector.seen = []
    await core.apply_routing(routing(
        ("timers", "tests.core.jobs:TimerJob", ["in"], ["out"], {"repeat": "1"} if repeat else {}),
        ("collect", "tests.core.jobs:Collector", ["out"], [], {"name": "out"}),
    ))
    return core


def _fired() -> list[bytes]:
    return _outputs()


def _queue_then_advance(core: WorkerCore, record: Record, clock: list[int], to: int) -> asyncio.Future[int]:
    """Queue ``record`` and move the clock with no await in between, so the tablet's next
    batch holds both the record and the timer that became due."""
    fut = _queue(core, ("timers", 0), record)
    clock[0] = to
    return fut


def test_a_record_deleting_a_due_timer_in_the_same_batch_stops_it(tmp_path: object) -> None:
    clock = [BASE]

    async def main() -> None:
        core = await _timer_core(str(tmp_path), clock)
        assert await core.deliver("timers", 0, 1, [rec(1, b"set 10")]) == OK
        assert await _queue_then_advance(core, rec(4, b"del"), clock, BASE + 20) == OK
        await _mark(core, "timers")
        assert _fired() == []
        assert len(core.tablets[("timers", 0)].timers) == 0
        await core.close_all()

    asyncio.run(main())


def test_a_record_moving_a_due_timer_makes_it_wait_for_its_new_time(tmp_path: object) -> None:
    clock = [BASE]

    async def main() -> None:
        core = await _timer_core(str(tmp_path), clock)
        assert await core.deliver("timers", 0, 1, [rec(1, b"set 10")]) == OK
        assert await _queue_then_advance(core, rec(4, b"move 30"), clock, BASE + 20) == OK
        await _mark(core, "timers")
        assert _fired() == []
        clock[0] = BASE + 40
        core.tablets[("timers", 0)]._wake.set()
        await _until(lambda: _fired() == [b"fired 30"], "the moved timer")
        await _mark(core, "timers")
        assert _fired() == [b"fired 30"]
        await core.close_all()

    asyncio.run(main())


def test_a_timer_setting_itself_again_at_its_own_time_fires_again(tmp_path: object) -> None:
    clock = [BASE]

    async def main() -> None:
        core = await _timer_core(str(tmp_path), clock, repeat=True)
        assert await core.deliver("timers", 0, 1, [rec(1, b"set 10")]) == OK
        clock[0] = BASE + 20
        core.tablets[("timers", 0)]._wake.set()
        await _until(lambda: len(_fired()) == 3, "three firings")
        await _mark(core, "timers")
        assert _fired() == [b"fired 10"] * 3
        assert len(core.tablets[("timers", 0)].timers) == 0
        await core.close_all()

    asyncio.run(main())


def test_a_restarted_workers_first_report_is_newer_than_every_receipt_of_the_one_before(tmp_path: object) -> None:
    """A receipt names the report that will reflect a commit (worker id, report number). Its
    holder lets go once the leader holds that report or a newer one. Report numbers used to
    restart at 1 in every process: after a SIGKILL right after a commit, the restarted
    worker (same id, same disk) needed as many reports as its predecessor had sent before
    the receipt counted as reported, and an injector's finish() gave up after 60 s (chaos
    seed 8). Numbers now start from the process's start time."""
    async def nowhere(*args: object) -> int:
        raise AssertionError("everything is local in these tests")

    clock = [1_700_000_000_000_000]
    old = WorkerCore(str(tmp_path), "self:1", nowhere, WorkerLimits(), wall_us=lambda: clock[0])
    old.worker_id = "w"
    for _ in range(5000):  # four minutes of heartbeats
        old.next_report()
    receipt = old.receipt()
    clock[0] += 1_000_000  # restarted a second later
    new = WorkerCore(str(tmp_path), "self:1", nowhere, WorkerLimits(), wall_us=lambda: clock[0])
    new.worker_id = "w"
    first, _ = new.next_report()
    assert first >= receipt[1], (first, receipt)


def test_a_fresh_worker_runs_no_batch_before_it_knows_its_input_watermarks(tmp_path: object) -> None:
    """Review N20: a worker process took deliveries and ran batches before the leader's first
    heartbeat answer: every input watermark read as MIN, so a record already late was not
    late (a fired window opened again, expired state read as live)."""
    async def nowhere(*args: object) -> int:
        raise AssertionError("everything is local in these tests")

    async def main() -> None:
        core = WorkerCore(str(tmp_path), "self:1", nowhere, WorkerLimits(), await_watermarks=True)
        core.worker_id = "w"
        core.renewed(core.now_ms(), 60_000)
        Collector.seen = []
        r = routing(("echo", "tests.core.jobs:Echo", ["in"], ["out"], {}),
                    ("collect", "tests.core.jobs:Collector", ["out"], [], {"name": "out"}))
        r.computations[0].late_records = "drop"
        await core.apply_routing(r)
        assert set(core.tablets) == {("echo", 0), ("collect", 0)}, "tablets open meanwhile"
        late, on_time = Record(b"k", b"late", BASE, b"1".ljust(16)), Record(b"k", b"on time", BASE + 10, b"2".ljust(16))
        delivery = asyncio.ensure_future(core.deliver("echo", 0, 1, [late, on_time]))
        for _ in range(20):
            await asyncio.sleep(0.01)  # time for a batch to run, if one could
        assert not delivery.done() and core.tablets[("echo", 0)].processed == 0, "no batch yet"
        core.set_watermarks({})  # a new leader's answer before its first tick: it knows none yet
        assert not core.watermarks_known, "an empty answer made the start of time the watermarks"
        core.set_watermarks({"echo": BASE + 5, "collect": BASE + 5})  # the leader's first answer
        assert await asyncio.wait_for(delivery, 10) == OK
        await _until(lambda: Collector.seen == [("out", b"k", b"on time")], "the record that is on time")
        assert core.tablets[("echo", 0)].late == 1
        await core.close_all()

    asyncio.run(main())


def test_a_heartbeat_answer_older_than_the_routing_that_dropped_a_computation_leaves_its_watermark(
        tmp_path: object) -> None:
    """Review of watermarks: an answer the leader built before a computation was deleted and
    submitted again under its name, applied after the routing that dropped it, gave the new
    computation the old one's watermark (its on-time records late, its timers due early). The
    answer says which incarnation it speaks of (routing versions cannot: they are not
    comparable across leaders)."""
    async def main() -> None:
        core = await _core(str(tmp_path), WorkerLimits(), lambda: 0)
        core.set_watermarks({"echo": BASE + 5}, {})
        assert core.watermark("echo") == BASE + 5
        again = routing(("echo", "tests.core.jobs:Echo", ["in"], ["out"], {}),
                        ("collect", "tests.core.jobs:Collector", ["out"], [], {"name": "out"}))
        again.dropped.add(computation="echo", below=1)
        await core.apply_routing(again)
        assert core.watermark("echo") == WATERMARK_MIN
        core.set_watermarks({"echo": BASE + 5, "collect": BASE + 5}, {})  # built before the drop
        assert core.watermark("echo") == WATERMARK_MIN and core.watermark("collect") == BASE + 5
        core.set_watermarks({"echo": BASE + 9}, {"echo": 2})  # after a later drop this worker has not seen
        assert core.watermark("echo") == WATERMARK_MIN
        core.set_watermarks({"echo": BASE + 1}, {"echo": 1})  # the new computation's own
        assert core.watermark("echo") == BASE + 1
        core.set_watermarks({"echo": BASE + 2})  # a leader that sends no ids: as before
        assert core.watermark("echo") == BASE + 2
        await core.close_all()

    asyncio.run(main())


@pytest.mark.parametrize("job, held", [("EarlyThenBlock", 2000), ("EarlyOutputThenBlock", 1000)])
def test_a_batch_holds_the_watermark_at_what_it_makes_earlier_than_its_input_before_it_commits(
        tmp_path: object, job: str, held: int) -> None:
    """Review N22: a timer set (or an output stamped) earlier than its record's time entered
    the tablet's oldest work only after the commit; while the batch ran on, committed and
    replicated, reports held only the record's time, and the watermark could pass it. An
    output alone holds too, though strong outputs are routed only once the batch is done."""
    from tests.core.jobs import Blocking

    async def nowhere(*args: object) -> int:
        raise AssertionError("everything is local in these tests")

    async def main() -> None:
        Blocking.gate.clear()
        Blocking.started.clear()
        core = WorkerCore(str(tmp_path), "self:1", nowhere, WorkerLimits())
        core.worker_id = "w"
        core.renewed(core.now_ms(), 60_000)
        Collector.seen = []
        await core.apply_routing(routing(("early", f"tests.core.jobs:{job}", ["in"], ["out"], {}),
                                         ("collect", "tests.core.jobs:Collector", ["out"], [], {"name": "out"})))
        tablet = core.tablets[("early", 0)]
        t = BASE + 10_000_000
        delivery = asyncio.ensure_future(core.deliver("early", 0, 1, [
            Record(b"k", b"early", t, b"1".ljust(16)), Record(b"k", b"block", t + 1, b"2".ljust(16))]))
        try:
            await _until(Blocking.started.is_set, "the batch to reach the blocking record")
            assert tablet.oldest_work() == t - held, "held at what the batch made, before it commits"
        finally:
            Blocking.gate.set()
        assert await asyncio.wait_for(delivery, 10) == OK
        await _until(lambda: len(Collector.seen) == 2, "both outputs")
        if job == "EarlyThenBlock":
            assert tablet.oldest_work() == t - 2000, "the timer, now in the index"
        assert tablet.proc.hold is None
        await core.close_all()

    asyncio.run(main())


def test_a_reopened_producer_holds_again_what_it_had_acknowledged_but_not_seen_reported(tmp_path: object) -> None:
    """Review N21: the hold of an acknowledged production lived only in the producing Tablet
    object, its checkpoint already deleted: once the tablet closed and reopened (a failed
    batch, a move, a split), nothing held the watermark at it while the receiver's covering
    report was still on its way. Now its checkpoint stays until the receipt is confirmed:
    the successor re-sends it (a duplicate, dropped) and holds it again."""
    async def nowhere(*args: object) -> int:
        raise AssertionError("everything is local in these tests")

    async def main() -> None:
        core = WorkerCore(str(tmp_path), "self:1", nowhere, WorkerLimits())
        core.worker_id = "w"
        core.renewed(core.now_ms(), 60_000)
        Collector.seen = []
        comps = (("echo", "tests.core.jobs:Echo", ["in"], ["out"], {}),
                 ("collect", "tests.core.jobs:Collector", ["out"], [], {"name": "out"}))
        await core.apply_routing(routing(*comps))
        assert await core.deliver("echo", 0, 1, [Record(b"k", b"v", BASE, b"1".ljust(16))]) == OK
        await _until(lambda: Collector.seen == [("out", b"k", b"v")] and core.tablets[("echo", 0)].outbox.unacked == 0,
                     "the production acknowledged")
        assert core.tablets[("echo", 0)].oldest_work() == BASE, "held until its receipt is confirmed"
        moved = routing(*comps)
        moved.version = 2
        moved.computations[0].assignments[0].token = 2  # reopened under the next token
        await core.apply_routing(moved)
        await _until(lambda: ("echo", 0) in core.tablets and core.tablets[("echo", 0)].token == 2, "the reopening")
        echo = core.tablets[("echo", 0)]
        await _until(lambda: echo.outbox.unacked == 0, "the re-sent production acknowledged")
        assert echo.oldest_work() == BASE, "the successor holds it again"
        assert echo.progress().in_flight == 1, "a savepoint waits for it: its checkpoint is still on disk"
        core.release({"w": 1 << 62})  # the leader holds the receiver's covering report
        assert echo.oldest_work() is None and echo.store.productions() == []
        assert Collector.seen == [("out", b"k", b"v")], "the re-sent one was a duplicate"
        await core.close_all()

    asyncio.run(main())


def test_a_tablet_opened_long_after_its_producers_last_sent_keeps_their_marks_for_a_replay(tmp_path: object) -> None:
    """Review of restores: a producer's silence counted from its last record, so a savepoint
    restored (or a job resumed) more than ``producer_expiry_s`` later dropped every mark in
    its first batch, and a replay of the source counted from its second delivery on. Silence
    now counts from when the tablet opened, too."""
    from runtime.record import producer_prefix, sequence_id

    p = producer_prefix("injector/nightly")
    week = 7 * 24 * 3600 * 1_000_000

    def batch(lo: int, hi: int) -> list[Record]:
        return [Record(b"k%d" % s, b"r%d" % s, BASE + s, sequence_id(p, s)) for s in range(lo, hi + 1)]

    async def first() -> None:
        core = await _core(str(tmp_path), WorkerLimits(), lambda: BASE)
        assert await core.deliver_counted("echo", 0, 1, batch(1, 100), {p: (0, 0)}) == (OK, 0)
        await _until(lambda: len(_outputs()) >= 100, "a hundred outputs")
        await core.close_all()

    asyncio.run(first())
    seen = sorted(_outputs())

    async def a_week_and_a_day_later() -> None:
        core = await _core(str(tmp_path), WorkerLimits(), lambda: BASE + week + 24 * 3600 * 1_000_000)
        assert await core.deliver_counted("echo", 0, 1, batch(1, 50), {p: (0, 0)}) == (OK, 50)
        assert await core.deliver_counted("echo", 0, 1, batch(51, 100), {p: (0, 0)}) == (OK, 50)
        assert p in core.tablets[("echo", 0)].store.marks()
        await core.close_all()

    asyncio.run(a_week_and_a_day_later())
    assert len(seen) == 100 and _outputs() == []


def test_a_producer_silent_for_the_expiry_while_its_tablet_was_open_loses_its_mark_across_a_reopen(
        tmp_path: object) -> None:
    """The other side of the test above: only the time the tablet was closed is left out, so a
    tablet reopened (moved, restarted) still forgets a producer gone for the expiry."""
    from runtime.record import producer_prefix, sequence_id

    gone, live = producer_prefix("injector/gone"), producer_prefix("injector/live")
    day = 24 * 3600 * 1_000_000
    clock = [BASE]

    def batch(p: bytes, lo: int, hi: int) -> list[Record]:
        return [Record(b"k%d" % s, b"r%d" % s, BASE + s, sequence_id(p, s)) for s in range(lo, hi + 1)]

    async def run(deliveries: list[tuple[int, bytes, int, int]]) -> dict[bytes, object]:
        core = await _core(str(tmp_path), WorkerLimits(), lambda: clock[0])
        for at, p, lo, hi in deliveries:
            clock[0] = at
            assert await core.deliver("echo", 0, 1, batch(p, lo, hi), {p: (lo - 1, 0)}) == OK
        marks = dict(core.tablets[("echo", 0)].store.marks())
        await core.close_all()
        return marks

    minute = 60_000_000
    assert gone in asyncio.run(run([(BASE, gone, 1, 10)]))
    # Reopened twice, every four days (a weekly restart would do too); the live producer sends on.
    assert gone in asyncio.run(run([(BASE + minute, live, 1, 10), (BASE + 4 * day, live, 11, 20)]))
    marks = asyncio.run(run([(BASE + 4 * day + minute, live, 21, 30), (BASE + 8 * day, live, 31, 40)]))
    assert live in marks and gone not in marks


def test_a_due_timer_fires_within_a_batch_or_two_however_many_records_wait(tmp_path: object) -> None:
    """Review of the timers: records ran first and filled every batch of a tablet with a
    backlog, so a due timer (a timeout, a window) was deferred batch after batch until the
    backlog drained, and never while input stayed at capacity. A batch now fires a quarter
    of its limit of due timers however many records came first."""
    clock = [BASE]

    async def main() -> None:
        async def nowhere(*args: object) -> int:
            raise AssertionError("everything is local in these tests")

        core = WorkerCore(str(tmp_path), "self:1", nowhere, WorkerLimits(max_batch_records=4),
                          wall_us=lambda: clock[0])
        core.worker_id = "w"
        core.renewed(core.now_ms(), 60_000)
        Collector.seen = []
        await core.apply_routing(routing(
            ("timers", "tests.core.jobs:TimerJob", ["in"], ["out"], {}),
            ("collect", "tests.core.jobs:Collector", ["out"], [], {"name": "out"}),
        ))
        assert await core.deliver("timers", 0, 1, [rec(1, b"set 10")]) == OK
        tablet = core.tablets[("timers", 0)]
        backlog = [Record(b"k%d" % i, b"mark %d" % i, BASE + i, (100 + i).to_bytes(16, "big")) for i in range(40)]
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        tablet.inbox.put(Columns.of_records(backlog), fut)  # one delivery, ten batches' worth
        clock[0] = BASE + 20  # the timer is due (no await in between: the next batch holds both)
        tablet._wake.set()
        seen = lambda: [v for _, _, v in Collector.seen]  # noqa: E731 (marks included)
        await _until(lambda: len(seen()) == 41, "the backlog and the timer")
        assert seen().index(b"fired 10") < 8, seen()
        await core.close_all()

    asyncio.run(main())
