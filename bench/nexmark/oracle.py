"""The expected output of each query of :mod:`bench.nexmark.queries`, in plain Python.

Each function takes the configuration and the ``(key, value, timestamp)`` records that went
into the input stream (any order: every query's output is a function of the set of events)
and returns the multiset of ``(key, value, timestamp)`` the query must produce. It works from
the definitions of the queries (the docstrings there), whole windows and whole joins at a
time, and imports nothing from millstream, so it checks the runtime rather than repeating it.
Query 12 groups bids by processing time, so only its totals are fixed: :func:`q12_totals`.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable

from bench.nexmark.generator import SECOND_US, Auction, Bid, Event, NexmarkConfig, Person, decode, encode

Output = Counter[tuple[bytes, bytes, int]]
Records = Iterable[tuple[bytes, bytes, int]]
Q3_STATES = ("OR", "ID", "CA")
Q3_CATEGORY = 10


def _events(records: Records) -> list[tuple[bytes, Event]]:
    return [(key, decode(value)) for key, value, _ in records]


def _bids(records: Records) -> list[tuple[bytes, Bid]]:
    return [(key, e) for key, e in _events(records) if isinstance(e, Bid)]


def q0(config: NexmarkConfig, records: Records) -> Output:
    """Every event, unchanged."""
    return Counter(records)


def q1(config: NexmarkConfig, records: Records) -> Output:
    """Every bid with its price × 89 // 100."""
    return Counter((key, encode(Bid(b.auction, b.bidder, b.price * 89 // 100, b.date_time, b.extra)), b.date_time)
                   for key, b in _bids(records))


def q2(config: NexmarkConfig, records: Records) -> Output:
    """Bids on auctions whose id is a multiple of ``auction_skip``."""
    return Counter((b"%d" % b.auction, b"%d|%d" % (b.auction, b.price), b.date_time)
                   for _, b in _bids(records) if b.auction % config.auction_skip == 0)


def q3(config: NexmarkConfig, records: Records) -> Output:
    """Each category-10 auction whose seller lives in OR, ID or CA and registered less than
    ``max_auctions_waiting_sec`` from it, stamped at the later of the two."""
    events = [e for _, e in _events(records)]
    people = {p.id: p for p in events if isinstance(p, Person) and p.state in Q3_STATES}
    wait = config.max_auctions_waiting_sec * SECOND_US
    out: Output = Counter()
    for a in events:
        if isinstance(a, Auction) and a.category == Q3_CATEGORY and a.seller in people:
            p = people[a.seller]
            if abs(a.date_time - p.date_time) < wait:
                out[(b"%d" % p.id, f"{p.name}|{p.city}|{p.state}|{a.id}".encode(), max(a.date_time, p.date_time))] += 1
    return out


def _sliding_starts(ts: int, size: int, period: int) -> list[int]:
    start = ts // period * period
    starts = []
    while start + size > ts:
        starts.append(start)
        start -= period
    return starts


def q5(config: NexmarkConfig, records: Records) -> Output:
    """Per sliding window, the auctions with the most bids: ``auction|count`` keyed by the
    window's start, stamped a µs after its end."""
    size, period = config.window_size_sec * SECOND_US, config.window_period_sec * SECOND_US
    counts: dict[int, Counter[int]] = defaultdict(Counter)
    for _, b in _bids(records):
        for start in _sliding_starts(b.date_time, size, period):
            counts[start][b.auction] += 1
    out: Output = Counter()
    for start, per_auction in counts.items():
        top = max(per_auction.values())
        for auction, n in per_auction.items():
            if n == top:
                out[(b"%d" % start, b"%d|%d" % (auction, n), start + size + 1)] += 1
    return out


def q7(config: NexmarkConfig, records: Records) -> Output:
    """Per tumbling window, every bid at its highest price (encoded), keyed by the window's
    start, stamped a µs after its end."""
    size = config.window_size_sec * SECOND_US
    windows: dict[int, list[Bid]] = defaultdict(list)
    for _, b in _bids(records):
        windows[b.date_time // size * size].append(b)
    out: Output = Counter()
    for start, bids in windows.items():
        top = max(b.price for b in bids)
        for b in bids:
            if b.price == top:
                out[(b"%d" % start, encode(b), start + size + 1)] += 1
    return out


def q8(config: NexmarkConfig, records: Records) -> Output:
    """``id|name|reserve`` for each auction opened by a person in the tumbling window they
    registered in, stamped at the later of the two."""
    size = config.window_size_sec * SECOND_US
    events = [e for _, e in _events(records)]
    people = {p.id: p for p in events if isinstance(p, Person)}
    out: Output = Counter()
    for a in events:
        if isinstance(a, Auction) and a.seller in people:
            p = people[a.seller]
            if a.date_time // size == p.date_time // size:
                out[(b"%d" % p.id, f"{p.id}|{p.name}|{a.reserve}".encode(), max(a.date_time, p.date_time))] += 1
    return out


def q11(config: NexmarkConfig, records: Records) -> Output:
    """Per bidder, the bids of each session (bids less than ``window_size_sec`` apart), stamped
    at the session's end: its last bid plus the gap."""
    gap = config.window_size_sec * SECOND_US
    times: dict[int, list[int]] = defaultdict(list)
    for _, b in _bids(records):
        times[b.bidder].append(b.date_time)
    out: Output = Counter()
    for bidder, ts in times.items():
        ts.sort()
        count = 1
        for before, after in zip(ts, ts[1:], strict=False):
            if after - before >= gap:
                out[(b"%d" % bidder, b"%d" % count, before + gap)] += 1
                count = 0
            count += 1
        out[(b"%d" % bidder, b"%d" % count, ts[-1] + gap)] += 1
    return out


def q12_totals(config: NexmarkConfig, records: Records) -> Counter[bytes]:
    """Per bidder, the number of bids: what q12's counts add up to, whatever its panes were."""
    return Counter(b"%d" % b.bidder for _, b in _bids(records))


ORACLES: dict[str, Callable[[NexmarkConfig, Records], Output]] = {
    "q0": q0, "q1": q1, "q2": q2, "q3": q3, "q5": q5, "q7": q7, "q8": q8, "q11": q11,
}
