"""An injector's deliveries (injectors/tablets.py, the shell around runtime/courier.py) keep
each key's records in send order (DESIGN.md §2) where no chain of ``after`` holds them at the
tablet: re-routed after a merge, and cut into several deliveries to one tablet; and rounds
follow new readers of their stream and fail together when one cannot be committed."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest

from injectors.rounds import Round
from injectors.tablets import Tablets
from runtime.columns import Columns, of_request
from runtime.delivery import Outcome, Status
from runtime.errors import InjectionError
from runtime.record import Record, producer_prefix, sequence_id
from runtime.wire import millstream_pb2 as pb

P = producer_prefix("injector/src")
HALF = 1 << 63


class _Client:
    def __init__(self, routing: pb.Routing) -> None:
        self.current = routing
        self.fetches = 0

    def routing(self) -> pb.Routing:
        self.fetches += 1
        return self.current


def _routing(version: int, *ranges: tuple[int, int, int], exactly_once: bool = True,
             readers: tuple[str, ...] = ("c",)) -> pb.Routing:
    return pb.Routing(version=version, computations=[pb.ComputationRoute(
        name=name, exactly_once=exactly_once, inputs=[pb.Input(stream="s")],
        assignments=[pb.Assignment(key_range=r, start=lo, end=hi, address="w:1", token=1) for r, lo, hi in ranges])
        for name in readers])


class _Transport:
    """Deliveries land in ``sent``; each is answered by ``answer(request)`` (None: held until
    :meth:`release`)."""

    def __init__(self, answer: Callable[[pb.DeliverRequest], Status | Outcome | None]) -> None:
        self.answer = answer
        self.sent: list[pb.DeliverRequest] = []
        self.held: list[asyncio.Future[Outcome]] = []
        self.loop: asyncio.AbstractEventLoop | None = None

    def post(self, address: str, request: pb.DeliverRequest) -> asyncio.Future[Outcome]:
        self.loop = asyncio.get_running_loop()
        self.sent.append(request)
        fut: asyncio.Future[Outcome] = self.loop.create_future()
        status = self.answer(request)
        if status is None:
            self.held.append(fut)
        elif isinstance(status, Outcome):
            fut.set_result(status)
        else:
            fut.set_result(Outcome(status, ("w", 1) if status == Status.OK else None))
        return fut

    def release(self) -> None:
        held, self.held = self.held, []
        assert self.loop is not None
        for fut in held:
            self.loop.call_soon_threadsafe(fut.set_result, Outcome(Status.OK, ("w", 1)))

    async def close(self) -> None:
        pass


def _tablets(client: _Client, transport: _Transport) -> Tablets:
    return Tablets("src", "s", client, None, {P: 0}, threading.Event(),  # type: ignore[arg-type]
                   committed=lambda *a: None, links=lambda: transport)


def _until(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.001)  # poll interval of this deadline-bounded wait


def _on_loop(tablets: Tablets, fn: Callable[[], object]) -> object:
    """``fn()`` run on the shell's loop, after everything the loop was given before it."""
    assert tablets._loop is not None

    async def call() -> object:
        await asyncio.sleep(0)  # one more turn: what the callbacks before it scheduled has run
        return fn()

    return asyncio.run_coroutine_threadsafe(call(), tablets._loop).result(10)


def _deliver(tablets: Tablets, rnd: Round, timeout: float = 10) -> threading.Thread:
    """Deliver ``rnd`` on a thread of its own (as a round thread would)."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            tablets.deliver(rnd, timeout)
        except BaseException as e:  # noqa: BLE001 - looked at by the test
            errors.append(e)

    t = threading.Thread(target=run)
    t.errors = errors  # type: ignore[attr-defined]
    t.start()
    return t


def test_records_of_merged_ranges_keep_the_rounds_send_order() -> None:
    client = _Client(_routing(1, (0, 0, HALF), (1, HALF, 0)))
    transport = _Transport(lambda req: Status.NOT_OWNER if req.key_range in (0, 1) else Status.OK)
    tablets = _tablets(client, transport)
    try:
        # Ids of the caller's (random bytes, nothing like send order) and sequenced ones, mixed.
        sent = [Record(b"k%d" % (i % 5), b"%d" % i, 1, (bytes([255 - i]) * 16) if i % 2 else sequence_id(P, i))
                for i in range(40)]
        client.current = _routing(2, (2, 0, 0))  # merged into one range, which the injector learns late
        rnd = Round(0, Columns.of_records(sent), 1)
        tablets.enqueue(rnd)
        tablets.deliver(rnd, 10)
        assert {req.key_range for req in transport.sent[:2]} == {0, 1}, "the keys should fall in both ranges"
        last = [req for req in transport.sent if req.key_range == 2]
        assert [r.value for req in last for r in of_request(req).records()] == [r.value for r in sent]
        assert client.fetches >= 2, "it asked for the newer routing"
    finally:
        tablets.close()


@pytest.mark.parametrize(("exactly_once", "ids"), [(True, "sequenced"), (True, "caller's"), (False, "sequenced")])
def test_a_later_delivery_to_a_tablet_goes_with_the_first_only_where_the_chain_holds_it(exactly_once: bool,
                                                                                       ids: str) -> None:
    """Two rounds' records for one tablet: to an exactly-once reader they go at once, the
    second chained after the first; to an at-least-once reader, or without a producer to
    chain, the second goes once the first is committed."""
    transport = _Transport(lambda req: None)
    tablets = _tablets(_Client(_routing(1, (0, 0, 0), exactly_once=exactly_once)), transport)
    try:
        rounds = []
        for n in range(2):
            recs = [Record(b"k", b"%d" % i, 1, sequence_id(P, i + 1) if ids == "sequenced" else bytes([i]) * 16)
                    for i in range(3 * n, 3 * n + 3)]
            rounds.append(Round(n, Columns.of_records(recs, P if ids == "sequenced" else None), 1, first=3 * n))
            tablets.enqueue(rounds[-1])
        threads = [_deliver(tablets, rnd) for rnd in rounds]
        chained = exactly_once and ids == "sequenced"
        _until(lambda: len(transport.sent) == (2 if chained else 1), "the first deliveries")
        assert _on_loop(tablets, lambda: len(transport.sent)) == (2 if chained else 1), "nothing else meanwhile"
        if chained:
            assert [[(o.producer, o.after) for o in req.orders] for req in transport.sent] == [[(P, 0)], [(P, 3)]]
        while any(t.is_alive() for t in threads):
            transport.release()
            time.sleep(0.001)  # poll interval; the threads end once every delivery is answered
        assert [v for req in transport.sent for v in of_request(req).values] == [b"%d" % i for i in range(6)]
        assert all(not t.errors for t in threads)  # type: ignore[attr-defined]
    finally:
        tablets.close()


def test_a_round_in_flight_goes_to_a_reader_the_routing_adds() -> None:
    client = _Client(_routing(1, (0, 0, 0), readers=("a",)))
    transport = _Transport(lambda req: Status.OK if req.computation == "b" or client.fetches > 1 else Status.BUSY)
    tablets = _tablets(client, transport)
    try:
        rnd = Round(0, Columns.of_records([Record(b"k", b"v", 1, sequence_id(P, 1))], P), 1)
        tablets.enqueue(rnd)
        client.current = _routing(2, (0, 0, 0), readers=("a", "b"))
        transport.answer = lambda req: Status.OK if client.fetches > 1 else Status.NOT_OWNER
        tablets.deliver(rnd, 10)
        assert sorted(req.computation for req in transport.sent if req.computation == "b") == ["b"]
    finally:
        tablets.close()


def test_a_round_committed_under_an_older_routing_is_done_once_it_reached_the_readers_the_newer_adds() -> None:
    """An update adds a reader of the stream; nothing refuses the injector (the old reader's
    tablets did not move), but their answers carry the newer routing's version: the round is
    done only once the injector fetched that routing and the new reader committed it too
    (test_lifecycle.py's injector running through an update)."""
    client = _Client(_routing(1, (0, 0, 0), readers=("a",)))
    transport = _Transport(lambda req: Outcome(Status.OK, ("w", 1), routing_version=2))
    tablets = _tablets(client, transport)
    try:
        rnd = Round(0, Columns.of_records([Record(b"k", b"v", 1, sequence_id(P, 1))], P), 1)
        tablets.enqueue(rnd)
        client.current = _routing(2, (0, 0, 0), readers=("a", "b"))
        tablets.deliver(rnd, 10)
        assert [req.computation for req in transport.sent] == ["a", "b"]
    finally:
        tablets.close()


def test_a_round_not_committed_in_time_fails_every_round_in_flight_and_sends_them_no_more() -> None:
    transport = _Transport(lambda req: Status.BUSY)
    tablets = _tablets(_Client(_routing(1, (0, 0, 0))), transport)
    try:
        rounds = [Round(n, Columns.of_records([Record(b"k", b"v", 1, sequence_id(P, n + 1))], P), 1, first=n)
                  for n in range(2)]
        for rnd in rounds:
            tablets.enqueue(rnd)
        first = _deliver(tablets, rounds[0], timeout=0.3)
        second = _deliver(tablets, rounds[1], timeout=60)
        first.join(10)
        second.join(10)
        for t in (first, second):
            [error] = t.errors  # type: ignore[attr-defined]
            assert isinstance(error, InjectionError) and "were not acknowledged within 0s" in str(error)
        assert tablets._courier is not None
        assert _on_loop(tablets, tablets._courier.pending) == 0, "nothing of the failed rounds is kept to retry"
    finally:
        tablets.close()


def test_a_round_handed_over_after_the_rounds_in_flight_failed_fails_too_until_they_are_queued_again() -> None:
    """Review of the injector: a round taken in the moment between the rounds in flight failing
    (on the delivery loop) and the injector hearing of it was sent under the new owner, ahead
    of their records; committed, it moved its tablet's mark past them, and once queued again
    they were dropped as duplicates: lost, with flush() returning normally. It now fails with
    them, until the injector has queued their records again (``resume``)."""
    answers = {"mode": Status.BUSY}
    transport = _Transport(lambda req: answers["mode"])
    tablets = _tablets(_Client(_routing(1, (0, 0, 0))), transport)
    try:
        def rnd(n: int) -> Round:
            return Round(n, Columns.of_records([Record(b"k", b"v", 1, sequence_id(P, n + 1))], P), 1, first=n)

        first = rnd(0)
        tablets.enqueue(first)
        failing = _deliver(tablets, first, timeout=0.3)
        failing.join(10)
        [error] = failing.errors  # type: ignore[attr-defined]
        assert isinstance(error, InjectionError)
        answers["mode"] = Status.OK
        sent = len(transport.sent)
        taken_meanwhile = rnd(1)  # taken before the injector heard that the first failed
        tablets.enqueue(taken_meanwhile)
        late = _deliver(tablets, taken_meanwhile)
        late.join(10)
        assert late.errors == [error]  # type: ignore[attr-defined]
        assert len(transport.sent) == sent, "nothing of it went out"
        tablets.resume()  # the injector queued the failed records again
        again = rnd(0)
        tablets.enqueue(again)
        tablets.deliver(again, 10)
        assert len(transport.sent) > sent
    finally:
        tablets.close()


def test_a_failure_with_no_round_in_flight_fails_no_later_round() -> None:
    """Review of the gate: a refusal arriving late for a withdrawn delivery, with nothing in
    flight, failed the next round for nothing (the user saw an error that need not be)."""
    transport = _Transport(lambda req: Status.OK)
    tablets = _tablets(_Client(_routing(1, (0, 0, 0))), transport)
    try:
        rnd = Round(0, Columns.of_records([Record(b"k", b"v", 1, sequence_id(P, 1))], P), 1, first=0)
        tablets.enqueue(rnd)
        tablets.deliver(rnd, 10)
        _on_loop(tablets, lambda: tablets._fail(InjectionError("a refusal of a delivery withdrawn earlier")))
        later = Round(1, Columns.of_records([Record(b"k", b"v", 1, sequence_id(P, 2))], P), 1, first=1)
        tablets.enqueue(later)
        tablets.deliver(later, 10)  # does not raise
    finally:
        tablets.close()


def test_an_injector_delivers_from_a_uvloop_loop() -> None:
    """Its deliveries' loop is uvloop's, as the daemons' are: asyncio's own socket transport
    cost the sending process a sixth of a W1 round (docs/performance-history.md)."""
    import uvloop

    tablets = _tablets(_Client(_routing(1, (0, 0, 0))), _Transport(lambda req: Status.OK))
    try:
        rnd = Round(0, Columns.of_records([Record(b"k", b"v", 1, sequence_id(P, 1))]), 1)
        tablets.enqueue(rnd)
        tablets.deliver(rnd, 10)
        assert isinstance(tablets._loop, uvloop.Loop)
    finally:
        tablets.close()
