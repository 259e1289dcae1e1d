"""The injector's queue (injectors/buffer.py): FIFO order and the oldest timestamp queued,
against a plain list, through any sequence of sends, rounds and failed rounds put back."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from injectors.buffer import END_OF_TIME, Buffer
from runtime.record import Record

ops = st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(-5, 5)),
    st.tuples(st.just("take"), st.integers(1, 6)),
    st.tuples(st.just("put_back"), st.integers(1, 6)),
), max_size=200)


@settings(max_examples=300)
@given(ops)
def test_the_buffer_is_a_fifo_that_knows_its_oldest_timestamp(steps: list[tuple[str, int]]) -> None:
    buf, model, n = Buffer(), [], 0
    for op, arg in steps:
        if op == "append":
            r = Record(b"k", b"%d" % n, arg, n.to_bytes(16, "big"))
            n += 1
            buf.append(r)
            model.append(r)
        elif op == "take":
            got = buf.take(arg)
            assert got == model[:arg]
            del model[:arg]
        else:  # a round of the oldest ``arg`` that failed and comes back first
            taken = buf.take(arg)
            buf.put_back(taken)
        assert len(buf) == len(model) and bool(buf) == bool(model)
        assert list(buf) == model
        assert buf.min_timestamp == min((r.timestamp for r in model), default=END_OF_TIME)


def test_a_long_queue_stays_correct_across_compactions() -> None:
    buf = Buffer()
    for i in range(20_000):
        buf.append(Record(b"k", b"", 20_000 - i if i % 2 else i, i.to_bytes(16, "big")))
    seen = 0
    while buf:
        rest = list(buf)
        assert buf.min_timestamp == min(r.timestamp for r in rest)
        got = buf.take(1000)
        assert [int.from_bytes(r.id, "big") for r in got] == list(range(seen, seen + len(got)))
        seen += len(got)
    assert seen == 20_000 and buf.min_timestamp == END_OF_TIME
