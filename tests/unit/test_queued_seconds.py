"""``metrics.queued_seconds``: a thread's own wait for a core, read without releasing the
interpreter lock, from a file each thread opens once and closes when it ends."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from runtime import metrics

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/thread-self/schedstat"),
                                reason="the kernel does not publish schedstat")


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_each_thread_reads_its_own_wait_and_closes_its_file_when_it_ends() -> None:
    mine = metrics.queued_seconds()
    assert mine is not None and mine >= 0
    before = _open_fds()
    seen: list[float | None] = []
    for _ in range(50):
        t = threading.Thread(target=lambda: seen.append(metrics.queued_seconds()))
        t.start()
        t.join()
    assert len(seen) == 50 and all(v is not None and v >= 0 for v in seen)
    assert _open_fds() == before  # a thread's file went with it
    # Its own: a new thread has waited for a core far less than this one, which ran the tests.
    assert min(v for v in seen if v is not None) <= max(mine, 0.001)


def test_it_never_goes_back_and_keeps_the_interpreter_lock() -> None:
    values = [metrics.queued_seconds() for _ in range(1000)]
    assert all(v is not None for v in values)
    assert values == sorted(values)  # type: ignore[type-var]
    # A read through Python's files would release the lock, and a thread waiting for it would
    # take a turn; none may while this one reads (under a switch interval of 10 s, nothing
    # else makes it release the lock).
    switched: list[int] = []
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            switched.append(1)
            time.sleep(0)  # releases the lock: this thread runs only when the other releases it

    old = sys.getswitchinterval()
    sys.setswitchinterval(10.0)
    other = threading.Thread(target=spin)
    try:
        other.start()  # it runs once this thread releases the lock
        while not switched:
            os.sched_yield()  # a syscall that releases it; the spinner runs
        count = len(switched)
        for _ in range(2000):
            metrics.queued_seconds()
        # A thread that was already waiting when the interval changed may still force a switch
        # or two; reads that release the lock gave the spinner hundreds of turns (348).
        assert len(switched) - count <= 5
    finally:
        stop.set()
        sys.setswitchinterval(old)
        other.join()
