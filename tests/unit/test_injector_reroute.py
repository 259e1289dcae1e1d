"""A round retried after a merge sends what it had for the replaced ranges to the range that
replaced them (injectors/tablets.py): in the round's send order, so each key's records keep
their order (DESIGN.md §2), those with the caller's own ids too, and each producer's stay
in sequence."""

from __future__ import annotations

import threading

from injectors.tablets import Tablets
from runtime.record import Record, producer_prefix, sequence_id
from runtime.wire import millstream_pb2 as pb

P = producer_prefix("injector/src")
HALF = 1 << 63


class _Client:
    def __init__(self, routing: pb.Routing) -> None:
        self.current = routing

    def routing(self) -> pb.Routing:
        return self.current


def _routing(version: int, *ranges: tuple[int, int, int]) -> pb.Routing:
    return pb.Routing(version=version, computations=[pb.ComputationRoute(
        name="c", exactly_once=True, inputs=[pb.Input(stream="s")],
        assignments=[pb.Assignment(key_range=r, start=lo, end=hi, address="w:1", token=1) for r, lo, hi in ranges])])


def test_records_of_merged_ranges_keep_the_rounds_send_order() -> None:
    client = _Client(_routing(1, (0, 0, HALF), (1, HALF, 0)))
    tablets = Tablets("src", "s", client, None, {P: 0}, threading.Event(),  # type: ignore[arg-type]
                      calls=1, committed=lambda *a: None)
    # Ids of the caller's (random bytes, nothing like send order) and sequenced ones, mixed.
    sent = [Record(b"k%d" % (i % 5), b"%d" % i, 1, (bytes([255 - i]) * 16) if i % 2 else sequence_id(P, i))
            for i in range(40)]
    pending = {(c, r, 0): recs for (c, r), recs in tablets.route_with(sent, tablets.routing).items()}
    assert len(pending) == 2, "the keys should fall in both ranges"
    client.current = _routing(2, (2, 0, 0))  # merged into one range
    tablets.routing = tablets.fetch()
    tablets._reroute(pending, sent)
    assert list(pending) == [("c", 2, 0)]
    assert [r.value for r in pending[("c", 2, 0)]] == [r.value for r in sent]
