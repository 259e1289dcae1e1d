"""Nexmark q0–q12 as :class:`~runtime.Dataflow` s, written as a Flink or Bytewax user writes
them: decode the events, ``filter``, ``map``, ``key_by``, ``window`` with an aggregator,
``join`` / ``interval_join``, and ``process`` where a query needs a computation of its own.

Each query is a function ``qN(name_prefix, input_stream, output_stream, *, key_ranges=4,
config=NexmarkConfig(), sink_dir=None) -> Dataflow`` (:data:`FLOWS`), with the signature of the classic
versions in :mod:`bench.nexmark.queries` (which show the escape hatch: computations and key
extractors by hand). The input stream carries :func:`bench.nexmark.generator.records`; the
output is what :mod:`bench.nexmark.oracle` expects of the query (:data:`oracle.FLOW_ORACLES`).
The steps' code is in :mod:`bench.nexmark.steps`.

**What each compiles to** (runtime/dataflow.py): the steps up to an input's first ``key_by``
run in the input's key extractor, on the injector (a record they filter out is never sent),
and again in the stage; a ``window`` then a ``process`` or another stateless step run in one
computation; a ``key_by`` after a stateful step is one hop to the next; the sink the bench
gives (``sink_dir``) runs in the last stage. So q0, q1 are one stateless stage; q2, q3, q8,
q9 (its winners), q10, q11, q12 one keyed stage; q4, q5, q6 and q7 two. Without
``sink_dir`` the results go to ``output_stream`` (the tests read it in process).

**Deviations from Beam's queries**, besides those of the classic versions (the module doc
of :mod:`bench.nexmark.queries`):

- q3 and q8 key people and auctions with one ``key_by`` (a person by its id, an auction by
  its seller) and split them after it: two ``key_by`` on one input would read it twice,
  which costs a hop through a stateless stage (runtime/dataflow.py).
- q5 and q7 find each window's maximum in a second ``window``: the first stage's results of
  one window are all stamped at its end T, so a one-microsecond tumbling window ``[T, T+1)``
  per window start collects exactly them and fires when the watermark passes T, as the
  classic second stage's timer at T + 1 does (the same output, the same stamps).
- q8 is a window join: a match is emitted when its window fires, stamped at the window's end
  (Beam's join at the window's end), not as soon as both sides are in as the classic q8 does.
- q4 (average price per category) and q6 (average selling price per seller) build on q9's
  winning bids (:class:`~bench.nexmark.steps.WinningBid`); q4 averages them per category in
  sliding windows of ``window_size_sec`` every ``window_period_sec`` (Beam's q4); q6 keeps
  each seller's last 10 in event-time order (so the averages do not depend on arrival order).
- q10 (log to sharded files) emits each event as a line naming its file
  (``<window start>/<shard>``) for a sink to write, rather than writing files per pane.
- q12 is the classic one as a ``process`` step (processing-time panes).
"""

from __future__ import annotations

from collections.abc import Callable

from bench.nexmark import steps as s
from bench.nexmark.generator import SECOND_US, NexmarkConfig
from bench.nexmark.sink import OutputSink
from runtime import Dataflow, KeyedStream, Stream, codecs
from runtime.codecs import Codec
from runtime.windows import Count, Mean, Session, Sliding, Tumbling

DEFAULT = NexmarkConfig()


def _flow(prefix: str, query: str, key_ranges: int) -> Dataflow:
    return Dataflow(f"{prefix}nexmark-{query}", key_ranges=key_ranges)


def _events(flow: Dataflow, stream: str) -> Stream:
    return flow.input(stream, codec=s.EVENTS, name=f"{flow.name}.events")


def _out(stream: Stream, output_stream: str, sink_dir: str | None, codec: Codec = codecs.BYTES) -> None:
    """The query's results: to ``output_stream``, or (``sink_dir``, as the bench runs it) to
    :class:`~bench.nexmark.sink.OutputSink` writing under ``sink_dir``, fused into the
    query's last stage as a user's ``sink`` is (runtime/dataflow.py)."""
    if sink_dir is None:
        stream.output(output_stream, codec=codec)
    else:
        stream.sink(OutputSink, name=f"{output_stream}.sink", codec=codec, path=sink_dir)


def q0(name_prefix: str, input_stream: str, output_stream: str, *, key_ranges: int = 4,
       config: NexmarkConfig = DEFAULT, sink_dir: str | None = None) -> Dataflow:
    """Passthrough: every event decoded and encoded again (Beam's q0 measures the codec)."""
    flow = _flow(name_prefix, "q0", key_ranges)
    _out(_events(flow, input_stream), output_stream, sink_dir, s.EVENTS)
    return flow


def q1(name_prefix: str, input_stream: str, output_stream: str, *, key_ranges: int = 4,
       config: NexmarkConfig = DEFAULT, sink_dir: str | None = None) -> Dataflow:
    """Currency conversion: every bid, its price × 89 // 100."""
    flow = _flow(name_prefix, "q1", key_ranges)
    _out(_events(flow, input_stream).filter(s.is_bid).map(s.in_euros), output_stream, sink_dir, s.EVENTS)
    return flow


def q2(name_prefix: str, input_stream: str, output_stream: str, *, key_ranges: int = 4,
       config: NexmarkConfig = DEFAULT, sink_dir: str | None = None) -> Dataflow:
    """Selection: bids on every ``auction_skip``-th auction, keyed by auction,
    ``auction|price`` (the skip is a parameter: a ``process`` step's)."""
    flow = _flow(name_prefix, "q2", key_ranges)
    results = (_events(flow, input_stream).filter(s.is_bid).key_by(s.auction_key)
               .process(s.EveryNthAuction, name=f"{name_prefix}q2.select", skip=str(config.auction_skip)))
    _out(results, output_stream, sink_dir)
    return flow


def _people_and_auctions(flow: Dataflow, stream: str, which: Callable[..., bool]) -> tuple[KeyedStream, KeyedStream]:
    """People by id and auctions by seller (those ``which`` keeps), keyed once and split."""
    keyed = _events(flow, stream).filter(which).key_by(s.person_key)
    return keyed.filter(s.is_person), keyed.filter(s.is_auction)


def q3(name_prefix: str, input_stream: str, output_stream: str, *, key_ranges: int = 4,
       config: NexmarkConfig = DEFAULT, sink_dir: str | None = None) -> Dataflow:
    """Local item suggestion: people in OR, ID or CA with their auctions in category 10, an
    interval join (a person and an auction less than ``max_auctions_waiting_sec`` apart),
    keyed by person: ``name|city|state|auction id``, stamped at the later of the two."""
    flow = _flow(name_prefix, "q3", key_ranges)
    people, auctions = _people_and_auctions(flow, input_stream, s.q3_relevant)
    wait = config.max_auctions_waiting_sec * SECOND_US
    results = (people.map(s.person_fields)
               .interval_join(auctions.map(s.auction_id), -(wait - 1), wait - 1, name=f"{name_prefix}q3.join")
               .map(s.suggestion))
    _out(results, output_stream, sink_dir, codecs.STR)
    return flow


def _winners(flow: Dataflow, stream: str, prefix: str, query: str) -> KeyedStream:
    """q9's winning bids, one per auction with a valid bid, on its auction's ``expires``."""
    return (_events(flow, stream).filter(s.is_auction_or_bid).key_by(s.auction_key)
            .process(s.WinningBid, name=f"{prefix}{query}.winners"))


def q4(name_prefix: str, input_stream: str, output_stream: str, *, key_ranges: int = 4,
       config: NexmarkConfig = DEFAULT, sink_dir: str | None = None) -> Dataflow:
    """Average price per category: the winning bids (q9) by their auction's category, the mean
    price per sliding window: ``<window start>|<mean>`` keyed by category."""
    flow = _flow(name_prefix, "q4", key_ranges)
    windows = Sliding(config.window_size_sec * SECOND_US, config.window_period_sec * SECOND_US)
    results = (_winners(flow, input_stream, name_prefix, "q4").key_by(s.category_key).map(s.winning_price)
               .window(windows, Mean(), name=f"{name_prefix}q4.means").map(s.category_average))
    _out(results, output_stream, sink_dir)
    return flow


def q5(name_prefix: str, input_stream: str, output_stream: str, *, key_ranges: int = 4,
       config: NexmarkConfig = DEFAULT, sink_dir: str | None = None) -> Dataflow:
    """Hot items: bids per auction per sliding window of ``window_size_sec`` every
    ``window_period_sec``, then per window (keyed by its start) the auctions with the most:
    ``auction|count``, stamped a µs after the window's end."""
    flow = _flow(name_prefix, "q5", key_ranges)
    windows = Sliding(config.window_size_sec * SECOND_US, config.window_period_sec * SECOND_US)
    counts = (_events(flow, input_stream).filter(s.is_bid).map(s.auction_of).key_by(s.decimal)
              .window(windows, s.Tally(), name=f"{name_prefix}q5.counts"))
    results = (counts.key_by(s.window_start, name=f"{name_prefix}q5.by_window").map(s.window_value)
               .window(Tumbling(1), s.Leaders(), name=f"{name_prefix}q5.hottest").flat_map(s.hot_items))
    _out(results, output_stream, sink_dir)
    return flow


def q6(name_prefix: str, input_stream: str, output_stream: str, *, key_ranges: int = 4,
       config: NexmarkConfig = DEFAULT, sink_dir: str | None = None) -> Dataflow:
    """Average selling price by seller: the winning bids (q9) by seller; for each, the mean
    of the seller's last 10 (rounded down), stamped a µs after its auction expired."""
    flow = _flow(name_prefix, "q6", key_ranges)
    results = (_winners(flow, input_stream, name_prefix, "q6").key_by(s.seller_key)
               .process(s.SellerAverage, name=f"{name_prefix}q6.averages"))
    _out(results, output_stream, sink_dir)
    return flow


def q7(name_prefix: str, input_stream: str, output_stream: str, *, key_ranges: int = 4,
       config: NexmarkConfig = DEFAULT, sink_dir: str | None = None) -> Dataflow:
    """Highest bid: per tumbling window of ``window_size_sec``, partial maxima over
    :data:`~bench.nexmark.steps.FANOUT` buckets, then the maximum per window (keyed by its
    start): every bid at the highest price, encoded, stamped a µs after the window's end."""
    flow = _flow(name_prefix, "q7", key_ranges)
    partial = (_events(flow, input_stream).filter(s.is_bid).key_by(s.bucket).map(s.price_and_bid)
               .window(Tumbling(config.window_size_sec * SECOND_US), s.Leaders(), name=f"{name_prefix}q7.partial"))
    results = (partial.key_by(s.window_start, name=f"{name_prefix}q7.by_window").map(s.window_value)
               .window(Tumbling(1), s.Leaders(), name=f"{name_prefix}q7.highest").flat_map(s.top_bids))
    _out(results, output_stream, sink_dir)
    return flow


def q8(name_prefix: str, input_stream: str, output_stream: str, *, key_ranges: int = 4,
       config: NexmarkConfig = DEFAULT, sink_dir: str | None = None) -> Dataflow:
    """Monitor new users: a window join of people and the auctions they opened in the
    tumbling window of ``window_size_sec`` they registered in, keyed by person:
    ``id|name|reserve``, stamped at the window's end."""
    flow = _flow(name_prefix, "q8", key_ranges)
    people, auctions = _people_and_auctions(flow, input_stream, s.is_person_or_auction)
    results = (people.map(s.person_fields)
               .join(auctions.map(s.auction_reserve), Tumbling(config.window_size_sec * SECOND_US),
                     name=f"{name_prefix}q8.join")
               .map(s.new_user))
    _out(results, output_stream, sink_dir, codecs.STR)
    return flow


def q9(name_prefix: str, input_stream: str, output_stream: str, *, key_ranges: int = 4,
       config: NexmarkConfig = DEFAULT, sink_dir: str | None = None) -> Dataflow:
    """Winning bids: per auction, the highest valid bid (:class:`~bench.nexmark.steps.WinningBid`),
    encoded, keyed by auction, stamped when the auction expires."""
    flow = _flow(name_prefix, "q9", key_ranges)
    _out(_winners(flow, input_stream, name_prefix, "q9").map(s.winning_bid), output_stream, sink_dir)
    return flow


def q10(name_prefix: str, input_stream: str, output_stream: str, *, key_ranges: int = 4,
        config: NexmarkConfig = DEFAULT, sink_dir: str | None = None) -> Dataflow:
    """Log to sharded files: every event, keyed by one of :data:`~bench.nexmark.steps.SHARDS`
    shards, as ``<window start>/<shard>|<event>`` (windows of ``window_size_sec``)."""
    flow = _flow(name_prefix, "q10", key_ranges)
    results = (_events(flow, input_stream).key_by(s.shard)
               .process(s.LogLines, name=f"{name_prefix}q10.log", window_us=str(config.window_size_sec * SECOND_US)))
    _out(results, output_stream, sink_dir)
    return flow


def q11(name_prefix: str, input_stream: str, output_stream: str, *, key_ranges: int = 4,
        config: NexmarkConfig = DEFAULT, sink_dir: str | None = None) -> Dataflow:
    """User sessions: bids per bidder per session with a gap of ``window_size_sec``: the count,
    stamped at the session's end (no early firings, no allowed lateness, as the classic q11)."""
    flow = _flow(name_prefix, "q11", key_ranges)
    results = (_events(flow, input_stream).filter(s.is_bid).key_by(s.bidder_key)
               .window(Session(config.window_size_sec * SECOND_US), Count(), name=f"{name_prefix}q11.sessions")
               .map(s.count_text))
    _out(results, output_stream, sink_dir, codecs.STR)
    return flow


def q12(name_prefix: str, input_stream: str, output_stream: str, *, key_ranges: int = 4,
        config: NexmarkConfig = DEFAULT, sink_dir: str | None = None) -> Dataflow:
    """Processing-time windows: bids per bidder in panes of ``window_size_sec`` of wall time
    (:class:`~bench.nexmark.steps.BidsPerPane`); only each bidder's total is fixed."""
    flow = _flow(name_prefix, "q12", key_ranges)
    results = (_events(flow, input_stream).filter(s.is_bid).key_by(s.bidder_key)
               .process(s.BidsPerPane, name=f"{name_prefix}q12.panes", window_us=str(config.window_size_sec * SECOND_US)))
    _out(results, output_stream, sink_dir)
    return flow


FLOWS: dict[str, Callable[..., Dataflow]] = {
    "q0": q0, "q1": q1, "q2": q2, "q3": q3, "q4": q4, "q5": q5, "q6": q6, "q7": q7, "q8": q8, "q9": q9,
    "q10": q10, "q11": q11, "q12": q12,
}
