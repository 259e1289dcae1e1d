"""A busy worker is not a dead worker (issue 9): slow user code, a record slower than the
lease and a burst of due timers delay their key ranges, never a lease.

Every scenario runs on default timing (a 3 s lease) and ends with :func:`assert_no_lease_lost`:
the leader saw no lease expire and no worker register twice, and no worker logged that it
self-fenced, refused a commit or re-registered.
"""

from __future__ import annotations

import collections
import os
import random
import threading

from bench.generator import SECOND_US, window_of
from cli.demo import oracle
from injectors import Injector
from runtime import Topology
from runtime.keyspace import range_of
from runtime.sinks import read_file_sink
from tests.harness import Cluster, wait_until

BASE_TS = 1_700_000_000_000_000
LIVENESS_FAILURES = ("self-fencing", "lease expired", "re-registering")


def assert_no_lease_lost(c: Cluster, workers: int) -> None:
    live = c.client.status()["liveness"]
    assert live["lease_expiries"] == 0, live
    assert live["registrations"] == workers, live  # each worker registered once, never again
    for w in c.workers:
        with open(w.log_path) as f:
            bad = [line for line in f if any(s in line for s in LIVENESS_FAILURES)]
        assert not bad, f"{w.name}: {bad[:3]}"


def zipf_lines(n: int, vocabulary: int = 400, s: float = 1.1, seed: int = 5) -> list[str]:
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(vocabulary)]
    weights = [1 / (i + 1) ** s for i in range(vocabulary)]
    return [" ".join(rng.choices(words, weights, k=rng.randint(1, 8))) for _ in range(n)]


def test_a_hot_key_with_slow_growing_state_finishes_exactly_and_keeps_its_lease(tmp_path: object) -> None:
    """splitter -> counter -> a collector that re-writes a JSON list of every count it got,
    per word: for the hottest word the list grows past 100 KB and each record costs
    milliseconds. Before issue 9 a batch of such records outlived the lease and the job
    never finished."""
    with Cluster(str(tmp_path), workers=2, lease_ms=3000).running() as c:
        out = os.path.join(c.data_dir, "collected")
        topo = Topology("hot")
        topo.add_computation("splitter", "examples.wordcount:Splitter", inputs={"lines": None},
                             outputs=["words"])
        topo.add_computation("counter", "examples.wordcount:Counter", inputs={"words": None},
                             outputs=["counts"])
        topo.add_computation("collector", "tests.jobs:NaiveCollector", inputs={"counts": None},
                             outputs=["collected"])
        topo.add_computation("sink", "runtime.sinks:FileSink", inputs={"collected": None},
                             params={"path": out}, key_ranges=2)
        c.client.submit(topo)
        c.wait_assigned()
        lines = zipf_lines(20_000)
        expected = oracle(lines)
        assert max(expected.values()) > 15_000  # the hot key's state: a JSON list of >15k counts
        with Injector(c.masters_arg, "lines", "hot-lines") as inj:
            for i, line in enumerate(lines):
                inj.send(b"", line.encode(), BASE_TS + i * 1000)
        total = sum(expected.values())
        wait_until(lambda: sum(1 for _ in read_file_sink(out)) >= total, 600, f"{total} collected rows")
        by_word: dict[str, dict[int, int]] = collections.defaultdict(dict)
        for row in read_file_sink(out):
            n, s = map(int, str(row["value"]).split())
            assert n not in by_word[str(row["key"])], f"{row['key']}: list length {n} emitted twice"
            by_word[str(row["key"])][n] = s
        for word, n in expected.items():
            got = by_word[word]
            assert sorted(got) == list(range(1, n + 1)), word
            assert got[n] == n * (n + 1) // 2, f"{word}: the collected counts are not 1..{n}"
        assert_no_lease_lost(c, workers=2)


def _slow_calls(c: Cluster) -> list[dict[str, object]]:
    return list(c.client.status()["computations"]["sleepy"]["slow_keys"])


def test_a_record_slower_than_the_lease_delays_only_its_key_range(tmp_path: object) -> None:
    """One record sleeps 10 s with a 3 s lease: the lease holds, status names the key while it
    runs, and another key range on the same worker commits records meanwhile."""
    with Cluster(str(tmp_path), workers=2, lease_ms=3000).running() as c:
        out = os.path.join(c.data_dir, "echoed")
        topo = Topology("slow")
        topo.add_computation("sleepy", "tests.jobs:Sleepy", inputs={"in": None}, outputs=["echoed"],
                             key_ranges=4)
        topo.add_computation("sink", "runtime.sinks:FileSink", inputs={"echoed": None}, params={"path": out})
        c.client.submit(topo)
        c.wait_assigned()
        owner = {t["key_range"]: t["worker"] for t in c.client.status()["tablets"]
                 if t["computation"] == "sleepy"}
        keys = [f"k{i}".encode() for i in range(200)]
        slow_key = keys[0]
        slow_range = range_of(slow_key, 4)
        neighbours = [k for k in keys if range_of(k, 4) != slow_range
                      and owner[range_of(k, 4)] == owner[slow_range]]
        assert neighbours, "no other key range on the slow key's worker"

        def send_slow() -> None:
            with Injector(c.masters_arg, "in", "slow-one") as inj:
                inj.send(slow_key, b"sleep 10", BASE_TS)

        slow = threading.Thread(target=send_slow)
        slow.start()
        try:
            wait_until(lambda: any(s["key"] == slow_key.decode() and s["running"] for s in _slow_calls(c)),
                       30, "status to show the slow key running")
            with Injector(c.masters_arg, "in", "others") as inj:
                for i, k in enumerate(neighbours):
                    inj.send(k, b"v%d" % i, BASE_TS + i)
                inj.flush()  # returns once every one of them is committed
            # ... while the slow record was still running on the same worker:
            running = [s for s in _slow_calls(c) if s["key"] == slow_key.decode() and s["running"]]
            assert running, "the slow record finished before the other range committed"
        finally:
            slow.join(60)
        assert not slow.is_alive()
        want = 1 + len(neighbours)
        wait_until(lambda: sum(1 for _ in read_file_sink(out)) >= want, 60, f"{want} echoed records")
        rows = [(r["key"], r["value"]) for r in read_file_sink(out)]
        assert len(rows) == want and ("k0", "sleep 10") in rows
        took = [s for s in _slow_calls(c) if s["key"] == slow_key.decode()]
        assert took and float(str(took[0]["seconds"])) >= 10
        owner_proc = next(w for w in c.workers if any(
            f"for key '{slow_key.decode()}' has been running" in line for line in open(w.log_path)))
        assert owner_proc.alive()
        assert_no_lease_lost(c, workers=2)


def test_a_burst_of_event_time_timers_is_fired_exactly_and_keeps_the_lease(tmp_path: object) -> None:
    """A bounded input of 200,000 records over 2,000 keys in one-second windows; the watermark
    is released by finish() at the end, so ~86,000 window timers fall due at once."""
    with Cluster(str(tmp_path), workers=2, lease_ms=3000).running() as c:
        out = os.path.join(c.data_dir, "windows")
        topo = Topology("burst")
        topo.add_computation("windows", "bench.jobs:WindowCounter", inputs={"events": None},
                             outputs=["windows"], key_ranges=8)
        topo.add_computation("sink", "runtime.sinks:FileSink", inputs={"windows": None},
                             params={"path": out}, key_ranges=2)
        c.client.submit(topo)
        c.wait_assigned()
        rng = random.Random(9)
        expected: collections.Counter[tuple[str, int]] = collections.Counter()
        with Injector(c.masters_arg, "events", "burst") as inj:
            for _ in range(200_000):
                key = f"user{rng.randrange(2000)}"
                ts = BASE_TS + rng.randrange(50 * SECOND_US)
                expected[(key, window_of(ts))] += 1
                inj.send(key.encode(), b"", ts)
            inj.finish()  # the watermark goes to the end of time: every window falls due
        wait_until(lambda: sum(1 for _ in read_file_sink(out)) >= len(expected), 600,
                   f"{len(expected)} windows")
        got: dict[tuple[str, int], int] = {}
        for row in read_file_sink(out):
            w, n = map(int, str(row["value"]).split())
            k = (str(row["key"]), w)
            assert k not in got, f"window {k} emitted twice"
            got[k] = n
        assert got == dict(expected)
        assert_no_lease_lost(c, workers=2)
