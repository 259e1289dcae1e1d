"""Records as columns (runtime/columns.py): the wire form round-trips every record, id and
producer exactly, and a malformed message is refused with what is wrong."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.columns import Columns, MalformedColumns, of_request
from runtime.record import Record
from runtime.wire import millstream_pb2 as pb

P = b"producer"
_i64 = st.integers(-(2**63), 2**63 - 1)
_records = st.lists(st.tuples(st.binary(max_size=40), st.binary(max_size=200), _i64), max_size=50)


@given(rows=_records, seqs=st.lists(st.integers(0, 2**64 - 1), min_size=50, max_size=50), sequenced=st.booleans())
def test_columns_round_trip_on_the_wire(rows: list[tuple[bytes, bytes, int]], seqs: list[int], sequenced: bool) -> None:
    ids = [P + s.to_bytes(8, "big") if sequenced else bytes(reversed(P + s.to_bytes(8, "big")))
           for s in seqs[:len(rows)]]
    records = [Record(k, v, t, i) for (k, v, t), i in zip(rows, ids, strict=True)]
    cols = Columns.of_records(records, P)
    assert not records or (cols.producer is not None) == sequenced
    wire = pb.DeliverRequest(columns=cols.to_proto()).SerializeToString()
    back = of_request(pb.DeliverRequest.FromString(wire))
    assert back.records() == records == cols.records()
    assert [back.id(i) for i in range(len(back))] == ids
    # A checkpoint: the same message (built once), with the producers its delivery lists.
    saved = pb.Columns.FromString(cols.checkpoint([P, b"other"]))
    assert list(saved.producers) == [P, b"other"]
    assert Columns.from_proto(saved).records() == records
    assert cols.to_proto() is cols.to_proto()


@given(parts=st.lists(_records, max_size=4), sequenced=st.booleans())
def test_concat_and_select_keep_order(parts: list[list[tuple[bytes, bytes, int]]], sequenced: bool) -> None:
    n = 0
    cols, everything = [], []
    for rows in parts:
        recs = [Record(k, v, t, P + (n + i).to_bytes(8, "big") if sequenced else bytes(16)) for i, (k, v, t) in
                enumerate(rows)]
        n += len(rows)
        everything += recs
        cols.append(Columns.of_records(recs, P if sequenced else None))
    if not cols:
        return
    joined = Columns.concat(cols)
    assert joined.records() == everything
    assert joined.select(range(len(joined) - 1, -1, -1)).records() == everything[::-1]


def test_rows_from_an_older_sender_are_read_as_columns() -> None:
    req = pb.DeliverRequest(records=[pb.Record(key=b"k", value=b"v", timestamp=3, id=bytes(16))])
    assert of_request(req).records() == [Record(b"k", b"v", 3, bytes(16))]


@pytest.mark.parametrize("columns, problem", [
    (pb.Columns(keys=[b"a", b"b"], values=[b"1"], timestamps=[1, 2], ids=bytes(32)), "different lengths"),
    (pb.Columns(keys=[b"a"], values=[b"1"], timestamps=[1], ids=bytes(15)), "15 bytes of ids for 1 records"),
    (pb.Columns(keys=[b"a"], values=[b"1"], timestamps=[1], producer=b"short", seqs=[1]), "5 bytes long"),
    (pb.Columns(keys=[b"a"], values=[b"1"], timestamps=[1], producer=P, seqs=[]), "0 sequence numbers for 1"),
])
def test_malformed_columns_say_what_is_wrong(columns: pb.Columns, problem: str) -> None:
    with pytest.raises(MalformedColumns, match=problem):
        of_request(pb.DeliverRequest(columns=columns))
