"""The code the Nexmark flows (bench/nexmark/flows.py) hand their steps: the event codec, the
functions of ``filter``/``map``/``key_by``/``flat_map``, the aggregators of their windows and
the computations of their ``process`` steps.

A flow loads these by module path, in the workers and (for the steps before an input's first
``key_by``) in the injector, so they live here at module level. Steps that need a query
parameter (q2's ``auction_skip``, q10's window, q12's pane length) are ``process`` steps:
a function passed to ``map`` or ``filter`` takes no parameters.

Inside a stage the values are :mod:`bench.nexmark.generator`'s dataclasses; where a value
crosses to another stage or into an operator's state (a window's accumulator, a join's
buffer) it must be one a flow carries (numbers, strings, bytes, lists, tuples, dicts), so the
steps before those turn events into tuples of the fields the query needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bench.nexmark.generator import Auction, Bid, Event, Person, decode, encode
from runtime import Computation, Context, ListState, Record, TimeDomain, ValueState, codecs
from runtime.windows import WindowResult

FANOUT = 5  # q7's partial maxima per window (Beam's default fanout)
SHARDS = 4  # q10's log shards
Q3_STATES = ("OR", "ID", "CA")
Q3_CATEGORY = 10


class EventCodec:
    """A record value (:func:`bench.nexmark.generator.encode`) as a Person, Auction or Bid."""

    name = "nexmark"

    def encode(self, e: Event) -> bytes:
        return encode(e)

    def decode(self, data: bytes) -> Event:
        return decode(data)


EVENTS = EventCodec()


# ------------------------------------------------------------------ which events


def is_bid(e: Event) -> bool:
    return type(e) is Bid


def is_person(e: Event) -> bool:
    return type(e) is Person


def is_auction(e: Event) -> bool:
    return type(e) is Auction


def is_person_or_auction(e: Event) -> bool:
    return type(e) is not Bid


def is_auction_or_bid(e: Event) -> bool:
    return type(e) is not Person


def q3_relevant(e: Event) -> bool:
    """A person in OR, ID or CA, or an auction in category 10."""
    if type(e) is Person:
        return e.state in Q3_STATES
    return type(e) is Auction and e.category == Q3_CATEGORY


# ------------------------------------------------------------------ keys (str: the record key)


def person_key(e: Person | Auction) -> str:
    """A person by its id, an auction by its seller."""
    return str(e.id) if type(e) is Person else str(e.seller)  # type: ignore[union-attr]


def auction_key(e: Auction | Bid) -> str:
    """An auction by its id, a bid by its auction."""
    return str(e.auction) if type(e) is Bid else str(e.id)  # type: ignore[union-attr]


def bidder_key(b: Bid) -> str:
    return str(b.bidder)


def decimal(n: int) -> str:
    return str(n)


def _ints_hash(e: Event) -> int:
    """A hash of the event's numbers: the same in every process (text hashes are salted)."""
    if type(e) is Bid:
        return hash((e.auction, e.bidder, e.price, e.date_time))
    return hash((e.id, e.date_time))  # type: ignore[union-attr]


def bucket(b: Bid) -> str:
    """One of :data:`FANOUT` buckets."""
    return str(_ints_hash(b) % FANOUT)


def shard(e: Event) -> str:
    """One of :data:`SHARDS` log shards."""
    return str(_ints_hash(e) % SHARDS)


def window_start(w: WindowResult) -> str:
    return str(w.start)


def category_key(winner: tuple[Any, ...]) -> str:
    return str(winner[WINNER_CATEGORY])


def seller_key(winner: tuple[Any, ...]) -> str:
    return str(winner[WINNER_SELLER])


# ------------------------------------------------------------------ values


def in_euros(b: Bid) -> Bid:
    """q1: the price × 89 / 100, rounded down."""
    return Bid(b.auction, b.bidder, b.price * 89 // 100, b.date_time, b.extra)


def auction_of(b: Bid) -> int:
    return b.auction


def person_fields(p: Person) -> tuple[int, str, str, str]:
    return (p.id, p.name, p.city, p.state)


def auction_id(a: Auction) -> int:
    return a.id


def auction_reserve(a: Auction) -> int:
    return a.reserve


def suggestion(pair: tuple[tuple[int, str, str, str], int]) -> str:
    """q3's output: ``name|city|state|auction id``."""
    (_, name, city, state), auction = pair
    return f"{name}|{city}|{state}|{auction}"


def new_user(pair: tuple[tuple[int, str, str, str], int]) -> str:
    """q8's output: ``id|name|reserve``."""
    (person, name, _, _), reserve = pair
    return f"{person}|{name}|{reserve}"


def window_value(w: WindowResult) -> Any:
    return w.value


def count_text(w: WindowResult) -> str:
    return str(w.value)


def price_and_bid(b: Bid) -> list[Any]:
    """q7: ``[price, [the bid, encoded]]``, a value for :class:`Leaders`."""
    return [b.price, [encode(b)]]


def hot_items(w: WindowResult) -> list[bytes]:
    """q5: ``auction|count`` for each auction at the window's highest count."""
    count, auctions = w.value
    return [b"%d|%d" % (a, count) for a in auctions]


def top_bids(w: WindowResult) -> list[bytes]:
    """q7: every bid at the window's highest price, as encoded."""
    return list(w.value[1])


# ------------------------------------------------------------------ aggregators


class Tally:
    """How many values a window holds, and which: every value of a key is the same (q5: the
    auction a bid is on, keyed by it), so the result is ``[count, [value]]``, a value for
    :class:`Leaders` (a window's result does not carry its key)."""

    def create(self) -> list[Any]:
        return [0, None]

    def add(self, acc: list[Any], value: Any) -> list[Any]:
        acc[0] += 1
        acc[1] = value
        return acc

    def merge(self, a: list[Any], b: list[Any]) -> list[Any]:
        return [a[0] + b[0], a[1] if a[1] is not None else b[1]]

    def result(self, acc: list[Any]) -> list[Any]:
        return [acc[0], [acc[1]]]


class Leaders:
    """The highest score and every item at it: values and accumulator ``[score, [items]]``
    (ties are all kept, as Beam's q5 and q7 keep them)."""

    def create(self) -> list[Any]:
        return [None, []]

    def add(self, acc: list[Any], value: list[Any]) -> list[Any]:
        score, items = value
        if acc[0] is None or score > acc[0]:
            return [score, list(items)]
        if score == acc[0]:
            acc[1].extend(items)
        return acc

    def merge(self, a: list[Any], b: list[Any]) -> list[Any]:
        return a if b[0] is None else self.add(a, b)


# ------------------------------------------------------------------ process steps


class _Output(Computation):
    """A flow step whose results go on to the next step (the stream name is not used)."""

    def setup(self, params: Mapping[str, str]) -> None:
        super().setup(params)
        self.output = "out"


class EveryNthAuction(_Output):
    """q2: bids on auctions whose id is a multiple of param ``skip``: ``auction|price``."""

    def setup(self, params: Mapping[str, str]) -> None:
        super().setup(params)
        self.skip = int(params["skip"])

    def process_record(self, ctx: Context, record: Record) -> None:
        b: Bid = record.value  # type: ignore[assignment]  # in a flow, the value itself
        if b.auction % self.skip == 0:
            ctx.produce(self.output, b"%d|%d" % (b.auction, b.price))


class LogLines(_Output):
    """q10: each event as a line of the log file of its shard (the key) and window of param
    ``window_us``: ``<window start>/<shard>|<event>``."""

    def setup(self, params: Mapping[str, str]) -> None:
        super().setup(params)
        self.window_us = int(params["window_us"])

    def process_record(self, ctx: Context, record: Record) -> None:
        ts = record.timestamp
        start = ts - ts % self.window_us
        ctx.produce(self.output, b"%d/%s|%s" % (start, ctx.key, encode(record.value)))  # type: ignore[arg-type]


class BidsPerPane(_Output):
    """q12: a bidder's bids (the key) in processing-time panes of param ``window_us``: the
    first bid of a pane starts a wall-clock timer; when it fires, the pane's count goes on,
    stamped at the pane's newest event time or the low watermark, whichever is later (as
    :class:`bench.nexmark.queries.Q12ProcessingTime`, whose docstring says why that is the
    best a wall-clock timer can do)."""

    pane = ValueState("pane", codecs.JSON)  # [count, newest event time]

    def setup(self, params: Mapping[str, str]) -> None:
        super().setup(params)
        self.window_us = int(params["window_us"])

    def process_record(self, ctx: Context, record: Record) -> None:
        pane = ctx.state_of(self.pane)
        count, newest = pane.get() or (0, record.timestamp)
        if not count:
            ctx.set_timer("pane", ctx.now() + self.window_us, TimeDomain.WALL_TIME)
        pane.set([count + 1, max(newest, record.timestamp)])

    def process_timer(self, ctx: Context, tag: str, time: int) -> None:
        pane = ctx.state_of(self.pane)
        count, newest = pane.get()
        ctx.produce(self.output, b"%d" % count, timestamp=max(newest, ctx.low_watermark))
        pane.clear()


# q9's winner: (auction, seller, category, expires, price, the winning bid encoded)
WINNER_AUCTION, WINNER_SELLER, WINNER_CATEGORY, WINNER_EXPIRES, WINNER_PRICE, WINNER_BID = range(6)


def _better(bid: list[Any], than: list[Any] | None) -> bool:
    """Beam's order of bids for an auction: the higher price wins, then the earlier bid; then
    (a total order, so the winner never depends on arrival) the lower bidder, the smaller
    text."""
    if than is None:
        return True
    price, ts, bidder, line = bid
    oprice, ots, obidder, oline = than
    return (-price, ts, bidder, line) < (-oprice, ots, obidder, oline)


class WinningBid(_Output):
    """q9 (and q4, q6 after it): per auction (the key; its bids keyed by it too), the best bid
    (:func:`_better`) of those made while it ran (``date_time <= bid < expires``) at or above
    its reserve, emitted when the watermark reaches ``expires`` as a winner tuple
    (``WINNER_*``), stamped there.

    A bid may arrive before its auction (the generator refers to auctions up to 10 ahead, and
    events come out of order): it waits in ``pending``. Once the watermark passes the bid's
    time, every event at or before it has arrived; if its auction is still missing, that
    auction started after the bid, which therefore cannot count: the ``drop`` timer forgets
    it. So nothing waits forever, and the result does not depend on arrival order."""

    auction = ValueState("auction", codecs.JSON)  # [seller, category, reserve, date_time, expires]
    best = ValueState("best", codecs.JSON)        # [price, date_time, bidder, line]
    pending = ListState("pending", codecs.JSON)   # [price, date_time, bidder, line], auction unseen

    def process_record(self, ctx: Context, record: Record) -> None:
        e = record.value
        if type(e) is Auction:
            a = [e.seller, e.category, e.reserve, e.date_time, e.expires]
            ctx.state_of(self.auction).set(a)
            pending = ctx.state_of(self.pending)
            for bid in pending:
                self._offer(ctx, a, bid)
            pending.clear()
            ctx.delete_timer("drop")
            ctx.set_timer("close", e.expires)
        elif type(e) is Bid:
            bid = [e.price, e.date_time, e.bidder, encode(e).decode()]
            a = ctx.state_of(self.auction).get()
            if a is not None:
                self._offer(ctx, a, bid)
                return
            pending = ctx.state_of(self.pending)
            first = min((p[1] for p in pending), default=None)
            pending.append(bid)
            if first is None or e.date_time < first:
                ctx.set_timer("drop", e.date_time + 1)

    def _offer(self, ctx: Context, a: list[Any], bid: list[Any]) -> None:
        _, _, reserve, start, expires = a
        if start <= bid[1] < expires and bid[0] >= reserve:
            best = ctx.state_of(self.best)
            if _better(bid, best.get()):
                best.set(bid)

    def process_timer(self, ctx: Context, tag: str, time: int) -> None:
        if tag == "drop":
            pending = ctx.state_of(self.pending)
            keep = [p for p in pending if p[1] >= time]
            pending.clear()
            if keep:
                pending.extend(keep)
                ctx.set_timer("drop", min(p[1] for p in keep) + 1)
            return
        a = ctx.state_of(self.auction).get()
        best = ctx.state_of(self.best)
        bid = best.get()
        if bid is not None and a is not None:
            seller, category, _, _, expires = a
            winner = (int(ctx.key), seller, category, expires, bid[0], bid[3].encode())
            ctx.produce(self.output, winner, timestamp=time)  # type: ignore[arg-type]  # a flow step: values are objects
        best.clear()
        ctx.state_of(self.auction).clear()


def winning_bid(winner: tuple[Any, ...]) -> bytes:
    """q9's output: the winning bid, encoded."""
    return bytes(winner[WINNER_BID])


def winning_price(winner: tuple[Any, ...]) -> int:
    return int(winner[WINNER_PRICE])


def category_average(w: WindowResult) -> bytes:
    """q4's output: ``<window start>|<mean price, rounded>``."""
    return b"%d|%d" % (w.start, round(w.value))


class SellerAverage(_Output):
    """q6: per seller (the key), the mean price of its last 10 winning bids (rounded down),
    emitted for each new one.

    "Last" is in event time (a winner's auction's ``expires``, then its id): winners of one
    seller come from several tablets of the stage before, in any order, so they wait in
    ``pending`` until the watermark says every winner up to their time is in (a timer one µs
    after the earliest: the stage before stamps winners when its timers at ``expires`` fire,
    and holds its watermark there until they are sent), then go in order."""

    last = ValueState("last", codecs.JSON)        # the last 10 prices
    pending = ListState("pending", codecs.JSON)   # [expires, auction, price], not yet in order

    def process_record(self, ctx: Context, record: Record) -> None:
        w = record.value
        pending = ctx.state_of(self.pending)
        first = min((p[0] for p in pending), default=None)
        pending.append([w[WINNER_EXPIRES], w[WINNER_AUCTION], w[WINNER_PRICE]])  # type: ignore[index]
        if first is None or w[WINNER_EXPIRES] < first:  # type: ignore[index]
            ctx.set_timer("release", w[WINNER_EXPIRES] + 1)  # type: ignore[index]

    def process_timer(self, ctx: Context, tag: str, time: int) -> None:
        pending = ctx.state_of(self.pending)
        items = sorted(pending)
        ready = [p for p in items if p[0] < time]
        rest = [p for p in items if p[0] >= time]
        last = ctx.state_of(self.last)
        prices = last.get() or []
        for _, _, price in ready:
            prices = (prices + [price])[-10:]
            ctx.produce(self.output, b"%d" % (sum(prices) // len(prices)), timestamp=time)
        last.set(prices)
        pending.clear()
        if rest:
            pending.extend(rest)
            ctx.set_timer("release", rest[0][0] + 1)
