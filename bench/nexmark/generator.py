"""The Nexmark event generator, written from the specification of Beam's Nexmark suite.

Event number ``n`` is exactly one event, a pure function of ``(config, n)``:

- In each block of 50 numbers, 1 is a person, 3 are auctions and 46 are bids (``n % 50`` is
  0, 1-3 and 4-49). Person and auction ids count up from 1000 in that order, so the id of
  every event is known from ``n`` alone; categories are 10-14.
- Sellers and bidders are drawn from the last ``num_active_people`` people (plus 10 not yet
  created, so a person can show up after their first auction or bid), bids from the last
  ``num_in_flight_auctions`` auctions (plus 10 ahead). Hot keys: a bid is for the *hot
  auction* (the first of the current batch of 100 auctions) with probability
  ``1 - 1/hot_auction_ratio``; an auction's seller is the first person of the current batch
  of 100 with probability ``1 - 1/hot_sellers_ratio``, a bid's bidder the second one with
  probability ``1 - 1/hot_bidders_ratio``.
- An auction runs for a random time averaging the time it takes to create
  ``num_in_flight_auctions`` more auctions.
- Event time: ``base_time_us + n * 1e6 / events_per_second`` (µs, as millstream stamps).
- Strings are padded with ``extra`` so that events average 200 (person), 500 (auction) and
  100 (bid) bytes (Beam's ``avg*ByteSize``), which is what makes the wire volume realistic.

**Out of order** (the spec's ``outOfOrderGroupSize``): the stream is cut into groups of
``out_of_order_group_size`` positions, and within each group the events come in a fixed
pseudo-random order (position ``p`` carries event number ``p - p % g + (p * 953) % g``). So an
event is at most ``g - 1`` inter-event delays late, and after position ``p`` nothing older than
the first event of the group of ``p + 1`` can come: :func:`watermark_after`. Positions
``[a, b)`` carry exactly the event numbers ``[a, b)`` when ``a`` and ``b`` are multiples of
``g``. The spec's other source of disorder (``probDelayedEvent``: events held back past the
watermark) makes late data on purpose, so it is left out: every query here has an exact oracle.

**Deviations from Beam**, none of which changes a distribution: a constant event rate (Beam's
default is a sine wave around 10,000 events/s) on one timeline (Beam splits the stream over
100 generators); draws from SplitMix64 seeded with the event number rather than
``java.util.Random`` (seeding Python's Mersenne Twister per event costs ~5 µs); random
strings are slices of one fixed random text rather than drawn letter by letter.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

SECOND_US = 1_000_000
FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
NUM_CATEGORIES = 5
PERSON_PROPORTION, AUCTION_PROPORTION, BID_PROPORTION = 1, 3, 46
PROPORTION_DENOMINATOR = PERSON_PROPORTION + AUCTION_PROPORTION + BID_PROPORTION
ID_LEAD = 10  # people and auctions not created yet that a new event may still refer to
HOT_BATCH = 100  # the hot seller, bidder and auction are the first ids of their batch of 100
_SHUFFLE = 953  # a prime: p * 953 % g permutes each group of g positions (g not a multiple of it)
_TEXT_SIZE = 8192  # random strings are slices of one random text this long

US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
US_CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond", "Seattle",
             "Kent", "Cheyenne")
FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris")


@dataclass(frozen=True)
class NexmarkConfig:
    """What shapes the events and the queries, with the defaults of Beam's NexmarkConfiguration.

    Times are whole seconds as in Beam (the queries work in µs); ``base_time_us`` is the event
    time of event 0."""

    base_time_us: int = 1_700_000_000_000_000
    events_per_second: int = 10_000
    out_of_order_group_size: int = 1
    hot_auction_ratio: int = 2
    hot_sellers_ratio: int = 4
    hot_bidders_ratio: int = 4
    num_in_flight_auctions: int = 100
    num_active_people: int = 1000
    avg_person_bytes: int = 200
    avg_auction_bytes: int = 500
    avg_bid_bytes: int = 100
    # The queries' parameters.
    window_size_sec: int = 10  # q5, q7 and q8 windows; q11's session gap; q12's processing-time window
    window_period_sec: int = 5  # q5's sliding period
    auction_skip: int = 123  # q2 keeps bids on auctions whose id is a multiple of it
    max_auctions_waiting_sec: int = 600  # q3: how far apart a person and an auction still join

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if name != "base_time_us" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"NexmarkConfig: {name}={value!r} must be a whole number >= 1")
        if self.out_of_order_group_size % _SHUFFLE == 0:
            raise ValueError(f"NexmarkConfig: out_of_order_group_size={self.out_of_order_group_size} must not be "
                             f"a multiple of {_SHUFFLE} (the shuffle would not be a permutation)")
        biggest = max(self.avg_person_bytes, self.avg_auction_bytes, self.avg_bid_bytes)
        if biggest > _TEXT_SIZE // 2:
            raise ValueError(f"NexmarkConfig: average event sizes must be at most {_TEXT_SIZE // 2} bytes, "
                             f"not {biggest}")
        if self.window_period_sec > self.window_size_sec:
            raise ValueError(f"NexmarkConfig: window_period_sec={self.window_period_sec} must be at most "
                             f"window_size_sec={self.window_size_sec}")


@dataclass(frozen=True, slots=True)
class Person:
    """Someone registering on the auction site."""

    id: int
    name: str
    email: str
    credit_card: str
    city: str
    state: str
    date_time: int
    extra: str


@dataclass(frozen=True, slots=True)
class Auction:
    """An item put up for auction by ``seller`` until ``expires`` (µs); prices in cents."""

    id: int
    item_name: str
    description: str
    initial_bid: int
    reserve: int
    date_time: int
    expires: int
    seller: int
    category: int
    extra: str


@dataclass(frozen=True, slots=True)
class Bid:
    """A bid of ``bidder`` on ``auction``."""

    auction: int
    bidder: int
    price: int  # cents
    date_time: int
    extra: str


Event = Person | Auction | Bid

# ------------------------------------------------------------------ randomness

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


class _Draws:
    """SplitMix64: the random draws of one event, seeded with its event number."""

    __slots__ = ("_s",)

    def __init__(self, seed: int) -> None:
        self._s = seed & _MASK

    def _next(self) -> int:
        self._s = s = (self._s + _GOLDEN) & _MASK
        z = ((s ^ (s >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        return z ^ (z >> 31)

    def below(self, n: int) -> int:
        """Uniform in ``[0, n)`` (n < 2**32 here, so the multiply-shift bias is negligible)."""
        return (self._next() * n) >> 64

    def unit(self) -> float:
        """Uniform in ``[0, 1)``."""
        return (self._next() >> 11) * (1.0 / (1 << 53))


def _text(size: int) -> str:
    d = _Draws(0x6E65786D61726B)  # "nexmark"
    return "".join(" " if d.below(13) == 0 else chr(97 + d.below(26)) for _ in range(size))


_TEXT = _text(_TEXT_SIZE)  # lowercase words and spaces


def _exact_string(d: _Draws, size: int) -> str:
    at = d.below(len(_TEXT) - size)
    return _TEXT[at:at + size]


def _string(d: _Draws, max_size: int) -> str:
    """3 to ``max_size - 1`` characters, trimmed, as Beam's ``nextString``."""
    return _exact_string(d, 3 + d.below(max_size - 3)).strip()


def _extra(d: _Draws, current: int, average: int) -> str:
    """Padding that brings an event of ``current`` bytes to ``average`` on average (±20%)."""
    if current >= average:
        return ""
    rest = average - current
    delta = round(rest * 0.2)
    return _exact_string(d, rest - delta + (d.below(2 * delta) if delta else 0))


def _price(d: _Draws) -> int:
    """Cents, log-uniform from $1 to $1,000,000."""
    return round(10.0 ** (d.unit() * 6.0) * 100.0)


# ------------------------------------------------------------------ ids


def last_person(n: int) -> int:
    """The newest person id (from 0) as of event ``n``: ``n``'s own if it is a person."""
    epoch, offset = divmod(n, PROPORTION_DENOMINATOR)
    return epoch * PERSON_PROPORTION + min(offset, PERSON_PROPORTION - 1)


def last_auction(n: int) -> int:
    """The newest auction id (from 0) as of event ``n``: ``n``'s own if it is an auction."""
    epoch, offset = divmod(n, PROPORTION_DENOMINATOR)
    if offset < PERSON_PROPORTION:
        epoch, offset = epoch - 1, AUCTION_PROPORTION - 1
    elif offset >= PERSON_PROPORTION + AUCTION_PROPORTION:
        offset = AUCTION_PROPORTION - 1
    else:
        offset -= PERSON_PROPORTION
    return epoch * AUCTION_PROPORTION + offset


def _some_person(config: NexmarkConfig, n: int, d: _Draws) -> int:
    people = last_person(n) + 1
    active = min(people, config.num_active_people)
    return people - active + d.below(active + ID_LEAD)


def _some_auction(config: NexmarkConfig, n: int, d: _Draws) -> int:
    newest = last_auction(n)
    oldest = max(newest - config.num_in_flight_auctions, 0)
    return oldest + d.below(newest - oldest + 1 + ID_LEAD)


# ------------------------------------------------------------------ events


def timestamp(config: NexmarkConfig, n: int) -> int:
    """Event time of event number ``n`` (µs since the epoch)."""
    return config.base_time_us + n * SECOND_US // config.events_per_second


def event_number(config: NexmarkConfig, position: int) -> int:
    """The event number that comes at ``position`` of the stream (the module doc's shuffle)."""
    g = config.out_of_order_group_size
    return position - position % g + position * _SHUFFLE % g


def watermark_after(config: NexmarkConfig, position: int) -> int:
    """What an injector may promise once it has sent positions up to ``position``: no later
    position carries an event older than this."""
    nxt = position + 1
    return timestamp(config, nxt - nxt % config.out_of_order_group_size)


def event(config: NexmarkConfig, n: int) -> Event:
    """Event number ``n``."""
    d = _Draws(n)
    ts = timestamp(config, n)
    kind = n % PROPORTION_DENOMINATOR
    if kind >= PERSON_PROPORTION + AUCTION_PROPORTION:
        return _bid(config, n, d, ts)
    if kind >= PERSON_PROPORTION:
        return _auction(config, n, d, ts)
    return _person(config, n, d, ts)


def _person(config: NexmarkConfig, n: int, d: _Draws, ts: int) -> Person:
    name = f"{FIRST_NAMES[d.below(len(FIRST_NAMES))]} {LAST_NAMES[d.below(len(LAST_NAMES))]}"
    email = f"{_string(d, 7)}@{_string(d, 5)}.com"
    card = " ".join(f"{d.below(10_000):04d}" for _ in range(4))
    city = US_CITIES[d.below(len(US_CITIES))]
    state = US_STATES[d.below(len(US_STATES))]
    size = 8 + len(name) + len(email) + len(card) + len(city) + len(state)
    return Person(FIRST_PERSON_ID + last_person(n), name, email, card, city, state, ts,
                  _extra(d, size, config.avg_person_bytes))


def _auction(config: NexmarkConfig, n: int, d: _Draws, ts: int) -> Auction:
    if d.below(config.hot_sellers_ratio) > 0:
        seller = last_person(n) // HOT_BATCH * HOT_BATCH
    else:
        seller = _some_person(config, n, d)
    category = FIRST_CATEGORY_ID + d.below(NUM_CATEGORIES)
    initial = _price(d)
    # Long enough, on average, for num_in_flight_auctions more auctions to be created.
    ahead = config.num_in_flight_auctions * PROPORTION_DENOMINATOR // AUCTION_PROPORTION
    horizon = timestamp(config, n + ahead) - ts
    expires = ts + 1 + d.below(max(2 * horizon, 1))
    name, description = _string(d, 20), _string(d, 100)
    reserve = initial + _price(d)
    size = 8 + len(name) + len(description) + 40
    return Auction(FIRST_AUCTION_ID + last_auction(n), name, description, initial, reserve, ts, expires,
                   FIRST_PERSON_ID + seller, category, _extra(d, size, config.avg_auction_bytes))


def _bid(config: NexmarkConfig, n: int, d: _Draws, ts: int) -> Bid:
    if d.below(config.hot_auction_ratio) > 0:
        auction = last_auction(n) // HOT_BATCH * HOT_BATCH
    else:
        auction = _some_auction(config, n, d)
    if d.below(config.hot_bidders_ratio) > 0:
        bidder = last_person(n) // HOT_BATCH * HOT_BATCH + 1  # not the hot seller
    else:
        bidder = _some_person(config, n, d)
    return Bid(FIRST_AUCTION_ID + auction, FIRST_PERSON_ID + bidder, _price(d), ts,
               _extra(d, 32, config.avg_bid_bytes))  # 32: four 8-byte numbers


# ------------------------------------------------------------------ the wire

# One line of '|'-separated fields, kind first, then the numbers a key extractor needs (so
# it can split off just those), then the rest. Generated strings never contain '|'. Measured
# on this project's 2-core machine with timeit (Python 3.11, best of 5): a bid (~103 bytes)
# encodes in 0.4 µs and decodes in 1.5 µs, 0.8 µs of which is the frozen dataclass; a person
# (~220 bytes) 0.4 / 1.7 µs, an auction (~520 bytes) 0.6 / 2.5 µs. A whole record (generate
# and encode) costs ~7 µs: one core makes ~140,000 events/s.
#   P|id|state|city|name|email|credit_card|date_time|extra
#   A|id|seller|category|initial_bid|reserve|date_time|expires|item_name|description|extra
#   B|auction|bidder|price|date_time|extra


def encode(e: Event) -> bytes:
    """The event as a record value (UTF-8; its text fields must not contain ``|``)."""
    if isinstance(e, Bid):
        return f"B|{e.auction}|{e.bidder}|{e.price}|{e.date_time}|{e.extra}".encode()
    if isinstance(e, Auction):
        return (f"A|{e.id}|{e.seller}|{e.category}|{e.initial_bid}|{e.reserve}|{e.date_time}|{e.expires}|"
                f"{e.item_name}|{e.description}|{e.extra}").encode()
    return (f"P|{e.id}|{e.state}|{e.city}|{e.name}|{e.email}|{e.credit_card}|{e.date_time}|"
            f"{e.extra}").encode()


def decode(value: bytes) -> Event:
    """The event :func:`encode` made ``value`` from."""
    kind, *f = value.decode().split("|")
    if kind == "B":
        auction, bidder, price, ts, extra = f
        return Bid(int(auction), int(bidder), int(price), int(ts), extra)
    if kind == "A":
        id_, seller, category, initial, reserve, ts, expires, name, description, extra = f
        return Auction(int(id_), name, description, int(initial), int(reserve), int(ts), int(expires),
                       int(seller), int(category), extra)
    if kind == "P":
        id_, state, city, name, email, card, ts, extra = f
        return Person(int(id_), name, email, card, city, state, int(ts), extra)
    raise ValueError(f"not a Nexmark event: {value[:40]!r}")


def records(config: NexmarkConfig, start: int, stop: int) -> Iterator[tuple[bytes, bytes, int]]:
    """``(key, value, timestamp)`` of stream positions ``[start, stop)``, for an injector: the
    key is the event number (so keys spread evenly), the value :func:`encode` d."""
    for position in range(start, stop):
        n = event_number(config, position)
        e = event(config, n)
        yield b"%d" % n, encode(e), e.date_time
