"""``millstream inject-files`` (injectors/files.py) end to end: every line of every file is
counted once, and injecting the same directory again adds nothing (each file is a sequenced
producer, its lines its sequence: deliveries in the columns' sequenced form)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import warnings
from collections import Counter

from cli.demo import oracle, sample_lines
from examples import wordcount
from injectors.files import inject_directory
from injectors.follow import follow_directory
from runtime import Dataflow, codecs
from runtime.record import TimestampUnitWarning
from runtime.sinks import FileSink, read_file_sink
from runtime.windows import SECOND, Sum, Tumbling
from tests import flowjobs as j
from tests.harness import Cluster, wait_until

T0 = 1_700_000_000_000_000
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _submit_clicks(cluster: Cluster, name: str) -> str:
    """A flow summing each user's clicks per second of event time, from JSON lines on
    ``<name>.in``; its sink's directory."""
    out = os.path.join(cluster.data_dir, f"out-{name}")
    flow = Dataflow(name, key_ranges=2)
    flow.input(f"{name}.in", codec=codecs.JSON, keyed=True).map(j.one).window(Tumbling(SECOND), Sum()) \
        .sink(FileSink, name=f"{name}_out", codec=codecs.JSON, path=out)
    cluster.client.submit(flow)
    cluster.wait_assigned()
    return out


def _windows(out: str) -> dict[tuple[str, int], int]:
    """The sink's windows, (user, second after T0) -> sum; each fired once."""
    rows = list(read_file_sink(out))
    got = {(r["key"], (json.loads(r["value"])[0] - T0) // SECOND): json.loads(r["value"])[2] for r in rows}
    assert len(got) == len(rows), "a window fired twice"
    return got


def test_a_directory_is_counted_once_however_often_it_is_injected(cluster: Cluster) -> None:
    out = os.path.join(cluster.data_dir, "out-files")
    cluster.client.submit(wordcount.topology(out, name="files"))
    cluster.wait_assigned()
    src = os.path.join(cluster.data_dir, "src")
    os.makedirs(src)
    lines = sample_lines(1200, seed=5)
    for n, part in enumerate((lines[:700], lines[700:])):
        with open(os.path.join(src, f"part-{n}.log"), "w") as f:
            f.write("\n".join(part) + "\n")
    expected = oracle(lines)
    total = sum(expected.values())
    assert inject_directory(src, cluster.masters_arg, "lines", security=cluster.security) == len(lines)
    wait_until(lambda: len(list(read_file_sink(out))) >= total, 120, f"{total} count records in the sink")
    assert wordcount.final_counts(list(read_file_sink(out))) == expected
    # Again, then a marker file: once the marker is counted, the re-run has gone through.
    assert inject_directory(src, cluster.masters_arg, "lines", security=cluster.security) == len(lines)
    marker = os.path.join(cluster.data_dir, "marker")
    os.makedirs(marker)
    with open(os.path.join(marker, "m.log"), "w") as f:
        f.write("zzmarker\n")
    inject_directory(marker, cluster.masters_arg, "lines", security=cluster.security)
    wait_until(lambda: any(r["key"] == "zzmarker" for r in read_file_sink(out)), 60, "the marker")
    rows = [r for r in read_file_sink(out) if r["key"] != "zzmarker"]
    assert wordcount.final_counts(rows) == expected and len(rows) == total


def test_json_lines_injected_with_their_own_keys_and_times_fill_event_time_windows(cluster: Cluster) -> None:
    """`inject-files --key-field user --timestamp-field ts`: records keyed and timed by their
    lines, out of order across files; the windows fire once the directory is finished."""
    out = _submit_clicks(cluster, "jsonclicks")
    src = os.path.join(cluster.data_dir, "clicks")
    os.makedirs(src)
    events = [(f"u{i % 4}", T0 + (i * 7_919) % 5_000_000) for i in range(400)]
    for n in range(2):
        with open(os.path.join(src, f"part-{n}.jsonl"), "w") as f:
            f.write("".join(json.dumps({"user": u, "ts": t}) + "\n" for u, t in events[n::2]))
    assert inject_directory(src, cluster.masters_arg, "jsonclicks.in", security=cluster.security,
                            key_field="user", time_field="ts") == len(events)
    expected = Counter((u, (t - T0) // SECOND) for u, t in events)
    wait_until(lambda: len(list(read_file_sink(out))) >= len(expected), 120, "every window in the sink")
    assert _windows(out) == dict(expected)


def test_a_followed_directory_sends_each_file_once_as_it_comes_and_across_restarts(cluster: Cluster) -> None:
    """`inject-files --follow` on the command line: files moved in while it runs are counted,
    Ctrl-C leaves the stream unfinished, and run again it sends only what its readers lack."""
    out = os.path.join(cluster.data_dir, "out-follow")
    cluster.client.submit(wordcount.topology(out, name="follow"))
    cluster.wait_assigned()
    src, staging = os.path.join(cluster.data_dir, "follow-src"), os.path.join(cluster.data_dir, "follow-staging")
    os.makedirs(src)
    os.makedirs(staging)
    lines = sample_lines(900, seed=9)
    parts = [lines[:300], lines[300:600], lines[600:]]

    def move_in(n: int) -> None:
        with open(os.path.join(staging, f"part-{n}.log"), "w") as f:
            f.write("\n".join(parts[n]) + "\n")
        os.rename(os.path.join(staging, f"part-{n}.log"), os.path.join(src, f"part-{n}.log"))

    def counted(upto: int) -> bool:
        rows = list(read_file_sink(out))
        return wordcount.final_counts(rows) == oracle(lines[:upto]) and len(rows) == sum(oracle(lines[:upto]).values())

    def follower() -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "cli", "--log-level", "ERROR", "inject-files", src, "--stream",
                                 "lines", "--follow", "--poll-s", "0.1", "--masters", cluster.masters_arg],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                env=dict(os.environ, PYTHONPATH=ROOT))

    def stopped(proc: subprocess.Popen[str], how: signal.Signals) -> str:
        proc.send_signal(how)
        stdout, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 0 and "Traceback" not in stderr, stderr
        return stdout

    proc = follower()
    try:
        move_in(0)
        wait_until(lambda: counted(300), 120, "the first file counted")
        move_in(1)
        wait_until(lambda: counted(600), 120, "the second file counted")
        assert "sent 600 lines into 'lines'; the stream is not finished" in stopped(proc, signal.SIGINT)
        move_in(2)  # while no follower runs
        proc = follower()
        wait_until(lambda: counted(900), 120, "the third file counted, the first two not again")
        assert "sent 900 lines" in stopped(proc, signal.SIGTERM)  # (the first two again: dropped by their readers)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert counted(900)


def test_followed_json_lines_fire_the_windows_their_later_times_pass_across_a_restart(cluster: Cluster) -> None:
    """With --timestamp-field the follower's watermark trails the latest time by --max-delay-s:
    windows before it fire while the follower runs, the one it has not passed does not; and a
    follower stopped and run again under the same name takes the stream on past where the
    first run left it (its hold is replaced, not added to)."""
    out = _submit_clicks(cluster, "followclicks")
    src = os.path.join(cluster.data_dir, "followed-clicks")
    os.makedirs(src)
    events = [(f"u{i % 3}", T0 + (i * 1_234_567) % 5_000_000) for i in range(300)]  # seconds 0-4, shuffled
    parts = [e for e in events if e[1] < T0 + 3 * SECOND], [e for e in events if e[1] >= T0 + 3 * SECOND]

    def fired(upto: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        closed = (max(t for _, t in upto) - 500_000 - T0) // SECOND  # windows before it have fired
        return dict(Counter((u, (t - T0) // SECOND) for u, t in upto if (t - T0) // SECOND < closed))

    def run_with(n: int) -> int:
        stop, sent = threading.Event(), []
        thread = threading.Thread(target=lambda: sent.append(follow_directory(
            src, cluster.masters_arg, "followclicks.in", security=cluster.security, key_field="user",
            time_field="ts", max_delay_us=500_000, poll_s=0.1, stop=stop)))
        thread.start()
        try:
            tmp = os.path.join(src, f".part-{n}.jsonl")
            with open(tmp, "w") as f:
                f.write("".join(json.dumps({"user": u, "ts": t}) + "\n" for u, t in parts[n]))
            os.rename(tmp, os.path.join(src, f"part-{n}.jsonl"))
            expected = fired([e for p in parts[:n + 1] for e in p])
            wait_until(lambda: len(list(read_file_sink(out))) >= len(expected), 120,
                       f"the windows run {n}'s watermark passed")
            assert _windows(out) == expected  # none past its watermark yet
        finally:
            stop.set()
            thread.join(60)
        return sent[0]

    assert run_with(0) == len(parts[0])
    assert run_with(1) == len(events)  # (the first file again: its readers drop it)


def test_numbers_taken_as_microseconds_by_timestamp_unit_us_are_sent_without_a_unit_warning(cluster: Cluster) -> None:
    """`--timestamp-unit us` says numbers that look like milliseconds are microseconds: the
    injector sends them as they are and does not warn (an Injector a user writes would issue a
    TimestampUnitWarning for each: injectors/files.py turns its check off)."""
    out = _submit_clicks(cluster, "usclicks")
    src = os.path.join(cluster.data_dir, "usclicks")
    os.makedirs(src)
    ms_like = 1_700_000_000_000  # milliseconds of 2023, taken as microseconds of January 1970
    events = [(f"u{i % 3}", ms_like + i * 30_011) for i in range(200)]
    with open(os.path.join(src, "part.jsonl"), "w") as f:
        f.write("".join(json.dumps({"user": u, "ts": t}) + "\n" for u, t in events))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert inject_directory(src, cluster.masters_arg, "usclicks.in", security=cluster.security,
                                key_field="user", time_field="ts", unit="us") == len(events)
    assert [w for w in caught if issubclass(w.category, TimestampUnitWarning)] == []
    expected = Counter((u, (t - T0) // SECOND) for u, t in events)
    wait_until(lambda: len(list(read_file_sink(out))) >= len(expected), 120, "every window in the sink")
    assert _windows(out) == dict(expected)
