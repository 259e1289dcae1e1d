"""The delivery core (runtime/courier.py), tested without a network.

Property tests drive one :class:`~runtime.courier.Courier` against a model of the receiving
tablets (tests/unit/courier_model.py, deduplicating as worker/dedup.py does) through random
productions, splits and merges (which the sender learns late), lost, late, BUSY and
out-of-order answers, and owners that close and are succeeded: every record is committed
exactly once, each key's records of one owner in the order they were made, and an owner
hears a parcel acknowledged only once it is committed. Unit tests pin the rules one at a
time: the chain of deliveries in flight, back-off and routing waits, the door of a lane
(07476bf's loss), dropping for a computation gone."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.columns import Columns
from runtime.courier import Acked, Courier, Deliver, Dropped, FetchRouting, Refused
from runtime.delivery import Outcome, Status
from runtime.keyspace import HASH_SPACE, key_hash
from runtime.parcels import Rerouted, in_order
from runtime.record import sequence_id
from runtime.routing import RoutingTable
from runtime.wire import millstream_pb2 as pb
from tests.unit.courier_model import COMP, Lineage, Made, Owner, Parcel, Receivers, outcome, piece, quiesce

KEYS = [b"k%d" % i for i in range(12)]


class _Run:
    """One sender (a courier), its owners and the receivers, stepped by the test."""

    def __init__(self, ranges: int, window: int, kinds: list[str], exactly_once: bool = True) -> None:
        self.rx = Receivers(ranges)
        self.exactly_once = exactly_once
        self.courier: Courier[Parcel, Owner] = Courier(self.rx.routing(exactly_once), piece, max_records=7,
                                                      window=window)
        self.older = self.courier.routing  # the routing before the sender's current one
        self.in_flight: dict[int, Deliver] = {}
        self.now = 0.0
        self.lineages: list[Lineage] = []
        self.original: dict[bytes, tuple[Lineage, int]] = {}  # id -> (lineage, place when first made)
        for n, kind in enumerate(kinds):
            name = f"{kind[0]}{n}"
            prefixes = tuple(f"{name}-p{j}".encode().ljust(8, b"-")[:8] for j in range(2 if kind == "weak" else 1))
            lin = Lineage(name, kind, prefixes, None)  # type: ignore[arg-type]
            lin.owner = Owner(lin, 0 if kind == "ordered" else 1)
            self.lineages.append(lin)

    def apply(self, actions: list[Any]) -> None:
        for a in actions:
            if isinstance(a, Deliver):
                assert a.id not in self.in_flight
                self.in_flight[a.id] = a
                assert a.computation == COMP and len(a.cols)
            elif isinstance(a, Acked):
                committed = self.rx.ids
                for p in a.parcels:
                    assert all(rid in committed for rid in p.cols.all_ids()), "acknowledged before committed"
                if not a.owner.closing:
                    for p in a.parcels:
                        a.owner.lineage.acked.update(p.cols.all_ids())
            elif isinstance(a, Rerouted):
                old = sorted(rid for p in a.old for rid in p.cols.all_ids())
                new = sorted(rid for p in a.new for rid in p.cols.all_ids())
                assert old == new, "a re-route lost or added records"
            else:
                assert not isinstance(a, (Dropped, Refused)), a

    def produce(self, lin: Lineage, keys: list[bytes], stale: bool) -> None:
        """One commit of ``lin``'s owner: records for several ranges, routed with the sender's
        routing (or the one before it: a batch computed before the change reached it)."""
        routing = self.older if stale else self.courier.routing
        by_range: dict[int, list[Made]] = {}
        for key in keys:
            m = lin.make(key)
            self.original[m.rid] = (lin, m.place)
            by_range.setdefault(routing.range_for(COMP, key), []).append(m)
        parcels = []
        for r, records in by_range.items():
            lin.parcels.append((r, records))
            parcels.append(lin.parcel(r, records))
        self.apply(self.courier.send(parcels, lin.owner, self.now))

    def succeed(self, lin: Lineage, together: bool) -> None:
        """``lin``'s owner closes; its successor re-sends what was not acknowledged, from its
        checkpoints (each as made, for the range it was made for), in one call or one by one."""
        lin.owner.closing = True
        lin.owner = Owner(lin, lin.owner.token + (lin.kind != "ordered"))
        resend = []
        if lin.kind == "ordered":
            # An injector's rounds put back in its queue, in send order, and sent again: the
            # same ids, new places, routed afresh.
            left = sorted((m for _, records in lin.parcels for m in records if m.rid not in lin.acked),
                          key=lambda m: self.original[m.rid][1])
            by_range: dict[int, list[Made]] = {}
            for m in left:
                lin.places += 1
                by_range.setdefault(self.courier.routing.range_for(COMP, m.key), []).append(
                    Made(m.rid, m.key, lin.places))
            resend = [lin.parcel(r, records) for r, records in by_range.items()]
        for r, records in lin.parcels if lin.kind != "ordered" else []:
            left = [m for m in records if m.rid not in lin.acked]
            if left:
                resend.append(lin.parcel(r, left, resent=True))
        lin.parcels = [(p.key_range, [Made(rid, p.cols.keys[i], 0) for i, rid in enumerate(p.cols.all_ids())])
                       for p in resend]
        if together:
            self.apply(self.courier.send(resend, lin.owner, self.now))
        else:
            for p in resend:
                self.apply(self.courier.send([p], lin.owner, self.now))

    def answer(self, pick: int, how: int) -> None:
        d = self.in_flight.pop(sorted(self.in_flight)[pick % len(self.in_flight)])
        if how == 0:
            status = Status.BUSY
        elif how == 1:
            status = Status.UNREACHABLE  # lost on the way there
        else:
            status = self.rx.deliver(d)
            if how == 2 and status == Status.OK:
                status = Status.UNREACHABLE  # committed, the answer lost
        self.apply(self.courier.answered(d.id, outcome(status), self.now))

    def reshard(self, split: bool, pick: int) -> None:
        ids = sorted(self.rx.tablets, key=lambda r: self.rx.tablets[r].lo)
        if split or len(ids) < 2:
            if len(ids) < 6:
                self.rx.split(ids[pick % len(ids)])
        else:
            i = pick % (len(ids) - 1)
            self.rx.merge(ids[i], ids[i + 1])

    def learn_routing(self) -> None:
        if self.courier.routing.version != self.rx.version:
            self.older = self.courier.routing
            self.apply(self.courier.routing_changed(self.rx.routing(self.exactly_once), self.now))

    def check(self) -> None:
        self.now = quiesce(self.courier, self.rx, self.in_flight, self.apply, self.now + 10)
        made = {rid for lin in self.lineages for m in lin.made for rid in [m.rid]}
        assert set(self.original) == made
        lost = made - self.rx.ids
        assert not lost, f"{len(lost)} records never committed (taken for duplicates): {sorted(lost)[:5]}"
        last: dict[tuple[str, bytes], int] = {}
        for rid, key in self.rx.committed:
            lin, place = self.original[rid]
            assert place > last.get((lin.name, key), 0), f"{lin.name}'s records of key {key!r} committed out of order"
            last[(lin.name, key)] = place


steps = st.lists(st.tuples(st.integers(0, 9), st.integers(0, 1 << 16), st.integers(0, 1 << 16)), min_size=1,
                 max_size=120)


def _drive(run: _Run, plan: list[tuple[int, int, int]]) -> None:
    for op, a, b in plan:
        lin = run.lineages[a % len(run.lineages)]
        if op <= 2:
            n = 1 + b % 9
            run.produce(lin, [KEYS[(a + i * (b | 1)) % len(KEYS)] for i in range(n)], stale=op == 2)
        elif op <= 5 and run.in_flight:
            run.answer(a, b % 5)
        elif op == 6:
            run.reshard(split=b % 2 == 0, pick=a)
        elif op == 7:
            run.learn_routing()
        elif op == 8:
            run.succeed(lin, together=b % 2 == 0)
        else:
            run.now += (b % 100) / 1000
            run.apply(run.courier.tick(run.now))
    run.check()


@settings(max_examples=1000, deadline=None)
@given(st.integers(1, 3), st.lists(st.sampled_from(["strong", "weak"]), min_size=1, max_size=3), steps)
def test_a_workers_sends_stay_exact_and_in_key_order_through_splits_merges_and_failures(
        ranges: int, kinds: list[str], plan: list[tuple[int, int, int]]) -> None:
    _drive(_Run(ranges, 1, kinds), plan)


@settings(max_examples=1000, deadline=None)
@given(st.integers(1, 3), st.integers(2, 4), steps)
def test_an_injectors_chained_deliveries_stay_exact_and_in_key_order(
        ranges: int, window: int, plan: list[tuple[int, int, int]]) -> None:
    _drive(_Run(ranges, window, ["ordered"]), plan)


# ------------------------------------------------------------------ one rule at a time

P = b"produce1"
HALF = HASH_SPACE // 2


class _O:
    def __init__(self, token: int = 1) -> None:
        self.token = token
        self.closing = False
        self.name = "owner"


def _routing(version: int, ranges: list[tuple[int, int, int]], exactly_once: bool = True, address: str = "w"
             ) -> RoutingTable:
    r = pb.Routing(version=version)
    c = r.computations.add(name=COMP, exactly_once=exactly_once)
    for rid, lo, hi in ranges:
        c.assignments.add(key_range=rid, address=address, token=3, start=lo, end=0 if hi == HASH_SPACE else hi)
    return RoutingTable(r)


def _seq_parcel(r: int, seqs: list[int], keys: list[bytes] | None = None) -> Parcel:
    keys = keys or [b"k%d" % s for s in seqs]
    cols = Columns(keys, [b""] * len(seqs), [1] * len(seqs), P, list(seqs))
    return Parcel(COMP, r, cols, (P,))


def _deliveries(actions: list[Any]) -> list[Deliver]:
    return [a for a in actions if isinstance(a, Deliver)]


def test_a_lane_delivers_one_at_a_time_batching_what_waits_within_its_bounds() -> None:
    c: Courier[Parcel, _O] = Courier(_routing(1, [(0, 0, HASH_SPACE)]), piece, max_records=4)
    owner = _O()
    [first] = _deliveries(c.send([_seq_parcel(0, [1, 2])], owner, 0))
    assert first.orders == {P: (0, 1)} and (first.address, first.token) == ("w", 3)
    assert _deliveries(c.send([_seq_parcel(0, [3, 4]), _seq_parcel(0, [5, 6, 7]), _seq_parcel(0, [8])], owner, 0)) == []
    out = c.answered(first.id, Outcome(Status.OK, ("w", 9)), 0)
    acked = [a for a in out if isinstance(a, Acked)]
    assert [p.cols.seqs for p in acked[0].parcels] == [[1, 2]] and acked[0].outcome.receipt == ("w", 9)
    [second] = _deliveries(out)
    assert second.cols.seqs == [3, 4], "4 records at most: the next parcel would pass it"
    assert c.pending() == 3


def test_busy_backs_off_doubling_and_not_owner_waits_for_a_newer_routing() -> None:
    c: Courier[Parcel, _O] = Courier(_routing(1, [(0, 0, HASH_SPACE)]), piece, jitter=lambda: 0.5)  # (nominal)
    [d] = _deliveries(c.send([_seq_parcel(0, [1])], _O(), 0))
    assert _deliveries(c.answered(d.id, Outcome(Status.BUSY), 0.0)) == []
    assert c.wake_at == 0.005 and _deliveries(c.tick(0.004)) == []
    [d] = _deliveries(c.tick(0.005))
    c.answered(d.id, Outcome(Status.OUT_OF_ORDER), 1.0)
    assert c.wake_at == 1.01  # doubled
    [d] = _deliveries(c.tick(1.01))
    out = c.answered(d.id, Outcome(Status.NOT_OWNER), 2.0)
    assert FetchRouting(1) in out and _deliveries(out) == []
    # A newer routing lets it go at once, without waiting out the back-off.
    [d] = _deliveries(c.routing_changed(_routing(2, [(0, 0, HASH_SPACE)]), 2.001))
    acked = c.answered(d.id, Outcome(Status.OK), 2.002)
    assert any(isinstance(a, Acked) for a in acked) and c.pending() == 0 and c.wake_at is None


@pytest.mark.parametrize("draw, wait", [(0.0, 0.004), (0.5, 0.005), (0.75, 0.0055)])
def test_each_back_off_falls_at_random_within_a_fifth_of_its_length(draw: float, wait: float) -> None:
    """Senders a BUSY tablet turned away at once do not all come back at once."""
    c: Courier[Parcel, _O] = Courier(_routing(1, [(0, 0, HASH_SPACE)]), piece, jitter=lambda: draw)
    [d] = _deliveries(c.send([_seq_parcel(0, [1])], _O(), 0))
    c.answered(d.id, Outcome(Status.BUSY), 0.0)
    assert c.wake_at == pytest.approx(wait)


def test_a_tablet_without_an_owner_waits_for_a_routing_that_gives_it_one() -> None:
    c: Courier[Parcel, _O] = Courier(_routing(1, [(0, 0, HASH_SPACE)], address=""), piece)
    out = c.send([_seq_parcel(0, [1])], _O(), 0)
    assert _deliveries(out) == [] and FetchRouting(1) in out
    assert len(_deliveries(c.routing_changed(_routing(2, [(0, 0, HASH_SPACE)]), 0.001))) == 1


def test_shipments_for_merged_ranges_sent_one_by_one_still_reach_the_merged_range_in_sequence() -> None:
    """07476bf: a tablet reopened after a merge re-sent the checkpoints of the two old ranges
    one send at a time; the merged range's queue held [2, 4, 6] then [1, 3, 5] of one producer
    in one delivery, and the receiver dropped 1, 3 and 5 as duplicates. Every parcel enters a
    lane through one door that keeps each owner's order, however the caller hands them in."""
    keys = [b"k%d" % i for i in range(40)]
    halves: dict[int, list[int]] = {0: [], 1: []}
    for s in range(1, 41):
        halves[0 if key_hash(keys[s - 1]) < HALF else 1].append(s)
    c: Courier[Parcel, _O] = Courier(_routing(2, [(2, 0, HASH_SPACE)]), piece, max_records=1000)
    owner = _O()
    busy = _deliveries(c.send([_seq_parcel(2, [99], [b"x"])], owner, 0))  # one in flight: the rest waits
    rerouted: list[Any] = []
    for r in (1, 0):  # the later half first: what a loop over checkpoints may well do
        rerouted += c.send([_seq_parcel(r, halves[r], [keys[s - 1] for s in halves[r]])], owner, 0)
    moves = [a for a in rerouted if isinstance(a, Rerouted)]
    assert moves, "the second send should have been re-arranged into the first"
    [d] = _deliveries(c.answered(busy[0].id, Outcome(Status.OK), 0))
    assert d.cols.seqs == list(range(1, 41))


def test_records_of_unknown_order_go_first_and_others_keep_their_owners_order() -> None:
    c: Courier[Parcel, _O] = Courier(_routing(1, [(0, 0, HASH_SPACE)]), piece)
    owner = _O()
    [held] = _deliveries(c.send([Parcel(COMP, 0, Columns([b"a"], [b""], [1], ids=[bytes(16)]), (), [7])], owner, 0))
    weak = [Parcel(COMP, 0, Columns([b"b", b"c"], [b"5", b"6"], [1, 1], ids=[b"\x01" * 16, b"\x02" * 16]), (), [5, 6]),
            Parcel(COMP, 0, Columns([b"d"], [b"?"], [1], ids=[b"\x03" * 16]), (), None),  # re-sent: not known
            Parcel(COMP, 0, Columns([b"e"], [b"4"], [1], ids=[b"\x04" * 16]), (), [4])]
    for p in weak:
        c.send([p], owner, 0)
    [d] = _deliveries(c.answered(held.id, Outcome(Status.OK), 0))
    assert d.cols.values == [b"?", b"4", b"5", b"6"]


def test_a_split_ranges_queue_goes_to_the_halves_ahead_of_newer_records() -> None:
    c: Courier[Parcel, _O] = Courier(_routing(1, [(0, 0, HASH_SPACE)]), piece, max_records=1000)
    owner = _O()
    keys = [b"k%d" % i for i in range(30)]
    [d] = _deliveries(c.send([_seq_parcel(0, list(range(1, 11)), keys[:10])], owner, 0))
    c.send([_seq_parcel(0, list(range(11, 21)), keys[10:20])], owner, 0)
    assert _deliveries(c.routing_changed(_routing(2, [(1, 0, HALF), (2, HALF, HASH_SPACE)]), 0)) == []
    newer = [_seq_parcel(1 if key_hash(k) < HALF else 2, [21 + i], [k]) for i, k in enumerate(keys[20:])]
    assert _deliveries(c.send(newer, owner, 0)) == [], "the halves wait for the retired range"
    out = c.answered(d.id, Outcome(Status.NOT_OWNER), 0)
    got = {x.key_range: x.cols.seqs for x in _deliveries(out)}
    assert set(got) == {1, 2}
    every = sorted(s for seqs in got.values() for s in seqs or [])
    assert every == list(range(1, 31)) and all(seqs == sorted(seqs or []) for seqs in got.values())
    assert sum(len(m.new) for m in out if isinstance(m, Rerouted)) >= 2


def test_a_computation_the_routing_no_longer_has_is_dropped_after_its_delivery_in_flight() -> None:
    c: Courier[Parcel, _O] = Courier(_routing(1, [(0, 0, HASH_SPACE)]), piece, max_records=2)
    owner = _O()
    [d] = _deliveries(c.send([_seq_parcel(0, [1, 2]), _seq_parcel(0, [3, 4])], owner, 0))
    assert c.routing_changed(RoutingTable(pb.Routing(version=2)), 0) == []
    out = c.answered(d.id, Outcome(Status.OK), 0)
    assert [type(a) for a in out] == [Acked, Dropped] and c.pending() == 0
    dropped = c.send([_seq_parcel(0, [5])], owner, 0)
    assert [(type(a), a.queued) for a in dropped if isinstance(a, Dropped)] == [(Dropped, False)]


def test_closing_owners_parcels_are_skipped_and_not_retried() -> None:
    c: Courier[Parcel, _O] = Courier(_routing(1, [(0, 0, HASH_SPACE)]), piece, max_records=1)
    old, new = _O(1), _O(2)
    [d] = _deliveries(c.send([_seq_parcel(0, [1]), _seq_parcel(0, [2])], old, 0))
    c.send([_seq_parcel(0, [1])], new, 0)
    old.closing = True
    [again] = _deliveries(c.answered(d.id, Outcome(Status.UNREACHABLE), 0) + c.tick(1))
    assert again.orders == {P: (0, 2)} and again.cols.seqs == [1]
    assert c.answered(again.id, Outcome(Status.OK), 1) and c.pending() == 0


def test_a_chain_names_the_last_sequence_in_flight_and_starts_again_after_a_failure() -> None:
    c: Courier[Parcel, _O] = Courier(_routing(1, [(0, 0, HASH_SPACE)]), piece, max_records=2, window=3)
    inj = _O(0)
    out = _deliveries(c.send([_seq_parcel(0, [1, 2]), _seq_parcel(0, [3, 4]), _seq_parcel(0, [5, 6]),
                              _seq_parcel(0, [7])], inj, 0))
    assert [d.orders[P][0] for d in out] == [0, 2, 4], "each after the last sequence before it"
    c.answered(out[1].id, Outcome(Status.OUT_OF_ORDER), 0)  # overtook the first
    assert _deliveries(c.answered(out[0].id, Outcome(Status.OK), 0)) == [], "not while one is in flight"
    again = _deliveries(c.answered(out[2].id, Outcome(Status.OK), 0) + c.tick(1))
    assert [(d.cols.seqs, d.orders[P][0]) for d in again] == [([3, 4], 0), ([7], 4)]


def test_a_chain_binds_only_exactly_once_readers_with_a_producer_in_common() -> None:
    for exactly_once, opaque in ((False, False), (True, True)):
        c: Courier[Parcel, _O] = Courier(_routing(1, [(0, 0, HASH_SPACE)], exactly_once), piece, max_records=1,
                                        window=3)
        first = Parcel(COMP, 0, Columns([b"a"], [b""], [1], ids=[sequence_id(P, 1)]), (P,), [1])
        later = (Parcel(COMP, 0, Columns([b"a"], [b""], [1], ids=[b"\x09" * 16]), (), [2]) if opaque
                 else Parcel(COMP, 0, Columns([b"a"], [b""], [1], ids=[sequence_id(P, 2)]), (P,), [2]))
        out = _deliveries(c.send([first, later], _O(0), 0))
        assert len(out) == 1, (exactly_once, opaque)
        assert len(_deliveries(c.answered(out[0].id, Outcome(Status.OK), 0))) == 1


def test_a_permanent_refusal_is_reported_and_waits_as_an_unreachable_one() -> None:
    c: Courier[Parcel, _O] = Courier(_routing(1, [(0, 0, HASH_SPACE)]), piece)
    owner = _O()
    [d] = _deliveries(c.send([_seq_parcel(0, [1])], owner, 0))
    out = c.answered(d.id, Outcome(Status.UNREACHABLE, refused="bad record"), 0)
    [refused] = [a for a in out if isinstance(a, Refused)]
    assert refused.reason == "bad record" and refused.owners == (owner,) and c.pending() == 1


def test_in_order_reads_unknown_keys_first() -> None:
    assert in_order([-1, -1, 3, 3, 7]) and not in_order([3, -1]) and not in_order([4, 2])


@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=20), min_size=1, max_size=8))
def test_every_chained_delivery_follows_exactly_the_previous_records_of_its_tablet(rounds: list[list[int]]) -> None:
    """Rounds of records (each a tablet number) sent in order while nothing is answered: a
    delivery's ``after`` is the last sequence of the same producer sent to its tablet by any
    earlier round, or 0 (was injectors/rounds.py's ``chained_orders``)."""
    ranges = [(t, t * (HASH_SPACE // 4), (t + 1) * (HASH_SPACE // 4)) for t in range(4)]
    c: Courier[Parcel, _O] = Courier(_routing(1, ranges), piece, window=64)
    inj = _O(0)
    seq = 0
    last_on: dict[int, int] = {}
    for n, tablets in enumerate(rounds):
        by_tablet: dict[int, list[int]] = {}
        expect: dict[int, int] = {}
        for t in tablets:
            seq += 1
            expect.setdefault(t, last_on.get(t, 0))
            by_tablet.setdefault(t, []).append(seq)
            last_on[t] = seq
        parcels = [Parcel(COMP, t, Columns([b"k"] * len(s), [b""] * len(s), [1] * len(s), P, s), (P,), s)
                   for t, s in by_tablet.items()]
        out = _deliveries(c.send(parcels, inj, n))
        assert {d.key_range: d.orders[P][0] for d in out} == expect


def test_a_lane_backing_off_with_nothing_queued_still_wakes_for_what_is_sent_to_it_meanwhile() -> None:
    """Review of the delivery core: a BUSY lane whose queue emptied while it backed off (its
    owner closing, an injector's round withdrawn at its deadline) lost its timer to a look at
    ``wake_at``; a parcel sent to it before the back-off ended then waited for some other
    event (an idle worker tablet: for ever, holding its watermark)."""
    c: Courier[Parcel, _O] = Courier(_routing(1, [(0, 0, HASH_SPACE)]), piece, jitter=lambda: 0.5)
    old = _O(1)
    [d] = _deliveries(c.send([_seq_parcel(0, [1])], old, 0))
    old.closing = True
    assert _deliveries(c.answered(d.id, Outcome(Status.BUSY), 0.0)) == []  # nothing goes back: closing
    assert c.wake_at == 0.005  # the caller arms its timer
    assert _deliveries(c.send([_seq_parcel(0, [1])], _O(2), 0.001)) == []  # the successor, within the back-off
    assert c.wake_at == 0.005, "nothing would wake the lane"
    assert len(_deliveries(c.tick(0.005))) == 1
