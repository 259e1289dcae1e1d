"""A flow's event-time steps (runtime/flows/windowing.py, joins.py) driven directly on a
context of cells in a dict: the order of a record and a timer within one batch, and a lost
timer, are the test's to choose. The steps through a stage and a worker are in
tests/core/test_dataflow_windows.py."""

from __future__ import annotations

from typing import Any

from runtime.flows import joins, windowing
from runtime.windows import SECOND, Count, Session, Sum, Tumbling

T0 = 1_700_000_000_000_000


class _Cells:
    """A window step's context, as its stage gives it (cells in a dict, timers and late
    records noted): the step driven directly, so the order of a record and a timer within
    one batch is the test's to choose."""

    def __init__(self) -> None:
        self.cells: dict[bytes, bytes] = {}
        self.low_watermark = T0 - 1
        self.produced: list[tuple[str, bytes]] = []
        self.timers: list[tuple[str, int]] = []

    def cell_scan(self, prefix: bytes) -> list[tuple[bytes, bytes]]:
        return sorted((k, v) for k, v in self.cells.items() if k.startswith(prefix))

    def cell_get(self, key: bytes) -> bytes | None:
        return self.cells.get(key)

    def cell_put(self, key: bytes, value: bytes) -> None:
        self.cells[key] = value

    def cell_delete(self, key: bytes) -> None:
        self.cells.pop(key, None)

    def cell_write(self, writes: dict[bytes, bytes | None]) -> None:
        for key, value in writes.items():
            if value is None:
                self.cell_delete(key)
            else:
                self.cell_put(key, value)

    def produce(self, stream: str, value: bytes, key: bytes = b"", timestamp: int = 0) -> None:
        self.produced.append((stream, value))

    def rebind(self, key: bytes, time: int) -> None:
        pass

    def set_timer(self, tag: str, time: int, domain: Any) -> None:
        self.timers.append((tag, time))


def _sessions(gap: int, timer_first: bool) -> list[tuple[int, int, int]]:
    """A session of key a at T0, closed by the watermark; then a record at T0 + 0.5 s, after
    the session's timer ran (``timer_first``) or before it in the same batch."""
    ctx = _Cells()
    step = windowing.Window("sessions", Session(gap), Sum(), late="sessions.late")
    fired: list[Any] = []
    step.muted = fired

    def call(fn: Any, *args: Any) -> None:
        fn(ctx, *args)
        step.finish(ctx)  # type: ignore[arg-type]
        step.commit()

    call(step.push, [(b"a", 1, T0)])
    ctx.low_watermark = T0 + gap + 200_000  # [T0, T0 + gap) is closed
    record = [(b"a", 2, T0 + 500_000)]      # not late: its own session ends after the watermark
    if timer_first:
        call(step.on_timer, f"@{T0 + gap}", ctx.low_watermark)
        call(step.push, record)
    else:  # one batch: its records, then its timers
        step.push(ctx, record)  # type: ignore[arg-type]
        call(step.on_timer, f"@{T0 + gap}", ctx.low_watermark)
    ctx.low_watermark = T0 + 10 * gap
    call(step.on_timer, f"@{T0 + 500_000 + gap}", ctx.low_watermark)
    return sorted((r.start - T0, r.end - T0, r.value) for _, r, _ in fired)


def test_a_session_the_watermark_closed_is_final_whether_or_not_its_timer_ran() -> None:
    """Review of the flows: a record overlapping a session whose end the watermark passed
    joined it when it came in the same batch as the session's timer (records run first) and
    started a session of its own when the timer ran in an earlier batch: the result depended
    on batching. A closed session is final (as in Flink, whose timers run as the watermark
    passes them)."""
    gap = SECOND
    results = [_sessions(gap, timer_first) for timer_first in (True, False)]
    assert results[0] == results[1] == [(0, gap, 1), (500_000, 500_000 + gap, 2)]


def _chained(first: Any, then: Any) -> tuple[_Cells, list[Any]]:
    """Two event-time steps of one stage, ``first`` feeding ``then`` (side 0), wired as the
    stage wires them; what ``then`` emits is kept in the list returned."""
    ctx, out = _Cells(), []
    first.nexts = [(then, 0)]
    then.upstream = [first]
    then.clock = first.clock
    then.muted = out
    return ctx, out


def _call(ctx: _Cells, steps: list[Any], fn: Any, *args: Any) -> None:
    fn(ctx, *args)
    for step in steps:
        step.finish(ctx)
        step.commit()


def test_a_step_waiting_for_the_one_before_it_sets_that_ones_timer_again() -> None:
    """Review of the deferral: a step before it whose timer was lost (a call dead-lettered
    whole consumes the timer, while its undo leaves the due time marked as timed) would hold
    it back for ever; the waiting step sets that timer again."""
    first = windowing.Window("seconds", Tumbling(SECOND), Count(), late="seconds.late")
    then = windowing.Window("minutes", Tumbling(60 * SECOND), Sum(), late="minutes.late")
    ctx, _ = _chained(first, then)
    _call(ctx, [first, then], first.push, [(b"a", b"", T0)])
    ctx.timers.clear()  # as if the worker had consumed first's timer in a call it dead-lettered
    ctx.low_watermark = T0 + 120 * SECOND
    _call(ctx, [first, then], then.on_timer, f"@{T0 + SECOND}", T0 + SECOND)
    assert (f"flow/seconds/@{T0 - T0 % SECOND + SECOND}", T0 - T0 % SECOND + SECOND) in ctx.timers


def test_a_raw_input_of_a_join_after_a_window_is_judged_as_if_the_window_were_a_stage_before_it() -> None:
    """Review of the deferral: in one batch the watermark jumped past a window's end, and a
    record of the join's other input (records run before timers) was judged against it: not
    kept, so the window's result, fired next, found no partner. In two stages the window's
    pending timer would have held the join's watermark back; in one, it does too."""
    first = windowing.Window("seconds", Tumbling(SECOND), Count(), late="seconds.late")
    then = joins.IntervalJoin("near", 5 * SECOND, 10 * SECOND, late="near.late")
    ctx, out = _chained(first, then)
    base = T0 - T0 % SECOND + 100 * SECOND
    ctx.low_watermark = base
    _call(ctx, [first, then], first.push, [(b"a", b"", base + 500_000)])  # its window fires at base + 1 s
    ctx.low_watermark = base + 7_500_000
    then.push(ctx, [(b"a", "right", base + 6_200_000)], 1)  # records first ...
    _call(ctx, [first, then], first.on_timer, f"@{base + SECOND}", base + SECOND)  # ... then the timer
    assert [(k, v[1], t - base) for k, v, t in out] == [(b"a", "right", 6_200_000)]


class _Refuses:
    """A step after the window that raises on a batch of results holding key ``bad``."""

    def push(self, ctx: Any, items: list[Any], side: int = 0) -> None:
        if any(key == b"bad" for key, _, _ in items):
            raise ValueError("refused")


def test_a_firing_that_failed_for_a_later_due_time_keeps_one_window_per_call(monkeypatch: Any) -> None:
    """Review of the give-up: isolation ended once the due time of the call that just ran had
    nothing left, though the firing that raised was for a later one: its next call took a
    whole chunk again (with one attempt, healthy windows went to the dead letters with it)."""
    monkeypatch.setattr(windowing, "FIRE_SLICE_S", 0.0)  # one chunk per call
    monkeypatch.setattr(windowing, "FIRE_CHUNK", 2)
    ctx = _Cells()
    step = windowing.Window("w", Tumbling(SECOND), Count(), late="w.late")
    step.nexts = [(_Refuses(), 0)]  # type: ignore[list-item]

    def call(fn: Any, *args: Any) -> bool:
        try:
            fn(ctx, *args)
            step.finish(ctx)  # type: ignore[arg-type]
        except ValueError as e:
            step.abort()
            step.timer_failed(e)
            return False
        step.commit()
        step.timer_done()
        return True

    t1, t2 = T0 + SECOND, T0 + 2 * SECOND
    call(step.push, [(b"a", 1, T0), (b"b", 1, T0 + 1), (b"c", 1, T0 + 2), (b"bad", 1, t1), (b"x", 1, t1 + 1)])
    ctx.low_watermark = t2
    assert call(step.on_timer, f"@{t1}", t1)      # a and b; c is left due by t1
    assert not call(step.on_timer, f"@{t2}", t2)  # c and bad: raises
    assert call(step.on_timer, f"@{t1}", t1)      # one window per call now: c, the last due by t1
    assert not call(step.on_timer, f"@{t2}", t2)  # still one per call: bad alone
    assert step.took == 1
