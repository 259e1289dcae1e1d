"""Dataflows on a real cluster: a fused word count exact through a worker's crash, and
event-time windows exact while their key range is split and merged under traffic (each half
gets the timers of its windows: runtime/flows/windowing.py)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import defaultdict

from cli.demo import oracle, sample_lines
from examples import wordcount
from injectors import Injector
from runtime import Dataflow, codecs
from runtime.sinks import FileSink, read_file_sink
from runtime.windows import SECOND, Sum, Tumbling
from tests import flowjobs as j
from tests.e2e.wordcount_run import inject_lines
from tests.harness import Cluster, wait_until

T0 = 1_700_000_000_000_000


def test_a_flow_word_count_is_exact_through_a_worker_sigkill(cluster: Cluster) -> None:
    out = os.path.join(cluster.data_dir, "out-flow")
    flow = wordcount.flow(out, name="wcflow")
    assert list(flow.topology().computations) == ["wcflow.input", "wcflow.counts"]  # the sink runs in counts
    cluster.client.submit(flow)
    cluster.wait_assigned()
    lines = sample_lines(3000, seed=5)
    expected = oracle(lines)
    victim = cluster.workers[0]

    def crash_and_restart() -> None:
        cluster.kill_worker(victim, graceful=False)
        cluster.restart_worker(victim)

    inject_lines(cluster.masters_arg, "flow-source", lines, repeat_every=5, midway=crash_and_restart)
    total = sum(expected.values())
    wait_until(lambda: len(list(read_file_sink(out))) >= total, 120, f"{total} counts")
    rows = list(read_file_sink(out))
    assert wordcount.final_counts(rows) == expected
    assert len(rows) == total
    # The flow's state, read from outside: the reduce step's running count, by the step's name.
    word, n = max(expected.items(), key=lambda kv: kv[1])
    assert cluster.client.typed_state("wcflow.counts", word.encode(), "wcflow.counts") == n
    done = subprocess.run([sys.executable, "-m", "cli", "state", "get", "wcflow.counts", word, "--state",
                           "wcflow.counts", "--masters", cluster.masters_arg],
                          capture_output=True, text=True, timeout=120, check=False)
    assert (done.returncode, done.stdout.strip()) == (0, str(n)), done.stderr
    # A flow's stage has no ctx.state: without --state, the answer names what --state reads.
    done = subprocess.run([sys.executable, "-m", "cli", "state", "get", "wcflow.counts", word,
                           "--masters", cluster.masters_arg], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "wcflow.counts" in done.stdout.strip().partition("read with --state NAME: ")[2].split(", "), done.stdout


def test_windows_of_a_flow_stay_exact_while_their_range_splits_and_merges(cluster: Cluster) -> None:
    out = os.path.join(cluster.data_dir, "out-win")
    flow = Dataflow("winflow", key_ranges=1)
    (flow.input("events", codec=codecs.JSON).key_by(j.key_of).map(j.value_of)
     .window(Tumbling(SECOND), Sum(), name="win_sums").sink(FileSink, name="win_out", path=out))
    cluster.client.submit(flow)
    cluster.wait_assigned()
    rng = random.Random(2)
    expected: dict[tuple[str, int], int] = defaultdict(int)
    # The input's key function runs here, in the injector: its module must be allowed.
    with Injector(cluster.masters_arg, "events", "win-source", batch_size=100, allow_code=["tests"]) as inj:
        for chunk in range(6):
            for i in range(300):
                n = chunk * 300 + i
                k, v, ts = f"k{rng.randrange(40)}", rng.randrange(10), T0 + n * 10_000
                expected[(k, ts - ts % SECOND)] += v
                inj.send(b"", json.dumps({"k": k, "v": v}).encode(), ts)
            inj.flush()
            inj.advance_watermark(T0 + (chunk + 1) * 300 * 10_000 - 500_000)
            ranges = sorted((t for t in cluster.client.status()["tablets"] if t["computation"] == "win_sums"),
                            key=lambda t: t["start"])
            if chunk in (1, 3) and len(ranges) == 1:
                cluster.client.split("win_sums", ranges[0]["key_range"])  # the halves each need timers
            elif chunk == 4 and len(ranges) == 2:
                cluster.client.merge("win_sums", ranges[0]["key_range"], ranges[1]["key_range"])
        inj.finish()
    wait_until(lambda: len(list(read_file_sink(out))) >= len(expected), 120, f"{len(expected)} windows")
    got = {}
    for row in read_file_sink(out):
        start, _, total = json.loads(str(row["value"]))
        assert (row["key"], start) not in got, f"window {(row['key'], start)} fired twice"
        got[(str(row["key"]), start)] = total
    assert got == dict(expected)
