"""An injector's deliveries are columns (``DeliverRequest.columns``, runtime/columns.py): a
round carries exactly the records, ids and orders the row form carried, routed, cut and
chained the same way (a reference router of rows, per record, below); ``send_many`` queues
records given as columns as a loop of ``send`` would, after checking every one."""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from injectors.buffer import Buffer
from injectors.injector import Injector
from injectors.tablets import Tablets
from runtime import delivery
from runtime.columns import Columns, of_request
from runtime.errors import InjectionError, InvalidRecordError
from runtime.imports import CodePolicy
from runtime.record import Record, producer_prefix
from runtime.topology import dead_letter_stream
from runtime.wire import millstream_pb2 as pb

HALF = 1 << 63


class _Client:
    def __init__(self, routing: pb.Routing) -> None:
        self.current = routing

    def routing(self) -> pb.Routing:
        return self.current


def _routing() -> pb.Routing:
    """Readers of "s": one range, four ranges, two ranges behind a key extractor that fails on
    values that are not JSON; and the reader of that one's dead letters."""
    r = pb.Routing(version=1)
    for name, stream, extractor, ranges in (("one", "s", "", 1), ("four", "s", "", 4),
                                            ("buggy", "s", "tests.core.jobs:extractor_raising", 2),
                                            ("buggy_dead", dead_letter_stream("buggy"), "", 1)):
        c = r.computations.add(name=name, exactly_once=True)
        c.inputs.add(stream=stream, key_extractor=extractor)
        step = (1 << 64) // ranges
        for i in range(ranges):
            c.assignments.add(key_range=i, address=f"w{i % 2}:1", token=1, start=i * step,
                              end=0 if i == ranges - 1 else (i + 1) * step)
    return r


class _Answering:
    """A transport (runtime/links.py's) that answers every delivery OK and keeps it."""

    def __init__(self) -> None:
        self.sent: list[pb.DeliverRequest] = []

    def post(self, address: str, request: pb.DeliverRequest) -> asyncio.Future[delivery.Outcome]:
        self.sent.append(request)
        fut: asyncio.Future[delivery.Outcome] = asyncio.get_running_loop().create_future()
        fut.set_result(delivery.Outcome(delivery.Status.OK, ("w", 1)))
        return fut

    async def close(self) -> None:
        pass


def _injector() -> tuple[Injector, list[pb.DeliverRequest]]:
    """An injector with no master and no network: its rounds' requests land in the list."""
    inj = Injector.__new__(Injector)
    inj.name, inj.stream, inj.batch_size, inj.finished, inj.timeout = "src", "s", 100_000, False, 30.0
    inj.position, inj._buffer, inj._queued, inj._first_at = 0, Buffer(), 0, 0.0
    inj._mutex = threading.RLock()
    inj._cond = threading.Condition(inj._mutex)
    inj.max_queued, inj._error, inj._flight, inj._returned = 1 << 40, None, deque(), []
    inj._rounds_taken, inj._places, inj.peak_in_flight, inj.max_in_flight = 0, 0, 0, 4
    inj._start_rounds = lambda: None  # type: ignore[method-assign]
    inj._closed = threading.Event()
    inj._marks = SimpleNamespace(forked=None, resume=lambda: None, report_later=lambda: None)  # type: ignore[assignment]
    inj._prefix = producer_prefix("injector/src")
    inj._sequenced = {inj._prefix: 0}
    inj._last_producer = (None, b"")
    links = _Answering()
    inj._tablets = Tablets("src", "s", _Client(_routing()), None, inj._sequenced, threading.Event(),  # type: ignore[arg-type]
                           committed=lambda *a: None, code_policy=CodePolicy.parse("tests", where="test"),
                           links=lambda: links)
    return inj, links.sent


def _rows(tablets: Tablets, records: list[Record], sequenced: dict[bytes, int]) -> dict[Any, Any]:
    """The row form of one round, record by record, as the injector built it before columns:
    ``{(computation, range, chunk): (records, {producer: after})}``."""
    routing = tablets.routing
    by_tablet: dict[tuple[str, int], list[Record]] = {}
    for r in records:
        errors: list[tuple[str, BaseException]] = []
        for comp, kr, key in routing.route_fields("s", r.key, r.value, r.timestamp, r,
                                                  lambda c, e, errors=errors: errors.append((c, e))):
            by_tablet.setdefault((comp, kr), []).append(Record(key, r.value, r.timestamp, r.id, "s"))
        for reader, error in errors:
            letter = tablets.routes.dead_letter(reader, r, error)
            for comp, kr, key in routing.route_fields(dead_letter_stream(reader), letter.key, letter.value,
                                                      letter.timestamp):
                by_tablet.setdefault((comp, kr), []).append(
                    Record(key, letter.value, letter.timestamp, letter.id, dead_letter_stream(reader)))
    out: dict[Any, Any] = {}
    for (comp, kr), recs in sorted(by_tablet.items()):
        after: dict[bytes, int] = {}
        for i, part in enumerate(delivery.cut(recs)):
            here: dict[bytes, int] = {}
            for rec in reversed(part):
                if rec.id[:8] in sequenced:
                    here.setdefault(rec.id[:8], int.from_bytes(rec.id[8:], "big"))
            out[(comp, kr, i)] = (part, {p: after.get(p, 0) for p in here})
            after.update(here)
    return out


def _round(inj: Injector, sent: list[pb.DeliverRequest]) -> dict[Any, Any]:
    """Take and deliver one round; what each tablet got, as the row form reads."""
    rnd = inj._take_round()
    assert rnd is not None
    try:
        inj._tablets.deliver(rnd, 30)
    finally:
        inj._tablets.close()
    got: dict[Any, Any] = {}
    chunks: dict[tuple[str, int], int] = {}
    for req in sent:
        assert req.HasField("columns") and not req.records, "a delivery in rows"
        n = chunks[(req.computation, req.key_range)] = chunks.get((req.computation, req.key_range), -1) + 1
        got[(req.computation, req.key_range, n)] = (of_request(req).records(),
                                                    {o.producer: o.after for o in req.orders})
    return got


records = st.lists(st.tuples(st.sampled_from(["own", "opaque", "file"]), st.integers(0, 7), st.booleans()),
                   min_size=1, max_size=60)


@settings(max_examples=150, deadline=None)
@given(records)
def test_a_round_goes_as_columns_carrying_what_the_rows_carried(spec: list[tuple[str, int, bool]]) -> None:
    inj, sent = _injector()
    seq = 0
    for i, (kind, k, json) in enumerate(spec):
        value = b'{"user": "u%d"}' % k if json else b"plain %d" % i
        if kind == "own":
            inj.send(b"k%d" % k, value, 100 + i)
        elif kind == "opaque":
            inj.send(b"k%d" % k, value, 100 + i, id=bytes([i]) * 16)
        else:
            seq += 1
            inj.send_sequenced("a.log", seq, b"k%d" % k, value, 100 + i)
    expected = _rows(inj._tablets, list(inj._buffer), inj._sequenced)
    assert _round(inj, sent) == expected
    kinds = {kind for kind, _, _ in spec}
    for req in sent:
        # One producer's round: sequenced, except the dead letters (ids of their own).
        sequenced = len(kinds) == 1 and kinds != {"opaque"} and req.computation != "buggy_dead"
        assert bool(req.columns.producer) == sequenced, (kinds, req.computation)


def test_a_tablet_s_records_are_cut_at_the_delivery_bound_as_rows_were() -> None:
    inj, sent = _injector()
    big = b"x" * (6 << 20)
    for i in range(7):
        inj.send(b"k%d" % i, big if i % 3 else b"{}", i)
    expected = _rows(inj._tablets, list(inj._buffer), inj._sequenced)
    got = _round(inj, sent)
    assert got == expected
    assert max(key[2] for key in got) >= 1, "the records should need several deliveries to one tablet"


def test_send_many_queues_what_a_loop_of_send_would() -> None:
    a, _ = _injector()
    b, _ = _injector()
    keys, values, stamps = [b"k%d" % i for i in range(2500)], [b"v%d" % i for i in range(2500)], list(range(2500))
    a.send(b"first", b"", 7)
    b.send(b"first", b"", 7)
    a.send_many(keys, values, stamps)
    for k, v, t in zip(keys, values, stamps, strict=True):
        b.send(k, v, t)
    assert a.send(b"last", b"", 9) == b.send(b"last", b"", 9)
    assert list(a._buffer) == list(b._buffer) and a.position == b.position == 2502
    assert a._queued == 2502 and a._buffer.min_timestamp == 0
    rnd = a._take_round()
    assert rnd is not None and rnd.records.producer == a._prefix, "one producer's records: sequenced"
    a._tablets.close()
    b._tablets.close()


@pytest.mark.parametrize(("keys", "values", "stamps", "match"), [
    ([b"a", "b", b"c"], [b""] * 3, [1, 2, 3], "record 1: key must be bytes"),
    ([b"a", b"b", b"c"], [b"", b"", 3], [1, 2, 3], "record 2: value must be bytes"),
    ([b"a", b"b"], [b"", b""], [1, True], "record 1: timestamp True must be an int"),
    ([b"a", b"b"], [b"", b""], [1 << 63, 2], "record 0: timestamp"),
    ([b"a", b"b"], [b"", b"x" * ((16 << 20) + 1)], [1, 2], "record 1: a record of 1 key bytes"),
    ([b"a", b"b"], [b""], [1, 2], "2 keys, 1 values and 2 timestamps"),
])
def test_send_many_refuses_a_bad_record_by_its_index_and_queues_nothing(
        keys: list[Any], values: list[Any], stamps: list[Any], match: str) -> None:
    inj, _ = _injector()
    inj.send(b"before", b"", 1)
    with pytest.raises(InvalidRecordError, match=match):
        inj.send_many(keys, values, stamps)
    assert [r.key for r in inj._buffer] == [b"before"] and inj.position == 1 and inj._queued == 1
    inj.send_many([bytearray(b"no")][:0], [], [])  # nothing to queue: fine
    inj.finished = True
    with pytest.raises(InjectionError, match="finished"):
        inj.send_many([b"a"], [b""], [1])


def test_send_many_takes_bytes_subclasses_as_send_does() -> None:
    class Key(bytes):
        pass

    inj, _ = _injector()
    inj.send_many([Key(b"a")], [b""], [1])
    assert [r.key for r in inj._buffer] == [b"a"]


def test_a_flush_that_failed_is_retried_and_every_record_reaches_its_tablets() -> None:
    """Review of the injector: once rounds fail, the delivery shell fails every round handed to
    it until the injector has queued their records again (so none passes them); the injector
    then says so (``Tablets.resume``), and the next flush sends everything, in order."""

    inj, sent = _injector()
    inj.timeout = 0.3
    inj._flushing = inj._committed = 0
    links = inj._tablets._make_links()
    answer = {"status": delivery.Status.BUSY}
    ok = links.post

    def post(address: str, request: pb.DeliverRequest) -> asyncio.Future[delivery.Outcome]:
        if answer["status"] == delivery.Status.OK:
            return ok(address, request)
        fut: asyncio.Future[delivery.Outcome] = asyncio.get_running_loop().create_future()
        fut.set_result(delivery.Outcome(answer["status"]))
        return fut

    links.post = post  # type: ignore[method-assign]
    try:
        for i in range(5):
            inj.send(b"k%d" % i, b"%d" % i, 1_000 + i)
        with pytest.raises(InjectionError):
            inj.flush()
        answer["status"] = delivery.Status.OK
        inj.timeout = 30.0  # (its lanes still back off from the BUSYs, up to 0.5 s ± 20 %: past the 0.3 s above)
        inj.flush()
        one = [r.value for req in sent if req.computation == "one" for r in of_request(req).records()]
        assert one == [b"%d" % i for i in range(5)]
    finally:
        inj._tablets.close()


def test_a_flush_interrupted_by_ctrl_c_leaves_the_injector_able_to_flush_again() -> None:
    """Review of the injector: a KeyboardInterrupt in a flush (a notebook user stopping a slow
    one) left its round in flight, never done, and every flush after it waited for ever. The
    round now fails (its records queued again) and the interrupt goes on."""

    inj, sent = _injector()
    inj._flushing = inj._committed = 0
    deliver = inj._tablets.deliver

    def interrupted(rnd: Any, timeout: float) -> None:
        inj._tablets._call(inj._tablets._release, rnd, timeout)  # it went out...
        raise KeyboardInterrupt  # ... and the caller pressed Ctrl-C while it waited

    inj._tablets.deliver = interrupted  # type: ignore[method-assign]
    try:
        for i in range(5):
            inj.send(b"k%d" % i, b"%d" % i, 1_000 + i)
        with pytest.raises(KeyboardInterrupt):
            inj.flush()
        inj._tablets.deliver = deliver  # type: ignore[method-assign]
        done = threading.Event()

        def flush() -> None:
            inj.flush()  # no "interrupted" error raised again: the caller had it
            done.set()

        threading.Thread(target=flush, daemon=True).start()
        assert done.wait(10), "the flush after the interrupt should finish"
        one = [r.value for req in sent if req.computation == "one" for r in of_request(req).records()]
        assert one[-5:] == [b"%d" % i for i in range(5)] and not inj._flight
    finally:
        inj._tablets.close()


def test_a_second_ctrl_c_while_the_round_waits_for_those_before_it_still_lets_it_go() -> None:
    """Review of the interrupt: a second KeyboardInterrupt, while the interrupted round waited
    for the rounds before it, left it in flight, never done: the wedge again."""
    from injectors.rounds import Round

    inj, _ = _injector()
    before = Round(0, Columns.of_records([Record(b"a", b"0", 1, bytes(16))]), 1)
    rnd = Round(1, Columns.of_records([Record(b"a", b"1", 1, bytes(16))]), 1)
    inj._flight.extend([before, rnd])

    def interrupted(r: Any, timeout: float) -> None:
        raise KeyboardInterrupt

    class _Interrupting(threading.Condition):
        def wait(self, timeout: float | None = None) -> bool:
            raise KeyboardInterrupt  # the second Ctrl-C

    inj._tablets.deliver = interrupted  # type: ignore[method-assign]
    inj._cond = _Interrupting(inj._mutex)
    try:
        with pytest.raises(KeyboardInterrupt):
            inj._run_round(rnd)
        assert rnd.done and rnd.returned and inj._returned == [rnd] and inj._error is None
    finally:
        inj._tablets.close()
