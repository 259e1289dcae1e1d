"""Job lifecycle on real processes (issue 14, docs/lifecycle.md): update, drain, cancel,
state get, and the bad uses of each."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Callable

import pytest

from cli.demo import oracle, sample_lines
from examples import windows, wordcount
from injectors import Injector
from runtime.errors import InjectionError, MillstreamError, TopologyError
from runtime.sinks import read_file_sink
from runtime.topology import Topology
from tests.e2e.test_watermarks import _events, _oracle, _send, _windows
from tests.harness import Cluster, wait_until

BASE_TS = 1_700_000_000_000_000


def _inject(cluster: Cluster, name: str, lines: list[str], finish: bool = False) -> None:
    inj = Injector(cluster.masters_arg, "lines", name, batch_size=200, security=cluster.security)
    try:
        for i, line in enumerate(lines):
            inj.send(b"", line.encode(), BASE_TS + i * 1000)
        inj.flush()
        if finish:
            inj.finish()
    finally:
        inj.close()


def _counts(out: str, expected: dict[str, int]) -> dict[str, int]:
    """The sink's final counts once it holds as many records as ``expected`` implies."""
    total = sum(expected.values())
    wait_until(lambda: len(list(read_file_sink(out))) >= total, 120, f"{total} count records in {out}")
    rows = list(read_file_sink(out))
    assert len(rows) == total, f"{len(rows)} count records for {total} words"
    return wordcount.final_counts(rows)


def _dirs(cluster: Cluster, computation: str) -> list[str]:
    return [os.path.join(w.state_dir, computation) for w in cluster.workers
            if os.path.isdir(os.path.join(w.state_dir, computation))]


def _job(cluster: Cluster, name: str) -> dict[str, object]:
    return next(j for j in cluster.client.jobs() if j["name"] == name)


def _cli(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli", *args, "--masters", cluster.masters_arg],
                          capture_output=True, text=True, timeout=120, check=False)


def test_update_adds_a_computation_removes_another_and_keeps_the_state_of_the_rest(cluster: Cluster) -> None:
    out, out2 = os.path.join(cluster.data_dir, "counts"), os.path.join(cluster.data_dir, "counts2")
    topo = wordcount.topology(out, name="wc")
    topo.add_computation("doomed", "tests.jobs:CountTo", inputs={"words": None}, outputs=["doomed_counts"],
                         params={"out": "doomed_counts"})
    cluster.client.submit(topo)
    cluster.wait_assigned()
    first, second = sample_lines(800, seed=5), sample_lines(700, seed=6)
    _inject(cluster, "part-1", first)
    assert _counts(out, oracle(first)) == oracle(first)
    wait_until(lambda: _dirs(cluster, "doomed"), 30, "the doomed computation's storage")

    new = wordcount.topology(out, name="wc")
    # Changed: the counter's options (it reopens with them, keeping its counts).
    new.computations["counter"] = dataclasses.replace(new.computations["counter"], params={"note": "v2"})
    new.add_computation("counter2", "tests.jobs:CountTo", inputs={"words": None}, outputs=["counts2"],
                        params={"out": "counts2"})
    new.add_computation("counts2_sink", "runtime.sinks:FileSink", inputs={"counts2": None},
                        params={"path": out2}, key_ranges=2)
    with pytest.raises(TopologyError, match="removes doomed.*--drop-state"):
        cluster.client.update(new)
    assert "doomed" in cluster.client.status()["computations"], "a refused update changes nothing"
    summary = cluster.client.update(new, drop_state=True)
    assert (summary["added"], summary["removed"], summary["changed"]) == (
        ["counter2", "counts2_sink"], ["doomed"], ["counter"])
    assert set(cluster.client.status()["computations"]) == {"splitter", "counter", "counts_sink", "counter2",
                                                            "counts2_sink"}
    _inject(cluster, "part-2", second, finish=True)
    assert _counts(out, oracle(first + second)) == oracle(first + second)  # counts went on from part 1
    assert _counts(out2, oracle(second)) == oracle(second)  # the new computation saw what came after
    wait_until(lambda: not _dirs(cluster, "doomed"), 30, "the removed computation's storage deleted")
    word, n = next(iter(oracle(first + second).items()))
    assert cluster.client.state("counter", word.encode()) == str(n).encode()
    done = _cli(cluster, "state", "get", "counter", word)
    assert done.returncode == 0 and done.stdout.strip() == str(n), done.stderr


def _with_raw_reader(out: str, raw: str) -> Topology:
    """The word count plus a second reader of ``lines`` that writes every line to ``raw``."""
    topo = wordcount.topology(out, name="wc")
    topo.add_computation("raw_lines", "runtime.sinks:FileSink", inputs={"lines": None},
                         params={"path": raw}, key_ranges=2)
    return topo


def _inject_through(inj: Injector, first: list[str], second: list[str], update: Callable[[], None]) -> None:
    """One injector: ``first``, flushed; then ``update()``; then ``second``, flushed and finished."""
    try:
        for i, line in enumerate(first + second):
            if i == len(first):
                inj.flush()
                update()
            inj.send(b"", line.encode(), BASE_TS + i * 1000)
        inj.flush()
        inj.finish()
    finally:
        inj.close()


def test_an_injector_running_through_an_update_feeds_the_new_reader_of_its_stream(cluster: Cluster) -> None:
    """The same injector before and after an update that adds a second reader of its stream:
    everything sent after update() returns reaches the new reader. The injector used to keep
    the routing it started with (nothing refused it: the old reader's tablets had not moved),
    and the new reader got nothing from it."""
    out, raw = os.path.join(cluster.data_dir, "counts"), os.path.join(cluster.data_dir, "raw")
    cluster.client.submit(wordcount.topology(out, name="wc"))
    cluster.wait_assigned()
    first, second = sample_lines(300, seed=7), sample_lines(300, seed=8)

    def add_reader() -> None:
        assert cluster.client.update(_with_raw_reader(out, raw))["added"] == ["raw_lines"]

    _inject_through(Injector(cluster.masters_arg, "lines", "long-lived", batch_size=50, security=cluster.security),
                    first, second, add_reader)
    assert _counts(out, oracle(first + second)) == oracle(first + second)
    wait_until(lambda: len(list(read_file_sink(raw))) >= len(second), 60, "the new reader's lines")
    got = sorted(str(r["value"]) for r in read_file_sink(raw))
    assert got == sorted(second), (len(got), len(second))


def test_an_injector_running_through_an_update_stops_feeding_a_removed_reader(cluster: Cluster) -> None:
    """The other direction: an update removes a reader of the injector's stream. Its tablets
    are gone, and a delivery to them was answered BUSY until the round timed out: the
    injector's next flush raised. Now the round drops them and goes on."""
    out, raw = os.path.join(cluster.data_dir, "counts"), os.path.join(cluster.data_dir, "raw")
    cluster.client.submit(_with_raw_reader(out, raw))
    cluster.wait_assigned()
    first, second = sample_lines(300, seed=9), sample_lines(300, seed=10)

    def remove_reader() -> None:
        wait_until(lambda: len(list(read_file_sink(raw))) >= len(first), 60, "the first lines")
        assert cluster.client.update(wordcount.topology(out, name="wc"), drop_state=True)["removed"] == ["raw_lines"]

    _inject_through(Injector(cluster.masters_arg, "lines", "long-lived", batch_size=50, timeout=20,
                             security=cluster.security), first, second, remove_reader)
    assert _counts(out, oracle(first + second)) == oracle(first + second)


def test_drain_emits_every_window_then_refuses_input(cluster: Cluster) -> None:
    out = os.path.join(cluster.data_dir, "windows")
    cluster.client.submit(windows.topology(out, name="win"))
    cluster.wait_assigned()
    events = _events(4000, 20, seed=4)
    inj = Injector(cluster.masters_arg, "events", "never-finishes", batch_size=500)
    try:
        _send(inj, events)
        inj.flush()  # but never finish(): only the drain can close the last windows
        assert cluster.client.drain("win", timeout=120) == "drained"
        assert _windows(out) == _oracle(events)
        assert _job(cluster, "win")["state"] == "drained"
        inj.send(b"k1", b"", events[-1][1] + 10_000_000)
        with pytest.raises(InjectionError, match="job 'win'.*drain"):
            inj.flush()
        assert inj.queued == 1, "a refused record stays queued"
    finally:
        inj.close()
    with pytest.raises(MillstreamError, match="drained"):
        Injector(cluster.masters_arg, "events", "latecomer")
    assert _windows(out) == _oracle(events), "nothing after the drain"
    listed = _cli(cluster, "jobs")
    assert listed.returncode == 0 and "DRAINED" in listed.stdout and "window_counter" in listed.stdout


def test_cancel_keeps_state_to_resume_or_deletes_it(cluster: Cluster) -> None:
    out = os.path.join(cluster.data_dir, "counts")
    cluster.client.submit(wordcount.topology(out, name="wc"))
    cluster.wait_assigned()
    first, second, third = sample_lines(600, seed=7), sample_lines(500, seed=8), sample_lines(400, seed=9)
    _inject(cluster, "part-1", first)
    assert _counts(out, oracle(first)) == oracle(first)

    assert cluster.client.cancel("wc", keep_state=True) == "cancelled"
    assert _job(cluster, "wc")["state_kept"] is True
    assert not cluster.client.routing().computations, "a cancelled job's tablets close"
    with pytest.raises(MillstreamError, match="cancelled"):
        _inject(cluster, "refused", first[:5])
    assert _dirs(cluster, "counter"), "the state is kept"

    cluster.client.submit(wordcount.topology(out, name="wc"))  # resumes from the kept state
    assert _job(cluster, "wc")["state"] == "running"
    _inject(cluster, "part-2", second, finish=True)
    assert _counts(out, oracle(first + second)) == oracle(first + second)

    ranges_before = {t["key_range"] for t in cluster.client.status()["tablets"] if t["computation"] == "counter"}
    done = _cli(cluster, "cancel", "wc")
    assert done.returncode == 0 and "deleted" in done.stdout, done.stderr
    assert not cluster.client.status()["tablets"]
    wait_until(lambda: not _dirs(cluster, "counter") and not _dirs(cluster, "splitter"), 30,
               "every copy of the cancelled job's state deleted")
    assert _job(cluster, "wc")["state"] == "cancelled" and _job(cluster, "wc")["state_kept"] is False

    out3 = os.path.join(cluster.data_dir, "counts-again")
    cluster.client.submit(wordcount.topology(out3, name="wc"))  # the name again: a new job from nothing
    ranges_after = {t["key_range"] for t in cluster.client.status()["tablets"] if t["computation"] == "counter"}
    assert min(ranges_after) > max(ranges_before), "range ids never come back"
    _inject(cluster, "part-3", third, finish=True)
    assert _counts(out3, oracle(third)) == oracle(third)


def _low_watermark(cluster: Cluster, computation: str) -> int:
    return int(cluster.client.status()["computations"][computation]["low_watermark"])


def test_cancelling_the_reader_of_a_stream_another_job_produces_does_not_stall_that_job(cluster: Cluster) -> None:
    """Review 3, N3: what the producing job had routed to the cancelled reader was retried for
    ever and held its watermark, so its windows, its drain and its savepoints, for good."""
    producer = Topology("producer")
    producer.add_computation("p", "tests.jobs:CountTo", inputs={"lines": None}, outputs=["s"], params={"out": "s"})
    reader = Topology("reader")  # slow: the producer's productions queue for it
    reader.add_computation("r", "tests.jobs:SlowCounter", inputs={"s": None}, outputs=["r_counts"],
                           params={"every": "1", "sleep": "0.05"})
    cluster.client.submit(producer)
    cluster.client.submit(reader)
    cluster.wait_assigned()
    inj = Injector(cluster.masters_arg, "lines", "steady", batch_size=50, security=cluster.security)
    try:
        for i in range(300):
            inj.send(b"k%d" % (i % 30), b"", BASE_TS + i * 1000)
        inj.flush()
        inj.advance_watermark(BASE_TS + 300 * 1000)
        wait_until(lambda: cluster.client.status()["computations"]["r"]["processed"] > 0, 30, "the reader at work")
        assert cluster.client.status()["computations"]["r"]["processed"] < 300, "productions still on their way"
        assert cluster.client.cancel("reader", keep_state=True) == "cancelled"
        later = BASE_TS + 60_000_000
        for i in range(300):
            inj.send(b"k%d" % (i % 30), b"", later + i * 1000)
        inj.flush()
        inj.advance_watermark(later + 300 * 1000)
        wait_until(lambda: _low_watermark(cluster, "p") >= later, 30,
                   "the producer's watermark past what it had sent the cancelled reader")
    finally:
        inj.close()
    assert cluster.client.drain("producer", timeout=30) == "drained"


def test_bad_lifecycle_commands_get_one_line_each(cluster: Cluster) -> None:
    for args, expect in ((("drain", "nope"), "no job named 'nope'"), (("cancel", "nope"), "no job named 'nope'"),
                         (("update", "examples.wordcount:Counter"), "not a Topology"),
                         (("state", "get", "nope", "k"), "no computation 'nope' is running"),
                         (("savepoint", "nope", os.path.join(cluster.data_dir, "sp")), "no job named 'nope'"),
                         (("restore", cluster.data_dir), "is not a millstream savepoint")):
        done = _cli(cluster, *args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and expect in lines[0], (args, done.stderr)
    topo = Topology("never-submitted")
    topo.add_computation("c1", "examples.wordcount:Counter", inputs={"x": None})
    with pytest.raises(MillstreamError, match="no job named 'never-submitted'"):
        cluster.client.update(topo)


UPJOB = '''
from runtime import Computation


class Counter(Computation):
    def process_record(self, ctx, record):
        n = int(ctx.state.get() or b"0") + 1
        ctx.state.set(str(n).encode())
        ctx.produce("counts", ("%d" + SUFFIX).encode() % n)
'''


def test_user_code_upgrades_by_a_rolling_restart_of_the_workers(tmp_path: object,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    code = os.path.join(str(tmp_path), "code")
    os.makedirs(code)
    with open(os.path.join(code, "upjob.py"), "w") as f:
        f.write('SUFFIX = ""\n' + UPJOB)
    monkeypatch.syspath_prepend(code)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([code, os.environ.get("PYTHONPATH", "")]))
    out = os.path.join(str(tmp_path), "counts")
    topo = Topology("up")
    topo.add_computation("upcounter", "upjob:Counter", inputs={"words": None}, outputs=["counts"])
    topo.add_computation("upsink", "runtime.sinks:FileSink", inputs={"counts": None}, params={"path": out},
                         key_ranges=2)
    words = [f"w{i % 37}".encode() for i in range(1500)]
    with Cluster(str(tmp_path), workers=2, allow_code="upjob,runtime,examples,tests").running() as cluster:
        cluster.client.submit(topo)
        cluster.wait_assigned()
        with Injector(cluster.masters_arg, "words", "before", batch_size=300) as inj:
            for i, w in enumerate(words[:700]):
                inj.send(w, b"1", BASE_TS + i)
        wait_until(lambda: len(list(read_file_sink(out))) >= 700, 60, "the first counts")
        with open(os.path.join(code, "upjob.py"), "w") as f:
            f.write('SUFFIX = ":v2"\n' + UPJOB)
        for worker in list(cluster.workers):  # one at a time: the other keeps the job running
            cluster.kill(worker, graceful=True)
            cluster.restart_worker(worker)
            cluster.wait_ready(60)
            cluster.wait_assigned()
        with Injector(cluster.masters_arg, "words", "after", batch_size=300) as inj:
            for i, w in enumerate(words[700:]):
                inj.send(w, b"1", BASE_TS + 700 + i)
        wait_until(lambda: len(list(read_file_sink(out))) >= len(words), 60, "every count")
        rows = list(read_file_sink(out))
    assert len(rows) == len(words)
    by_word: dict[str, list[str]] = {}
    for row in rows:
        by_word.setdefault(str(row["key"]), []).append(str(row["value"]))
    for word, values in by_word.items():
        counts = sorted(int(v.split(":")[0]) for v in values)
        assert counts == list(range(1, words.count(word.encode()) + 1)), word  # state kept through the restarts
    assert sum(v.endswith(":v2") for vs in by_word.values() for v in vs) == len(words) - 700


def test_savepoint_cancel_and_restore_from_the_command_line(cluster: Cluster) -> None:
    out = os.path.join(cluster.data_dir, "counts")
    cluster.client.submit(wordcount.topology(out, name="wc"))
    cluster.wait_assigned()
    lines = sample_lines(300, seed=12)
    _inject(cluster, "cli", lines, finish=True)
    expected = oracle(lines)
    assert _counts(out, expected) == expected
    saved = os.path.join(cluster.data_dir, "savepoint")
    for args, says in ((("savepoint", "wc", saved), "savepoint of job 'wc'"), (("cancel", "wc"), "deleted"),
                       (("restore", saved), "restored job 'wc'")):
        done = _cli(cluster, *args)
        assert done.returncode == 0 and says in done.stdout, (args, done.stdout, done.stderr)
    cluster.wait_assigned()
    word, n = max(expected.items(), key=lambda kv: kv[1])
    done = _cli(cluster, "state", "get", "counter", word)
    assert done.returncode == 0 and done.stdout.strip() == str(n), (done.stdout, done.stderr)
    assert _job(cluster, "wc")["state"] == "running"


def test_the_same_savepoint_restores_again_after_the_first_restores_sink_tablets_moved(cluster: Cluster) -> None:
    """Restoring a savepoint a second time (a backfill run again): the second restore's tablets
    got the first one's tokens (saved + 2^20), below what the first restore's moved sink
    tablets had claimed their files with, and every FileSink tablet with output then failed
    its claim for ever (StaleTokenError), its output never coming. Now it outranks them, takes
    its files back to the savepoint and goes on: the output is the savepoint's and what came
    after the second restore, each count once."""
    out = os.path.join(cluster.data_dir, "counts")
    cluster.client.submit(wordcount.topology(out, name="wc"))
    cluster.wait_assigned()
    before, between, after = (sample_lines(n, seed=s) for n, s in ((200, 31), (150, 32), (120, 33)))
    _inject(cluster, "before", before)
    assert _counts(out, oracle(before)) == oracle(before)
    saved = os.path.join(cluster.data_dir, "savepoint")
    cluster.client.savepoint("wc", saved)
    cluster.client.cancel("wc")
    assert cluster.client.restore(saved) == "wc"
    cluster.wait_assigned()
    doc = cluster.client.status()
    moved = {}
    for t in [t for t in doc["tablets"] if t["computation"] == "counts_sink"]:
        other = next(w for w in doc["workers"] if w["id"] != t["worker"])
        # its token passes the restore's (once its copy there has caught up)
        moved[t["key_range"]] = cluster.client.move("counts_sink", t["key_range"], other["address"])

    def tokens() -> dict[int, int]:
        return {t["key_range"]: t["token"] for t in cluster.client.status()["tablets"]
                if t["computation"] == "counts_sink" and t["worker"]}

    wait_until(lambda: all(tokens().get(r, 0) >= t for r, t in moved.items()), 60,
               f"the sink's tablets moved (tokens {moved})")
    _inject(cluster, "between", between)  # written by the moved tablets, after their claim
    assert _counts(out, oracle(before + between)) == oracle(before + between)

    cluster.client.cancel("wc")
    assert cluster.client.restore(saved) == "wc"
    cluster.wait_assigned()
    _inject(cluster, "after", after)
    expected = oracle(before + after)
    total = sum(expected.values())

    def settled() -> bool:
        rows = list(read_file_sink(out))
        try:
            return len(rows) == total and wordcount.final_counts(rows) == expected
        except AssertionError:  # a count twice: the files are not back to the savepoint (yet)
            return False

    wait_until(settled, 120, "the savepoint's counts and the later ones, each once, in the sink")
