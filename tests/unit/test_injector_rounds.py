"""The order that lets an injector keep several rounds in flight (injectors/rounds.py):
each delivery names the last sequence sent before it to its tablet."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from injectors.rounds import chained_orders, ordered
from runtime.columns import Columns
from runtime.record import Record, producer_prefix, sequence_id
from runtime.routing import RoutingTable
from runtime.wire import millstream_pb2 as pb

P = producer_prefix("injector/src")
Q = producer_prefix("source\x00src\x00a.log")


def _recs(producer: bytes, seqs: list[int]) -> list[Record]:
    return [Record(b"k", b"v", 1, sequence_id(producer, s)) for s in seqs]


def _cols(records: list[Record]) -> Columns:
    """In the sequenced form where the records allow it, as an injector's round makes them."""
    producers = {r.id[:8] for r in records}
    return Columns.of_records(records, producers.pop() if len(producers) == 1 else None)


def _pending(pending: dict) -> dict:  # type: ignore[type-arg]
    return {dest: _cols(recs) for dest, recs in pending.items()}


def _after(orders: list, producer: bytes) -> int:  # type: ignore[type-arg]
    return next(o.after for o in orders if o.producer == producer)


def test_a_round_follows_the_last_sequence_the_rounds_before_it_sent_to_each_tablet() -> None:
    sequenced = {P: 0}
    first, tails = chained_orders(_pending({("c", 0, 0): _recs(P, [1, 3]), ("c", 1, 0): _recs(P, [2])}), sequenced, {})
    assert _after(first[("c", 0, 0)], P) == 0 and _after(first[("c", 1, 0)], P) == 0
    assert tails == {("c", 0): {P: 3}, ("c", 1): {P: 2}}
    second, more = chained_orders(_pending({("c", 0, 0): _recs(P, [4]), ("c", 2, 0): _recs(P, [5])}), sequenced, tails)
    assert _after(second[("c", 0, 0)], P) == 3   # waits for the first round's 3 on tablet 0
    assert _after(second[("c", 2, 0)], P) == 0   # nothing before it on tablet 2
    assert more == {("c", 0): {P: 4}, ("c", 2): {P: 5}}
    assert tails == {("c", 0): {P: 3}, ("c", 1): {P: 2}}  # unchanged: the caller merges


def test_chunks_to_one_tablet_chain_and_opaque_ids_name_no_producer() -> None:
    opaque = Record(b"k", b"v", 1, b"\x01" * 16)
    orders, tails = chained_orders(_pending({("c", 0, 0): _recs(P, [7, 8]), ("c", 0, 1): [*_recs(P, [9]), opaque],
                                             ("c", 1, 0): [opaque]}), {P: 0, Q: 0}, {("c", 0): {P: 5, Q: 2}})
    assert _after(orders[("c", 0, 0)], P) == 5 and _after(orders[("c", 0, 1)], P) == 8
    assert [o.producer for o in orders[("c", 1, 0)]] == []
    assert tails[("c", 0)] == {P: 9, Q: 2}  # a producer this round did not send to keeps its place


@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=20), min_size=1, max_size=8))
def test_every_delivery_follows_exactly_the_previous_records_of_its_tablet(rounds: list[list[int]]) -> None:
    """Rounds of records (each a tablet number) taken in order: a delivery's ``after`` is the
    last sequence of the same producer sent to its tablet by any earlier round, or 0."""
    sequenced = {P: 0}
    tails: dict = {}  # type: ignore[type-arg]
    seq = 0
    last_on: dict[int, int] = {}
    for tablets in rounds:
        pending: dict = {}  # type: ignore[type-arg]
        expect: dict[int, int] = {}
        for t in tablets:
            seq += 1
            expect.setdefault(t, last_on.get(t, 0))
            pending.setdefault(("c", t, 0), []).extend(_recs(P, [seq]))
            last_on[t] = seq
        orders, new = chained_orders(_pending(pending), sequenced, tails)
        tails.update(new)
        assert {dest[1]: _after(o, P) for dest, o in orders.items()} == expect


def test_only_rounds_the_chain_orders_everywhere_may_overlap() -> None:
    """A round may travel with others in flight only if every delivery of it lists a producer
    (records with the caller's ids list none) and goes to an exactly-once reader (an
    at-least-once one keeps no marks to hold a delivery behind): DESIGN.md §2, key order."""
    routing = RoutingTable(pb.Routing(version=1, computations=[
        pb.ComputationRoute(name="eo", exactly_once=True), pb.ComputationRoute(name="alo", exactly_once=False)]))
    opaque = Record(b"k", b"v", 1, b"\x01" * 16)
    seq = _pending({("eo", 0, 0): _recs(P, [1, 2]), ("eo", 1, 0): [*_recs(P, [3]), opaque]})
    assert ordered(seq, chained_orders(seq, {P: 0}, {})[0], routing)
    ids = {**seq, ("eo", 2, 0): _cols([opaque])}
    assert not ordered(ids, chained_orders(ids, {P: 0}, {})[0], routing)
    loose = {**seq, ("alo", 0, 0): _cols(_recs(P, [1, 2]))}
    assert not ordered(loose, chained_orders(loose, {P: 0}, {})[0], routing)
