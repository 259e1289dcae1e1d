"""Typed state (runtime/state.py) on the worker core in-process: real RocksDB, the real batch
path. Writes are seen by later records of the same batch, commit with it, survive a reopen,
clear and remove, and expire on the event-time watermark (TTL), storage included."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest

from runtime import Record, codecs
from runtime.computation import Computation, Context, TimeDomain
from runtime.errors import MillstreamError
from runtime.state import _EXPIRY, _INDEX, COUNT, ELEMENT, NEVER, ListState, ValueState, cell, expired
from tests.core.corekit import make_core
from tests.core.jobs import Collector
from tests.core.test_worker_core import BASE, _queue, _until, routing
from worker.context import KeyContext

ROUTING = routing(("typed", "tests.core.jobs:Typed", ["in"], ["out"], {}),
                  ("collect", "tests.core.jobs:Collector", ["out"], [], {"name": "out"}))


def _r(i: int, value: str, key: bytes = b"k") -> Record:
    return Record(key, value.encode(), BASE + i * 1_000_000, (1000 + i).to_bytes(16, "big"))


def _outs() -> list[dict[str, Any]]:
    return [json.loads(v) for name, _, v in Collector.seen if name == "out"]


@pytest.mark.parametrize("clear_points, batch_points", [(1024, 1 << 16), (0, 1 << 16), (1024, 1)])
def test_typed_state_across_batches_and_a_reopen(tmp_path: Any, monkeypatch: Any, clear_points: int,
                                                 batch_points: int) -> None:
    """A clear deletes entry by entry; past its limit, or the batch's, it is a range delete."""
    from worker import context, writes
    monkeypatch.setattr(context, "CLEAR_POINTS", clear_points)
    monkeypatch.setattr(context, "BATCH_CLEAR_POINTS", batch_points)
    ranges: list[bytes] = []
    real = writes.Writes.delete_range
    monkeypatch.setattr(writes.Writes, "delete_range",
                        lambda self, start, end: (ranges.append(start), real(self, start, end))[1])

    async def run() -> None:
        core = await make_core(str(tmp_path), ROUTING)
        for i, v in enumerate(["1", "2", "1"]):  # one batch: each record sees the ones before
            _queue(core, ("typed", 0), _r(i, v))
        await _until(lambda: len(_outs()) == 3, "three outputs")
        assert _outs()[-1] == {"seen": [1, 2, 1], "total": 4, "map": {"1": {"n": 2}, "2": {"n": 1}},
                               "keys": ["1", "2"], "has1": True, "recent": "1"}
        await core.close_all()
        core = await make_core(str(tmp_path), ROUTING)  # committed: a new process finds it all
        _queue(core, ("typed", 0), _r(3, "5"))
        await _until(lambda: len(_outs()) == 1, "an output after the reopen")
        assert _outs()[0]["seen"] == [1, 2, 1, 5] and _outs()[0]["total"] == 9
        _queue(core, ("typed", 0), _r(4, "clear"))
        _queue(core, ("typed", 0), _r(5, "7"))
        await _until(lambda: len(_outs()) == 3, "outputs after clear")
        assert _outs()[1]["seen"] == [] and _outs()[1]["map"] == {}
        assert _outs()[2]["seen"] == [7] and _outs()[2]["map"] == {"7": {"n": 1}} and _outs()[2]["total"] == 16
        await core.close_all()

    asyncio.run(run())
    assert bool([r for r in ranges if r.startswith(b"Y")]) == ((clear_points, batch_points) != (1024, 1 << 16))


def test_ttl_hides_then_deletes_on_the_watermark(tmp_path: Any) -> None:
    async def run() -> None:
        core = await make_core(str(tmp_path), ROUTING)
        _queue(core, ("typed", 0), _r(0, "3"))
        await _until(lambda: len(_outs()) == 1, "an output")
        tablet = core.tablets[("typed", 0)]
        stored = cell(b"k", "recent")
        assert list(tablet.store.scan(stored)), "written with its expiry (record time + 10 s)"
        core.set_watermarks({"typed": BASE + 9_000_000})
        _queue(core, ("typed", 0), _r(1, "look"))
        await _until(lambda: len(_outs()) == 2, "a look before the expiry")
        assert _outs()[1]["recent"] == "3"
        core.set_watermarks({"typed": BASE + 10_000_000})  # the watermark reaches the expiry
        await _until(lambda: not list(tablet.store.scan(stored)), "the runtime's TTL timer to delete it")
        _queue(core, ("typed", 0), _r(2, "look"))
        await _until(lambda: len(_outs()) == 3, "a look after the expiry")
        assert _outs()[2]["recent"] is None and _outs()[2]["total"] == 3  # no TTL on total
        await core.close_all()

    asyncio.run(run())


def test_a_wall_time_ttl_forgets_by_the_clock_whatever_the_records_times_and_the_watermark(tmp_path: Any) -> None:
    """``ttl_domain=TimeDomain.WALL_TIME``: each write lives 10 s of the worker's clock; the
    records' times (years behind it) and the watermark (which never moves here) play no part."""
    now = [BASE + 3 * 365 * 86_400_000_000]  # the clock, three years after the records' times
    wall = routing(("wall", "tests.core.jobs:WallTyped", ["in"], ["out"], {}),
                   ("collect", "tests.core.jobs:Collector", ["out"], [], {"name": "out"}))

    def tick(us: int) -> None:
        now[0] += us
        core.clock_moved()

    async def run() -> None:
        nonlocal core
        core = await make_core(str(tmp_path), wall, clock=lambda: now[0])
        tablet = core.tablets[("wall", 0)]
        for i, step in enumerate([0, 9_000_000, 9_000_000]):  # each within 10 s of the write before
            tick(step)
            _queue(core, ("wall", 0), _r(i, f"v{i}"))
            await _until(lambda n=i + 1: len(_outs()) == n, f"output {i + 1}")  # type: ignore[misc]
        assert _outs()[-1] == {"count": 3, "seen": ["v1", "v2"]}  # (each element its own 10 s: v0's is past)
        tick(10_000_000)  # 10 s after the last write: all of it is past
        await _until(lambda: not list(tablet.store.scan(cell(b"k", "count")))
                     and not list(tablet.store.scan(cell(b"k", "seen"))), "the wall-time TTL timer to delete it")
        _queue(core, ("wall", 0), _r(3, "v3"))
        await _until(lambda: len(_outs()) == 4, "an output after the expiry")
        assert _outs()[-1] == {"count": 1, "seen": ["v3"]}
        assert core.watermark("wall") < BASE  # (no watermark ever came)
        await core.close_all()

    core: Any = None
    asyncio.run(run())


def test_a_handle_is_only_valid_during_its_call() -> None:
    ctx = KeyContext(frozenset(), lambda k: None, lambda: 0)
    ctx.begin(b"k", 0)
    handle = ctx.state_of(ListState("seen", codecs.INT))
    handle.append(1)
    ctx.begin(b"k", 0)  # the next record
    with pytest.raises(MillstreamError, match="used outside the call that obtained it"):
        handle.append(2)
    with pytest.raises(TypeError, match="takes a ValueState, ListState or MapState"):
        ctx.state_of("seen")


def test_user_code_may_not_set_or_delete_a_timer_under_the_runtimes_ttl_tag() -> None:
    """A user timer tagged ``millstream.ttl/<name>`` was taken for the runtime's TTL timer: it
    never reached process_timer (and deleting one stopped a state's expiry)."""
    from runtime.errors import UsageError
    ctx = KeyContext(frozenset(), lambda k: None, lambda: 0)
    ctx.begin(b"k", 0)
    with pytest.raises(UsageError, match="are the runtime's own"):
        ctx.set_timer("millstream.ttl/count", BASE)
    with pytest.raises(UsageError, match="are the runtime's own"):
        ctx.delete_timer("millstream.ttl/count")
    ctx.set_timer("millstream.other", BASE)  # only the TTL's prefix is taken
    ctx.state_of(ValueState("v", codecs.INT, ttl=1_000_000)).set(1)  # the runtime's own TTL timer: set
    assert [t.tag for t in ctx.effects.timers_set.values()] == ["millstream.other", "millstream.ttl/v"]


def test_a_sink_written_before_runtime_sink_still_has_its_hooks_called(tmp_path: Any) -> None:
    from tests.core.jobs import UndeclaredSink

    async def run() -> None:
        UndeclaredSink.restored, UndeclaredSink.prepared = [], 0
        core = await make_core(str(tmp_path), routing(("legacy", "tests.core.jobs:UndeclaredSink", ["in"], [], {})))
        assert UndeclaredSink.restored == [("legacy/0", None)]
        _queue(core, ("legacy", 0), _r(0, "1"))
        await _until(lambda: UndeclaredSink.prepared == 1, "its prepare_commit")
        await core.close_all()
        core = await make_core(str(tmp_path), routing(("legacy", "tests.core.jobs:UndeclaredSink", ["in"], [], {})))
        assert UndeclaredSink.restored[-1] == ("legacy/0", b"1")  # the committed meta comes back
        await core.close_all()

    asyncio.run(run())


class TtlEvents(Computation):
    """A list whose elements expire 10 s of event time after they were appended."""

    events = ListState("events", codecs.INT, ttl=10_000_000)

    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.state_of(self.events).append(int(record.value))


def test_a_ttl_firing_deletes_no_more_than_the_batchs_budget_and_comes_back_for_the_rest(
        tmp_path: Any, monkeypatch: Any) -> None:
    """Review: a key's TTL firing deleted every expired entry in one commit (a million of them
    would not fit a replication frame). It deletes what the batch's budget of one-by-one
    deletes leaves room for, and its timer comes back in the next batch for the rest."""
    from worker import context, storage
    monkeypatch.setattr(context, "BATCH_CLEAR_POINTS", 2)
    deletes: list[int] = []
    real = storage.TabletStore.commit

    def commit(self: Any, c: Any) -> Any:
        deletes.append(sum(v is None for v in c.cells.values()))
        return real(self, c)
    monkeypatch.setattr(storage.TabletStore, "commit", commit)

    async def run() -> None:
        core = await make_core(str(tmp_path), routing(("ttl", f"{__name__}:TtlEvents", ["in"], [], {})))
        for i in range(5):
            _queue(core, ("ttl", 0), _r(i, "1"))
        await _until(lambda: (t := core.tablets.get(("ttl", 0))) is not None and t.processed == 5, "five records")
        tablet = core.tablets[("ttl", 0)]
        core.set_watermarks({"ttl": BASE + 20_000_000})  # past every element's expiry
        await _until(lambda: not list(tablet.store.scan(b"Y")), "the list, counter included, deleted")
        await core.close_all()

    asyncio.run(run())
    assert max(deletes) == 2 and sum(deletes) == 6, deletes  # five elements and the counter, two a batch


def test_clears_that_spend_their_budget_do_not_starve_ttl_deletion() -> None:
    """Review: clears and TTL firings shared one budget, and TTL firings run last: a workload
    whose clears spent it in every batch left expired entries stored for ever (their timer
    holding the watermark). Each has a budget of its own; a clear past it is a range delete."""
    from worker import context
    ctx = KeyContext(frozenset(), lambda k: None, lambda: 0)
    ctx.start_batch({})
    ctx.cleared_points = context.BATCH_CLEAR_POINTS  # the clears spent theirs
    ctx.begin(b"k", 0)
    assert ctx.expire_room() == context.BATCH_CLEAR_POINTS
    assert ctx.delete_expired([b"a", b"b"]) and ctx.effects.cells == {b"a": None, b"b": None}
    ctx.expired_points = context.BATCH_CLEAR_POINTS - 1
    assert not ctx.delete_expired([b"c", b"d"]) and b"c" in ctx.effects.cells and b"d" not in ctx.effects.cells
    assert ctx.expire_room() == 0


def test_a_ttl_list_whose_elements_all_expired_leaves_nothing_of_its_key(tmp_path: Any) -> None:
    """Review 3 N15: the list's counter had no expiry and stayed for ever (one entry per key
    ever seen), and no TTL timer came back for it."""
    async def run() -> None:
        core = await make_core(str(tmp_path), routing(("ttl", f"{__name__}:TtlEvents", ["in"], [], {})))
        for i, key in enumerate([b"a", b"a", b"b"]):
            _queue(core, ("ttl", 0), _r(i, "1", key))
        await _until(lambda: (t := core.tablets.get(("ttl", 0))) is not None and t.processed == 3, "three records")
        tablet = core.tablets[("ttl", 0)]
        assert list(tablet.store.scan(cell(b"a", "events")))
        core.set_watermarks({"ttl": BASE + 12_000_001})  # past every element's expiry
        await _until(lambda: not list(tablet.store.scan(b"Y")), "every key's list, counter included, deleted")
        assert not tablet.timers.peek(TimeDomain.EVENT_TIME), "no TTL timer left behind"
        _queue(core, ("ttl", 0), _r(20, "5"))  # a key seen again starts a new list
        await _until(lambda: tablet.processed == 4, "a fourth record")
        assert [v for _, v in tablet.store.scan(cell(b"k", "events"))]
        await core.close_all()

    asyncio.run(run())


def test_a_key_written_more_often_than_its_ttl_still_has_its_expired_entries_deleted(tmp_path: Any) -> None:
    """Review of typed state (1): every write moved the key's TTL timer to its own expiry, so a
    key written more often than its TTL kept the timer ahead of the watermark for ever, and
    every entry that had expired stayed stored (and was scanned by every read of the list)."""
    async def run() -> None:
        core = await make_core(str(tmp_path), routing(("ttl", f"{__name__}:TtlEvents", ["in"], [], {})))
        elements = cell(b"a", "events") + ELEMENT
        for i in range(6):  # an element every 5 s of event time (each lives 10 s), the watermark 1 s behind
            core.set_watermarks({"ttl": BASE + i * 5_000_000 - 1_000_000})
            _queue(core, ("ttl", 0), Record(b"a", b"1", BASE + i * 5_000_000, (2000 + i).to_bytes(16, "big")))
            await _until(lambda n=i + 1: (t := core.tablets.get(("ttl", 0))) is not None and t.processed == n,
                         f"record {i}")
        tablet = core.tablets[("ttl", 0)]
        # At 24 s, the elements of 0, 5 and 10 s (expired at 10, 15 and 20 s) are gone; 15, 20, 25 s stay.
        await _until(lambda: len(list(tablet.store.scan(elements))) == 3, "the three expired elements deleted")
        core.set_watermarks({"ttl": BASE + 36_000_000})  # past every expiry: all of them at once
        await _until(lambda: not list(tablet.store.scan(b"Y")), "the rest deleted")
        await core.close_all()

    asyncio.run(run())


class TtlTimerReader(Computation):
    """A value that lives 10 s; the record ``second`` also sets a timer 5 s later that reads it."""

    value = ValueState("v", codecs.STR, ttl=10_000_000)

    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.state_of(self.value).set(record.value.decode())
        if record.value == b"second":
            ctx.set_timer("read", record.timestamp + 5_000_000, TimeDomain.EVENT_TIME)

    def process_timer(self, ctx: Context, tag: str, time: int) -> None:
        ctx.produce("out", repr(ctx.state_of(self.value).get()).encode())


def test_a_timer_due_with_a_ttl_timer_reads_its_keys_state_as_of_its_own_time(tmp_path: Any) -> None:
    """Review of this round's TTL fix: the TTL timer stays at the first write's expiry; due in
    one batch with a later timer of the key (the watermark jumped), a firing that deleted what
    the watermark had passed took what that timer was to read as live at its own time. A TTL
    firing deletes only what expired by its own time."""
    async def run() -> None:
        Collector.seen = []
        core = await make_core(str(tmp_path), routing(("ttl", f"{__name__}:TtlTimerReader", ["in"], ["out"], {}),
                                                      ("collect", "tests.core.jobs:Collector", ["out"], [], {})))
        _queue(core, ("ttl", 0), _r(0, "first"))      # expires at 10 s: the TTL timer's time
        _queue(core, ("ttl", 0), _r(50, "second"))    # expires at 60 s; its timer reads at 55 s
        await _until(lambda: (t := core.tablets.get(("ttl", 0))) is not None and t.processed == 2, "both records")
        core.set_watermarks({"ttl": BASE + 100_000_000, "collect": BASE + 100_000_000})  # both timers due at once
        await _until(lambda: len(Collector.seen) == 1, "the timer's read")
        assert Collector.seen[0][2] == b"'second'"
        tablet = core.tablets[("ttl", 0)]
        await _until(lambda: not list(tablet.store.scan(cell(b"k", "v"))), "the value deleted after it")
        await core.close_all()

    asyncio.run(run())


def test_a_ttl_timer_does_not_delete_what_a_timer_left_for_the_next_batch_is_to_read(tmp_path: Any) -> None:
    """The same across batches: a batch takes at most its limit of due timers, in time order;
    a key's TTL timer taken while its later timer waited for the next batch must not delete
    what that timer is to read. (Batches of two timers: k's TTL at 10 s and j's read at 20 s
    go first; j's TTL at 25 s and k's read at 55 s wait.)"""
    from worker.core import WorkerLimits

    async def run() -> None:
        Collector.seen = []
        core = await make_core(str(tmp_path), routing(("ttl", f"{__name__}:TtlTimerReader", ["in"], ["out"], {}),
                                                      ("collect", "tests.core.jobs:Collector", ["out"], [], {})),
                               WorkerLimits(max_batch_records=2))
        _queue(core, ("ttl", 0), _r(0, "first"))               # k: expires at 10 s
        _queue(core, ("ttl", 0), _r(15, "second", key=b"j"))   # j: expires at 25 s, read at 20 s
        _queue(core, ("ttl", 0), _r(50, "second"))             # k: expires at 60 s, read at 55 s
        await _until(lambda: (t := core.tablets.get(("ttl", 0))) is not None and t.processed == 3, "the records")
        core.set_watermarks({"ttl": BASE + 100_000_000, "collect": BASE + 100_000_000})
        await _until(lambda: len(Collector.seen) == 2, "both reads")
        assert sorted((k, v) for _, k, v in Collector.seen) == [(b"j", b"'second'"), (b"k", b"'second'")]
        await core.close_all()

    asyncio.run(run())


def test_a_ttl_timer_comes_back_no_sooner_than_a_second_after_its_time(tmp_path: Any) -> None:
    """Review of this round's TTL fix: re-armed at the next expiry, the timer of a key written
    on and on fired at nearly every watermark tick, each time scanning the key's whole list."""
    from runtime.state import TTL_TAG

    async def run() -> None:
        core = await make_core(str(tmp_path), routing(("ttl", f"{__name__}:TtlEvents", ["in"], [], {})))
        _queue(core, ("ttl", 0), Record(b"a", b"1", BASE, (3000).to_bytes(16, "big")))             # expires at 10 s
        _queue(core, ("ttl", 0), Record(b"a", b"2", BASE + 500_000, (3001).to_bytes(16, "big")))   # ... at 10.5 s
        await _until(lambda: (t := core.tablets.get(("ttl", 0))) is not None and t.processed == 2, "both records")
        tablet = core.tablets[("ttl", 0)]
        core.set_watermarks({"ttl": BASE + 10_000_000})
        await _until(lambda: len(list(tablet.store.scan(cell(b"a", "events") + ELEMENT))) == 1, "the first deleted")
        timer = tablet.timers.get((b"a", TTL_TAG + "events"))
        assert timer is not None and timer.time == BASE + 11_000_000  # not 10.5 s: its time + 1 s
        await core.close_all()

    asyncio.run(run())


def test_a_ttl_timer_comes_back_half_way_to_a_watermark_far_ahead_and_never_past_the_end_of_time() -> None:
    """Review of this round's TTL fix: re-armed at the watermark + 1 s, a TTL timer firing at a
    watermark at the end of time (a drain) was set past it, and the call was dead-lettered."""
    from runtime.record import END_OF_TIME
    from runtime.state import ttl_rearm

    assert ttl_rearm(10, 15, 12) == 1_000_010                # a second later at least
    assert ttl_rearm(0, 10, 100_000_000) == 50_000_000       # half way to a watermark far ahead
    assert ttl_rearm(0, 80_000_000, 100_000_000) == 80_000_000  # the next expiry, if later
    assert ttl_rearm(5, 10, END_OF_TIME) <= END_OF_TIME
    assert ttl_rearm(END_OF_TIME - 10, END_OF_TIME - 5, END_OF_TIME) == END_OF_TIME


class TtlArmReader(Computation):
    """A value that lives 10 s; the record ``arm`` sets a timer at 5 s that reads it."""

    value = ValueState("v", codecs.STR, ttl=10_000_000)

    def process_record(self, ctx: Context, record: Record) -> None:
        if record.value == b"arm":
            ctx.set_timer("read", BASE + 5_000_000, TimeDomain.EVENT_TIME)
        else:
            ctx.state_of(self.value).set(record.value.decode())

    def process_timer(self, ctx: Context, tag: str, time: int) -> None:
        ctx.produce("out", repr(ctx.state_of(self.value).get()).encode())


def test_a_ttl_firing_leaves_what_a_timer_its_batch_set_behind_it_is_to_read(tmp_path: Any) -> None:
    """Review of the last TTL fix: a timer set in the batch at a time before a due TTL timer's
    (a record's, or a window step's re-armed firing) fires in the next batch and reads as of
    its own time; the TTL firing, last in the batch, deleted what it was to read. The firing
    now deletes nothing that expired after that timer; the re-armed TTL timer deletes it."""
    async def run() -> None:
        Collector.seen = []
        core = await make_core(str(tmp_path), routing(("ttl", f"{__name__}:TtlArmReader", ["in"], ["out"], {}),
                                                      ("collect", "tests.core.jobs:Collector", ["out"], [], {})))
        _queue(core, ("ttl", 0), _r(0, "first"))  # lives until 10 s: the TTL timer's time
        await _until(lambda: (t := core.tablets.get(("ttl", 0))) is not None and t.processed == 1, "the value")
        _queue(core, ("ttl", 0), _r(1, "arm"))    # sets a read at 5 s, in the batch that fires the TTL timer:
        core.set_watermarks({"ttl": BASE + 100_000_000, "collect": BASE + 100_000_000})  # (no await between)
        await _until(lambda: len(Collector.seen) == 1, "the read")
        assert Collector.seen[0][2] == b"'first'"  # live at 5 s
        tablet = core.tablets[("ttl", 0)]
        await _until(lambda: not list(tablet.store.scan(cell(b"k", "v"))), "the value deleted after it")
        await core.close_all()

    asyncio.run(run())


class TtlChain(Computation):
    """A value that lives 10 s; the record ``arm`` starts a chain of timers at 5, 6, 7, 8 and 9 s,
    each setting the next in its own batch (a trickle of timers behind a TTL timer). The step
    at 6 s waits for the test to look at the store."""

    value = ValueState("v", codecs.STR, ttl=10_000_000)
    at_six = threading.Event()
    go_on = threading.Event()

    def process_record(self, ctx: Context, record: Record) -> None:
        if record.value == b"arm":
            ctx.set_timer("step", BASE + 5_000_000, TimeDomain.EVENT_TIME)
        else:
            ctx.state_of(self.value).set(record.value.decode())

    def process_timer(self, ctx: Context, tag: str, time: int) -> None:
        if time == BASE + 6_000_000:
            TtlChain.at_six.set()
            assert TtlChain.go_on.wait(30), "the test did not let the chain go on"
        ctx.produce("out", str(time - BASE).encode())
        if time < BASE + 9_000_000:
            ctx.set_timer("step", time + 1_000_000, TimeDomain.EVENT_TIME)


def test_a_timer_another_key_set_behind_a_ttl_timer_does_not_hold_it_back(tmp_path: Any) -> None:
    """Review of the TTL deferral (ca1a6d5): a TTL timer later than any timer its batch set, of
    any key, waited a batch; a trickle of such timers (late records, timer chains) kept every
    key's expired state stored and the tablet's watermark held at the TTL timer. Now a TTL
    firing waits for nothing: it deletes no further than its own key's earlier timers."""
    async def run() -> None:
        Collector.seen = []
        TtlChain.at_six.clear()
        TtlChain.go_on.clear()
        core = await make_core(str(tmp_path), routing(("ttl", f"{__name__}:TtlChain", ["in"], ["out"], {}),
                                                      ("collect", "tests.core.jobs:Collector", ["out"], [], {})))
        _queue(core, ("ttl", 0), _r(0, "first"))  # key k, lives until 10 s
        await _until(lambda: (t := core.tablets.get(("ttl", 0))) is not None and t.processed == 1, "the value")
        _queue(core, ("ttl", 0), _r(1, "arm", key=b"o"))  # another key's chain, from the batch that fires k's TTL
        core.set_watermarks({"ttl": BASE + 100_000_000, "collect": BASE + 100_000_000})
        await _until(TtlChain.at_six.is_set, "the chain's step at 6 s, two batches on")
        try:
            tablet = core.tablets[("ttl", 0)]
            assert not list(tablet.store.scan(cell(b"k", "v"))), "k's expired value waited for o's chain"
        finally:
            TtlChain.go_on.set()
        await _until(lambda: len(Collector.seen) == 5, "the whole chain")
        await core.close_all()

    asyncio.run(run())


def test_expired_deletes_a_lists_counter_with_its_last_element() -> None:
    prefix = cell(b"session-123", "events")
    entries = sorted([(prefix + COUNT, _INDEX.pack(3)),
                      (prefix + ELEMENT + _INDEX.pack(0), _EXPIRY.pack(100) + b"a"),
                      (prefix + ELEMENT + _INDEX.pack(1), _EXPIRY.pack(200) + b"b")])
    gone, nxt = expired(prefix, entries, 150)
    assert gone == [prefix + ELEMENT + _INDEX.pack(0)] and nxt == 200  # one left: the counter stays
    gone, nxt = expired(prefix, entries, 1_000)
    assert sorted(gone) == sorted(k for k, _ in entries) and nxt is None
    forever = [*entries, (prefix + ELEMENT + _INDEX.pack(2), _EXPIRY.pack(NEVER) + b"c")]
    gone, nxt = expired(prefix, sorted(forever), 1_000)
    assert prefix + COUNT not in gone and nxt is None  # an element without expiry keeps the list
