"""Injector input checks (review B21, B22), without a cluster: a refused call changes
nothing, so the good records around it still go through."""

from __future__ import annotations

import re
import threading
from collections import deque
from typing import Any

import pytest

from injectors.buffer import Buffer
from injectors.injector import Injector
from injectors.watermark import Watermark
from runtime.errors import InjectionError
from runtime.record import producer_prefix

MIN = -(1 << 63)


class NoMaster:
    """Fails the test if a refused call got as far as the master."""

    timeout = 1.0

    def call(self, fn: Any) -> Any:
        raise AssertionError("the refused call reached the master")


class _Idle:
    """Stands for a live round thread that never sends (these injectors have no master)."""

    def is_alive(self) -> bool:
        return True


def _injector() -> Injector:
    # An Injector with no master behind it: only what send/advance_watermark touch.
    inj = Injector.__new__(Injector)
    inj.name, inj.stream, inj.batch_size, inj.finished = "src", "in", 1000, False
    inj.position, inj._buffer = 0, Buffer()
    inj._mutex = threading.RLock()
    inj._cond, inj._queued = threading.Condition(inj._mutex), 0
    inj.max_queued, inj._error, inj._rounds, inj._first_at = 100_000, None, _Idle(), 0.0  # type: ignore[assignment]
    inj._flight, inj._returned = deque(), []
    inj._committed = inj._flushing = 0
    inj._closed = threading.Event()
    inj.client = NoMaster()  # type: ignore[assignment]
    inj._marks = Watermark("src", "in", "x", inj.client, inj._queued_min, inj._closed)
    inj._marks.reported = MIN
    inj._prefix = producer_prefix("injector/src")
    inj._sequenced = {inj._prefix: 0}
    inj._last_producer = (None, b"")
    return inj


@pytest.mark.parametrize("ts", [1 << 70, -(1 << 63) - 1, 1.5, True])
def test_b21_a_timestamp_outside_signed_64_bits_is_refused_and_the_buffer_is_unchanged(ts: object) -> None:
    inj = _injector()
    inj.send(b"k", b"good", 1_000)
    with pytest.raises(InjectionError, match=r"timestamp .* must be an int of microseconds .* signed 64 bits"):
        inj.send(b"k", b"bad", ts)  # type: ignore[arg-type]
    assert [r.value for r in inj._buffer] == [b"good"] and inj.position == 1
    inj.send(b"k", b"good too", 2_000)
    assert [r.value for r in inj._buffer] == [b"good", b"good too"]


@pytest.mark.parametrize("bad_id", [b"short", b"x" * 17, "a" * 16])
def test_b21_an_id_that_is_not_16_bytes_is_refused(bad_id: object) -> None:
    inj = _injector()
    with pytest.raises(InjectionError, match="id must be 16 bytes"):
        inj.send(b"k", b"v", 1, id=bad_id)  # type: ignore[arg-type]
    assert list(inj._buffer) == [] and inj.position == 0


def test_b22_a_watermark_outside_signed_64_bits_is_refused_and_the_promise_is_unchanged() -> None:
    inj = _injector()
    with pytest.raises(InjectionError, match=r"watermark 18446744073709551616 must be an int"):
        inj.advance_watermark(1 << 64)
    assert inj.watermark == MIN  # a later report still works: the bad value was never kept


def test_a_sequenced_source_must_rise_and_a_refused_place_changes_nothing() -> None:
    inj = _injector()
    inj.send_sequenced("a.log", 1, b"k", b"one", 1_000)
    inj.send_sequenced("b.log", 1, b"k", b"other file", 1_000)
    for bad in (1, 0, -3, 2**64, True, "2"):
        with pytest.raises(InjectionError, match=r"producer 'a.log': seq .* must be an int above the last one sent for it \(1\)"):
            inj.send_sequenced("a.log", bad, b"k", b"bad", 1_000)  # type: ignore[arg-type]
    inj.send_sequenced("a.log", 5, b"k", b"five", 1_000)  # gaps are fine: only the order counts
    assert [r.value for r in inj._buffer] == [b"one", b"other file", b"five"]
    a1, b1, a5 = (r.id for r in inj._buffer)
    assert a1[:8] == a5[:8] != b1[:8] and a1[:8] != inj._prefix
    assert int.from_bytes(a5[8:], "big") == 5


def test_settings_are_checked_before_any_call_and_a_huge_batch_size_is_allowed() -> None:
    from runtime.cluster import free_port
    from runtime.errors import MasterUnavailableError

    nowhere = f"127.0.0.1:{free_port()}"
    with pytest.raises(InjectionError, match=r"linger_ms=-1 must be a number of milliseconds >= 0"):
        Injector(nowhere, "in", "src", linger_ms=-1)
    with pytest.raises(InjectionError, match=r"max_queued=10 must be an int >= batch_size \(100\)"):
        Injector(nowhere, "in", "src", batch_size=100, max_queued=10)
    # A batch as large as the caller likes (the queue bound follows it): the settings pass,
    # and only the master, which is not there, is missing.
    with pytest.raises(MasterUnavailableError):
        Injector(nowhere, "in", "src", batch_size=1 << 30, timeout=0.5)


class _Contended:
    """The injector's lock, telling when a thread found it held and had to wait."""

    def __init__(self, real: Any) -> None:
        self.real, self.waited = real, threading.Event()

    def __enter__(self) -> None:
        if not self.real.acquire(blocking=False):
            self.waited.set()
            self.real.acquire()

    def __exit__(self, *exc: object) -> None:
        self.real.release()


def test_n18_two_threads_on_one_producer_queue_its_records_in_sequence_order() -> None:
    """Review N18: send_sequenced checked and set the producer's last sequence outside the
    lock, then queued. A thread with seq n could be overtaken between the two by one with
    n+1, which queued first; the receiver then dropped n as a duplicate."""
    inj = _injector()
    lock = _Contended(inj._mutex)
    inj._mutex = lock  # type: ignore[assignment]
    other_done = threading.Event()

    def other() -> None:
        inj.send_sequenced("partition-0", 2, b"k", b"second", 2)
        other_done.set()

    class Sequenced(dict[bytes, int]):
        def __setitem__(self, prefix: bytes, seq: int) -> None:
            super().__setitem__(prefix, seq)
            # Thread A, between setting seq 1 as the last and queueing it: thread B sends seq 2
            # now, and either finishes (the race: it queues first) or has to wait for A's lock.
            if seq == 1:
                threading.Thread(target=other, daemon=True).start()
                deadline = 10.0
                while not (other_done.wait(0.001) or lock.waited.is_set()):
                    deadline -= 0.001
                    assert deadline > 0, "thread B neither finished nor waited for the lock"

    inj._sequenced = Sequenced(inj._sequenced)  # type: ignore[assignment]
    inj.send_sequenced("partition-0", 1, b"k", b"first", 1)
    assert other_done.wait(10)
    assert [r.value for r in inj._buffer] == [b"first", b"second"]


def test_sending_to_a_closed_injector_raises_instead_of_dropping_the_records() -> None:
    """Review of the injector: send, send_many and send_sequenced after close() returned as if
    queued (send even returned an id), and the records were never sent."""
    inj = _injector()
    inj.send(b"k", b"before", 1_000)
    inj._closed.set()  # what close() does first
    for call in (lambda: inj.send(b"k", b"after", 1_000), lambda: inj.send_many([b"k"], [b"after"], [1_000]),
                 lambda: inj.send_sequenced("a.log", 1, b"k", b"after", 1_000)):
        with pytest.raises(InjectionError, match=r"injector 'src' is closed \(what it had not flushed was "
                                                 r"dropped\); create a new one to send more"):
            call()
    assert [r.value for r in inj._buffer] == [b"before"]


@pytest.mark.parametrize(("setting", "value"), [("batch_size", 1e4), ("max_in_flight", "4"), ("max_queued", 2.5e5),
                                                ("linger_ms", "5"), ("batch_size", True), ("linger_ms", float("nan")),
                                                ("linger_ms", float("inf")), ("idle_after", float("nan")),
                                                ("linger_ms", 10 ** 400), ("linger_ms", 1e20)])
def test_an_injector_setting_of_the_wrong_type_is_refused_with_what_to_pass(setting: str, value: object) -> None:
    """Review of the injector: ``batch_size=1e4`` passed the range check, and the round thread
    then failed on a float slice, with records already taken from the queue: lost."""
    from injectors.checks import check_settings

    settings: dict[str, object] = {"linger_ms": 5, "batch_size": 1000, "max_queued": None, "max_in_flight": 4,
                                   "idle_after": None}
    settings[setting] = value
    with pytest.raises(InjectionError, match=re.escape(f"{setting}={value!r} must be a")):
        check_settings(**settings)  # type: ignore[arg-type]
    import numpy

    assert check_settings(numpy.int64(5), numpy.int64(2000), None, numpy.int32(4), numpy.float64(2.5)) == 100_000
    with pytest.raises(InjectionError, match=r"^batch_size=10000.0 must be an int >= 1$"):
        Injector("127.0.0.1:1", "in", "src", batch_size=1e4)  # type: ignore[arg-type]


def test_a_producer_that_is_not_a_str_and_a_timestamp_that_is_not_an_int_say_what_to_pass() -> None:
    import fractions

    inj = _injector()
    with pytest.raises(InjectionError, match=r"producer must be a str \(a file's, a partition's name\), not 17"):
        inj.send_sequenced(17, 1, b"k", b"v", 1_000)  # type: ignore[arg-type]

    class Int64:  # what numpy's int64 looks like to the check: an integer, not an int
        def __index__(self) -> int:
            return 1_700_000_000_000_000

        def __repr__(self) -> str:
            return "1700000000000000"

    with pytest.raises(InjectionError, match=r"\(it is a .*Int64: pass int\(\.\.\.\) of it\)"):
        inj.send(b"k", b"v", Int64())  # type: ignore[arg-type]
    with pytest.raises(InjectionError, match=r"e\.g\. time\.time_ns\(\) // 1000\), or a datetime with a time zone$"):
        inj.send(b"k", b"v", fractions.Fraction(1, 2))  # type: ignore[arg-type]
    assert list(inj._buffer) == []


def test_an_injector_in_a_forked_child_refuses_to_send_and_says_why() -> None:
    """Review of the injector: in a fork's child, the injector's threads and delivery loop are
    gone; its records were queued, and a flush waited about 100 s before a misleading error."""
    import os
    import signal

    from injectors import forks

    inj = _injector()
    forks.watch(inj)
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if the send was refused with the fork named
        code = 1
        try:
            inj.send(b"k", b"v", 1_000)
        except InjectionError as e:
            code = 0 if "does not survive fork()" in str(e) and not list(inj._buffer) else 2
        finally:
            os._exit(code)  # whatever happened: never back into the test runner
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    pid = os.fork()
    if pid == 0:  # nor does it report the parent's watermark (finish() would end its stream)
        code = 1
        try:
            inj.advance_watermark(5_000)
        except InjectionError as e:
            code = 0 if "does not survive fork()" in str(e) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    # Locks the parent's other threads held at the fork (a report in flight, a round being taken)
    # stay held in the child, by a thread that is not there: it must not wait on them for ever.
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with inj._marks._lock, inj._mutex:
            held.set()
            done.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(10)
    try:
        pid = os.fork()
        if pid == 0:
            signal.alarm(10)  # a hang ends the child (and fails the test) instead of the test run
            code = 1
            try:
                for call in (inj.release, inj.finish, lambda: inj.advance_watermark(9_000)):
                    try:
                        call()
                        code = 3
                    except InjectionError as e:
                        if "does not survive fork()" not in str(e):
                            code = 2
                if code == 1:
                    code = 0
            finally:
                os._exit(code)
    finally:
        done.set()
        holder.join(10)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    inj.send(b"k", b"v", 1_000)  # the parent's goes on
    assert len(list(inj._buffer)) == 1


def test_timestamps_and_watermarks_may_be_datetimes_with_a_time_zone() -> None:
    """User review (7): every timestamp was an int of microseconds; Bytewax users bring
    ``datetime``. One with a time zone is taken as its instant; one without is refused."""
    import datetime

    utc = datetime.datetime(2026, 12, 6, 1, 2, 3, 456789, tzinfo=datetime.UTC)
    us = 1_796_518_923_456_789
    paris = utc.astimezone(datetime.timezone(datetime.timedelta(hours=1)))
    inj = _injector()
    inj.send(b"k", b"a", utc)  # type: ignore[arg-type]
    inj.send_many([b"k", b"k"], [b"b", b"c"], [paris, us + 1])  # type: ignore[list-item]
    inj.send_sequenced("file", 1, b"k", b"d", utc)  # type: ignore[arg-type]
    assert [r.timestamp for r in inj._buffer] == [us, us, us + 1, us]
    with pytest.raises(InjectionError, match="has no time zone, so its instant is not known"):
        inj.send(b"k", b"naive", datetime.datetime(2026, 12, 6))  # type: ignore[arg-type]
    with pytest.raises(InjectionError, match="record 1: timestamp .* has no time zone"):
        inj.send_many([b"k", b"k"], [b"e", b"f"], [us, datetime.datetime(2026, 12, 6)])  # type: ignore[list-item]
    assert len(inj._buffer) == 4


def test_clock_readings_in_seconds_milliseconds_or_nanoseconds_are_sent_with_a_warning_at_the_users_line() -> None:
    """A new user's walkthrough: ``int(time.time())`` was taken as microseconds without a word,
    and every window and timer was a million times off. Such records are still sent, with one
    warning that names the unit and points at the caller's own line (one per ``send_many``
    batch). A test's small numbers, microseconds, and datetimes (their unit is in no doubt)
    are not warned of, nor is anything once ``check_units`` is off (a source that checked its
    unit itself: inject-files, the Spark bridge)."""
    import datetime
    import time
    import warnings

    from runtime.record import TimestampUnitWarning

    now_us = time.time_ns() // 1000
    inj = _injector()

    def sends(ts: Any) -> list[Any]:
        return [lambda: inj.send(b"k", b"v", ts), lambda: inj.send_many([b"k"] * 3, [b"v"] * 3, [ts, now_us, ts]),
                lambda: inj.send_sequenced("file", len(inj._buffer) + 1, b"k", b"v", ts)]

    for ts, unit in ((now_us // 1_000_000, "seconds"), (now_us // 1000, "milliseconds"), (now_us * 1000, "nanoseconds"),
                     (-(10**9), "seconds"), (10**14 - 1, "milliseconds"), (10**17 + 1, "nanoseconds")):
        for send in sends(ts):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                send()
            assert [(w.category, str(w.message).split(",")[0]) for w in caught] == [
                (TimestampUnitWarning, f"record timestamps look like {unit} since the epoch")], caught
            assert caught[0].filename == __file__, "the warning points at the caller, not the injector"
    assert len(inj._buffer) == 6 * 5, "every record was queued"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for ts in (now_us, 10**14, 10**17, 0, 1, 10**9 - 1, 10**11, 10**12 - 1,
                   datetime.datetime(1971, 6, 1, tzinfo=datetime.UTC), datetime.datetime(6000, 1, 1, tzinfo=datetime.UTC)):
            for send in sends(ts):
                send()
        inj.check_units = False
        for send in sends(now_us // 1_000_000):
            send()
    assert len(inj._buffer) == 6 * 5 + 11 * 5


def test_a_send_from_another_thread_while_finish_runs_is_refused_not_queued_after_the_end_of_time() -> None:
    """Review of the injector: ``send`` checked ``finished`` before taking the lock, and
    ``finish`` set it only once the leader held the end of time: a send in between queued its
    record after that promise (late at every reader, or dropped at close) and returned."""
    from runtime.record import END_OF_TIME

    inj = _injector()
    inj.timeout = 10
    promised, go_on = threading.Event(), threading.Event()

    def report(wait: bool = False) -> None:  # the leader holds the end of time; finish() not done yet
        inj._marks.reported = END_OF_TIME
        promised.set()
        assert go_on.wait(10)

    inj.flush = lambda: None  # type: ignore[method-assign]
    inj._marks.report = report  # type: ignore[method-assign]
    finishing = threading.Thread(target=inj.finish)
    finishing.start()
    try:
        assert promised.wait(10)
        for send in (lambda: inj.send(b"k", b"v", 5), lambda: inj.send_many([b"k"], [b"v"], [5]),
                     lambda: inj.send_sequenced("p", 1, b"k", b"v", 5)):
            with pytest.raises(InjectionError, match="is finished"):
                send()
    finally:
        go_on.set()
        finishing.join(10)
    assert inj.finished and list(inj._buffer) == []
