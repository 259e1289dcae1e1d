"""The Nexmark benchmark (bench/nexmark): the generator against its specification, and every
query, classic (bench/nexmark/queries.py) and on flows (bench/nexmark/flows.py), run through
the test kit (the real worker, virtual time) against the plain-Python oracle."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.nexmark import flows, oracle, queries
from bench.nexmark import run as run_nexmark
from bench.nexmark.generator import (
    FIRST_AUCTION_ID,
    FIRST_PERSON_ID,
    SECOND_US,
    Auction,
    Bid,
    NexmarkConfig,
    Person,
    decode,
    encode,
    event,
    event_number,
    records,
    timestamp,
    watermark_after,
)
from bench.nexmark.sink import read_outputs
from cli.main import build_parser
from runtime.errors import MillstreamError
from runtime.testing import TestRun

DEFAULT = NexmarkConfig()
# Slow enough that a few thousand events span many windows; disordered within groups of 25.
SMALL = NexmarkConfig(events_per_second=100, out_of_order_group_size=25, window_size_sec=2,
                      window_period_sec=1, auction_skip=7)
N = 3000
# q3: sellers drawn from everyone (no hot seller), so that many auctions meet a person in OR,
# ID or CA, some of them more than the 10 s horizon apart.
Q3 = NexmarkConfig(events_per_second=100, out_of_order_group_size=25, hot_sellers_ratio=1,
                   max_auctions_waiting_sec=10)
_RECORDS: dict[tuple[NexmarkConfig, int], list[tuple[bytes, bytes, int]]] = {}


def _records(config: NexmarkConfig, n: int) -> list[tuple[bytes, bytes, int]]:
    if (config, n) not in _RECORDS:
        _RECORDS[(config, n)] = list(records(config, 0, n))
    return _RECORDS[(config, n)]


# ------------------------------------------------------------------ the generator


def test_events_are_a_pure_function_of_the_config_and_the_event_number() -> None:
    assert list(records(DEFAULT, 0, 500)) == list(records(DEFAULT, 0, 500))
    assert [event(DEFAULT, n) for n in (7, 0, 4999, 123_456_789)] == [
        event(NexmarkConfig(), n) for n in (7, 0, 4999, 123_456_789)]
    assert list(records(DEFAULT, 1000, 1100)) == list(records(DEFAULT, 0, 1100))[1000:]
    no_hot_bidders = NexmarkConfig(hot_bidders_ratio=1)
    assert [event(DEFAULT, n) for n in range(50, 100)] != [event(no_hot_bidders, n) for n in range(50, 100)]


def test_each_block_of_fifty_is_one_person_three_auctions_and_46_bids() -> None:
    kinds = [type(event(DEFAULT, n)) for n in range(5000)]
    for block in range(0, 5000, 50):
        assert kinds[block:block + 50] == [Person] + [Auction] * 3 + [Bid] * 46


def test_ids_count_up_from_the_first_ids_and_references_stay_near_them() -> None:
    events = [event(DEFAULT, n) for n in range(20_000)]
    people = [e for e in events if isinstance(e, Person)]
    auctions = [e for e in events if isinstance(e, Auction)]
    assert [p.id for p in people] == list(range(FIRST_PERSON_ID, FIRST_PERSON_ID + 400))
    assert [a.id for a in auctions] == list(range(FIRST_AUCTION_ID, FIRST_AUCTION_ID + 1200))
    assert {a.category for a in auctions} == {10, 11, 12, 13, 14}
    newest_person, newest_auction = FIRST_PERSON_ID - 1, FIRST_AUCTION_ID - 1
    for e in events:
        if isinstance(e, Person):
            newest_person = e.id
        elif isinstance(e, Auction):
            newest_auction = e.id
            assert newest_person - 1000 < e.seller <= newest_person + 10  # active people, 10 ahead
            assert e.date_time < e.expires
            assert e.initial_bid < e.reserve
        else:
            assert newest_auction - 100 <= e.auction <= newest_auction + 10  # in flight, 10 ahead
            assert newest_person - 1000 < e.bidder <= newest_person + 10
            assert 100 <= e.price <= 100_000_000


def test_hot_auctions_sellers_and_bidders_are_as_skewed_as_the_ratios_say() -> None:
    events = [event(DEFAULT, n) for n in range(50_000)]
    bids = [e for e in events if isinstance(e, Bid)]
    auctions = [e for e in events if isinstance(e, Auction)]
    # Hot ids are the first (auction, seller) or second (bidder) of their batch of 100; a few
    # random picks land there too.
    hot_auction = sum((b.auction - FIRST_AUCTION_ID) % 100 == 0 for b in bids) / len(bids)
    hot_bidder = sum((b.bidder - FIRST_PERSON_ID) % 100 == 1 for b in bids) / len(bids)
    hot_seller = sum((a.seller - FIRST_PERSON_ID) % 100 == 0 for a in auctions) / len(auctions)
    assert 0.48 < hot_auction < 0.53  # 1 - 1/2
    assert 0.73 < hot_bidder < 0.77  # 1 - 1/4
    assert 0.72 < hot_seller < 0.78  # 1 - 1/4


def test_events_average_the_specified_sizes_on_the_wire() -> None:
    sizes: dict[bytes, list[int]] = {b"P": [], b"A": [], b"B": []}
    for _, value, _ in records(DEFAULT, 0, 10_000):
        sizes[value[:1]].append(len(value))
    for kind, average in ((b"P", 200), (b"A", 500), (b"B", 100)):
        assert average <= sum(sizes[kind]) / len(sizes[kind]) <= average * 1.15


def test_timestamps_follow_the_rate_and_the_watermark_holds_out_of_order() -> None:
    assert [timestamp(DEFAULT, n) - DEFAULT.base_time_us for n in (0, 1, 10_000)] == [0, 100, SECOND_US]
    recs = _records(SMALL, N)
    keys = [int(k) for k, _, _ in recs]
    assert keys != sorted(keys) and sorted(keys) == list(range(N))  # each group of 25 is shuffled
    for position, (_, value, ts) in enumerate(recs):
        assert decode(value).date_time == ts
        if position:
            assert ts >= watermark_after(SMALL, position - 1)  # the promise is never broken
        assert abs(position - event_number(SMALL, position)) < 25  # and disorder is bounded
    assert watermark_after(SMALL, N - 1) == timestamp(SMALL, N)


def test_config_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="events_per_second=0"):
        NexmarkConfig(events_per_second=0)
    with pytest.raises(ValueError, match="multiple of 953"):
        NexmarkConfig(out_of_order_group_size=953 * 2)
    with pytest.raises(ValueError, match="window_period_sec=20"):
        NexmarkConfig(window_period_sec=20)


def test_generated_events_round_trip_through_the_wire_encoding() -> None:
    for n in range(2000):
        e = event(DEFAULT, n)
        assert decode(encode(e)) == e
    with pytest.raises(ValueError, match="not a Nexmark event"):
        decode(b"X|1")


_TEXT = st.text(st.characters(min_codepoint=32, max_codepoint=126, exclude_characters="|"), max_size=30)
_INT = st.integers(min_value=0, max_value=2**62)


@given(st.one_of(
    st.builds(Person, _INT, _TEXT, _TEXT, _TEXT, _TEXT, _TEXT, _INT, _TEXT),
    st.builds(Auction, _INT, _TEXT, _TEXT, _INT, _INT, _INT, _INT, _INT, _INT, _TEXT),
    st.builds(Bid, _INT, _INT, _INT, _INT, _TEXT),
))
def test_any_event_round_trips_through_the_wire_encoding(e: Person | Auction | Bid) -> None:
    assert decode(encode(e)) == e


# ------------------------------------------------------------------ the queries against the oracle


def _run(query: str, config: NexmarkConfig, n: int, chunk: int = 100, *, flow: bool = False,
         restart_at: int | None = None, sink_dir: str | None = None) -> TestRun:
    """Inject ``n`` events as an injector would: in chunks, each followed by the watermark the
    generator promises after it; at event ``restart_at``, every computation restarts from what
    it committed (as after a crash). ``sink_dir``: the flow writes there (the bench's sink)."""
    if flow:
        built = flows.FLOWS[query]("t-", "events", "out", key_ranges=3, config=config, sink_dir=sink_dir)
    else:
        built = queries.QUERIES[query]("t-", "events", "out", key_ranges=3, config=config)
    run = TestRun(built)
    recs = _records(config, n)
    for lo in range(0, n, chunk):
        for key, value, ts in recs[lo:lo + chunk]:
            run.inject("events", key, value, ts)
        run.advance_watermark("events", watermark_after(config, lo + chunk - 1))
        run.run_until_idle()
        if restart_at is not None and lo <= restart_at < lo + chunk:
            for computation in run.topology.computations:
                run.restart(computation)
    return run


def _late(run: TestRun) -> int:
    """Records any tablet (the collectors of the outputs included) received below its
    watermark, and records sent to late or dead-letter streams: none should be."""
    side = [s for s in run.streams if s.endswith((".late", ".dead_letter"))]
    return run.late() + sum(len(run.output(s)) for s in side)


@pytest.mark.parametrize(("query", "config", "n"), [
    ("q0", SMALL, N), ("q1", SMALL, N), ("q2", SMALL, N), ("q3", Q3, 4000), ("q5", SMALL, N), ("q7", SMALL, N), ("q8", SMALL, N), ("q11", SMALL, N),
])
def test_query_output_equals_the_oracle(query: str, config: NexmarkConfig, n: int) -> None:
    expected = oracle.ORACLES[query](config, _records(config, n))
    assert len(expected) >= 10  # the check means something
    with _run(query, config, n) as run:
        run.finish("events")
        run.run_until_idle()
        got = Counter((r.key, r.value, r.timestamp) for r in run.output("out"))
        assert _late(run) == 0
    assert got == expected


_FLOW_CASES = [("q0", SMALL, N), ("q1", SMALL, N), ("q2", SMALL, N), ("q3", Q3, 4000), ("q4", SMALL, N),
               ("q5", SMALL, N), ("q6", SMALL, N), ("q7", SMALL, N), ("q8", SMALL, N), ("q9", SMALL, N),
               ("q10", SMALL, N), ("q11", SMALL, N)]


@pytest.mark.parametrize(("query", "config", "n"), _FLOW_CASES)
def test_flow_output_equals_the_oracle_through_a_restart(query: str, config: NexmarkConfig, n: int) -> None:
    """Each query on flows, every computation restarted halfway (windows, joins, process
    steps' state and timers recover from what they committed)."""
    expected = oracle.FLOW_ORACLES[query](config, _records(config, n))
    assert len(expected) >= 10  # the check means something
    with _run(query, config, n, flow=True, restart_at=n // 2) as run:
        run.finish("events")
        run.run_until_idle()
        got = Counter((r.key, r.value, r.timestamp) for r in run.output("out"))
        assert _late(run) == 0
    assert got == expected


@pytest.mark.parametrize(("query", "config", "n"), [("q0", SMALL, N), ("q5", SMALL, N), ("q8", SMALL, N)])
def test_a_flow_writing_through_its_fused_sink_equals_the_oracle_through_a_restart(
        query: str, config: NexmarkConfig, n: int, tmp_path: Path) -> None:
    """As the bench runs them: the OutputSink at the end of the flow runs in its last stage,
    and what it committed, read back from its files, is the oracle's, once each."""
    expected = oracle.FLOW_ORACLES[query](config, _records(config, n))
    with _run(query, config, n, flow=True, restart_at=n // 2, sink_dir=str(tmp_path)) as run:
        assert "out" not in run.streams or not run.output("out")
        run.finish("events")
        run.run_until_idle()
        assert _late(run) == 0
    got = Counter((k, v, ts) for k, v, ts, _ in read_outputs(str(tmp_path)))
    assert got == expected


def test_every_query_has_a_flow_and_each_flow_an_oracle() -> None:
    assert set(flows.FLOWS) == {f"q{i}" for i in range(13)} == set(oracle.FLOW_ORACLES) | {"q12"}
    assert {q for q, _, _ in _FLOW_CASES} == set(oracle.FLOW_ORACLES)
    assert set(queries.QUERIES) < set(flows.FLOWS)


def test_flows_fuse_into_the_stages_their_docs_name() -> None:
    """One computation per stage: stateless queries and single-key queries are one, the
    two-level maxima and the queries on q9's winners two (bench/nexmark/flows.py)."""
    topologies = {q: build("t-", "in", "out").topology() for q, build in flows.FLOWS.items()}
    two = {"q4", "q5", "q6", "q7"}
    assert {q for q, t in topologies.items() if len(t.computations) == 2} == two
    assert all(len(t.computations) == 1 for q, t in topologies.items() if q not in two)
    # Joins: people and auctions keyed once, so one key extractor reads the input, on the
    # producing side (no hop through a stateless stage).
    for q in ("q3", "q8"):
        [spec] = topologies[q].computations.values()
        assert spec.inputs == {"in": "runtime.flows.keys:key_of"}


def test_q9_and_q6_checks_are_not_trivial() -> None:
    """The q9 check means something: some winning auctions got valid bids before their own
    record arrived (they waited), bids below the reserve and after the end exist, and a
    seller has more than 10 winners (q6 averages the last 10)."""
    recs = _records(SMALL, N)
    events = [(i, decode(v)) for i, (_, v, _) in enumerate(recs)]
    auctions = {e.id: (i, e) for i, e in events if isinstance(e, Auction)}
    won = oracle.winners(SMALL, recs)
    assert 10 < len(won) < len(auctions)
    early = low = after = 0
    for i, b in events:
        if isinstance(b, Bid) and b.auction in auctions:
            j, a = auctions[b.auction]
            valid_time = a.date_time <= b.date_time < a.expires
            early += valid_time and b.price >= a.reserve and i < j
            low += valid_time and b.price < a.reserve
            after += b.date_time >= a.expires
    assert early and low and after
    assert max(Counter(a.seller for a, _ in won).values()) > 10


def test_q3_horizon_leaves_some_matches_out() -> None:
    """The q3 configuration really exercises the horizon (else its check above is weaker)."""
    recs = _records(Q3, 4000)
    wide = dataclasses.replace(Q3, max_auctions_waiting_sec=600)
    assert 0 < sum(oracle.q3(Q3, recs).values()) < sum(oracle.q3(wide, recs).values())


@pytest.mark.parametrize("flow", [False, True])
def test_q12_counts_add_up_to_the_bids_of_each_bidder(flow: bool) -> None:
    """Processing-time panes: which bids share a pane depends on the wall clock, so only the
    totals are fixed. The clock moves past a pane halfway, so bidders get several panes; the
    last panes fire after the input has finished, at the end of time."""
    with _run("q12", SMALL, N // 2, flow=flow) as run:
        run.advance_wall_time(SMALL.window_size_sec * SECOND_US)
        run.run_until_idle()
        first = len(run.output("out"))
        for key, value, ts in _records(SMALL, N)[N // 2:]:
            run.inject("events", key, value, ts)
        run.advance_wall_time(SMALL.window_size_sec * SECOND_US)
        run.finish("events")
        run.run_until_idle()
        out = run.output("out")
        assert _late(run) == 0
    totals: Counter[bytes] = Counter()
    for r in out:
        totals[r.key] += int(r.value)
    assert 0 < first < len(out)
    assert totals == oracle.q12_totals(SMALL, _records(SMALL, N))


def test_the_runner_runs_the_flows_by_default_and_the_classic_queries_on_a_flag(tmp_path: Path) -> None:
    """bench/nexmark/run.py: what ``millstream bench --nexmark`` submits (the flow's stages and
    the sink), what ``--nexmark-classic`` submits instead, and the oracle each is checked against."""
    assert not build_parser().parse_args(["bench", "--nexmark"]).nexmark_classic
    assert build_parser().parse_args(["bench", "--nexmark", "--nexmark-classic"]).nexmark_classic
    assert run_nexmark.queries_of() == list(flows.FLOWS)
    assert run_nexmark.queries_of(classic=True) == list(queries.QUERIES)
    sink = f"t-{run_nexmark.OUT}"
    flow = run_nexmark._topology("q5", "t-", SMALL, str(tmp_path), 3)
    classic = run_nexmark._topology("q5", "t-", SMALL, str(tmp_path), 3, classic=True)
    want_flow = flows.q5("t-", f"t-{run_nexmark.STREAM}", sink, key_ranges=3, config=SMALL).topology()
    want_classic = queries.q5("t-", f"t-{run_nexmark.STREAM}", sink, key_ranges=3, config=SMALL)
    assert set(flow.computations) == set(want_flow.computations)  # the sink runs in the last stage
    last = flow.computations["t-q5.hottest"]
    assert last.code == "runtime.flows.stage:SinkStage" and "bench.nexmark.sink:OutputSink" in last.params["flow.plan"]
    assert set(classic.computations) == set(want_classic.computations) | {"t-sink"}
    assert set(flow.computations) != set(classic.computations)
    # q8's flow is checked at its window's end, the classic one as soon as both sides are in.
    recs = _records(SMALL, N)
    got = [(k, v, ts, 0) for (k, v, ts), n in oracle.q8_at_window_end(SMALL, recs).items() for _ in range(n)]
    assert run_nexmark._check("q8", SMALL, recs, got)["exact"]
    assert not run_nexmark._check("q8", SMALL, recs, got, classic=True)["exact"]
    with pytest.raises(MillstreamError, match="no classic Nexmark query q4; there are q0, q1"):
        run_nexmark.run(str(tmp_path), None, only=["q4"], classic=True)  # type: ignore[arg-type]
