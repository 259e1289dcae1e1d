"""Computations and topologies used by the end-to-end tests (workers import them)."""

from __future__ import annotations

from runtime import Computation, Context, Record, Topology


class Poison(Computation):
    """Counts per key like the word counter, but raises on the value b"poison"."""

    def process_record(self, ctx: Context, record: Record) -> None:
        if record.value == b"poison":
            raise ValueError("poisoned record")
        n = int(ctx.state.get() or b"0") + 1
        ctx.state.set(str(n).encode())
        ctx.produce("out", str(n).encode())


def bad_code() -> Topology:
    t = Topology("bad-code")
    t.add_computation("c", "no_such_module_for_millstream:Thing", inputs={"in": None})
    return t


BAD_CODE = bad_code()
