"""A strong batch's productions routed once, as columns (worker/outgoing.py ``add_batch``),
against the same productions routed one call at a time (``add``, the path weak tablets and a
strong batch's mixed or extractor-read streams take): the same deliveries, the same records
in the same order with the same sequences, the same checkpoint keys (the sequence of a
failed key extractor's dead letter aside)."""

from __future__ import annotations

from unittest.mock import patch

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.delivery import MAX_DELIVERY_BYTES
from runtime.keyspace import range_bounds, wire_end
from runtime.routing import RoutingTable
from runtime.wire import millstream_pb2 as pb
from worker.outgoing import Outgoing
from worker.storage import Commit, Shipment

# reader -> (the stream it reads, its key ranges, whether its key extractor is the buggy one)
READERS = {"a": ("s1", 3, False), "b": ("s1", 1, False), "c": ("s2", 2, False), "d": ("s3", 2, True)}


def _routing() -> RoutingTable:
    r = pb.Routing(version=1)
    for name, (stream, n, extracted) in READERS.items():
        c = r.computations.add(name=name)
        c.inputs.add(stream=stream, key_extractor="tests.core.jobs:extractor_raising" if extracted else "")
        for i in range(n):
            lo, hi = range_bounds(i, n)
            c.assignments.add(key_range=i, address="w", token=1, start=lo, end=wire_end(hi))
    dead = r.computations.add(name="d_dead")
    dead.inputs.add(stream="d.dead_letter", key_extractor="")
    dead.assignments.add(key_range=0, address="w", token=1, start=0, end=0)
    table = RoutingTable(r)
    assert table.load_extractors({}) == []
    return table


def _shipped(shipments: list[Shipment]) -> list[tuple[object, ...]]:
    return [(s.computation, s.key_range, s.cols.keys, s.cols.values, s.cols.timestamps, s.cols.seqs,
             s.cols.stream_column(), s.cols.producer, s.producers, s.ckey) for s in shipments]


productions = st.lists(st.tuples(st.sampled_from(["s1", "s2", "s3"]), st.binary(min_size=0, max_size=6),
                                  st.binary(max_size=4), st.integers(0, 1 << 40)), max_size=60)


@given(out=productions, one_stream=st.booleans(), first_seq=st.integers(0, 1 << 30),
       bound=st.sampled_from([None, 40, 120]))
@settings(max_examples=300, deadline=None)
def test_a_batch_routed_as_columns_ships_what_routing_each_call_ships(
        out: list[tuple[str, bytes, bytes, int]], one_stream: bool, first_seq: int, bound: int | None) -> None:
    """``bound``: deliveries cut at that many bytes (runtime/delivery.py), so that one tablet's
    productions make several shipments, each with its own checkpoint key."""
    if one_stream:
        out = [("s1", *rest) for _, *rest in out]  # type: ignore[misc]
    routing = _routing()
    each, batched = (Outgoing("p/0", "p", b"P" * 8, False, routing) for _ in range(2))
    c_each, c_batched = Commit(seq=first_seq), Commit(seq=first_seq)
    for i in range(len(out)):  # one call per production, as before add_batch
        each.add(c_each, out, i, i + 1, out[i][3], b"", None)
    batched.add_batch(c_batched, list(out))
    assert c_batched.seq == c_each.seq
    with patch("runtime.delivery.MAX_DELIVERY_BYTES", bound or MAX_DELIVERY_BYTES):
        got, want = (sorted(_shipped(o.shipments()), key=repr) for o in (batched, each))
    if any(stream == "s3" for stream, *_ in out):
        # A dead letter of a failed key extractor takes its sequence after the rest of what it
        # was routed with (a call's productions, or the batch's): its number may differ, never
        # the order of any delivery's records nor their sequences' rise.
        for shipped in got:
            assert shipped[5] == sorted(set(shipped[5]))  # type: ignore[arg-type]
        got, want = ([s[:5] + s[6:9] for s in x] for x in (got, want))
        got, want = sorted(got, key=repr), sorted(want, key=repr)
    assert got == want


def test_a_batch_to_one_plain_stream_goes_as_columns_without_rows() -> None:
    """The common case takes the columnar path (else the property above would hold of the
    per-call path alone)."""
    routing = _routing()
    out = Outgoing("p/0", "p", b"P" * 8, False, routing)
    commit = Commit(seq=10)
    made = [("s1", b"k%d" % i, b"v", i) for i in range(100)]
    out.add_batch(commit, made)
    assert out._rows == {} and {dest for dest in out._cols} == {("a", 0), ("a", 1), ("a", 2), ("b", 0)}
    shipped = out.shipments()
    assert sorted(seq for s in shipped if s.computation == "a" for seq in s.cols.seqs or ()) == list(range(11, 111))
    assert commit.seq == 110
