"""A model of a computation's receiving tablets and of the owners that send to them, for
testing the delivery core (runtime/courier.py) without a network: tablets split and merge
under it, answers are lost, late, BUSY or refused, owners close and their successors re-send
what was not acknowledged. The receivers deduplicate as worker/dedup.py does (one mark per
producer, a merged range's lower marks, ids of no listed producer kept as a set), so a
producer's records handed to a tablet out of order are lost here as they would be there."""

from __future__ import annotations

from dataclasses import dataclass, field

from runtime.columns import Columns
from runtime.courier import Courier, Deliver
from runtime.delivery import Orders, Outcome, Status
from runtime.keyspace import HASH_SPACE, key_hash
from runtime.record import ID_BYTES, sequence_id
from runtime.routing import RoutingTable
from runtime.wire import millstream_pb2 as pb

COMP = "c"


@dataclass(eq=False)
class Parcel:
    computation: str
    key_range: int
    cols: Columns
    producers: tuple[bytes, ...]
    order: list[int] | None = None


def piece(sources: list[Parcel], computation: str, key_range: int, cols: Columns,
          producers: tuple[bytes, ...], order: list[int] | None) -> Parcel:
    return Parcel(computation, key_range, cols, producers, order)


@dataclass(eq=False)
class Owner:
    lineage: Lineage
    token: int
    closing: bool = False

    @property
    def name(self) -> str:
        return self.lineage.name


@dataclass
class Made:
    """One record a lineage made: its id, key, place in the lineage's order."""

    rid: bytes
    key: bytes
    place: int


@dataclass(eq=False)
class Lineage:
    """A producer across its owners (a tablet reopened under new tokens, an injector that
    puts rounds back). ``kind``: "strong" (its own sequences), "weak" (two producers'
    sequences and opaque ids, production order in ``order``), "ordered" (one producer's
    sequences, send order in ``order``: an injector's rounds)."""

    name: str
    kind: str
    prefixes: tuple[bytes, ...]
    owner: Owner
    made: list[Made] = field(default_factory=list)
    parcels: list[tuple[int, list[Made]]] = field(default_factory=list)  # as made: (range, records)
    acked: set[bytes] = field(default_factory=set)
    seqs: dict[bytes, int] = field(default_factory=dict)
    places: int = 0
    opaque: int = 0

    def make(self, key: bytes) -> Made:
        self.places += 1
        if self.kind == "weak" and self.places % 3 == 0:
            self.opaque += 1
            rid = bytes([0xEE]) + self.name.encode().ljust(7, b"-")[:7] + self.opaque.to_bytes(8, "big")
        else:
            prefix = self.prefixes[self.places % len(self.prefixes)]
            self.seqs[prefix] = self.seqs.get(prefix, 0) + 1
            rid = sequence_id(prefix, self.seqs[prefix])
        m = Made(rid, key, self.places)
        self.made.append(m)
        return m

    def parcel(self, key_range: int, records: list[Made], resent: bool = False) -> Parcel:
        cols = Columns([m.key for m in records], [str(m.place).encode() for m in records],
                       [m.place for m in records], ids=[m.rid for m in records])
        if self.kind == "strong":
            cols = Columns.of_records(cols.records(), self.prefixes[0])
            return Parcel(COMP, key_range, cols, self.prefixes)
        if resent and self.kind == "weak":
            return Parcel(COMP, key_range, cols, self.prefixes)  # from a checkpoint: order not known
        return Parcel(COMP, key_range, cols, self.prefixes, [m.place for m in records])


class Tablet:
    def __init__(self, lo: int, hi: int) -> None:
        self.lo, self.hi = lo, hi
        self.marks: dict[bytes, int] = {}
        self.tokens: dict[bytes, int] = {}
        self.lows: dict[bytes, list[tuple[int, int, int]]] = {}

    def copy(self, lo: int, hi: int) -> Tablet:
        t = Tablet(lo, hi)
        t.marks, t.tokens = dict(self.marks), dict(self.tokens)
        t.lows = {p: [(max(a, lo), min(b, hi), s) for a, b, s in lows if a < hi and b > lo]
                  for p, lows in self.lows.items()}
        return t

    def floor(self, p: bytes) -> int:
        return min([self.marks.get(p, 0), *(s for _, _, s in self.lows.get(p, ()))])

    def seen(self, p: bytes, seq: int, key: bytes) -> bool:
        top = self.marks.get(p)
        if top is None or seq > top:
            return False
        h = key_hash(key)
        for lo, hi, s in self.lows.get(p, ()):
            if lo <= h < hi:
                return seq <= s
        return True

    def rise(self, p: bytes, seq: int) -> None:
        """Nothing of ``p`` older than ``seq`` can follow: its lower marks rise to it."""
        top = self.marks.get(p, 0)
        self.lows[p] = [(a, b, max(s, seq)) for a, b, s in self.lows.get(p, ()) if max(s, seq) < top]


class Receivers:
    """The tablets of computation ``c`` as the cluster has them (the truth the sender's
    routing follows, late)."""

    def __init__(self, ranges: int) -> None:
        step = HASH_SPACE // ranges
        self.tablets = {i: Tablet(i * step, HASH_SPACE if i == ranges - 1 else (i + 1) * step) for i in range(ranges)}
        self.next_id = ranges
        self.version = 1
        self.opaque: set[bytes] = set()
        self.committed: list[tuple[bytes, bytes]] = []  # (id, key) in commit order
        self.ids: set[bytes] = set()

    def routing(self, exactly_once: bool = True) -> RoutingTable:
        r = pb.Routing(version=self.version)
        c = r.computations.add(name=COMP, exactly_once=exactly_once)
        for rid, t in sorted(self.tablets.items()):
            c.assignments.add(key_range=rid, address="w", token=1, start=t.lo, end=0 if t.hi == HASH_SPACE else t.hi)
        return RoutingTable(r)

    def split(self, rid: int) -> None:
        t = self.tablets.pop(rid)
        mid = (t.lo + t.hi) // 2
        for lo, hi in ((t.lo, mid), (mid, t.hi)):
            self.tablets[self.next_id] = t.copy(lo, hi)
            self.next_id += 1
        self.version += 1

    def merge(self, a: int, b: int) -> None:
        ta, tb = self.tablets.pop(a), self.tablets.pop(b)
        m = Tablet(min(ta.lo, tb.lo), max(ta.hi, tb.hi))
        for p in set(ta.marks) | set(tb.marks):
            top = max(ta.marks.get(p, 0), tb.marks.get(p, 0))
            m.marks[p] = top
            m.tokens[p] = max(ta.tokens.get(p, 0), tb.tokens.get(p, 0))
            lows = []
            for t in (ta, tb):
                lows += t.lows.get(p, [])
                if t.marks.get(p, 0) < top:
                    lows.append((t.lo, t.hi, t.marks.get(p, 0)))
            m.lows[p] = [low for low in lows if low[2] < top]
        self.tablets[self.next_id] = m
        self.next_id += 1
        self.version += 1

    def deliver(self, d: Deliver) -> Status:
        """Commit (or refuse) a delivery as a tablet would."""
        t = self.tablets.get(d.key_range)
        if t is None:
            return Status.NOT_OWNER
        orders: Orders = d.orders
        for p, (after, token) in orders.items():
            if token < t.tokens.get(p, 0):
                return Status.NOT_OWNER
            if after > t.floor(p):
                return Status.OUT_OF_ORDER
        for p, (_, token) in orders.items():
            t.tokens[p] = max(token, t.tokens.get(p, 0))
        tops: dict[bytes, int] = {}
        cols = d.cols
        for i, rid in enumerate(cols.all_ids()):
            key = cols.keys[i]
            assert t.lo <= key_hash(key) < t.hi, f"record {rid.hex()} delivered to a range that does not hold its key"
            p = rid[:ID_BYTES // 2]
            if p in orders:
                seq = int.from_bytes(rid[8:], "big")
                if seq <= tops.get(p, -1):
                    continue
                if t.seen(p, seq, key):
                    t.rise(p, seq)
                    continue
                tops[p] = seq
            else:
                if rid in self.opaque:
                    continue
                self.opaque.add(rid)
            assert rid not in self.ids, f"record {rid.hex()} committed twice"
            self.ids.add(rid)
            self.committed.append((rid, key))
        for p, seq in tops.items():
            t.marks[p] = max(t.marks.get(p, 0), seq)
            t.rise(p, seq)
        return Status.OK


def outcome(status: Status) -> Outcome:
    return Outcome(status, ("w", 1) if status == Status.OK else None)


def quiesce(courier: Courier[Parcel, Owner], receivers: Receivers, in_flight: dict[int, Deliver],
            apply: object, now: float) -> float:
    """Let everything finish with no more faults: the sender's routing caught up, every
    delivery answered as its tablet would, time moved on when the sender waits on it."""
    assert callable(apply)
    for _ in range(5000):
        if courier.routing.version != receivers.version:
            apply(courier.routing_changed(receivers.routing(courier.routing.computations[COMP].exactly_once), now))
        if in_flight:
            d = in_flight.pop(min(in_flight))
            apply(courier.answered(d.id, outcome(receivers.deliver(d)), now))
            continue
        at = courier.wake_at
        if at is None:
            break
        now = max(now, at)
        apply(courier.tick(now))
    assert not in_flight and courier.pending() == 0, f"{courier.pending()} parcels still pending"
    return now
