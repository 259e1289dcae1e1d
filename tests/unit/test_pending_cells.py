"""The index of a call's or a batch's typed-state writes that scans use (worker/pending.py
``Pending``): what it finds under a prefix is what a filter of every write finds, however
writes, rewrites, scans and take-backs interleave."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.state import cell
from worker.pending import Pending

_KEYS = [b"a", b"b", b"c"]
_CELLS = [cell(k, n) + rest for k in _KEYS for n in ("x", "y") for rest in (b"v", b"m1", b"m2", b"n")]
_PREFIXES = [cell(k, n) for k in _KEYS for n in ("x", "y")] + [cell(b"a", "x") + b"m", b"Y", b""]

_OPS = st.lists(st.one_of(
    st.tuples(st.just("put"), st.sampled_from(_CELLS), st.one_of(st.none(), st.binary(max_size=2))),
    st.tuples(st.just("pop"), st.sampled_from(_CELLS), st.none()),
    st.tuples(st.just("scan"), st.sampled_from(_PREFIXES), st.none()),
), max_size=40)


@settings(max_examples=200, deadline=None)
@given(_OPS)
def test_what_is_under_a_prefix_is_what_a_filter_of_every_write_finds(ops: list) -> None:  # type: ignore[type-arg]
    cells: dict[bytes, bytes | None] = {}
    pending = Pending(cells)
    for op, k, v in ops:
        if op == "put":
            cells[k] = v
        elif op == "pop":
            if cells.pop(k, "absent") != "absent":
                pending.forget()
        else:
            assert pending.under(k) == {s: w for s, w in cells.items() if s.startswith(k)}
