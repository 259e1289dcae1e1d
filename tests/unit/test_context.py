"""The Context user code sees (worker/context.py KeyContext)."""

from __future__ import annotations

import pytest

from runtime.computation import Context, TimeDomain
from runtime.errors import MillstreamError, UsageError
from worker.context import KeyContext
from worker.storage import Timer

STORED = {b"k": b"stored"}


def make_ctx(key: bytes = b"k", ts: int = 1000) -> KeyContext:
    ctx = KeyContext(frozenset({"counts", "alerts"}), STORED.get, watermark=lambda: 500, now_us=lambda: 42)
    ctx.begin(key, ts)
    return ctx


def test_is_a_context() -> None:
    ctx = make_ctx()
    assert isinstance(ctx, Context)
    assert ctx.key == b"k"
    assert ctx.low_watermark == 500
    assert ctx.now() == 42


def test_produce_to_undeclared_stream_names_stream_and_outputs() -> None:
    with pytest.raises(MillstreamError,
                       match=r"produce\(\) to unknown stream 'cuonts': this computation's outputs are "
                             r"\['alerts', 'counts'\]; add it to outputs= in add_computation"):
        make_ctx().produce("cuonts", b"1")


@pytest.mark.parametrize("value", ["1", 1, None, [1]])
def test_produce_non_bytes_value(value: object) -> None:
    with pytest.raises(TypeError, match="produce\\(\\) value must be bytes, not"):
        make_ctx().produce("counts", value)  # type: ignore[arg-type]


def test_produce_non_bytes_key() -> None:
    with pytest.raises(TypeError, match="produce\\(\\) key must be bytes, not str"):
        make_ctx().produce("counts", b"1", key="k")  # type: ignore[arg-type]


def test_produce_defaults_key_and_timestamp() -> None:
    ctx = make_ctx(b"k", 1000)
    ctx.produce("counts", b"1")
    ctx.produce("alerts", bytearray(b"2"), key=b"other", timestamp=5)
    assert ctx.out == [("counts", b"k", b"1", 1000), ("alerts", b"other", b"2", 5)]
    assert all(type(v) is bytes for _, _, v, _ in ctx.out)


def test_a_call_that_raised_is_undone() -> None:
    ctx = make_ctx(b"k")
    ctx.state.set(b"kept")
    ctx.produce("counts", b"kept")
    ctx.begin(b"k", 1000)  # the next call
    mark = len(ctx.out)
    ctx.state.set(b"lost")
    ctx.produce("counts", b"lost")
    ctx.set_timer("t", 5)
    ctx.undo(mark)
    assert ctx.state.get() == b"kept" and [v for _, _, v, _ in ctx.out] == [b"kept"] and ctx.eff is None
    ctx.begin(b"j", 1000)
    ctx.state.set(b"new key")
    ctx.undo(len(ctx.out))
    assert b"j" not in ctx.writes


def test_state_get_sees_set_within_effects() -> None:
    ctx = make_ctx()
    assert ctx.state.get() == b"stored"
    ctx.state.set(b"new")
    assert ctx.state.get() == b"new"
    assert STORED[b"k"] == b"stored"  # nothing written through
    ctx.state.clear()
    assert ctx.state.get() is None
    assert ctx.writes == {b"k": None}


def test_state_is_per_key() -> None:
    ctx = make_ctx(b"k")
    ctx.state.set(b"for k")
    ctx.begin(b"j", 0)
    assert ctx.state.get() is None
    ctx.state.set(b"for j")
    ctx.begin(b"k", 0)
    assert ctx.state.get() == b"for k"


def test_state_set_non_bytes() -> None:
    with pytest.raises(TypeError, match="state must be bytes, not int; encode it first"):
        make_ctx().state.set(3)  # type: ignore[arg-type]


def test_set_timer_then_delete_timer() -> None:
    ctx = make_ctx()
    ctx.set_timer("flush", 2000, TimeDomain.WALL_TIME)
    assert ctx.effects.timers_set == {(b"k", "flush"): Timer(b"k", "flush", TimeDomain.WALL_TIME, 2000)}
    ctx.delete_timer("flush")
    assert ctx.effects.timers_set == {}
    assert ctx.effects.timers_deleted == {(b"k", "flush")}


def test_delete_then_set_timer_and_moving_it() -> None:
    ctx = make_ctx()
    ctx.delete_timer("flush")
    ctx.set_timer("flush", 10)
    ctx.set_timer("flush", 20)  # setting again moves it
    assert ctx.effects.timers_deleted == set()
    assert ctx.effects.timers_set == {(b"k", "flush"): Timer(b"k", "flush", TimeDomain.EVENT_TIME, 20)}


def test_set_timer_bad_tag() -> None:
    with pytest.raises(TypeError, match="timer tag must be str, not bytes"):
        make_ctx().set_timer(b"flush", 10)  # type: ignore[arg-type]


# Times are int64 on the wire (Record.timestamp) and in the timer index (time + 2**63 packed
# as an unsigned 64-bit number). A value outside that range accepted here fails only later,
# in TabletStore.commit, outside the poison-record retry of user code: the tablet closes,
# the record is redelivered, and the same failure repeats instead of being dead-lettered.
OUT_OF_RANGE = [2**63, -(2**63) - 1]


@pytest.mark.parametrize("time", OUT_OF_RANGE)
def test_set_timer_rejects_times_outside_int64(time: int) -> None:
    with pytest.raises((ValueError, MillstreamError)):
        make_ctx().set_timer("flush", time)


@pytest.mark.parametrize("ts", OUT_OF_RANGE)
def test_produce_rejects_timestamps_outside_int64(ts: int) -> None:
    with pytest.raises((ValueError, MillstreamError)):
        make_ctx().produce("counts", b"1", timestamp=ts)


def test_a_call_moved_back_in_time_makes_its_effects_so_the_batch_holds_the_watermark() -> None:
    """A strong tablet routes its productions when the batch is done; the batch looks at a
    call's productions for a watermark hold only when the call has Effects. produce() with an
    earlier timestamp makes them, and so must a rebind to an earlier time (a flow's operators
    rebind per item: what they produce then defaults to the earlier time)."""
    ctx = make_ctx(ts=1000)
    ctx.rebind(b"j", 2000)
    assert ctx.eff is None, "later: nothing to hold"
    ctx.rebind(b"j", 500)
    assert ctx.eff is not None, "earlier than the call"
    ctx = make_ctx(ts=1000)
    ctx.produce("counts", b"1", timestamp=1000)
    assert ctx.eff is None
    ctx.produce("counts", b"1", timestamp=999)
    assert ctx.eff is not None


def test_undo_after_rebinding_restores_each_key_the_call_wrote() -> None:
    """KeyContext.undo for a call that wrote several keys, one of them twice around another."""
    ctx = KeyContext(frozenset(), lambda key: None, lambda: 0)
    writes: dict[bytes, bytes | None] = {b"k1": b"1"}
    ctx.start_batch(writes)
    ctx.begin(b"", 100)
    for key, value in ((b"k1", b"2"), (b"k2", b"x"), (b"k1", b"3"), (b"k3", None)):
        ctx.rebind(key, 100)
        if value is None:
            ctx.rebind(b"k4", 100)  # left without a write: nothing to take back
        else:
            ctx.state.set(value)
    assert writes == {b"k1": b"3", b"k2": b"x"}
    ctx.undo(0)
    assert writes == {b"k1": b"1"}
    # A call of one key, as the record loop runs them, after the rebound one.
    ctx.begin(b"k2", 100)
    ctx.state.set(b"y")
    ctx.state.set(b"z")
    ctx.undo(0)
    assert writes == {b"k1": b"1"}


def test_cell_write_merges_a_batch_of_cells_or_refuses_it_whole() -> None:
    """``cell_write``, an operator's writes of a call in one merge (a window's ``finish``):
    puts and deletes as ``cell_put`` and ``cell_delete`` make them, seen by ``cell_get``; one
    value over the limit refuses them all, with the message ``cell_put`` gives."""
    from runtime.record import MAX_VALUE_BYTES

    ctx = KeyContext(frozenset(), lambda key: None, lambda: 0)
    ctx.start_batch({})
    ctx.begin(b"k", 100)
    ctx.cell_put(b"Ya", b"1")
    ctx.cell_write({b"Ya": None, b"Yb": b"2", b"Yc": b""})
    assert ctx.effects.cells == {b"Ya": None, b"Yb": b"2", b"Yc": b""}
    assert (ctx.cell_get(b"Ya"), ctx.cell_get(b"Yb")) == (None, b"2")
    with pytest.raises(UsageError, match="state value of .* bytes is over the limit"):
        ctx.cell_write({b"Yd": b"3", b"Ye": b"x" * (MAX_VALUE_BYTES + 1)})
    assert b"Yd" not in ctx.effects.cells


def test_a_fused_sinks_attempt_takes_back_its_cell_write() -> None:
    """A fused sink's attempt (runtime/flows/sinkstep.py) that raised is undone: what its
    ``cell_write`` replaced comes back, and what it added goes, as for ``cell_put``."""
    from runtime.flows.sinkstep import _Attempt

    ctx = KeyContext(frozenset(), lambda key: None, lambda: 0)
    ctx.start_batch({})
    ctx.begin(b"k", 100)
    ctx.cell_put(b"Ya", b"1")
    attempt = _Attempt(ctx)
    attempt.cell_write({b"Ya": None, b"Yb": b"2"})
    assert ctx.effects.cells == {b"Ya": None, b"Yb": b"2"}
    attempt.undo()
    assert ctx.effects.cells == {b"Ya": b"1"}
