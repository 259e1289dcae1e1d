"""How an injector routes its records (injectors/routes.py): a reader whose key extractor
fails on a record gets it in its dead letters; every other reader gets it as usual."""

from __future__ import annotations

import base64
import dataclasses
import json

from injectors.routes import Routes
from runtime.columns import Columns
from runtime.record import Record, producer_prefix, sequence_id
from runtime.routing import RoutingTable
from runtime.wire import millstream_pb2 as pb

P = producer_prefix("injector/src")


def _routing() -> RoutingTable:
    r = pb.Routing(version=3)
    for name, stream, extractor in (("good", "s", ""), ("buggy", "s", "tests.core.jobs:extractor_raising"),
                                    ("buggy_dead", "buggy.dead_letter", "")):
        c = r.computations.add(name=name)
        c.inputs.add(stream=stream, key_extractor=extractor)
        c.assignments.add(key_range=0, address="w", token=1, start=0, end=0)
    table = RoutingTable(r)
    assert table.load_extractors({}) == []
    return table


def _tablets(routing: RoutingTable) -> Routes:
    """The routing of injector "src"'s stream "s"."""
    return Routes("src", "s")


def test_a_reader_s_failing_key_extractor_sends_the_record_to_its_dead_letters_only() -> None:
    """Review N5: ``route_with`` raised, so the round failed and no reader of the stream got
    anything."""
    routing = _routing()
    tablets = _tablets(routing)
    records = [Record(b"k1", b'{"user": "ann"}', 10, sequence_id(P, 1)),
               Record(b"k2", b"not json", 11, sequence_id(P, 2))]
    round_ = Columns.of_records(records, P)
    out = tablets.route_with(round_, routing)
    # Each reader learns the stream its records came on (Record.stream).
    assert out[("good", 0)].records() == [dataclasses.replace(r, stream="s") for r in records]
    assert out[("buggy", 0)].records() == [Record(b"ann", b'{"user": "ann"}', 10, sequence_id(P, 1), "s")]
    [letter] = out[("buggy_dead", 0)].records()
    assert letter.stream == "buggy.dead_letter"
    doc = json.loads(letter.value)
    assert doc["error"].startswith("JSONDecodeError") and doc["computation"] == "buggy", doc
    assert (doc["stream"], doc["producer"], base64.b64decode(doc["value"])) == ("s", "injector/src", b"not json")
    assert (letter.key, letter.timestamp) == (b"k2", 11)
    assert letter.id[:8] != P, "an opaque id: it is in no producer's order"
    assert tablets.route_with(round_, routing)[("buggy_dead", 0)].records() == [letter], \
        "a retried round sends the same"
    # The dead letters' reader is not taken for a reader gone from the stream (what goes to a
    # computation that no longer takes the stream's records is dropped: runtime/courier.py).
    assert all(tablets.reads(routing, c) for c in ("good", "buggy", "buggy_dead"))
    assert not tablets.reads(routing, "elsewhere")
