"""Dataflow steps that answer before a window closes or from a table: a window's early
results (``emit="updates"``, Beam's early firings, Quix's ``.current()``) and the stream-table
``lookup_join`` (Kafka Streams' KStream-KTable join), in process, against what a user expects."""

from __future__ import annotations

import json
from typing import Any

import pytest

from runtime import Dataflow, codecs
from runtime.errors import UsageError
from runtime.flows.values import VALUES
from runtime.testing import TestRun
from runtime.windows import SECOND, Collect, Session, Sum, Tumbling
from tests import flowjobs as j

T0 = 1_700_000_000_000_000


def _j(record: Any) -> Any:
    return json.loads(record.value)


def test_a_window_that_emits_updates_emits_each_batchs_value_so_far_then_its_result() -> None:
    """User review (triggers): one emission per window, at its close. ``emit="updates"`` gives
    early results: each batch emits the windows it changed with their value so far, stamped
    at the window's last instant, or at the watermark in the allowed lateness; then the
    window's result when it closes, as without it."""
    flow = Dataflow("up", key_ranges=1)
    windows = Tumbling(SECOND, allowed_lateness=SECOND)
    flow.input("ev", codec=codecs.INT, keyed=True).window(windows, Sum(), name="sums", emit="updates") \
        .output("sums", codec=codecs.JSON)
    end = T0 + SECOND
    with TestRun(flow) as run:
        run.inject_batch("ev", [(b"a", b"1", T0), (b"a", b"2", T0 + 10), (b"b", b"5", end)])
        run.run_until_idle()
        first = [(r.key, _j(r), r.timestamp) for r in run.output("sums")]
        run.advance_watermark("ev", end + SECOND // 2)  # a's window is in its allowed lateness
        run.run_until_idle()
        run.inject_batch("ev", [(b"a", b"4", T0 + 20)])
        run.run_until_idle()
        late_update = [(r.key, _j(r), r.timestamp) for r in run.output("sums")][len(first):]
        run.advance_watermark("ev", T0 + 5 * SECOND)  # every window closes: its result
        run.run_until_idle()
        closes = [(r.key, _j(r), r.timestamp) for r in run.output("sums")][len(first) + 1:]
    assert first == [(b"a", [T0, end, 3], end - 1), (b"b", [end, end + SECOND, 5], end + SECOND - 1)]
    assert late_update == [(b"a", [T0, end, 7], end + SECOND // 2)]  # at the watermark: not late after it
    assert sorted(closes) == [(b"a", [T0, end, 7], end + SECOND), (b"b", [end, end + SECOND, 5], end + 2 * SECOND)]


def test_session_windows_that_emit_updates_emit_the_merged_session() -> None:
    flow = Dataflow("su", key_ranges=1)
    flow.input("ev", codec=codecs.INT, keyed=True).window(Session(2 * SECOND), Collect(), name="s", emit="updates") \
        .output("s", codec=codecs.JSON)
    with TestRun(flow) as run:
        run.inject_batch("ev", [(b"k", b"1", T0), (b"k", b"3", T0 + 3 * SECOND)])  # two sessions
        run.run_until_idle()
        run.inject_batch("ev", [(b"k", b"2", T0 + 1_500_000)])  # bridges them
        run.finish("ev")
        run.run_until_idle()
        got = [_j(r) for r in run.output("s")]
    assert got == [[T0, T0 + 2 * SECOND, [1]], [T0 + 3 * SECOND, T0 + 5 * SECOND, [3]],
                   [T0, T0 + 2 * SECOND, None], [T0 + 3 * SECOND, T0 + 5 * SECOND, None],  # merged away
                   [T0, T0 + 5 * SECOND, [1, 2, 3]], [T0, T0 + 5 * SECOND, [1, 2, 3]]]  # the update, the result
    with TestRun(flow) as run:  # records each extending the session they start, in one batch: no tombstones
        run.inject_batch("ev", [(b"k", b"%d" % i, T0 + i * SECOND) for i in range(4)])
        run.run_until_idle()
        assert [_j(r) for r in run.output("s")] == [[T0, T0 + 5 * SECOND, [0, 1, 2, 3]]]
    counted = Dataflow("cu", key_ranges=1)
    counted.input("ev", codec=codecs.INT, keyed=True).window(Tumbling(SECOND), j.CountByValue(), name="c",
                                                           emit="updates").output("c", codec=codecs.JSON)
    with TestRun(counted) as run:  # a result the flow's codec does not store (a Counter) is copied all the same
        run.inject_batch("ev", [(b"k", b"1", T0), (b"k", b"1", T0 + 1)])
        run.run_until_idle()
        assert [_j(r)[2] for r in run.output("c")] == [{"1": 2}] and run.output("c.dead_letter") == []
    with pytest.raises(UsageError, match="emit='sometimes'; pass \"final\""):
        Dataflow("bad").input("ev", keyed=True).window(Tumbling(SECOND), Sum(), emit="sometimes")  # type: ignore[arg-type]


def test_a_lookup_join_pairs_each_value_with_the_tables_latest_for_its_key_through_a_restart() -> None:
    """User review (stream-table joins): each value of the stream goes on with the last value
    the table carried for its key before it; with no table value yet it is dropped (inner)
    or goes on with None (left). The table is state: it survives a restart of the stage."""
    flow = Dataflow("lk", key_ranges=2)
    clicks = flow.input("clicks", codec=codecs.JSON).key_by(j.key_of).map(j.value_of)
    users = flow.input("users", codec=codecs.JSON).key_by(j.key_of).map(j.value_of)
    clicks.lookup_join(users, name="inner").output("inner", codec=codecs.JSON)
    clicks.lookup_join(users, how="left", name="left").output("left", codec=codecs.JSON)

    def send(stream: str, k: str, v: Any, t: int) -> None:
        run.inject(stream, b"", json.dumps({"k": k, "v": v}).encode(), T0 + t)

    with TestRun(flow) as run:
        send("clicks", "u1", "c0", 0)          # no table value yet
        send("users", "u1", "ann", 1)
        send("clicks", "u1", "c1", 2)
        send("users", "u1", "anne", 3)          # the table moves on
        run.run_until_idle()
        assert list(flow.topology().computations) == ["inner"]  # both joins in one stage
        run.restart("inner")
        send("clicks", "u1", "c2", 4)           # after a restart: the table's last value
        send("clicks", "u2", "c3", 5)
        send("users", "u2", "bob", 6)
        send("users", "u2", None, 7)            # None deletes the key's table value
        send("clicks", "u2", "c4", 8)
        run.run_until_idle()
        inner = [tuple(_j(r)) for r in run.output("inner")]
        left = [(r.key, tuple(_j(r))) for r in run.output("left")]
        assert run.typed_state("inner", b"u1", "inner") == run.typed_state("inner", b"u1", "left") == "anne"
        assert run.typed_state("inner", b"u2", "inner") is None  # deleted, not stored as None
    assert inner == [("c1", "ann"), ("c2", "anne")]
    assert left == [(b"u1", ("c0", None)), (b"u1", ("c1", "ann")), (b"u1", ("c2", "anne")), (b"u2", ("c3", None)),
                    (b"u2", ("c4", None))]
    with pytest.raises(UsageError, match="how='outer'; pass \"inner\""):
        clicks.lookup_join(users, how="outer")  # type: ignore[arg-type]


def test_a_lookup_join_keeps_the_order_its_inputs_came_in_within_a_batch() -> None:
    """Review of lookup_join: a batch took all of one input's records, then the other's, so a
    value could meet a table value that came after it, and the pairs depended on the batching
    (a batch run again one record at a time paired them otherwise)."""
    flow = Dataflow("lo", key_ranges=1)
    clicks = flow.input("clicks", codec=codecs.JSON, keyed=True)
    users = flow.input("users", codec=codecs.JSON, keyed=True)
    clicks.lookup_join(users, name="joined").output("joined", codec=codecs.JSON)
    from runtime.flows.stage import FlowStage
    from runtime.record import Record
    from worker.context import KeyContext

    spec = flow.topology().computations["joined"]
    records = [Record(b"u1", json.dumps(v).encode(), T0, b"%16d" % i, stream)
               for i, (stream, v) in enumerate([("users", "ann"), ("clicks", "c1"), ("users", "anne"), ("clicks", "c2")])]
    for call in ("process_batch", "process_columns"):  # one batch holding both inputs, as a tablet's may
        stage = FlowStage()
        stage.setup(dict(spec.params))
        ctx = KeyContext(frozenset(spec.outputs), lambda k: None, lambda: T0 - 1)
        ctx.start_batch({})
        ctx.begin(b"", T0)
        if call == "process_batch":
            stage.process_batch(ctx, records)
        else:
            stage.process_columns(ctx, [r.key for r in records], [r.value for r in records],
                                  [r.timestamp for r in records], [r.stream for r in records])
        assert [tuple(json.loads(value)) for _, _, value, _ in ctx.out] == [("c1", "ann"), ("c2", "anne")], call

    # Review: a delete and a lookup of a key whose value was committed before, in one batch:
    # the lookup read the stored value back (the delete is written at the call's end), and
    # the call's end then wrote it back, undoing the delete.
    from runtime.state import VALUE, cell, kept
    stored = {cell(b"u1", "flow/joined") + VALUE: kept(VALUES.encode("ann"))}
    stage = FlowStage()
    stage.setup(dict(spec.params))
    ctx = KeyContext(frozenset(spec.outputs), lambda k: None, lambda: T0 - 1, read_cell=stored.get)
    ctx.start_batch({})
    ctx.begin(b"", T0)
    gone = [Record(b"u1", b"null", T0, b"%16d" % 7, "users"), Record(b"u1", b'"c9"', T0, b"%16d" % 8, "clicks")]
    stage.process_batch(ctx, gone)
    assert ctx.out == [] and ctx.effects.cells == {cell(b"u1", "flow/joined") + VALUE: None}
    with pytest.raises(UsageError, match="the table comes from input 'clicks', as the stream does"):
        clicks.lookup_join(clicks.map(j.value_of), name="itself")
