"""The expected output of each Nexmark query, in plain Python: of the classic versions
(:mod:`bench.nexmark.queries`, :data:`ORACLES`) and of the flows (:mod:`bench.nexmark.flows`,
:data:`FLOW_ORACLES`: the same, plus q4, q6, q9 and q10, with q8 stamped at its window's end).

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


def q8_at_window_end(config: NexmarkConfig, records: Records) -> Output:
    """q8 as a window join emits it: the same matches, stamped at their window's end."""
    size = config.window_size_sec * SECOND_US
    out: Output = Counter()
    for (key, value, ts), n in q8(config, records).items():
        out[(key, value, ts - ts % size + size)] += n
    return out


def _rank(b: Bid) -> tuple[int, int, int, bytes]:
    """The order of an auction's bids: the highest price first, then the earliest, then (so
    that exactly one wins) the lowest bidder, the smallest encoding."""
    return (-b.price, b.date_time, b.bidder, encode(b))


def winners(config: NexmarkConfig, records: Records) -> list[tuple[Auction, Bid]]:
    """Each auction with a bid made while it ran (``date_time <= bid < expires``) at or above
    its reserve, with the first such bid in :func:`_rank` order."""
    events = [e for _, e in _events(records)]
    auctions = {a.id: a for a in events if isinstance(a, Auction)}
    best: dict[int, Bid] = {}
    for b in events:
        if isinstance(b, Bid) and b.auction in auctions:
            a = auctions[b.auction]
            if a.date_time <= b.date_time < a.expires and b.price >= a.reserve:
                if b.auction not in best or _rank(b) < _rank(best[b.auction]):
                    best[b.auction] = b
    return [(auctions[i], b) for i, b in best.items()]


def q9(config: NexmarkConfig, records: Records) -> Output:
    """Each auction's winning bid (:func:`winners`), encoded, keyed by the auction, stamped at
    its ``expires``."""
    return Counter((b"%d" % a.id, encode(b), a.expires) for a, b in winners(config, records))


def q4(config: NexmarkConfig, records: Records) -> Output:
    """Per category and sliding window (by the auctions' ``expires``), the mean price of the
    winning bids, rounded: ``<window start>|<mean>``, stamped at the window's end."""
    size, period = config.window_size_sec * SECOND_US, config.window_period_sec * SECOND_US
    prices: dict[tuple[int, int], list[int]] = defaultdict(list)
    for a, b in winners(config, records):
        for start in _sliding_starts(a.expires, size, period):
            prices[(a.category, start)].append(b.price)
    return Counter((b"%d" % category, b"%d|%d" % (start, round(sum(p) / len(p))), start + size)
                   for (category, start), p in prices.items())


def q6(config: NexmarkConfig, records: Records) -> Output:
    """Per seller, for each winning bid in the order of its auction's ``expires`` (then id),
    the mean price of the seller's last 10 (rounded down), stamped a µs after ``expires``."""
    by_seller: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for a, b in winners(config, records):
        by_seller[a.seller].append((a.expires, a.id, b.price))
    out: Output = Counter()
    for seller, sold in by_seller.items():
        last: list[int] = []
        for expires, _, price in sorted(sold):
            last = (last + [price])[-10:]
            out[(b"%d" % seller, b"%d" % (sum(last) // len(last)), expires + 1)] += 1
    return out


SHARDS = 4


def q10(config: NexmarkConfig, records: Records) -> Output:
    """Every event as a line of its log file: ``<window start>/<shard>|<event>``, keyed by
    its shard (a hash of its numbers, :data:`SHARDS` of them), at its own time."""
    size = config.window_size_sec * SECOND_US
    out: Output = Counter()
    for _, e in _events(records):
        numbers = (e.auction, e.bidder, e.price, e.date_time) if isinstance(e, Bid) else (e.id, e.date_time)
        shard = b"%d" % (hash(numbers) % SHARDS)
        ts = e.date_time
        out[(shard, b"%d/%s|%s" % (ts - ts % size, shard, encode(e)), ts)] += 1
    return out


ORACLES: dict[str, Callable[[NexmarkConfig, Records], Output]] = {
    "q0": q0, "q1": q1, "q2": q2, "q3": q3, "q5": q5, "q7": q7, "q8": q8, "q11": q11,
}
FLOW_ORACLES: dict[str, Callable[[NexmarkConfig, Records], Output]] = ORACLES | {
    "q4": q4, "q6": q6, "q8": q8_at_window_end, "q9": q9, "q10": q10,
}
