"""The injector's watermark side (injectors/watermark.py) against a scripted leader: what it
reports while receipts are held, and that a round's report never waits for one in flight.
The real master and workers are in tests/e2e/test_watermarks.py."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import pytest

from injectors import watermark as watermark_module
from injectors.watermark import MIN, Watermark
from runtime.cluster import wait_until
from runtime.errors import MillstreamError, RoleError
from runtime.wire import millstream_pb2 as pb

MAX = (1 << 63) - 1


class Leader:
    """Answers ReportInjector with the progress reports it holds per worker; can be made to
    hang inside a call until released."""

    timeout = 1.0

    def __init__(self) -> None:
        self.holds: dict[str, int] = {}
        self.watermarks: list[int] = []
        self.idle: list[bool] = []  # what each report said
        self.retired: list[bool] = []
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
        self.idle.append(report.idle)
        self.retired.append(report.retired)
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


def _asleep(name: str) -> bool:
    """Whether the confirmer thread of injector ``name`` is blocked in a wait (not between
    deciding to sleep and sleeping)."""
    for t in threading.enumerate():
        if t.name == f"injector {name}" and t.ident is not None:
            frame = sys._current_frames().get(t.ident)
            return frame is not None and frame.f_code.co_name == "wait" and frame.f_code.co_filename.endswith(
                "threading.py")
    return False


def test_a_receipt_held_while_the_confirmer_sleeps_reaches_the_leader_within_a_bounded_time() -> None:
    """Issue 28, the quiet source: the confirmer slept with nothing held; a round then
    committed (a receipt held) and asked for a report, which only woke a confirmer with
    nothing held, so nothing asked the leader again until finish(): the source's last promise
    never reached it and windows downstream never fired. Now it is asked within ~20 ms of the
    round and reports the promise once the leader holds the receiver's report."""
    leader, closed = Leader(), threading.Event()
    queued = [MAX]
    marks = Watermark("quiet", "in", "x", leader, lambda: queued[0], closed)  # type: ignore[arg-type]
    try:
        leader.holds = {"w1": 0}
        queued[0] = 100                 # a round in flight, its oldest record at 100
        marks.promise(1_000)            # advance_watermark(past the end of what it sent)
        marks.report()
        assert marks.reported == 100
        marks.report_later()            # an earlier round's end: the confirmer starts, finds nothing held
        wait_until(lambda: _asleep("quiet"), 10, "the confirmer to sleep with nothing held", interval=0.002)
        marks.hold(100, ("w1", 5))      # the round commits: its receipt is held ...
        queued[0] = MAX                 # ... it leaves the flight ...
        marks.report_later()            # ... and asks for a report; then the source goes quiet
        leader.holds = {"w1": 5}        # the receiver's report reaches the leader
        start = time.monotonic()
        wait_until(lambda: marks.reported == 1_000, 5, "the quiet source's promise to reach the leader",
                   interval=0.002)
        assert time.monotonic() - start < 1.0  # ~20 ms plus a thread switch; loose for loaded CI
    finally:
        closed.set()
        marks.close()


def test_n6_a_round_leaving_the_flight_between_the_two_reads_still_holds_the_watermark() -> None:
    """Review N6 (v_wm.py): effective read the holds, then the rounds in flight; a round that
    committed (hold added) and left the flight in between was in neither, and the injector
    reported a watermark above records whose receiver's report the leader did not hold."""
    t = 1_700_000_000_000_000
    in_flight = [t]
    marks: Watermark

    def queued_min() -> int:  # the round thread runs between the confirmer's two reads
        if in_flight:
            marks.hold(t, ("worker-a", 42))
            in_flight.clear()
        return min(in_flight, default=MAX)
    marks = Watermark("inj", "s", "inc", None, queued_min, threading.Event())  # type: ignore[arg-type]
    marks.promise(t + 10_000_000)
    assert marks.effective == t


def test_an_idle_injector_says_so_once_nothing_is_unconfirmed_and_wakes_up_before_its_next_round() -> None:
    leader, closed = Leader(), threading.Event()
    queued = [MAX]
    marks = Watermark("part-3", "in", "x", leader, lambda: queued[0], closed)  # type: ignore[arg-type]
    try:
        leader.holds = {"w1": 0}
        marks.promise(1_000)
        marks.report()
        marks.hold(500, ("w1", 1))      # its last round's receipt, not confirmed yet
        marks.mark_idle()
        marks.report()
        assert leader.idle[-1] is False and not marks.reported_idle  # something is unconfirmed
        leader.holds = {"w1": 1}
        wait_until(lambda: marks.reported_idle, 10, "the idle report once the receipt is confirmed", interval=0.002)
        assert leader.watermarks[-1] == 1_000 and leader.idle[-1] is True
        queued[0] = 2_000               # it sends again: the round tells the leader first
        n = len(leader.watermarks)
        marks.resume()
        assert len(leader.watermarks) == n + 1 and leader.idle[-1] is False and not marks.reported_idle
    finally:
        closed.set()
        marks.close()


def test_idle_after_makes_a_silent_injector_idle_and_a_promise_makes_it_active(monkeypatch: pytest.MonkeyPatch) -> None:
    """An injector that never sends (a partition with no data) goes idle too: review of the
    injector, its background thread started only when a round ended, so such an injector
    held its stream for ever."""
    leader, closed = Leader(), threading.Event()
    marks = Watermark("part-4", "in", "x", leader, lambda: MAX, closed, idle_after=0.05)  # type: ignore[arg-type]
    try:
        leader.holds = {"w1": 0}
        marks.promise(1_000)
        marks.report()                  # the registration; no round ever ends
        assert leader.idle == [False]
        wait_until(lambda: marks.reported_idle, 10, "idle_after to pass", interval=0.005)
        marks.promise(2_000)            # advance_watermark: active again
        marks.report()
        assert leader.watermarks[-1] == 2_000 and leader.idle[-1] is False
    finally:
        closed.set()
        marks.close()


def test_a_live_injector_reports_every_keepalive_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    """The leader expires registrations silent for long (MasterConfig.injector_expiry_s): a
    live injector with nothing to say reports anyway, so only a gone one is expired; also one
    that never sent anything (its keep-alives began only once a round ended)."""
    monkeypatch.setattr(watermark_module, "KEEPALIVE_S", 0.05)
    leader, closed = Leader(), threading.Event()
    marks = Watermark("alive", "in", "x", leader, lambda: MAX, closed)  # type: ignore[arg-type]
    try:
        leader.holds = {"w1": 0}
        marks.promise(1_000)
        marks.report()                  # the registration; no round ever ends
        wait_until(lambda: len(leader.watermarks) >= 4, 10, "keep-alive reports", interval=0.005)
        assert set(leader.watermarks) == {1_000}
    finally:
        closed.set()
        marks.close()


def test_a_released_injector_sends_no_keepalive(monkeypatch: pytest.MonkeyPatch) -> None:
    """Injector.release() drops the name at the leader; a keep-alive after it would register
    the name again and hold the stream."""
    monkeypatch.setattr(watermark_module, "KEEPALIVE_S", 0.01)
    leader, closed = Leader(), threading.Event()
    marks = Watermark("gone", "in", "x", leader, lambda: MAX, closed)  # type: ignore[arg-type]
    try:
        leader.holds = {"w1": 0}
        marks.promise(1_000)
        marks.report()
        marks.report_later()
        wait_until(lambda: len(leader.watermarks) >= 2, 10, "a keep-alive", interval=0.005)
        released: list[bool] = []
        marks.stop(lambda: released.append(True))  # the release call, made under the report lock
        assert released == [True]
        wait_until(lambda: not any(t.name == "injector gone" for t in threading.enumerate()), 10,
                   "the confirmer to end", interval=0.005)
    finally:
        closed.set()
        marks.close()


def test_a_release_whose_answer_is_lost_still_stops_the_keepalives(monkeypatch: pytest.MonkeyPatch) -> None:
    """Review of the floor: a release applied whose answer was lost (a retry then finds no such
    name) left the injector reporting, and its next keep-alive registered the name again."""
    monkeypatch.setattr(watermark_module, "KEEPALIVE_S", 0.01)
    leader, closed = Leader(), threading.Event()
    marks = Watermark("gone", "in", "x", leader, lambda: MAX, closed)  # type: ignore[arg-type]
    try:
        marks.promise(1_000)
        marks.report()
        marks.report_later()
        wait_until(lambda: len(leader.watermarks) >= 2, 10, "a keep-alive", interval=0.005)

        def lost() -> None:
            raise MillstreamError("no injector 'gone' holds stream 'in'")

        def refused() -> None:
            raise RoleError("releasing injector 'gone' drops every hold under the name, an operator's action")

        with pytest.raises(RoleError):
            marks.stop(refused)  # not released: it goes on reporting
        assert not marks.stopped
        with pytest.raises(MillstreamError):
            marks.stop(lost)
        assert marks.stopped
        wait_until(lambda: not any(t.name == "injector gone" for t in threading.enumerate()), 10,
                   "the confirmer to end", interval=0.005)
    finally:
        closed.set()
        marks.close()


def test_after_retiring_a_promise_or_going_idle_reports_nothing() -> None:
    """Review of the retirement: advance_watermark() or mark_idle() after retire() reported a
    plain promise, and the leader took the incarnation for a live run again (it then held
    the stream until the expiry, a day)."""
    leader, closed = Leader(), threading.Event()
    marks = Watermark("daily", "in", "x", leader, lambda: MAX, closed)  # type: ignore[arg-type]
    try:
        marks.promise(1_000)
        marks.report()
        marks.retire()
        assert leader.retired[-1] and leader.watermarks[-1] == 1_000
        n = len(leader.watermarks)
        marks.promise(2_000)
        marks.report()
        marks.mark_idle()
        marks.report()
        assert len(leader.watermarks) == n, "a report after the retirement"
    finally:
        closed.set()
        marks.close()


def test_a_round_starting_while_the_idle_report_is_in_flight_says_it_is_active_before_it_delivers() -> None:
    """Else the leader could take the idle report after the round's records were delivered,
    and let the stream pass them before their receipts are confirmed."""
    leader, closed = Leader(), threading.Event()
    queued = [MAX]
    marks = Watermark("part-5", "in", "x", leader, lambda: queued[0], closed)  # type: ignore[arg-type]
    try:
        leader.holds = {"w1": 0}
        marks.promise(1_000)
        marks.report()
        marks.mark_idle()
        leader.hang.set()
        idle_report = threading.Thread(target=marks.report)
        idle_report.start()
        assert leader.inside.wait(10)        # the idle report is at the leader ...
        queued[0] = 1_500                    # ... when a round is taken
        resumed = threading.Event()
        round_start = threading.Thread(target=lambda: (marks.resume(), resumed.set()))
        round_start.start()
        assert not resumed.wait(0.05), "the round went ahead of the idle report in flight"
        leader.hang.clear()
        leader.release.set()
        assert resumed.wait(10)
        idle_report.join(10)
        assert leader.idle[-2:] == [True, False] and not marks.reported_idle
    finally:
        leader.release.set()
        closed.set()
        marks.close()


def test_promises_made_while_the_confirmer_asks_anyway_make_no_call_of_their_own() -> None:
    """A fast source promising every few hundred records made one master call per promise, on
    its own thread, beside the confirmer's asks every 20 ms (Nexmark's injector: hundreds a
    second). While receipts are held the confirmer's next ask reports the promise."""
    leader, closed = Leader(), threading.Event()
    marks = Watermark("src", "in", "x", leader, lambda: MAX, closed)  # type: ignore[arg-type]
    try:
        leader.holds = {"w1": 0}
        marks.promise(10)
        marks.report_promise()  # nothing held: at once, from this thread
        assert leader.watermarks == [10]
        marks.hold(500, ("w1", 1))
        marks.report_later()
        wait_until(lambda: len(leader.watermarks) >= 2, 10, "the confirmer to ask", interval=0.005)
        calls = threading.local()
        calls.n = 0
        real = leader.ReportInjector

        def counting(report: pb.InjectorReport, timeout: float) -> pb.InjectorResponse:
            if threading.current_thread() is threading.main_thread():
                calls.n += 1
            return real(report, timeout)

        leader.ReportInjector = counting  # type: ignore[method-assign]
        for t in range(20, 420, 20):
            marks.promise(t)
            marks.report_promise()
        assert calls.n == 0  # none from the caller's thread
        assert marks.effective == 400  # the promise, below the held receipt's 500
        wait_until(lambda: marks.reported == 400, 10, "the confirmer to report the promise", interval=0.005)
        leader.holds = {"w1": 1}
        wait_until(lambda: marks.reported == 400 and not marks._held, 10, "the receipt to be released",
                   interval=0.005)
        marks.promise(1_000)
        marks.report_promise()  # nothing held any more: at once again
        assert calls.n == 1 and leader.watermarks[-1] == 1_000
    finally:
        closed.set()
        marks.close()


def test_an_idle_report_whose_answer_is_lost_is_taken_back_before_the_next_round() -> None:
    """Review of the injector: an idle report the leader applied but whose answer was lost
    left the injector thinking it was active at the leader, so its next round said nothing
    first, and its records reached tablets while the leader held it idle (the stream followed
    the other injectors past them)."""
    class LosesIdleAnswer(Leader):
        def ReportInjector(self, report: pb.InjectorReport, timeout: float) -> pb.InjectorResponse:
            answer = super().ReportInjector(report, timeout)
            if report.idle:
                raise MillstreamError("deadline exceeded (the report was applied)")
            return answer

    leader, closed = LosesIdleAnswer(), threading.Event()
    marks = Watermark("part-9", "in", "x", leader, lambda: MAX, closed)  # type: ignore[arg-type]
    try:
        marks.promise(1_000)
        marks.report()
        marks.mark_idle()
        with pytest.raises(MillstreamError):
            marks.report()
        assert leader.idle[-1] is True and not marks.reported_idle  # the leader holds it idle
        n = len(leader.idle)
        marks.resume()                  # a round is about to deliver
        assert len(leader.idle) == n + 1 and leader.idle[-1] is False
    finally:
        closed.set()
        marks.close()
