"""worker/_loop.c against worker/recordloop.py's Python reference: the same batches, run by
both, leave the same trace (what user code saw, what the batch counted, what went back into
Python, what the context holds), whatever the records do: return, raise, come late, run
slow, make effects or weak productions, or meet the batch's bounds."""

from __future__ import annotations

import collections
import gc
import math
import sys
import weakref
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.columns import Columns
from runtime.record import Record
from worker import recordloop
from worker.context import KeyContext
from worker.slowcalls import CallWatch

compiled = recordloop._compiled
needs_compiled = pytest.mark.skipif(compiled is None, reason="worker/_loop.c is not built (no compiler)")

PRODUCER = b"\x01" * 8
NORMAL, RAISE, ABORT, EARLIER, EFFECT, SLOW, SHORTEN = range(7)


class Abort(BaseException):
    """Not an Exception: the loops take anything a call raises."""


class Clock:
    """Floats as time.monotonic gives them; or nanosecond ints (an injected clock may)."""

    def __init__(self, ints: bool = False) -> None:
        self.ints = ints
        self.now: float = 10**18 if ints else 100.0

    def __call__(self) -> float:
        self.now += 7 if self.ints else 0.001
        return self.now

    def jump(self) -> None:
        self.now += 600_000_000 if self.ints else 0.6


class LateCounter:
    def __init__(self) -> None:
        self.n = 0

    def inc(self, by: int = 1) -> None:
        self.n += by


@dataclass
class FakeBatch:
    commit: object = field(default_factory=object)
    new: int = 0


class FakeProc:
    """What the loop reads of a BatchProcessor, with its callbacks recorded."""

    def __init__(self, *, weak: bool, wm: int, drop: bool, limit: int, out_of_time: bool,
                 int_clock: bool = False, fail_in: str | None = None) -> None:
        self.clock = Clock(int_clock)
        self.ctx = KeyContext(frozenset({"out"}), read_state=lambda k: None, watermark=lambda: wm)
        self.ctx.start_batch({})
        self.calls = CallWatch("t", record_above=500_000_000 if int_clock else 0.5, clock=self.clock)
        self.calls.slow = self.slow  # type: ignore[method-assign]
        self.fail_in = fail_in
        self.cols: Columns | None = None
        self._durations: list[float] = []
        self.weak, self._wm = weak, wm
        self.late_records = "drop" if drop else "process"
        self._started, self._budget = (-math.inf, 0.0) if out_of_time else (0.0, math.inf)
        self._work, self._limit, self._taken, self.late, self._stop = 0, limit, 0, 0, False
        self.metrics = type("M", (), {})()
        self.metrics.late = LateCounter()
        self.metrics.late.inc = self.late_inc  # type: ignore[method-assign]
        self.seen: list[Record] = []
        self.trace: list[tuple[Any, ...]] = []
        self._one = self._record_fn = self.user_code

    def user_code(self, ctx: KeyContext, record: Record) -> None:
        self.seen.append(record)
        action = record.value[0]
        ctx.state.set(record.value)
        ctx.produce("out", record.value)
        if action == RAISE:
            raise ValueError(f"record {record.timestamp}")
        if action == ABORT:
            raise Abort()
        if action == EARLIER:
            ctx.produce("out", b"earlier", timestamp=record.timestamp - 1)
        if action == EFFECT:
            ctx.effects  # noqa: B018  (a call with timers or typed state makes its Effects)
        if action == SLOW:
            self.clock.jump()
        if action == SHORTEN:  # (no job does this; the loop must still not read past a list)
            cols = self.cols
            assert cols is not None
            i = record.value[1]
            which = [cols.keys, cols.values, cols.timestamps, cols.seqs if cols.seqs is not None else cols.ids,
                     cols.streams if type(cols.streams) is list else cols.keys][i % 5]
            del which[i:]  # type: ignore[union-attr]

    def _fail(self, where: str) -> None:
        if self.fail_in == where:
            raise RuntimeError(f"the runtime failed in {where}")

    def late_inc(self, by: int = 1) -> None:
        self.trace.append(("late", self._taken, self.late))
        self._fail("late")
        self.metrics.late.n += by

    def slow(self, key: bytes, seconds: float, now: float) -> None:
        self.trace.append(("slow", key, type(seconds).__name__, seconds, now, self._work))
        self._fail("slow")

    def _run_user(self, commit: object, key: bytes, ts: int, value: bytes, rid: bytes, fn: object,
                  record: Record, source: object, failed: BaseException | None = None) -> None:
        assert failed is not None and failed.__traceback__ is not None
        self.trace.append(("run_user", key, ts, value, rid, fn == self.user_code, record, source,
                           type(failed).__name__, str(failed), self._taken, self._work))
        self._fail("run_user")

    def _after_call(self, commit: object, eff: object, mark: int, ts: int, rid: bytes, source: object,
                    n: int) -> None:
        self.trace.append(("after", eff is not None, mark, ts, rid, source, n, self.ctx.out[mark:n], self._work))
        self._fail("after")

    def state(self, batch: FakeBatch, reached: int) -> dict[str, Any]:
        return {"reached": reached, "work": self._work, "taken": self._taken, "late": self.late,
                "late_metric": self.metrics.late.n, "stop": self._stop, "new": batch.new, "seen": self.seen,
                "trace": self.trace, "out": self.ctx.out, "writes": self.ctx.writes,
                "durations": [(type(d).__name__, d) for d in self._durations], "running": self.calls.running_call}


@st.composite
def scenarios(draw: Any) -> dict[str, Any]:
    n = draw(st.integers(0, 40))
    return {
        "actions": draw(st.lists(st.sampled_from([NORMAL] * 8 + [RAISE, ABORT, EARLIER, EFFECT, SLOW, SHORTEN]),
                                 min_size=n, max_size=n)),
        "times": draw(st.lists(st.integers(-5, 30), min_size=n, max_size=n)),
        "wm": draw(st.integers(0, 10)),
        "weak": draw(st.booleans()),
        "drop": draw(st.booleans()),
        "limit": draw(st.integers(0, 45)),
        "out_of_time": draw(st.booleans()),
        "sequenced": draw(st.booleans()),
        "streams": draw(st.sampled_from(["one", "each", "none"])),
        "start": draw(st.integers(0, 5)),
        "stop": draw(st.one_of(st.none(), st.integers(0, 40))),
        "int_clock": draw(st.booleans()),
        "no_producer": draw(st.booleans()),  # sequenced columns, but run for one record's source
        "fail_in": draw(st.sampled_from([None] * 4 + ["late", "slow", "run_user", "after"])),
    }


def columns(s: dict[str, Any]) -> Columns:
    n = len(s["actions"])
    keys = [b"k%d" % (i % 3) for i in range(n)]
    values = [bytes([a, i]) for i, a in enumerate(s["actions"])]
    streams: Any = {"one": "in", "each": [f"s{i % 2}" for i in range(n)], "none": None}[s["streams"]]
    if s["sequenced"]:
        return Columns(keys, values, list(s["times"]), producer=PRODUCER, seqs=[1000 + i for i in range(n)],
                       streams=streams)
    return Columns(keys, values, list(s["times"]), ids=[b"%016d" % i for i in range(n)], streams=streams)


def run(loop: Any, s: dict[str, Any]) -> dict[str, Any]:
    proc = FakeProc(weak=s["weak"], wm=s["wm"], drop=s["drop"], limit=s["limit"], out_of_time=s["out_of_time"],
                    int_clock=s.get("int_clock", False), fail_in=s.get("fail_in"))
    batch = FakeBatch()
    cols = proc.cols = columns(s)
    stop = None if s["stop"] is None else min(s["stop"], len(cols))
    start = min(s["start"], len(cols) if stop is None else stop)
    producer = PRODUCER if s["sequenced"] and not s.get("no_producer") else None
    source = None if producer is not None else (b"p", 7)
    try:
        reached: Any = loop(proc, batch, cols, start, producer, stop, source)
    except Exception as e:  # the runtime's own failure, or a column shortened under the loop
        context = e.__context__
        reached = ("raised", type(e).__name__, str(e), type(context).__name__, str(context))
    return proc.state(batch, reached)


@needs_compiled
@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_the_compiled_loop_leaves_what_the_python_loop_leaves(s: dict[str, Any]) -> None:
    assert run(compiled.run_records, s) == run(recordloop.run_records_py, s)


@needs_compiled
def test_a_scenario_of_every_kind_is_covered() -> None:
    # (the property test's draws could miss a path: this one takes each at least once)
    s = {"actions": [NORMAL, RAISE, ABORT, EARLIER, EFFECT, SLOW] * 3, "times": list(range(18)), "wm": 3,
         "weak": True, "drop": False, "limit": 40, "out_of_time": False, "sequenced": True, "streams": "each",
         "start": 0, "stop": None}
    got = run(compiled.run_records, s)
    assert got == run(recordloop.run_records_py, s)
    kinds = {t[0] for t in got["trace"]}
    assert kinds == {"run_user", "after", "late", "slow"} and got["late"] == 3 and got["reached"] == 18


@needs_compiled
@pytest.mark.parametrize("fail_in", ["late", "slow", "run_user", "after"])
def test_a_failure_of_the_runtime_itself_leaves_the_same_state(fail_in: str) -> None:
    s = {"actions": [NORMAL, RAISE, SLOW, EFFECT, NORMAL], "times": [1, 5, 6, 7, 8], "wm": 3, "weak": False,
         "drop": False, "limit": 9, "out_of_time": False, "sequenced": True, "streams": "one", "start": 0,
         "stop": None, "fail_in": fail_in, "int_clock": True}
    got = run(compiled.run_records, s)
    assert got == run(recordloop.run_records_py, s)
    assert got["reached"][:3] == ("raised", "RuntimeError", f"the runtime failed in {fail_in}")
    if fail_in == "run_user":  # raised while the user's error was being handled, in both
        assert got["reached"][3:] == ("ValueError", "record 5")


@needs_compiled
@pytest.mark.parametrize("sequenced", [True, False])
@pytest.mark.parametrize("column", range(5))  # keys, values, timestamps, seqs or ids, streams
def test_a_column_shortened_under_the_loop_raises_as_python_does(column: int, sequenced: bool) -> None:
    actions = [NORMAL] * 9
    actions[5 + column if column < 3 else column] = SHORTEN  # (record i cuts column i % 5 to i records)
    s = {"actions": actions, "times": [5] * 9, "wm": 0, "weak": False, "drop": False, "limit": 9,
         "out_of_time": False, "sequenced": sequenced, "streams": "each", "start": 0, "stop": None}
    got = run(compiled.run_records, s)
    assert got == run(recordloop.run_records_py, s)
    assert got["reached"][:3] == ("raised", "IndexError", "list index out of range")


@needs_compiled
def test_the_loop_keeps_no_reference_once_it_returns() -> None:
    class Failed(Exception):
        pass

    key, source, errors = b"leak-sentinel-%d" % id(object()), (b"p", 7), []

    def user_code(ctx: KeyContext, record: Record) -> None:
        ctx.produce("out", record.value, timestamp=record.timestamp - 1)  # (an Effects: _after_call)
        if record.value[1] % 2:
            e = Failed()
            errors.append(weakref.ref(e))
            raise e

    def once() -> None:
        proc = FakeProc(weak=True, wm=3, drop=False, limit=99, out_of_time=False)
        proc._one = proc._record_fn = user_code  # type: ignore[method-assign]
        cols = Columns([key] * 20, [bytes([0, i]) for i in range(20)], list(range(20)), ids=[b"%016d" % i
                                                                                              for i in range(20)])
        assert compiled.run_records(proc, FakeBatch(), cols, 0, None, None, source) == 20

    once()  # (whatever the first run caches)
    gc.collect()
    before = sys.getrefcount(key), sys.getrefcount(source)
    for _ in range(30):
        once()
    gc.collect()
    assert (sys.getrefcount(key), sys.getrefcount(source)) == before
    assert errors and all(ref() is None for ref in errors)


@needs_compiled
def test_the_exception_being_handled_around_the_loop_is_left_as_it_was() -> None:
    s = {"actions": [RAISE, NORMAL], "times": [5, 6], "wm": 0, "weak": False, "drop": False, "limit": 9,
         "out_of_time": False, "sequenced": True, "streams": "one", "start": 0, "stop": None}
    for loop in (compiled.run_records, recordloop.run_records_py):
        try:
            raise KeyError("outer")
        except KeyError as outer:
            got = run(loop, s)
            assert sys.exc_info()[1] is outer, loop
        assert got["trace"][0][8:10] == ("ValueError", "record 5")


@needs_compiled
@pytest.mark.parametrize("durations", [collections.deque, type("Durations", (list,), {})])
def test_durations_of_another_kind_run_in_python(durations: Any) -> None:
    s = {"actions": [NORMAL, RAISE, NORMAL], "times": [5, 6, 7], "wm": 0, "weak": False, "drop": False, "limit": 9,
         "out_of_time": False, "sequenced": True, "streams": "one", "start": 0, "stop": None}
    proc = FakeProc(weak=False, wm=0, drop=False, limit=9, out_of_time=False)
    proc._durations = durations()
    assert compiled.run_records(proc, FakeBatch(), columns(s), 0, PRODUCER, None, None) is NotImplemented
    assert proc._taken == 0 and not proc.seen
    assert recordloop.run_records(proc, FakeBatch(), columns(s), 0, PRODUCER, None, None) == 3
    assert len(proc._durations) == 2


@needs_compiled
def test_columns_of_another_shape_run_in_python() -> None:
    s = {"actions": [NORMAL, RAISE], "times": [5, 6], "wm": 0, "weak": False, "drop": False, "limit": 9,
         "out_of_time": False, "sequenced": True, "streams": "one", "start": 0, "stop": None}
    proc = FakeProc(weak=False, wm=0, drop=False, limit=9, out_of_time=False)
    cols = columns(s)
    cols.keys = tuple(cols.keys)  # type: ignore[assignment]
    assert compiled.run_records(proc, FakeBatch(), cols, 0, PRODUCER, None, None) is NotImplemented
    assert proc._taken == 0  # nothing done before it said so
    assert recordloop.run_records(proc, FakeBatch(), cols, 0, PRODUCER, None, None) == 2


@needs_compiled
def test_an_error_of_the_runtime_itself_propagates_with_the_counters_written_back() -> None:
    s = {"actions": [NORMAL] * 4, "times": [5] * 4, "wm": 0, "weak": False, "drop": False, "limit": 9,
         "out_of_time": False, "sequenced": True, "streams": "one", "start": 0, "stop": None}
    for loop in (compiled.run_records, recordloop.run_records_py):
        proc = FakeProc(weak=False, wm=0, drop=False, limit=9, out_of_time=False)
        ticks = iter(range(5))
        proc.calls.clock = lambda: float(next(ticks))  # the clock fails at the third record's end  # noqa: B023
        batch = FakeBatch()
        with pytest.raises(StopIteration):
            loop(proc, batch, columns(s), 0, PRODUCER, None, None)
        assert (proc._taken, proc._work, batch.new, len(proc.seen)) == (3, 3, 3, 3), loop
        assert proc.calls.running_call is not None  # (the call that ended in the failure)


@needs_compiled
def test_records_are_made_as_records() -> None:
    r = compiled.record(b"k", b"v", 5, b"i" * 16, "s")
    assert type(r) is Record and r == Record(b"k", b"v", 5, b"i" * 16, "s")
    assert hash(r) == hash(Record(b"k", b"v", 5, b"i" * 16, "s"))
    with pytest.raises(AttributeError):
        r.key = b"x"  # type: ignore[misc]  # frozen, as ever


def test_the_loop_is_built_where_it_can_be() -> None:
    import os

    if os.environ.get("MILLSTREAM_PURE_PYTHON") not in (None, "", "0"):
        assert not recordloop.COMPILED
    else:
        assert recordloop.COMPILED, ("worker/_loop.c is not built: run `pip install -e .` in the virtualenv "
                                     "(it needs a C compiler and Python's headers)")
