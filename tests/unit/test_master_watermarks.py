"""The leader's watermark bookkeeping (its image and tick), without etcd (an in-memory store)."""

from __future__ import annotations

import asyncio
from typing import Any

from master import lifecycle, progress
from master.core import MasterCore
from runtime import Topology
from runtime.status import render
from runtime.wire import millstream_pb2 as pb
from tests.masterkit import END, MemoryStore, hold, leader, seed


def _core(store: MemoryStore | None = None) -> tuple[MasterCore, list[float]]:
    clock = [0.0]
    core = leader(store, clock=lambda: clock[0])
    topo = Topology("chain")
    topo.add_computation("a", "x:A", inputs={"in": None}, outputs=["ab"], key_ranges=1)
    topo.add_computation("b", "x:B", inputs={"ab": None}, outputs=["bc"], key_ranges=1)
    topo.add_computation("c", "x:C", inputs={"bc": None}, key_ranges=1)
    seed(core, topo)
    core.report_injector("inj", "in", 10_000)
    return core, clock


def _held(name: str, oldest: int | None) -> pb.HeldTablet:
    return pb.HeldTablet(computation=name, key_range=0, token=1, has_work=oldest is not None,
                         oldest_work=oldest or 0)


def test_w1_a_tablet_left_out_of_a_report_holds_the_watermark_until_it_reports_again() -> None:
    """Tablet b committed work at 50 (a timer, a checkpointed production) and then closed to
    reopen (same token) before reporting it. Its earlier report said "idle"; the leader used
    to keep that report and publish past 50."""
    core, clock = _core()

    async def main() -> None:
        core.heartbeat("w", [_held("a", 50), _held("b", None), _held("c", None)], 1)
        await progress.advance(core)
        assert core.image.published["b"] == 50
        core.heartbeat("w", [_held("a", None), _held("c", None)], 2)  # b omitted: reopening
        clock[0] += 10
        await progress.advance(core)
        assert core.image.published["b"] == 50 and core.image.published["c"] == 50  # held, not 10,000
        core.heartbeat("w", [_held("a", None), _held("b", 50), _held("c", None)], 3)
        await progress.advance(core)
        assert core.image.published["c"] == 50
        core.heartbeat("w", [_held("a", None), _held("b", None), _held("c", None)], 4)
        await progress.advance(core)
        assert core.image.published["c"] == 10_000

    asyncio.run(main())


def test_w2_an_injector_registering_again_while_its_finished_namesake_is_cleaned_up_stays() -> None:
    """The cleanup of a finished injector spans etcd writes; a new injector registering
    under the same name meanwhile used to be deleted with it, and its stream jumped to the
    end of time."""
    core, clock = _core()

    class Racing(MemoryStore):
        def apply(self, change: Any, term: int | None = None) -> None:
            if change.injectors_gone:
                core.report_injector("inj", "in", 5)  # the new registration arrives mid-cleanup
            super().apply(change)

    core.store = Racing()  # type: ignore[assignment]

    async def main() -> None:
        core.heartbeat("w", [_held("a", 1), _held("b", None), _held("c", None)], 1)  # a still works
        core.report_injector("inj", "in", END)  # the first injection finished
        await progress.advance(core)
        assert hold(core, "inj") == ("in", 5)
        core.heartbeat("w", [_held(n, None) for n in "abc"], 2)  # a is done
        await progress.advance(core)
        assert core.image.published["a"] == 5  # held by the new injector, not at the end of time

    asyncio.run(main())


def test_g4_a_silent_injector_is_flagged_stale_in_status_and_still_holds_its_stream() -> None:
    core, clock = _core()
    clock[0] += core.config.injector_stale_s * 1000 + 1
    core.heartbeat("w", [_held(n, None) for n in "abc"], 1)
    (inj,) = core.status()["injectors"]
    assert inj["stale"] and inj["last_report_ms_ago"] > core.config.injector_stale_s * 1000
    asyncio.run(progress.advance(core))
    assert core.image.published["a"] == 10_000  # held at its promise, not released by silence


def test_a_job_cancelled_while_its_watermarks_are_written_stays_forgotten() -> None:
    """advance_watermarks computes, writes to etcd, then applies. A cancel that ran during the
    write (it takes the leader's lock, which the write did not hold) forgot the job's
    watermarks, and the apply put the input watermarks back: a job submitted again under
    the same computation names would have started with its predecessor's input watermark
    and fired timers, or judged records late, against it."""
    core, clock = _core()
    loop_box: list[asyncio.AbstractEventLoop] = []
    cancels: list[Any] = []

    class Racing(MemoryStore):
        def apply(self, change: Any, term: int | None = None) -> None:  # runs on a thread: the cancel arrives now
            if change.watermarks and not cancels:
                cancels.append(asyncio.run_coroutine_threadsafe(lifecycle.cancel(core, "chain"), loop_box[0]))
            super().apply(change)

    core.store = Racing()  # type: ignore[assignment]

    async def main() -> None:
        loop_box.append(asyncio.get_running_loop())
        core.heartbeat("w", [_held(n, None) for n in "abc"], 1)
        await progress.advance(core)
        await asyncio.wrap_future(cancels[0])
        assert "chain" not in core.image.topologies
        assert not core.image.inputs, core.image.inputs
        assert not core.image.published, core.image.published

    asyncio.run(main())


def test_with_idleness_an_idle_injector_holds_nothing_while_another_on_its_stream_is_active() -> None:
    from master.watermarks import with_idleness
    injectors = {"p0": ("in", 500), "p1": ("in", 100), "p2": ("in", 300), "x": ("other", 7),
                 "finished markers of in": ("in", END)}
    assert with_idleness(injectors, set()) == injectors
    # p1 idle: the stream holds at the active p0 and p2, not at p1's 100.
    assert with_idleness(injectors, {"p1"})["p1"] == ("in", END)
    # All unfinished ones idle (a finished one is not active): the highest of them.
    out = with_idleness(injectors, {"p0", "p1", "p2"})
    assert {out[n][1] for n in ("p0", "p1", "p2")} == {500} and out["x"] == ("other", 7)


def test_an_idle_partition_does_not_hold_the_stream_and_holds_it_again_once_active() -> None:
    core, clock = _core()  # "inj" on "in" at 10,000
    core.heartbeat("w", [_held(n, None) for n in "abc"], 1)

    async def main() -> None:
        core.report_injector("quiet-partition", "in", 2_000, "i1")
        await progress.advance(core)
        assert core.image.published["a"] == 2_000
        core.report_injector("quiet-partition", "in", 2_000, "i1", idle=True)
        await progress.advance(core)
        assert core.image.published["a"] == 10_000 and core.image.inputs["a"] == 10_000
        doc = {i["name"]: i for i in core.status()["injectors"]}
        assert doc["quiet-partition"]["idle"] and not doc["inj"]["idle"]
        core.report_injector("quiet-partition", "in", 2_500, "i1")  # active again, below the stream
        core.report_injector("inj", "in", 20_000)
        await progress.advance(core)
        assert core.image.published["a"] == 10_000  # never back; held until the partition advances
        core.report_injector("quiet-partition", "in", 30_000, "i1")
        await progress.advance(core)
        assert core.image.published["a"] == 20_000

    asyncio.run(main())


def test_g4_an_injector_silent_past_the_expiry_is_released_with_a_log_line_and_a_status_entry(
        caplog: Any) -> None:
    core, clock = _core()
    core.heartbeat("w", [_held(n, None) for n in "abc"], 1)
    core.report_injector("alive", "in", 5_000, "a1")

    async def main() -> None:
        await progress.advance(core)
        assert core.image.published["a"] == 5_000
        for _ in range(3):  # "alive" keeps reporting (an Injector's keep-alive); "inj" is silent
            clock[0] += core.config.injector_expiry_s * 1000 / 2
            core.report_injector("alive", "in", 5_000, "a1")
            core.heartbeat("w", [_held(n, None) for n in "abc"], 2 + _)
            await progress.advance(core)
        assert hold(core, "inj") is None and hold(core, "alive") is not None
        assert core.image.published["a"] == 5_000

    asyncio.run(main())
    assert any("injector inj on in expired" in r.getMessage() for r in caplog.records)
    (entry,) = core.status()["expired_injectors"]
    assert entry["name"] == "inj" and entry["watermark"] == 10_000


def test_a_keepalive_that_changes_nothing_writes_nothing_to_etcd() -> None:
    core, clock = _core()
    core.heartbeat("w", [_held(n, None) for n in "abc"], 1)
    writes: list[Any] = []

    class Counting(MemoryStore):
        def apply(self, change: Any, term: int | None = None) -> None:
            writes.append(change)

    core.store = Counting()  # type: ignore[assignment]

    async def main() -> None:
        await progress.advance(core)
        n = len(writes)
        core.report_injector("inj", "in", 10_000)
        await progress.advance(core)
        assert len(writes) == n
        core.report_injector("inj", "in", 11_000)
        await progress.advance(core)
        assert len(writes) == n + 1

    asyncio.run(main())


def test_a_retired_run_holds_its_stream_until_the_next_run_under_its_name_reports() -> None:
    """Review of the Spark bridge: a daily load with watermark="max" closed its injector at
    its promise, and the next day's run (a new incarnation under the same name) could never
    move the name past it: the stream stopped at the first day's end. A run that retires
    holds its stream at its promise while no other run is live, also across a new leader; a
    next run's promises count while it runs, and the latest retired promise then stands (an
    empty run retiring below it moves nothing back)."""
    store = MemoryStore()
    core, clock = _core(store)

    async def main() -> None:
        core.report_injector("daily", "in", 500, "day1")
        core.report_injector("daily", "in", 800, "day1", retired=True)
        await progress.advance(core)
        assert hold(core, "daily") == ("in", 800)
        new = leader(store)
        await new.become_leader()
        assert hold(new, "daily") == ("in", 800) and new.image.injectors["daily"].waiting
        new.report_injector("daily", "in", 100, "day2")  # the next run starts: its promises count
        assert hold(new, "daily") == ("in", 100)
        new.report_injector("daily", "in", 2_000, "day2", retired=True)
        assert hold(new, "daily") == ("in", 2_000) and new.image.injectors["daily"].waiting
        new.report_injector("daily", "in", 0, "day3")  # a run with nothing to load
        new.report_injector("daily", "in", 0, "day3", retired=True)
        assert hold(new, "daily") == ("in", 2_000)
        new.report_injector("daily", "in", 0, "day2")  # the same incarnation again, for a next run
        new.report_injector("daily", "in", END, "day2")  # ... that finishes: the input is over for good
        assert hold(new, "daily") == ("in", END) and new.image.injectors["daily"].finished

    asyncio.run(main())


def test_a_name_left_at_the_end_of_time_holds_nothing_once_another_incarnation_registers() -> None:
    """Review of the watermark path: a name whose only incarnation finished ({a: END}) and
    that another registered under before the tick deleted it kept the finished one; once the
    new one went idle the name counted as finished at the end of time, though the new one
    had promised only 100."""
    core, clock = _core()
    core.report_injector("twice", "in", END, "a")
    core.report_injector("twice", "in", 100, "b")
    core.report_injector("twice", "in", 100, "b", idle=True)
    assert hold(core, "twice") == ("in", 100) and not core.image.injectors["twice"].finished


def test_a_retired_name_waits_for_its_next_run_past_the_expiry_and_is_never_stale() -> None:
    """Review of the retirement: a retired run reports nothing more, and the leader's expiry
    took that silence for a gone injector: a day later it released the name, and the stream
    jumped to the end of time before the next day's run registered."""
    core, clock = _core()
    core.report_injector("daily", "in", 800, "day1", retired=True)
    clock[0] += 2 * core.config.injector_expiry_s * 1000

    async def main() -> None:
        await progress.advance(core)

    asyncio.run(main())
    assert hold(core, "daily") == ("in", 800)
    [doc] = [i for i in core.status()["injectors"] if i["name"] == "daily"]
    assert doc["retired"] and not doc["stale"]
    assert "retired: holds its stream here until a next run under the name" in render(core.status())  # type: ignore[arg-type]
    # A next run that goes silent past the expiry is gone: the retired promise stands again.
    core.report_injector("daily", "in", 100, "day2")
    clock[0] += 2 * core.config.injector_expiry_s * 1000
    asyncio.run(main())
    assert hold(core, "daily") == ("in", 800) and core.image.injectors["daily"].waiting
    # ... also when that run reused the retired one's incarnation (a fixed incarnation=).
    core.report_injector("daily", "in", 100, "day1")
    clock[0] += 2 * core.config.injector_expiry_s * 1000
    asyncio.run(main())
    assert hold(core, "daily") == ("in", 800) and core.image.injectors["daily"].waiting


def test_a_registration_and_a_release_are_stored_before_they_are_answered() -> None:
    """Review 3's list: a new injector (or a new run of a name) was told it holds its stream
    once the leader's memory had it, and an operator's release once it was dropped there;
    etcd got either at the next tick. A failover in between left a new leader without the
    hold (publishing past the new run's records) or with the released one (holding the
    stream again). Both are written before the call returns; a promise waits for the tick."""
    store = MemoryStore()
    core, clock = _core(store)

    async def main() -> None:
        await core.report_injector_between_ticks("a", "in", 100, "run1")
        await core.report_injector_between_ticks("b", "in", 200, "run1")
        await core.report_injector_between_ticks("b", "in", 150, "run2")  # a second run of b
        written = len(store.changes)
        await core.report_injector_between_ticks("a", "in", 300, "run1")  # a promise: the tick's
        assert len(store.changes) == written
        new = leader(store)
        await new.become_leader()
        assert new.image.injectors["a"].incarnations == {"run1": 100}
        assert new.image.injectors["b"].incarnations == {"run1": 200, "run2": 150}
        await core.report_injector_between_ticks("b", "in", 0, release=True, operator=True)
        new = leader(store)
        await new.become_leader()
        assert new.image.injectors["b"].finished

    asyncio.run(main())


def test_a_registration_whose_write_failed_is_written_on_its_retry_and_a_burst_is_one_write() -> None:
    """A registration whose etcd write failed left the image with the run and the caller with
    an error; its retry was no registration any more (the image knew the run) and was answered
    unwritten. It stays waiting until written. And registrations arriving while one is written
    go out together in the next write, not one each, outside the leader's lock."""
    import threading

    from runtime.errors import EtcdUnavailableError

    class Flaky(MemoryStore):
        def __init__(self) -> None:
            super().__init__()
            self.fail, self.gate, self.writing = 1, threading.Event(), threading.Event()

        def apply(self, change: Any, term: int | None = None) -> None:
            if change.injectors and self.fail:
                self.fail -= 1
                raise EtcdUnavailableError("etcd did not answer in time")
            if change.injectors and not self.gate.is_set():
                self.writing.set()
                assert self.gate.wait(10)
            super().apply(change)

    store = Flaky()
    core, clock = _core(store)

    async def main() -> None:
        try:
            await core.report_injector_between_ticks("a", "in", 100, "run1")
            raise AssertionError("the first write was to fail")
        except EtcdUnavailableError:
            pass
        assert "run1" in core.image.injectors["a"].incarnations  # (the image has it: not etcd)
        first = asyncio.ensure_future(core.report_injector_between_ticks("a", "in", 100, "run1"))  # the retry
        await asyncio.to_thread(store.writing.wait, 10)  # its write is under way (held) ...
        burst = [asyncio.ensure_future(core.report_injector_between_ticks(f"n{i}", "in", 5, "r")) for i in range(5)]
        async with core.lock:  # ... and the leader's lock is free meanwhile (a tick would run)
            pass
        deadline = asyncio.get_running_loop().time() + 10
        while not {f"n{i}" for i in range(5)} <= core._unwritten:  # the five wait for the write
            assert asyncio.get_running_loop().time() < deadline, "the burst never queued"
            await asyncio.sleep(0.001)  # poll interval of this deadline-bounded wait
        written = len(store.changes)
        store.gate.set()
        await asyncio.gather(first, *burst)
        assert len(store.changes) - written == 2  # the retry's write, then the five in one
        new = leader(store)
        await new.become_leader()
        assert new.image.injectors["a"].incarnations == {"run1": 100}
        assert {f"n{i}" for i in range(5)} <= set(new.image.injectors)

    asyncio.run(main())


def test_a_retirement_is_stored_before_the_next_tick() -> None:
    """Review of the floor: a retired run reports nothing once answered; the leader wrote its
    promise only at the next tick, so a leader lost in between left a new one with the run
    as a live incarnation, released at the expiry (the stream then jumped to the end of time)."""
    store = MemoryStore()
    core, clock = _core(store)

    async def main() -> None:
        core.report_injector("daily", "in", 800, "day1")
        await core.report_injector_between_ticks("daily", "in", 800, "day1", retired=True)  # as ReportInjector
        await core.report_injector_between_ticks("once", "in", END, "x")  # ... and a finish
        new = leader(store)
        await new.become_leader()
        assert hold(new, "daily") == ("in", 800) and new.image.injectors["daily"].waiting
        assert new.image.injectors["once"].finished

    asyncio.run(main())
