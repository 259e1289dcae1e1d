"""Nexmark queries 0, 1, 2, 3, 5, 7, 8, 11 and 12 as millstream topologies.

Each query is a function ``qN(name_prefix, input_stream, output_stream, *, key_ranges=4,
config=NexmarkConfig()) -> Topology`` (:data:`QUERIES` maps names to them). The input stream
carries the records of :func:`bench.nexmark.generator.records`: key = event number, value = an
encoded event, timestamp = its event time. Computation, topology and intermediate stream names
start with ``name_prefix`` (computation and stream names are cluster-wide).

**Keys.** A key extractor cannot drop a record, and a subscriber receives every record of its
stream. So where a query needs events keyed by a field (a bid's auction, a person's id), its
extractor keys the events it wants by that field and every other event by its own key (the
event number, which spreads them evenly), and the computation ignores those at once: one hop
instead of a filter stage and a second hop.

**Timestamps.** A result is stamped no lower than the watermark of the computation that
produces it, or the next stage could count it late. Results made while processing a record
carry a timestamp at or after that record's (never late itself: the generator's watermark is
honest). Results of an event-time timer are stamped at the timer's time or later.

**Deviations from Beam's queries** (each is noted where it applies): q3 and q8 emit a match as
soon as both sides are in, and q3 joins a person and an auction at most
``max_auctions_waiting_sec`` apart (Beam's clean-up timer, made deterministic); q5 and q7 find
their per-window maximum in two stages; q7 pre-aggregates on a fixed fan-out of 5 (Beam's
default: key extractors take no parameters); q11 has no early firings and no allowed lateness;
q12 cannot stamp its results safely (see :class:`Q12ProcessingTime`).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Mapping
from typing import Any

from bench.nexmark.generator import SECOND_US, Auction, Bid, NexmarkConfig, Person, decode, encode
from runtime import Computation, Context, ListState, Record, TimeDomain, Topology, ValueState, codecs
from runtime.windows import Count, Session, Sliding, Tumbling, WindowedComputation

DEFAULT = NexmarkConfig()
FANOUT = 5  # q7's partial maxima per window (Beam's default fanout)
Q3_STATES = ("OR", "ID", "CA")
Q3_CATEGORY = 10
_HERE = "bench.nexmark.queries"

# ------------------------------------------------------------------ key extractors


def by_auction(record: Record) -> bytes:
    """A bid by its auction id; any other event by its own key."""
    v = record.value
    return v.split(b"|", 2)[1] if v[:1] == b"B" else record.key


def by_bidder(record: Record) -> bytes:
    """A bid by its bidder id; any other event by its own key."""
    v = record.value
    return v.split(b"|", 3)[2] if v[:1] == b"B" else record.key


def by_person(record: Record) -> bytes:
    """A person by its id, an auction by its seller; a bid by its own key."""
    v = record.value
    kind = v[:1]
    if kind == b"P":
        return v.split(b"|", 2)[1]
    if kind == b"A":
        return v.split(b"|", 3)[2]
    return record.key


def by_bucket(record: Record) -> bytes:
    """One of :data:`FANOUT` buckets, by the record's own key."""
    return b"%d" % (zlib.crc32(record.key) % FANOUT)


# ------------------------------------------------------------------ stateless: q0, q1, q2


class _Stateless(Computation):
    def setup(self, params: Mapping[str, str]) -> None:
        super().setup(params)
        self.output = params["output"]


class Q0Pass(_Stateless):
    """q0: every event, decoded and encoded again (Beam's q0 measures the codec's cost)."""

    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.produce(self.output, encode(decode(record.value)))


class Q1Convert(_Stateless):
    """q1: every bid, its price converted from dollars to euros (× 89 / 100, rounded down)."""

    def process_record(self, ctx: Context, record: Record) -> None:
        if record.value[:1] != b"B":
            return
        b = decode(record.value)
        assert isinstance(b, Bid)
        ctx.produce(self.output, encode(Bid(b.auction, b.bidder, b.price * 89 // 100, b.date_time, b.extra)))


class Q2Select(_Stateless):
    """q2: bids on every ``auction_skip``-th auction: key = auction id, value = ``auction|price``."""

    def setup(self, params: Mapping[str, str]) -> None:
        super().setup(params)
        self.skip = int(params["skip"])

    def process_record(self, ctx: Context, record: Record) -> None:
        v = record.value
        if v[:1] != b"B":
            return
        _, auction, _, price, _ = v.split(b"|", 4)
        if int(auction) % self.skip == 0:
            ctx.produce(self.output, auction + b"|" + price, key=auction)


# ------------------------------------------------------------------ q3: local item suggestion


class Q3Join(Computation):
    """q3: people in OR, ID or CA joined with their auctions in category 10, keyed by person
    id (:func:`by_person`); value = ``name|city|state|auction id``.

    Either side may come first: a person is kept to meet later auctions, an auction waits for
    its seller. Beam's clean-up timer (moved by every event, so what it cleans depends on
    arrival order) becomes a deterministic rule: a person and an auction join when their event
    times are less than ``max_auctions_waiting_sec`` apart. Typed state with that TTL forgets
    both once no later match is possible (an auction arriving after its person's TTL is later
    than the horizon anyway). A match is stamped at the later of the two event times: at or
    after the record being processed."""

    def setup(self, params: Mapping[str, str]) -> None:
        super().setup(params)
        self.output = params["output"]
        self.wait_us = int(params["wait_us"])
        self.person = ValueState("person", codecs.JSON, ttl=self.wait_us)  # [name, city, state, date_time]
        self.auctions = ListState("auctions", codecs.JSON, ttl=self.wait_us)  # [id, date_time], seller unseen

    def process_record(self, ctx: Context, record: Record) -> None:
        kind = record.value[:1]
        if kind == b"P":
            p = decode(record.value)
            assert isinstance(p, Person)
            if p.state not in Q3_STATES:
                return
            person = [p.name, p.city, p.state, p.date_time]
            ctx.state_of(self.person).set(person)
            waiting = ctx.state_of(self.auctions)
            for auction, ts in waiting:
                self._match(ctx, person, auction, ts)
            waiting.clear()
        elif kind == b"A":
            a = decode(record.value)
            assert isinstance(a, Auction)
            if a.category != Q3_CATEGORY:
                return
            person = ctx.state_of(self.person).get()
            if person is None:
                ctx.state_of(self.auctions).append([a.id, a.date_time])
            else:
                self._match(ctx, person, a.id, a.date_time)

    def _match(self, ctx: Context, person: list[Any], auction: int, ts: int) -> None:
        name, city, state, person_ts = person
        if abs(ts - person_ts) < self.wait_us:
            ctx.produce(self.output, f"{name}|{city}|{state}|{auction}".encode(), timestamp=max(ts, person_ts))


# ------------------------------------------------------------------ q5 and q7: maxima per window


class _WindowTop(Computation):
    """The second stage of q5 and q7, keyed by window start: of the ``[score, [items]]`` every
    first-stage key sends for the window, keep the items with the highest score, and emit them
    once all have arrived.

    The first stage stamps a window's candidates at the moment the window fires, T. Its
    watermark can sit *at* T while some of its timers for T are still pending (a pending timer
    holds the watermark at its time), so this stage reaching T does not mean every candidate is
    in; reaching T + 1 does. Hence the timer at T + 1, and results stamped there."""

    best = ValueState("best", codecs.JSON)  # [score, [items]]: the window's leaders so far

    def setup(self, params: Mapping[str, str]) -> None:
        super().setup(params)
        self.output = params["output"]

    def result(self, score: int, item: str) -> bytes:
        raise NotImplementedError

    def process_record(self, ctx: Context, record: Record) -> None:
        score, items = json.loads(record.value)
        best = ctx.state_of(self.best)
        have = best.get()
        if have is None:
            ctx.set_timer("emit", record.timestamp + 1)
        elif score < have[0]:
            return
        elif score == have[0]:
            items = have[1] + items
        best.set([score, items])

    def process_timer(self, ctx: Context, tag: str, time: int) -> None:
        best = ctx.state_of(self.best)
        score, items = best.get()
        best.clear()
        for item in items:
            ctx.produce(self.output, self.result(score, item), timestamp=time)


class Q5Count(WindowedComputation):
    """q5, stage 1: bids per auction (:func:`by_auction`) per sliding window of
    ``window_size_sec`` every ``window_period_sec``; sends ``[count, [auction]]`` to stage 2,
    keyed by window start."""

    aggregator = Count()

    def setup(self, params: Mapping[str, str]) -> None:
        super().setup(params)
        self.windows = Sliding(int(params["size_us"]), int(params["period_us"]))
        self.output = params["output"]

    def process_record(self, ctx: Context, record: Record) -> None:
        if record.value[:1] == b"B":
            super().process_record(ctx, record)

    def on_window(self, ctx: Context, start: int, end: int, acc: Any) -> None:
        ctx.produce(self.output, json.dumps([acc, [ctx.key.decode()]]).encode(), key=b"%d" % start,
                    timestamp=self.fired_at(end))


class Q5Max(_WindowTop):
    """q5, stage 2 ('hot items'): per window (key = its start), the auctions with the most
    bids: one ``auction|count`` each, stamped one µs after the window's end."""

    def result(self, score: int, item: str) -> bytes:
        return f"{item}|{score}".encode()


class _HighestBids:
    """Accumulates ``[price, [encoded bids]]``: the highest price so far and every bid at it."""

    def create(self) -> list[Any]:
        return [-1, []]

    def add(self, acc: list[Any], value: list[Any]) -> list[Any]:
        price, bid = value
        return self.merge(acc, [price, [bid]])

    def merge(self, a: list[Any], b: list[Any]) -> list[Any]:
        if a[0] != b[0]:
            return a if a[0] > b[0] else b
        return [a[0], a[1] + b[1]]

    def emit(self, acc: list[Any]) -> bytes:
        return json.dumps(acc).encode()


class Q7Partial(WindowedComputation):
    """q7, stage 1: per tumbling window of ``window_size_sec`` and bucket (:func:`by_bucket`),
    the highest bids; sends ``[price, [bids]]`` to stage 2, keyed by window start."""

    aggregator = _HighestBids()

    def setup(self, params: Mapping[str, str]) -> None:
        super().setup(params)
        self.windows = Tumbling(int(params["size_us"]))
        self.output = params["output"]

    def value(self, record: Record) -> list[Any]:
        return [int(record.value.split(b"|", 4)[3]), record.value.decode()]

    def process_record(self, ctx: Context, record: Record) -> None:
        if record.value[:1] == b"B":
            super().process_record(ctx, record)

    def on_window(self, ctx: Context, start: int, end: int, acc: Any) -> None:
        ctx.produce(self.output, self.aggregator.emit(acc), key=b"%d" % start, timestamp=self.fired_at(end))


class Q7Max(_WindowTop):
    """q7, stage 2 ('highest bid'): per window (key = its start), every bid at the window's
    highest price, as encoded, stamped one µs after the window's end."""

    def result(self, score: int, item: str) -> bytes:
        return item.encode()


# ------------------------------------------------------------------ q8: monitor new users


class Q8Join(Computation):
    """q8: people who opened an auction in the tumbling window of ``window_size_sec`` in which
    they registered, keyed by person id (:func:`by_person`); one ``id|name|reserve`` per such
    auction.

    Beam joins each window at its end; here a match is emitted as soon as both sides are in
    (the same results, sooner), stamped at the later of the two event times. A person is kept
    for one window size (its window is over by then) and an auction waits as long for its
    seller; auctions of a seller already seen in another window are dropped at once."""

    def setup(self, params: Mapping[str, str]) -> None:
        super().setup(params)
        self.output = params["output"]
        self.size_us = int(params["size_us"])
        self.person = ValueState("person", codecs.JSON, ttl=self.size_us)  # [name, date_time]
        self.auctions = ListState("auctions", codecs.JSON, ttl=self.size_us)  # [reserve, date_time]

    def process_record(self, ctx: Context, record: Record) -> None:
        kind = record.value[:1]
        if kind == b"P":
            p = decode(record.value)
            assert isinstance(p, Person)
            person = [p.name, p.date_time]
            ctx.state_of(self.person).set(person)
            waiting = ctx.state_of(self.auctions)
            for reserve, ts in waiting:
                self._match(ctx, person, reserve, ts)
            waiting.clear()
        elif kind == b"A":
            a = decode(record.value)
            assert isinstance(a, Auction)
            person = ctx.state_of(self.person).get()
            if person is None:
                ctx.state_of(self.auctions).append([a.reserve, a.date_time])
            else:
                self._match(ctx, person, a.reserve, a.date_time)

    def _match(self, ctx: Context, person: list[Any], reserve: int, ts: int) -> None:
        name, person_ts = person
        if ts // self.size_us == person_ts // self.size_us:
            ctx.produce(self.output, b"%s|%s|%d" % (ctx.key, name.encode(), reserve), timestamp=max(ts, person_ts))


# ------------------------------------------------------------------ q11, q12: bids per bidder


class Q11Sessions(WindowedComputation):
    """q11 ('user sessions'): bids per bidder (:func:`by_bidder`) per session with a gap of
    ``window_size_sec``; value = the count, stamped at the session's end (last bid + gap).

    Beam also fires early every 100,000 bids of a session and allows 1.5 s of lateness; the
    generator makes no late data and no session here comes near that size, so neither is kept."""

    aggregator = Count()

    def setup(self, params: Mapping[str, str]) -> None:
        super().setup(params)
        self.windows = Session(int(params["gap_us"]))
        self.output = params["output"]

    def process_record(self, ctx: Context, record: Record) -> None:
        if record.value[:1] == b"B":
            super().process_record(ctx, record)

    def on_window(self, ctx: Context, start: int, end: int, acc: Any) -> None:
        ctx.produce(self.output, b"%d" % acc, timestamp=self.fired_at(end))


class Q12ProcessingTime(Computation):
    """q12: bids per bidder (:func:`by_bidder`) in processing-time windows: the first bid of a
    pane starts a wall-clock timer of ``window_size_sec``; when it fires, the pane's count is
    emitted (value = the count) and the next bid starts a new pane. Not deterministic: only the
    totals per bidder are fixed.

    The result is stamped at the pane's newest event time or the low watermark, whichever is
    later. That is the best a wall-clock timer can do: it holds no watermark, and
    ``ctx.low_watermark`` may be a heartbeat behind the watermark readers already act on, so a
    result can still be counted late downstream (nothing here is dropped for it)."""

    pane = ValueState("pane", codecs.JSON)  # [count, newest event time]

    def setup(self, params: Mapping[str, str]) -> None:
        super().setup(params)
        self.output = params["output"]
        self.window_us = int(params["window_us"])

    def process_record(self, ctx: Context, record: Record) -> None:
        if record.value[:1] != b"B":
            return
        pane = ctx.state_of(self.pane)
        count, newest = pane.get() or (0, record.timestamp)
        if not count:
            ctx.set_timer("pane", ctx.now() + self.window_us, TimeDomain.WALL_TIME)
        pane.set([count + 1, max(newest, record.timestamp)])

    def process_timer(self, ctx: Context, tag: str, time: int) -> None:
        pane = ctx.state_of(self.pane)
        count, newest = pane.get()  # the timer and the pane start and end together
        ctx.produce(self.output, b"%d" % count, timestamp=max(newest, ctx.low_watermark))
        pane.clear()


# ------------------------------------------------------------------ topologies


def _one(name_prefix: str, query: str, code: str, input_stream: str, output_stream: str, key_ranges: int,
         params: dict[str, str], extractor: str | None = None) -> Topology:
    """A query of one computation, ``<prefix><query>``."""
    topo = Topology(f"{name_prefix}nexmark-{query}")
    key = None if extractor is None else f"{_HERE}:{extractor}"
    topo.add_computation(f"{name_prefix}{query}", f"{_HERE}:{code}", inputs={input_stream: key},
                         outputs=[output_stream], key_ranges=key_ranges, params={"output": output_stream, **params})
    return topo


def _two(name_prefix: str, query: str, first: str, second: str, input_stream: str, output_stream: str,
         key_ranges: int, params: dict[str, str], extractor: str) -> Topology:
    """A query of two stages joined by the stream ``<prefix><query>.partial``, keyed by window."""
    between = f"{name_prefix}{query}.partial"
    topo = _one(name_prefix, query, first, input_stream, between, key_ranges, params, extractor)
    topo.add_computation(f"{name_prefix}{query}-max", f"{_HERE}:{second}", inputs={between: None},
                         outputs=[output_stream], key_ranges=key_ranges, params={"output": output_stream})
    return topo


def q0(name_prefix: str, input_stream: str, output_stream: str, *, key_ranges: int = 4,
       config: NexmarkConfig = DEFAULT) -> Topology:
    """Passthrough (:class:`Q0Pass`)."""
    return _one(name_prefix, "q0", "Q0Pass", input_stream, output_stream, key_ranges, {})


def q1(name_prefix: str, input_stream: str, output_stream: str, *, key_ranges: int = 4,
       config: NexmarkConfig = DEFAULT) -> Topology:
    """Currency conversion (:class:`Q1Convert`)."""
    return _one(name_prefix, "q1", "Q1Convert", input_stream, output_stream, key_ranges, {})


def q2(name_prefix: str, input_stream: str, output_stream: str, *, key_ranges: int = 4,
       config: NexmarkConfig = DEFAULT) -> Topology:
    """Selection (:class:`Q2Select`)."""
    return _one(name_prefix, "q2", "Q2Select", input_stream, output_stream, key_ranges,
                {"skip": str(config.auction_skip)})


def q3(name_prefix: str, input_stream: str, output_stream: str, *, key_ranges: int = 4,
       config: NexmarkConfig = DEFAULT) -> Topology:
    """Local item suggestion (:class:`Q3Join`)."""
    return _one(name_prefix, "q3", "Q3Join", input_stream, output_stream, key_ranges,
                {"wait_us": str(config.max_auctions_waiting_sec * SECOND_US)}, "by_person")


def q5(name_prefix: str, input_stream: str, output_stream: str, *, key_ranges: int = 4,
       config: NexmarkConfig = DEFAULT) -> Topology:
    """Hot items (:class:`Q5Count`, then :class:`Q5Max`)."""
    return _two(name_prefix, "q5", "Q5Count", "Q5Max", input_stream, output_stream, key_ranges,
                {"size_us": str(config.window_size_sec * SECOND_US),
                 "period_us": str(config.window_period_sec * SECOND_US)}, "by_auction")


def q7(name_prefix: str, input_stream: str, output_stream: str, *, key_ranges: int = 4,
       config: NexmarkConfig = DEFAULT) -> Topology:
    """Highest bid (:class:`Q7Partial`, then :class:`Q7Max`)."""
    return _two(name_prefix, "q7", "Q7Partial", "Q7Max", input_stream, output_stream, key_ranges,
                {"size_us": str(config.window_size_sec * SECOND_US)}, "by_bucket")


def q8(name_prefix: str, input_stream: str, output_stream: str, *, key_ranges: int = 4,
       config: NexmarkConfig = DEFAULT) -> Topology:
    """Monitor new users (:class:`Q8Join`)."""
    return _one(name_prefix, "q8", "Q8Join", input_stream, output_stream, key_ranges,
                {"size_us": str(config.window_size_sec * SECOND_US)}, "by_person")


def q11(name_prefix: str, input_stream: str, output_stream: str, *, key_ranges: int = 4,
        config: NexmarkConfig = DEFAULT) -> Topology:
    """User sessions (:class:`Q11Sessions`)."""
    return _one(name_prefix, "q11", "Q11Sessions", input_stream, output_stream, key_ranges,
                {"gap_us": str(config.window_size_sec * SECOND_US)}, "by_bidder")


def q12(name_prefix: str, input_stream: str, output_stream: str, *, key_ranges: int = 4,
        config: NexmarkConfig = DEFAULT) -> Topology:
    """Processing-time windows (:class:`Q12ProcessingTime`)."""
    return _one(name_prefix, "q12", "Q12ProcessingTime", input_stream, output_stream, key_ranges,
                {"window_us": str(config.window_size_sec * SECOND_US)}, "by_bidder")


QUERIES: dict[str, Callable[..., Topology]] = {
    "q0": q0, "q1": q1, "q2": q2, "q3": q3, "q5": q5, "q7": q7, "q8": q8, "q11": q11, "q12": q12,
}
