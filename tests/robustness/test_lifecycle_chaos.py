"""Lifecycle operations in the middle of the chaos suite's seeded failures (issue 28).

The word count of test_chaos runs under the same faults (drawn between chunks of input from
a seed), and one operation a user does to a running job happens mid-run:

- a savepoint is taken, the job cancelled and restored from it, and the injection continued,
  once with the source quiet and once while a thread keeps sending (the savepoint pauses it)
  and the leader is killed during the copy;
- a second job that reads the word count's ``counts`` is cancelled (with ``--keep-state``,
  resumed, then cancelled for good) while the word count keeps running (review N3);
- the source promises a watermark and goes quiet without finishing; event-time windows of
  what it promised must fire while it is quiet.

Each ends with every count exactly once. CI runs one seed each; MILLSTREAM_CHAOS_SEEDS=1,2,3
runs others (each test adds its own offset, as test_chaos does).
"""

from __future__ import annotations

import collections
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from cli.demo import oracle, sample_lines
from examples import wordcount
from injectors import Injector
from runtime import savepoint
from runtime.sinks import read_file_sink
from runtime.topology import Topology
from runtime.windows import SECOND
from tests.harness import Cluster, wait_until
from tests.robustness.test_chaos import FAULTS, SEEDS, _kill_leader, _replicated

BASE_TS = 1_700_000_000_000_000  # a whole second: windows start on it
END_OF_TIME = (1 << 63) - 1
JOB = "chaos"


@pytest.fixture
def cluster(tmp_path: object) -> Iterator[Cluster]:
    with Cluster(str(tmp_path), masters=2, workers=3).running() as c:
        yield c


class Run:
    """One seeded run: its input, its fault schedule and what happened, for the messages."""

    def __init__(self, c: Cluster, seed: int, lines: int, step_us: int = 1000) -> None:
        self.c = c
        self.seed = seed
        self.rng = random.Random(seed)
        self.lines = sample_lines(lines, seed=seed)
        self.step_us = step_us
        self.out = os.path.join(c.data_dir, "out")
        self.history: list[str] = []

    def ts(self, i: int) -> int:
        return BASE_TS + i * self.step_us

    def injector(self) -> Injector:
        return Injector(self.c.masters_arg, "lines", "chaos-source", batch_size=100, security=self.c.security)

    def send(self, inj: Injector, start: int, stop: int) -> None:
        for i in range(start, stop):
            inj.send(b"%d" % (i % 8), self.lines[i].encode(), self.ts(i))

    def fault(self) -> None:
        try:
            self.history.append(self.rng.choice(FAULTS)(self.c, self.rng))
        except TimeoutError as e:
            raise TimeoutError(f"{self}: {e}") from None

    def wait(self, cond: Any, timeout: float, what: str) -> None:
        try:
            wait_until(cond, timeout, what)
        except TimeoutError as e:
            raise TimeoutError(f"{self}: {e}") from None

    def rows(self) -> list[tuple[str, str]]:
        return [(str(r["key"]), str(r["value"])) for r in read_file_sink(self.out)]

    def wait_counts(self, upto: int) -> None:
        """Every count of ``lines[:upto]`` is in the sink."""
        total = sum(oracle(self.lines[:upto]).values())
        self.wait(lambda: len(self.rows()) >= total, 120, f"the {total} counts of the first {upto} lines")

    def check_exact(self) -> None:
        expected = oracle(self.lines)
        self.wait_counts(len(self.lines))
        rows = list(read_file_sink(self.out))
        assert wordcount.final_counts(rows) == expected, self
        assert len(rows) == sum(expected.values()), self

    def __str__(self) -> str:
        return f"seed {self.seed}, after: {self.history}"


def _low_watermark(c: Cluster, computation: str) -> int:
    return int(c.client.status()["computations"][computation]["low_watermark"])


# -- 1. A savepoint taken and restored mid-run ------------------------------------------------

def _restore(run: Run, inj: Injector, saved: str, at_cut: collections.Counter[tuple[str, str]],
             upto: int) -> Injector:
    """Cancel the job (its output after the savepoint is in the sink), restore it from
    ``saved`` and continue the injection: the same injector name sends ``lines[:upto]`` again
    in the same order, so the restored marks drop what the savepoint holds and the rest counts
    again. Returns the new injector."""
    c = run.c
    run.wait_counts(upto)
    assert len(run.rows()) > sum(at_cut.values()), f"{run}: no output after the savepoint for the restore to roll back"
    inj.close()
    assert c.client.cancel(JOB) == "cancelled"
    assert c.client.restore(saved) == JOB
    c.wait_assigned()
    # What a restored FileSink writes to: its files cut back to what the savepoint committed.
    run.wait(lambda: collections.Counter(run.rows()) == at_cut, 60,
             "the sink's files cut back to the savepoint's output")
    inj = run.injector()
    run.send(inj, 0, upto)
    inj.flush()
    run.history.append(f"savepoint, cancel, restore, resend {upto} lines")
    return inj


def _savepoint_quiet(run: Run, inj: Injector, pos: int, chunk: int) -> tuple[Injector, int]:
    """The source is flushed and quiet: the savepoint holds exactly the counts of
    ``lines[:pos]``. A chunk after it is rolled back by the restore and sent again."""
    _replicated(run.c)
    saved = os.path.join(run.c.data_dir, f"savepoint-{pos}")
    run.c.client.savepoint(JOB, saved)
    rows = list(read_file_sink(run.out))
    assert wordcount.final_counts(rows) == oracle(run.lines[:pos]), run
    assert len(rows) == sum(oracle(run.lines[:pos]).values()), run
    at_cut = collections.Counter(run.rows())
    run.send(inj, pos, pos + chunk)
    inj.flush()
    return _restore(run, inj, saved, at_cut, pos + chunk), pos + chunk


def _savepoint_flowing(run: Run, inj: Injector, pos: int, monkeypatch: pytest.MonkeyPatch) -> tuple[Injector, int]:
    """A thread keeps sending while the savepoint is taken (the pause holds it back with
    BUSY; it goes on after), and the leader is killed once the first tablet is copied (a new
    leader must keep the pause; review N2). The sink's output at the cut, read when the copy
    starts (the job at rest), is consistent (every word's counts 1..n once, between what was
    flushed before and what was sent in all), and it is what the restored sink holds."""
    _replicated(run.c)
    saved = os.path.join(run.c.data_dir, f"savepoint-{pos}")
    cut: list[collections.Counter[tuple[str, str]]] = []
    fetch = savepoint._fetch

    def fetch_and_read_the_cut(client: Any, t: Any, target: str) -> None:
        first = not cut
        if first:
            cut.append(collections.Counter(run.rows()))
        fetch(client, t, target)
        if first:
            run.history.append(f"during the savepoint's copy: {_kill_leader(run.c, run.rng)}")

    monkeypatch.setattr(savepoint, "_fetch", fetch_and_read_the_cut)
    done = threading.Event()
    stop = threading.Event()
    sent = [pos]
    limit = len(run.lines) - 100
    errors: list[BaseException] = []

    def feed() -> None:
        try:  # until 100 lines after the savepoint returned
            after = 0
            while sent[0] < limit and after < 100 and not stop.is_set():
                run.send(inj, sent[0], sent[0] + 1)
                sent[0] += 1
                after += done.is_set()
                stop.wait(0.005)  # the source's pace, not a test wait
        except BaseException as e:  # noqa: BLE001 (raised in the test's thread below)
            errors.append(e)

    thread = threading.Thread(target=feed, daemon=True)
    thread.start()
    try:
        run.wait(lambda: sent[0] >= pos + 50 or not thread.is_alive(), 30, "the feed to run")
        run.c.client.savepoint(JOB, saved)
    except BaseException:
        stop.set()
        raise
    finally:
        done.set()
        thread.join()
    monkeypatch.setattr(savepoint, "_fetch", fetch)
    if errors:
        raise errors[0]
    end = sent[0]
    inj.flush()
    at_cut = cut[0]
    counts = wordcount.final_counts([{"key": k, "value": v} for k, v in at_cut.elements()])
    low, high = oracle(run.lines[:pos]), oracle(run.lines[:end])
    assert all(low[w] <= counts.get(w, 0) for w in low) and all(n <= high[w] for w, n in counts.items()), \
        f"{run}: the savepoint's output is not between what was flushed before it and what was sent"
    return _restore(run, inj, saved, at_cut, end), end


@pytest.mark.parametrize("seed", [s + 400 for s in SEEDS])
def test_savepoints_restored_mid_run_among_failures_count_every_record_once(
        cluster: Cluster, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two savepoints (the source quiet, then sending), each followed by cancel, restore and
    the injection continued, among the seeded faults. The sink across a restore is the
    savepoint's output, then what the continued injection adds: every count once."""
    run = Run(cluster, seed, lines=3000)
    cluster.client.submit(wordcount.topology(run.out, name=JOB))
    cluster.wait_assigned()
    chunk = 500
    pos = 0
    inj = run.injector()
    try:
        while pos < len(run.lines):
            if pos == 1000:
                inj, pos = _savepoint_quiet(run, inj, pos, chunk)
            elif pos == 1500:
                inj, pos = _savepoint_flowing(run, inj, pos, monkeypatch)
            else:
                run.send(inj, pos, min(pos + chunk, len(run.lines)))
                inj.flush()
                pos = min(pos + chunk, len(run.lines))
            run.fault()
        inj.finish()
    finally:
        inj.close()
    run.check_exact()


# -- 2. Cancelling a job that reads what the word count produces (review N3) -------------------

def _reader() -> Topology:
    """A slow reader of the word count's counts: what the counter sends it queues."""
    topo = Topology("audit")
    topo.add_computation("audit", "tests.jobs:SlowCounter", inputs={"counts": None}, outputs=["audited"],
                         params={"every": "1", "sleep": "0.005", "out": "audited"}, key_ranges=2)
    return topo


@pytest.mark.parametrize("seed", [s + 500 for s in SEEDS])
def test_cancelling_a_reader_of_the_counts_leaves_the_word_count_exact_and_its_watermark_free(
        cluster: Cluster, seed: int) -> None:
    """The reader is cancelled with --keep-state, resumed, then cancelled for good, each time
    with productions on their way to it, among the seeded faults. Without the fix of N3 those
    productions pinned the counter's watermark for ever: it must reach the end of time once
    the source finishes, and the word count must drain."""
    c = cluster
    run = Run(c, seed, lines=3000)
    c.client.submit(wordcount.topology(run.out, name=JOB))
    c.client.submit(_reader())
    c.wait_assigned()
    chunk = 500
    ops = {500: "cancel --keep-state", 1000: "resubmit", 1500: "cancel"}
    inj = run.injector()
    try:
        for pos in range(0, len(run.lines), chunk):
            run.send(inj, pos, pos + chunk)
            inj.flush()
            inj.advance_watermark(run.ts(pos + chunk))
            op = ops.get(pos + chunk)
            if op == "resubmit":
                c.client.submit(_reader())
                run.history.append("resubmit the reader")
            elif op is not None:
                run.wait(lambda: c.client.status()["computations"]["audit"]["processed"] > 0, 60,
                         "the reader at work")
                backlog = sum(oracle(run.lines[:pos + chunk]).values())
                processed = c.client.status()["computations"]["audit"]["processed"]
                assert processed < backlog, f"{run}: no production on its way to the reader ({processed})"
                assert c.client.cancel("audit", keep_state=op != "cancel") == "cancelled"
                run.history.append(f"{op} the reader ({processed} of {backlog} counts read)")
            run.fault()
        inj.finish()
    finally:
        inj.close()
    run.check_exact()
    run.wait(lambda: _low_watermark(c, "counter") == END_OF_TIME, 60,
             "the counter's low watermark at the end of time")
    assert c.client.drain(JOB, timeout=60) == "drained", run


# -- 3. A source that promises a watermark and goes quiet --------------------------------------

def _windowed(out: str, window_out: str) -> Topology:
    """The word count, and one-second event-time windows counting each word."""
    topo = wordcount.topology(out, name=JOB)
    topo.add_computation("window_counter", "examples.windows:WindowCounter", inputs={"words": None},
                         outputs=["window_counts"], key_ranges=2)
    topo.add_computation("window_sink", "runtime.sinks:FileSink", inputs={"window_counts": None},
                         params={"path": window_out}, key_ranges=1)
    return topo


def _windows(run: Run, upto: int) -> collections.Counter[tuple[str, str]]:
    """The window sink's rows for ``lines[:upto]``: ``(word, "<start>,<count>")``."""
    per = collections.Counter((w.lower(), (run.ts(i) // SECOND) * SECOND)
                              for i, line in enumerate(run.lines[:upto]) for w in line.split())
    return collections.Counter((w, f"{start},{n}") for (w, start), n in per.items())


def _windows_fire_while_quiet(run: Run, window_rows: Callable[[], collections.Counter[tuple[str, str]]],
                              promised: collections.Counter[tuple[str, str]]) -> None:
    quiet = time.monotonic()
    run.wait(lambda: not promised - window_rows(), 60,
             f"the {len(promised)} windows before the promise while the source is quiet")
    run.history.append(f"quiet source: its windows fired in {time.monotonic() - quiet:.1f} s")
    assert window_rows() == promised, f"{run}: windows after the promise, or twice"


@pytest.mark.parametrize("seed", [s + 600 for s in SEEDS])
def test_windows_fire_while_a_source_that_promised_a_watermark_is_quiet(cluster: Cluster, seed: int) -> None:
    """5 ms of event time per line, 2 s per chunk; the source promises a second behind what it
    sent after each chunk. After 1200 lines it promises everything it sent, flushes and sends
    nothing (no finish) through a fault: every window up to that promise fires meanwhile.
    Then it goes on and finishes; counts and windows are exact."""
    c = cluster
    run = Run(c, seed, lines=2400, step_us=5000)
    window_out = os.path.join(c.data_dir, "windows")
    c.client.submit(_windowed(run.out, window_out))
    c.wait_assigned()
    chunk, quiet_at = 400, 1200

    def window_rows() -> collections.Counter[tuple[str, str]]:
        return collections.Counter((str(r["key"]), str(r["value"])) for r in read_file_sink(window_out))

    inj = run.injector()
    try:
        for pos in range(0, len(run.lines), chunk):
            run.send(inj, pos, pos + chunk)
            inj.flush()
            if pos + chunk == quiet_at:
                inj.advance_watermark(run.ts(quiet_at))  # a whole second: every window before it is complete
                run.fault()
                _windows_fire_while_quiet(run, window_rows, _windows(run, quiet_at))
            else:
                inj.advance_watermark(run.ts(pos + chunk) - SECOND)
                run.fault()
        inj.finish()
    finally:
        inj.close()
    run.check_exact()
    expected = _windows(run, len(run.lines))
    run.wait(lambda: sum(window_rows().values()) >= sum(expected.values()), 60, "every window")
    assert window_rows() == expected, run
