"""runtime/flows/_steps.c (a flow's ``process`` step: its loop, its context's ``produce``, its
held ``ctx.state``) against runtime/flows/steps.py's reference: the same calls of user code
(``ctx.state`` get/set/clear with values of every type, ``produce`` with and without keywords,
a call that raises) leave the same trace, errors included. The reference runs in a process of
its own (``MILLSTREAM_PURE_PYTHON=1``, read at import)."""

from __future__ import annotations

import random
import re
from typing import Any

import pytest

from runtime import Computation, Context, Record
from runtime.flows import steps
from tests.reference import reference_traces

KEYS = [b"a", b"b", b"c"]
VALUES: list[Any] = [b"", b"1", b"22", bytearray(b"ba"), memoryview(b"mv"), "text", 7, None,
                     b"x" * (steps.MAX_HELD_BYTES + 1)]
SEEDS = range(12)


class _Stage:
    """The stage's context as a step sees it: rebinds and cells noted."""

    low_watermark = 0

    def __init__(self, cells: dict[bytes, bytes]) -> None:
        self.cells = cells
        self.log: list[str] = []

    def rebind(self, key: bytes, timestamp: int) -> None:
        self.log.append(f"rebind {key!r} {timestamp}")

    def cell_get(self, skey: bytes) -> bytes | None:
        self.log.append(f"read {skey!r}")
        return self.cells.get(skey)

    def cell_write(self, writes: dict[bytes, bytes | None]) -> None:
        self.log.append(f"write {sorted(writes.items())!r}")


def _outcome(fn: Any) -> str:
    try:
        return repr(fn())
    except Exception as e:  # the trace holds what each call raised
        return f"{type(e).__name__}: {e}"


class _Random(Computation):
    """Per record, a few random calls on its context, each one's outcome noted."""

    def __init__(self, rnd: random.Random, out: list[str]) -> None:
        self.rnd, self.out = rnd, out

    def process_record(self, ctx: Context, record: Record) -> None:
        rnd, out = self.rnd, self.out
        out.append(repr((record.key, record.value, record.timestamp, record.id, record.stream, ctx.key)))
        for _ in range(rnd.randrange(4)):
            op = rnd.randrange(7)
            if op == 0:
                out.append(_outcome(ctx.state.get))
            elif op in (1, 2):
                value = rnd.choice(VALUES)
                out.append(_outcome(lambda value=value: ctx.state.set(value)))
            elif op == 3:
                out.append(_outcome(ctx.state.clear))
            elif op == 4:
                out.append(_outcome(lambda: ctx.produce("out", rnd.choice(VALUES))))
            elif op == 5:
                kw = rnd.choice([{"key": ctx.key}, {"key": b"other"}, {"timestamp": rnd.randrange(100)},
                                 {"timestamp": 2.5}, {"timestamp": True}, {"key": None, "timestamp": None}])
                out.append(_outcome(lambda kw=kw: ctx.produce("out", b"v", **kw)))
            elif rnd.random() < 0.3:
                raise ValueError("the user's code raised")


def trace(seed: int, calls: int = 40) -> list[str]:
    """A random run of a process step's calls; what each call of user code returned or raised,
    and what the step held, produced, read and wrote."""
    rnd = random.Random(seed)
    out: list[str] = []
    op = steps.Process("p", _Random(rnd, out))
    op.muted = []  # what it emits, kept here
    stage = _Stage({steps.cell(b"a", op.raw.name) + steps.VALUE: steps.kept(b"stored-a")})
    for _ in range(calls):
        items = [(rnd.choice(KEYS), rnd.choice([b"v", 1, None]), rnd.randrange(100)) for _ in range(rnd.randrange(5))]
        try:
            op.push(stage, items)  # type: ignore[arg-type]
        except ValueError as e:
            op.abort()
            out.append(f"raised {e}")
        state = op.step_ctx._state
        out.append(repr((sorted(state._held.items()), sorted(state._dirty), op.muted, stage.log)))
        if rnd.random() < 0.3:
            op.finish(stage)  # type: ignore[arg-type]
            out.append(repr(stage.log[-1:]))
        op.muted, stage.log = [], []
    return [re.sub(r"<memory at 0x[0-9a-f]+>", "<memory>", line) for line in out]  # (produced as it is)


def test_the_compiled_step_leaves_what_the_reference_leaves() -> None:
    if not steps.COMPILED:
        pytest.skip("runtime/flows/_steps.c is not built: only the reference runs here")
    reference = reference_traces("tests.unit.test_step_core", "runtime.flows.steps")
    for seed, ref in zip(SEEDS, reference, strict=True):
        assert trace(seed) == ref, f"seed {seed}"


def test_the_trace_covers_every_outcome() -> None:
    """The runs above meet values refused, converted and too large, keywords refused and
    taken, a state read from its cell, and calls that raised: else the comparison says little."""
    text = "\n".join(line for s in SEEDS for line in trace(s))
    for expected in ("state must be bytes", "over the limit", "must keep the current key", "produce() timestamp",
                     "raised the user's code raised", "stored-a", "b'ba'", "write [", "rebind b'c'", "'text'"):
        assert expected in text, expected


def test_a_steps_fields_cannot_be_deleted_and_its_state_is_read_only() -> None:
    """User code holds the step's context: ``del ctx.out`` must not leave the compiled core a
    field it reads without a check, and ``ctx.state`` is not to be replaced (as everywhere)."""
    op = steps.Process("p", Computation())
    sc = op.step_ctx
    if steps.COMPILED:
        for name in ("key", "timestamp", "out", "ctx", "_state"):
            with pytest.raises(AttributeError, match="cannot be deleted"):
                delattr(sc, name)
        for name in ("_step", "_held", "_dirty"):
            with pytest.raises(AttributeError, match="cannot be deleted"):
                delattr(sc.state, name)
    with pytest.raises(AttributeError):
        sc.state = None  # type: ignore[misc]
    assert isinstance(sc.state, steps.State) and isinstance(sc, Context)
