"""The injector's watermark side (injectors/watermark.py) against a scripted leader: what it
reports while receipts are held, and that a round's report never waits for one in flight.
The real master and workers are in tests/e2e/test_watermarks.py."""

from __future__ import annotations

import threading
from typing import Any

from injectors.watermark import MIN, Watermark
from runtime.cluster import wait_until
from runtime.wire import millstream_pb2 as pb

MAX = (1 << 63) - 1


class Leader:
    """Answers ReportInjector with the progress reports it holds per worker; can be made to
    hang inside a call until released."""

    timeout = 1.0

    def __init__(self) -> None:
        self.holds: dict[str, int] = {}
        self.watermarks: list[int] = []
        self.hang = threading.Event()
        self.inside = threading.Event()
        self.release = threading.Event()

    def call(self, fn: Any) -> Any:
        return fn(self)

    def ReportInjector(self, report: pb.InjectorReport, timeout: float) -> pb.InjectorResponse:
        if self.hang.is_set():
            self.inside.set()
            assert self.release.wait(10)
        self.watermarks.append(report.watermark)
        return pb.InjectorResponse(reported=self.holds)


def test_a_held_receipt_holds_the_watermark_until_the_leader_holds_its_report() -> None:
    leader, closed = Leader(), threading.Event()
    marks = Watermark("src", "in", "x", leader, lambda: MAX, closed)  # type: ignore[arg-type]
    try:
        leader.holds = {"w1": 3}  # a worker the leader knows (an unknown one holds nothing)
        marks.report()
        assert leader.watermarks == [MIN]
        marks.hold(100, ("w1", 5))
        marks.promise(1_000)
        marks.report()
        assert marks.reported == 100 and marks.effective == 100  # the committed records hold it
        leader.holds = {"w1": 4}  # an older report: still held
        wait_until(lambda: len(leader.watermarks) >= 4, 10, "the confirmer to ask again", interval=0.005)
        assert marks.reported == 100
        leader.holds = {"w1": 5}
        wait_until(lambda: marks.reported == 1_000, 10, "the watermark to rise once the report is held", interval=0.005)
        assert marks.effective == 1_000 and leader.watermarks[-1] == 1_000
    finally:
        closed.set()
        marks.close()


def test_a_rounds_report_never_waits_for_a_report_in_flight() -> None:
    leader, closed = Leader(), threading.Event()
    marks = Watermark("src", "in", "x", leader, lambda: MAX, closed)  # type: ignore[arg-type]
    try:
        leader.holds = {"w1": 0}
        marks.report()
        leader.hang.set()
        caller = threading.Thread(target=lambda: (marks.promise(50), marks.report()))
        caller.start()  # advance_watermark's report, stuck at the master
        assert leader.inside.wait(10)
        round_end = threading.Thread(target=lambda: (marks.hold(10, ("w1", 1)), marks.report_later()))
        round_end.start()
        round_end.join(5)
        assert not round_end.is_alive(), "a round's report waited for the one in flight"
        leader.hang.clear()
        leader.release.set()
        caller.join(10)
        leader.holds = {"w1": 1}
        wait_until(lambda: marks.reported == 50, 10, "the confirmer to report what the round let rise", interval=0.005)
    finally:
        leader.release.set()
        closed.set()
        marks.close()


def test_rounds_more_often_than_the_asking_interval_do_not_put_the_asking_off() -> None:
    """A paced sender's rounds wake the confirmer every few milliseconds; it must still ask
    every 20 ms, or a held receipt is never released and the stream's watermark stalls."""
    leader, closed = Leader(), threading.Event()
    marks = Watermark("src", "in", "x", leader, lambda: MAX, closed)  # type: ignore[arg-type]
    rounds_done = threading.Event()

    def rounds() -> None:  # a round every 2 ms, each committed (and held) until told to stop
        seq = 2
        while not rounds_done.is_set():
            marks.hold(2_000 + seq, ("w1", seq))
            marks.report_later()
            seq += 1
            rounds_done.wait(0.002)
    try:
        leader.holds = {"w1": 0}
        marks.hold(500, ("w1", 1))
        marks.promise(1_000)
        marks.report()
        assert marks.reported == 500
        sender = threading.Thread(target=rounds)
        sender.start()
        leader.holds = {"w1": 1}  # the first receipt's report is held from now on
        wait_until(lambda: marks.reported == 1_000, 10, "held receipts to be asked about while rounds run", interval=0.005)
        assert sender.is_alive()
    finally:
        rounds_done.set()
        closed.set()
        marks.close()
