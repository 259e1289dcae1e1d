"""Sources that pause (issue 28): a live injector that goes quiet after a promise, and an
idle partition among several, must not stall event-time windows downstream."""

from __future__ import annotations

import os

from examples import windows
from injectors import Injector
from tests.e2e.test_watermarks import BASE, SECOND, _events, _oracle, _send, _windows
from tests.harness import Cluster, wait_until


def test_a_source_that_goes_quiet_after_a_promise_lets_its_windows_fire(cluster: Cluster) -> None:
    """A live source (no finish()): records with a promise every 200, then a promise past the
    end and a flush, then nothing. Its last rounds' receipts were held while the confirmer
    slept, and nothing asked the leader again: the stream stayed held early in the run and
    no window after it fired."""
    out = os.path.join(cluster.data_dir, "windows")
    cluster.client.submit(windows.topology(out))
    cluster.wait_assigned()
    events = [(b"k%d" % (i % 10), BASE + i * 1_000) for i in range(2_150)]  # in order, 1 ms apart
    expected = _oracle(events)
    inj = Injector(cluster.masters_arg, "events", "quiet-source", batch_size=100)
    try:
        for i, (key, ts) in enumerate(events[:2_000]):
            inj.send(key, b"", ts)
            if i % 200 == 199:
                inj.flush()
                inj.advance_watermark(ts)
        # A pause: every receipt confirmed (the records' timestamps no longer hold the
        # effective watermark below the promise), the background reporter asleep ...
        wait_until(lambda: inj.effective_watermark == inj.watermark, 10, "the first records' receipts")
        for key, ts in events[2_000:]:  # ... then the last records, a promise past them, a flush
            inj.send(key, b"", ts)
        inj.advance_watermark(events[-1][1] + SECOND)
        inj.flush()
        # Quiet from now on: the injector stays open and sends nothing.
        wait_until(lambda: len(_windows(out)) >= len(expected), 30, f"{len(expected)} windows to fire")
        assert _windows(out) == expected
        assert "quiet-source" in {i["name"] for i in cluster.client.status()["injectors"]}  # still registered
    finally:
        inj.close()


def test_an_idle_partition_does_not_hold_the_windows_of_the_others(cluster: Cluster) -> None:
    """Two partitions of one source: one sends a little and is marked idle; the other goes on
    (a live source, never finished). Its windows fire though the idle one promised little,
    and the idle one shows as idle in status."""
    out = os.path.join(cluster.data_dir, "windows")
    cluster.client.submit(windows.topology(out))
    cluster.wait_assigned()
    busy_events = _events(1_500, 5, seed=6)
    idle = Injector(cluster.masters_arg, "events", "partition-1")
    busy = Injector(cluster.masters_arg, "events", "partition-0", batch_size=100)
    try:
        idle.send(b"k0", b"", BASE + 100)
        idle.advance_watermark(BASE + 200)
        idle.mark_idle()  # reported idle once its record's receipt is confirmed
        wait_until(lambda: idle.idle, 10, "the partition to be reported idle", interval=0.01)
        _send(busy, busy_events)
        end = max(ts for _, ts in busy_events) + SECOND
        busy.advance_watermark(end)
        busy.flush()
        expected = _oracle(busy_events, [(b"k0", BASE + 100)])
        wait_until(lambda: len(_windows(out)) >= len(expected), 30, f"{len(expected)} windows to fire")
        assert _windows(out) == expected
        st = {i["name"]: i for i in cluster.client.status()["injectors"]}
        assert st["partition-1"]["idle"] and not st["partition-0"]["idle"]
        # Sending again makes it active (its round says so before its records go out): it holds
        # the stream again, at its own promise.
        idle.send(b"k1", b"", end + 10 * SECOND)
        idle.flush()
        assert not idle.idle
        st = {i["name"]: i for i in cluster.client.status()["injectors"]}
        assert not st["partition-1"]["idle"] and st["partition-1"]["watermark"] == BASE + 200
    finally:
        idle.close()
        busy.close()


def test_loads_that_retire_move_their_windows_on_each_run_and_hold_in_between(cluster: Cluster) -> None:
    """A batch job's daily loads under one name, each a new injector (a new incarnation) that
    sends its day (sequenced by a producer of the day's: under one name, positional ids would
    make the second day's records the first's duplicates), promises its end and retires
    (then leaves the ``with``, whose finish() must not take the retirement back). Between
    runs the stream is held at the last promise, and each run's windows fire once its
    promise is in."""
    out = os.path.join(cluster.data_dir, "windows")
    cluster.client.submit(windows.topology(out))
    cluster.wait_assigned()
    days = [[(b"k%d" % (i % 5), BASE + day * 10 * SECOND + i * 10_000) for i in range(300)] for day in range(2)]
    for day, events in enumerate(days):
        with Injector(cluster.masters_arg, "events", "daily-load", batch_size=100) as inj:
            for n, (key, ts) in enumerate(events, start=1):  # each day's records are its own producer's
                inj.send_sequenced(f"day-{day}", n, key, b"", ts)
            inj.advance_watermark(events[-1][1] + SECOND)
            inj.retire()
        [held] = [i for i in cluster.client.status()["injectors"] if i["name"] == "daily-load"]
        assert held["retired"] and not held["finished"] and held["watermark"] == events[-1][1] + SECOND
        expected = _oracle([e for d in days[:day + 1] for e in d])
        want = len(expected)
        wait_until(lambda: len(_windows(out)) >= want, 30, f"day {day}'s windows to fire")  # noqa: B023
        assert _windows(out) == expected
