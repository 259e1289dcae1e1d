"""worker/_loop.c's ContextCore against worker/context.py's reference (_CoreRef): the same
calls of user code on a context (``ctx.state`` get/set/clear, ``produce`` with and without
keywords, values of every type, a call that moves to another key, an undo) leave the same
trace, errors included. The reference runs in a process of its own
(``MILLSTREAM_PURE_PYTHON=1``, read at import)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests.reference import reference_traces
from worker import context

KEYS = [b"a", b"b", b"c"]
VALUES: list[Any] = [b"", b"1", b"22", bytearray(b"ba"), memoryview(b"mv"), "text", 7, None,
                     b"x" * (context.MAX_VALUE_BYTES + 1)]


def _outcome(fn: Any) -> str:
    try:
        return repr(fn())
    except Exception as e:  # the trace holds what each call raised
        return f"{type(e).__name__}: {e}"


def trace(seed: int, steps: int = 300) -> list[str]:
    """A random run of calls on one context; what each returned or raised, and what the
    context holds after it."""
    rnd = random.Random(seed)
    committed = {b"a": b"committed-a"}
    ctx = context.KeyContext(frozenset({"out", "other"}), read_state=lambda k: committed.get(k, b"read-" + k),
                             watermark=lambda: 0, committed=committed if seed % 2 else None)
    ctx.start_batch({})
    out: list[str] = []
    for _ in range(steps):
        op = rnd.randrange(9)
        if op == 0:
            ctx.begin(rnd.choice(KEYS), rnd.randrange(100))
            mark = len(ctx.out)
            out.append("begin")
        elif op == 1:
            out.append(_outcome(ctx.state.get))
        elif op in (2, 3):
            value = rnd.choice(VALUES)
            out.append(_outcome(lambda value=value: ctx.state.set(value)))
        elif op == 4:
            out.append(_outcome(ctx.state.clear))
        elif op == 5:
            stream, value = rnd.choice(["out", "other", "nope", 3]), rnd.choice(VALUES)
            out.append(_outcome(lambda stream=stream, value=value: ctx.produce(stream, value)))
        elif op == 6:
            kw = rnd.choice([{"key": rnd.choice(KEYS)}, {"timestamp": rnd.randrange(-5, 100)}, {"key": "str"},
                             {"timestamp": 2.5}, {"key": b"k", "timestamp": 3}])
            out.append(_outcome(lambda kw=kw: ctx.produce("out", b"v", **kw)))
        elif op == 7:
            ctx.rebind(rnd.choice(KEYS), rnd.randrange(100))
            out.append("rebind")
        else:
            ctx.undo(min(mark, len(ctx.out)) if "mark" in locals() else 0)
            out.append("undo")
        out.append(repr((ctx.key, ctx._timestamp, sorted(ctx.writes.items()), list(ctx.out),
                         ctx.eff is not None, type(ctx._saved).__name__)))
    return out


SEEDS = range(12)


def test_the_compiled_core_leaves_what_the_reference_leaves() -> None:
    if not context.COMPILED:
        pytest.skip("worker/_loop.c is not built: only the reference runs here")
    reference = reference_traces("tests.unit.test_context_core", "worker.context")
    for seed, ref in zip(SEEDS, reference, strict=True):
        assert trace(seed) == ref, f"seed {seed}"


def test_the_trace_covers_every_outcome() -> None:
    """The runs above meet values refused, converted and too large, unknown streams, keywords,
    and a call moved to another key: else the comparison says little."""
    text = "\n".join(line for s in SEEDS for line in trace(s))
    for expected in ("UsageError: state must be bytes", "over the limit", "unknown stream", "rebind", "undo",
                     "_Rebound", "'read-b'", "'committed-a'", "b'ba'", "produce() key must be bytes"):
        assert expected in text, expected


def test_the_state_handle_is_a_state() -> None:
    from runtime.computation import State

    ctx = context.KeyContext(frozenset(), read_state=lambda k: None, watermark=lambda: 0)
    assert isinstance(ctx.state, State)
    assert ctx.state is ctx.state


def test_a_contexts_fields_cannot_be_deleted() -> None:
    """User code holds the context: ``del ctx.writes`` must not leave the compiled core a
    field it reads without a check (it would take the worker down), so it is refused."""
    if not context.COMPILED:
        pytest.skip("worker/_loop.c is not built")
    ctx = context.KeyContext(frozenset({"out"}), read_state=lambda k: None, watermark=lambda: 0)
    for name in ("writes", "_key", "_timestamp", "eff", "_saved", "out", "committed", "read_state", "outputs"):
        with pytest.raises(AttributeError, match="cannot be deleted"):
            delattr(ctx, name)
    ctx.state.set(b"1")
    ctx.produce("out", b"v")
    assert ctx.state.get() == b"1" and ctx.out == [("out", b"", b"v", 0)] and ctx.reads == 1
