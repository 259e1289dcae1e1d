"""The injector's queue (injectors/buffer.py): FIFO order and the oldest timestamp queued,
against a plain list, through any sequence of sends (one at a time, sequenced or with opaque
ids, or many at once), rounds and failed rounds put back."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from injectors.buffer import BLOCK, END_OF_TIME, Buffer
from runtime.columns import Columns
from runtime.record import Record, producer_prefix, sequence_id

P = producer_prefix("injector/src")
Q = producer_prefix("source\x00src\x00a.log")

ops = st.lists(st.one_of(
    st.tuples(st.sampled_from(["add", "add_other", "add_id", "extend"]), st.integers(-5, 5)),
    st.tuples(st.just("take"), st.integers(1, 6)),
    st.tuples(st.just("put_back"), st.integers(1, 6)),
), max_size=200)


@settings(max_examples=300)
@given(ops)
def test_the_buffer_is_a_fifo_that_knows_its_oldest_timestamp(steps: list[tuple[str, int]]) -> None:
    buf, model, n = Buffer(), [], 0
    for op, arg in steps:
        if op in ("add", "add_other", "add_id"):
            n += 1
            producer = Q if op == "add_other" else P
            r = Record(b"k", b"%d" % n, arg, n.to_bytes(16, "big") if op == "add_id" else sequence_id(producer, n))
            if op == "add_id":
                buf.add_id(r.key, r.value, r.timestamp, r.id)
            else:
                buf.add(r.key, r.value, r.timestamp, producer, n)
            model.append(r)
        elif op == "extend":
            recs = [Record(b"k", b"%d" % (n + i), arg - i, sequence_id(P, n + i)) for i in range(1, 4)]
            n += 3
            buf.extend(Columns.of_records(recs, P))
            model += recs
        elif op == "take":
            got = buf.take(arg)
            assert got.records() == model[:arg]
            del model[:arg]
        else:  # a round of the oldest ``arg`` that failed and comes back first
            taken = buf.take(arg)
            buf.put_back([taken])
        assert len(buf) == len(model) and bool(buf) == bool(model)
        assert list(buf) == model
        assert buf.min_timestamp == min((r.timestamp for r in model), default=END_OF_TIME)


def test_a_round_of_one_producer_s_records_is_in_the_sequenced_form_and_a_mixed_one_in_ids() -> None:
    buf = Buffer()
    for i in range(1, 2 * BLOCK + 10):
        buf.add(b"k", b"", i, P, i)
    one = buf.take(BLOCK + 5)  # across blocks
    assert one.producer == P and one.seqs == list(range(1, BLOCK + 6)) and one.ids is None
    buf.add_id(b"k", b"", 1, b"\x01" * 16)
    mixed = buf.take(len(buf))
    assert mixed.producer is None and mixed.ids is not None
    assert mixed.ids[:-1] == [sequence_id(P, s) for s in range(BLOCK + 6, 2 * BLOCK + 10)]


def test_a_long_queue_stays_correct_across_blocks() -> None:
    buf = Buffer()
    for i in range(20_000):
        buf.add(b"k", b"", 20_000 - i if i % 2 else i, P, i + 1)
    seen = 0
    while buf:
        rest = list(buf)
        assert buf.min_timestamp == min(r.timestamp for r in rest)
        got = buf.take(1000)
        assert got.seqs == list(range(seen + 1, seen + len(got) + 1))
        seen += len(got)
    assert seen == 20_000 and buf.min_timestamp == END_OF_TIME
