"""An injector's deliveries (injectors/tablets.py) keep each key's records in send order
(DESIGN.md §2) where no chain of ``after`` holds them at the tablet: re-routed after a
merge, and cut into several deliveries to one tablet."""

from __future__ import annotations

import threading

from injectors.tablets import Tablets
from runtime.columns import Columns, of_request
from runtime.record import Record, producer_prefix, sequence_id
from runtime.wire import millstream_pb2 as pb

P = producer_prefix("injector/src")
HALF = 1 << 63


class _Client:
    def __init__(self, routing: pb.Routing) -> None:
        self.current = routing

    def routing(self) -> pb.Routing:
        return self.current


def _routing(version: int, *ranges: tuple[int, int, int], exactly_once: bool = True) -> pb.Routing:
    return pb.Routing(version=version, computations=[pb.ComputationRoute(
        name="c", exactly_once=exactly_once, inputs=[pb.Input(stream="s")],
        assignments=[pb.Assignment(key_range=r, start=lo, end=hi, address="w:1", token=1) for r, lo, hi in ranges])])


def _tablets(client: _Client) -> Tablets:
    return Tablets("src", "s", client, None, {P: 0}, threading.Event(),  # type: ignore[arg-type]
                   committed=lambda *a: None)


def test_records_of_merged_ranges_keep_the_rounds_send_order() -> None:
    client = _Client(_routing(1, (0, 0, HALF), (1, HALF, 0)))
    tablets = _tablets(client)
    # Ids of the caller's (random bytes, nothing like send order) and sequenced ones, mixed.
    sent = [Record(b"k%d" % (i % 5), b"%d" % i, 1, (bytes([255 - i]) * 16) if i % 2 else sequence_id(P, i))
            for i in range(40)]
    round_ = Columns.of_records(sent)
    pending = {(c, r, 0): recs for (c, r), recs in tablets.route_with(round_, tablets.routing).items()}
    assert len(pending) == 2, "the keys should fall in both ranges"
    client.current = _routing(2, (2, 0, 0))  # merged into one range
    tablets.routing = tablets.fetch()
    tablets._reroute(pending, round_)
    assert list(pending) == [("c", 2, 0)]
    assert pending[("c", 2, 0)].values == [r.value for r in sent]


def test_a_later_chunk_to_a_tablet_goes_with_the_first_only_where_the_chain_holds_it() -> None:
    """A round's records for one tablet cut into several deliveries (16 MiB each) all go at
    once to an exactly-once reader, each chained after the one before it; to an at-least-once
    reader, or without a producer to chain, a chunk goes once the one before it is committed."""
    sent: list[tuple[int, int]] = []

    def answer(tablets: Tablets, calls: list) -> list:  # type: ignore[type-arg]
        sent.extend((req.key_range, len(of_request(req))) for _, req, _ in calls)
        return [pb.DeliverResponse(status=pb.DeliverResponse.OK, worker_id="w", report_seq=1) for _ in calls]

    for exactly_once, ids in ((True, "sequenced"), (True, "caller's"), (False, "sequenced")):
        client = _Client(_routing(1, (0, 0, 0), exactly_once=exactly_once))
        tablets = _tablets(client)
        tablets._call_all = lambda calls, t=tablets: answer(t, calls)  # type: ignore[method-assign,misc]
        recs = [Record(b"k", b"%d" % i, 1, sequence_id(P, i + 1) if ids == "sequenced" else bytes([i]) * 16)
                for i in range(5)]
        producer = P if ids == "sequenced" else None
        pending = {("c", 0, 0): Columns.of_records(recs[:2], producer),
                   ("c", 0, 1): Columns.of_records(recs[2:], producer)}
        sent.clear()
        left, refresh = tablets.attempt(pending, tablets.orders(pending), tablets.routing)
        if exactly_once and ids == "sequenced":
            assert sent == [(0, 2), (0, 3)] and left == {}
        else:
            assert sent == [(0, 2)] and list(left) == [("c", 0, 1)], (exactly_once, ids)
            assert not refresh, "a chunk held behind the one before it needs no new routing"
            left, _ = tablets.attempt(left, tablets.orders(left), tablets.routing)
            assert sent == [(0, 2), (0, 3)] and left == {}
