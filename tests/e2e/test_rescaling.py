"""Live split and merge of key ranges on real processes (issue 13, docs/rescaling.md).

Every test splits or merges while records flow and checks the result against an oracle:
nothing lost, nothing counted twice, no window fired twice, watermarks never backwards.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest

from cli.demo import oracle
from examples import windows, wordcount
from injectors import Injector
from runtime.errors import MillstreamError
from runtime.keyspace import HASH_SPACE, key_hash
from runtime.sinks import read_file_sink
from tests.e2e.test_watermarks import _events, _oracle, _send, _windows
from tests.e2e.wordcount_run import run_wordcount
from tests.harness import Cluster, etcd_history, settled_word_counts, wait_until


def _ranges(cluster: Cluster, computation: str) -> list[dict[str, int]]:
    return sorted((t for t in cluster.client.status()["tablets"] if t["computation"] == computation),
                  key=lambda t: t["start"])


def _covers_the_space(ranges: list[dict[str, int]]) -> None:
    assert ranges[0]["start"] == 0 and ranges[-1]["end"] == HASH_SPACE
    assert all(a["end"] == b["start"] for a, b in zip(ranges, ranges[1:], strict=False))


def _in_background(fn: Callable[[], None]) -> Callable[[], None]:
    """Run ``fn`` on a thread from the midway hook (records keep flowing); re-raise its error."""
    errors: list[BaseException] = []
    threads: list[threading.Thread] = []

    def run() -> None:
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - reported by join()
            errors.append(e)

    def start() -> None:
        t = threading.Thread(target=run)
        threads.append(t)
        t.start()

    def join() -> None:
        for t in threads:
            t.join(180)
        if errors:
            raise errors[0]

    start.join = join  # type: ignore[attr-defined]
    return start


def test_split_and_merge_during_the_word_count_are_exact(cluster: Cluster) -> None:
    def reshard() -> None:
        before = _ranges(cluster, "counter")
        halves = cluster.client.split("counter", before[0]["key_range"])
        assert [h["start"] for h in halves] == [before[0]["start"], halves[0]["end"]]
        assert halves[1]["end"] == before[0]["end"]
        cluster.client.split("splitter", 1)
        # Back to back, no waiting here: a range just made is resharded only once its primary
        # has built and opened it (the leader waits), so no state is left behind.
        quarters = cluster.client.split("counter", halves[0]["key_range"])
        merged = cluster.client.merge("counter", quarters[0]["key_range"], quarters[1]["key_range"])
        assert (merged[0]["start"], merged[0]["end"]) == (halves[0]["start"], halves[0]["end"])
        merged = cluster.client.merge("counter", merged[0]["key_range"], halves[1]["key_range"])
        assert (merged[0]["start"], merged[0]["end"]) == (before[0]["start"], before[0]["end"])
        after = _ranges(cluster, "counter")
        _covers_the_space(after)
        assert len(after) == len(before) and merged[0]["key_range"] not in [t["key_range"] for t in before]

    hook = _in_background(reshard)
    run_wordcount(cluster, n_lines=4000, midway=hook, name="reshard")
    hook.join()  # type: ignore[attr-defined]
    assert len(_ranges(cluster, "splitter")) == 5
    # The new ranges' followers catch up from their primary: every tablet has its copies again.
    wait_until(lambda: all(t["health"] == "ok" for t in cluster.client.status()["tablets"]), 60,
               "every new range's follower to be in sync")


def test_a_split_window_pipeline_fires_every_window_once_and_watermarks_never_go_back(
        cluster: Cluster) -> None:
    out = os.path.join(cluster.data_dir, "windows")
    cluster.client.submit(windows.topology(out, key_ranges=2))
    cluster.wait_assigned()
    events = _events(9000, 40, seed=8)
    with Injector(cluster.masters_arg, "events", "src", batch_size=300) as inj:
        _send(inj, events[:3000])
        halves = cluster.client.split("window_counter", 0)
        _send(inj, events[3000:6000])
        cluster.client.merge("window_counter", halves[1]["key_range"], 1)
        _send(inj, events[6000:])
    expected = _oracle(events)
    wait_until(lambda: len(_windows(out)) >= len(expected), 120, "every window")
    assert _windows(out) == expected
    per_key: dict[str, list[int]] = collections.defaultdict(list)
    for key, value, _ in etcd_history(cluster.etcd_url, "/millstream/watermarks/"):
        per_key[key].append(int(value))
    assert per_key
    for key, values in per_key.items():
        assert values == sorted(values), f"{key} moved backwards: {values}"


def split_and_kill(c: Cluster) -> None:
    """Split the counter's first range, then kill its primary at once (and start it again)."""
    t = _ranges(c, "counter")[0]
    victim = next(w for w in c.workers if w.address == t["address"])
    c.client.split("counter", t["key_range"])
    c.kill_worker(victim, graceful=False)
    c.restart_worker(victim)


def test_a_split_when_its_worker_is_killed_is_exact(tmp_path: object) -> None:
    c = Cluster(str(tmp_path), workers=2)
    c.start()
    try:
        c.wait_ready(60)
        run_wordcount(c, n_lines=3000, midway=lambda: split_and_kill(c), name="kill")
    finally:
        c.close()


def test_a_split_racing_a_master_failover_is_exact(tmp_path: object) -> None:
    c = Cluster(str(tmp_path), masters=2, workers=2)
    c.start()
    try:
        c.wait_ready(60)

        def split_and_fail_over() -> None:
            leader = c.client.status()["masters"]["leader"]
            threading.Thread(target=lambda: c.kill(next(m for m in c.masters if m.address == leader),
                                                   graceful=False)).start()
            try:
                c.client.split("counter", 2)
            except MillstreamError:
                pass  # lost with its leader before etcd took it: the job goes on unsplit
        run_wordcount(c, n_lines=3000, midway=split_and_fail_over, name="race")
    finally:
        c.close()


def test_split_and_merge_refuse_what_they_cannot_do(cluster: Cluster) -> None:
    cluster.client.submit(windows.topology(os.path.join(cluster.data_dir, "w"), key_ranges=2))
    cluster.wait_assigned()
    with pytest.raises(MillstreamError, match="has no range 9"):
        cluster.client.split("window_counter", 9)
    with pytest.raises(MillstreamError, match="not strictly inside"):
        cluster.client.split("window_counter", 0, at=1 << 63)
    with pytest.raises(MillstreamError, match="not adjacent"):
        cluster.client.merge("window_counter", 1, 0)
    with pytest.raises(MillstreamError, match="no computation"):
        cluster.client.split("nope", 0)


def test_a_split_on_a_primary_killed_a_moment_ago_waits_for_a_live_one(tmp_path: object) -> None:
    """The chaos suite found it: a worker SIGKILLed a moment ago stays in the worker list until
    its lease runs out, and a split committed then built its halves on the dead primary alone,
    unavailable for good if its disk was lost too. The leader now waits for a heartbeat sent
    after the request: the split happens on the range's next primary, after the failover (or
    is refused with "try again")."""
    with Cluster(str(tmp_path), workers=3).running() as c:
        out = os.path.join(c.data_dir, "out")
        c.client.submit(wordcount.topology(out, name="dead-split"))
        c.wait_assigned()
        lines = [f"w{i} w{i + 1} w{i + 2}" for i in range(200)]  # every counter range gets words
        with Injector(c.masters_arg, "lines", "dead-split-source") as inj:
            for line in lines:
                inj.send(b"", line.encode(), 1_700_000_000_000_000)
            inj.flush()
        wait_until(lambda: len(list(read_file_sink(out))) >= 3 * len(lines), 60, "the counts")
        wait_until(lambda: all(t["health"] == "ok" for t in c.client.status()["tablets"]), 60,
                   "every tablet to have its in-sync follower")
        t = _ranges(c, "counter")[0]
        victim = next(w for w in c.workers if w.address == t["address"])
        c.kill_worker(victim, graceful=False)
        try:
            halves = c.client.split("counter", t["key_range"])
        except MillstreamError as e:
            assert "heard from" in str(e) or "no live primary" in str(e), e
        else:
            assert all(h["primary"] != t["worker"] for h in halves), (halves, t["worker"])
        wait_until(lambda: (len(c.client.status()["workers"]) == 2
                            and all(t["health"] == "ok" for t in c.client.status()["tablets"])), 60,
                   "every range to have a live primary and its in-sync follower again")


def test_a_split_cuts_where_the_load_divides_evenly(cluster: Cluster) -> None:
    """Keys whose hashes all lie in the first quarter: the middle of the range would leave one
    half empty; the primary's sample of its keys puts the cut among them."""
    out = os.path.join(cluster.data_dir, "out")
    topo = wordcount.topology(out, name="median", key_ranges=1)
    cluster.client.submit(topo)
    cluster.wait_assigned()
    words = [w for w in (f"w{i}" for i in range(5000)) if key_hash(w.encode()) < HASH_SPACE // 4][:200]
    with Injector(cluster.masters_arg, "lines", "median", batch_size=500) as inj:
        for i in range(3000):
            inj.send(b"", " ".join(words[(i + j) % len(words)] for j in range(3)).encode(), 1_700_000_000_000_000 + i)
    wait_until(lambda: next(t for t in cluster.client.status()["tablets"]
                            if t["computation"] == "counter")["load_median"] > 0, 30, "the counter's load median")
    halves = cluster.client.split("counter", 0)
    cut = halves[0]["end"]
    assert 0 < cut < HASH_SPACE // 4
    below = sum(1 for w in words if key_hash(w.encode()) < cut)
    assert len(words) // 4 < below < 3 * len(words) // 4  # about half the keys on each side


def test_the_split_and_merge_commands_print_the_new_ranges(cluster: Cluster) -> None:
    cluster.client.submit(windows.topology(os.path.join(cluster.data_dir, "w"), key_ranges=1))
    cluster.wait_assigned()

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cli", *args, "--masters", cluster.masters_arg],
                              capture_output=True, text=True, timeout=120)

    out = cli("split", "window_counter/0", "--at", "0x4000000000000000")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        f"window_counter/1  [0x0000000000000000, 0x4000000000000000)  primary {_ranges(cluster, 'window_counter')[0]['primary']} token 2",
        f"window_counter/2  [0x4000000000000000, 0x10000000000000000)  primary {_ranges(cluster, 'window_counter')[1]['primary']} token 2"]
    out = cli("merge", "window_counter/1", "window_counter/2")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("window_counter/3  [0x0000000000000000, 0x10000000000000000)")
    bad = cli("split", "window_counter/3", "--at", "zero")
    assert bad.returncode != 0 and "'zero' is not a hash" in bad.stderr and "Traceback" not in bad.stderr
    bad = cli("split", "window_counter/1")
    assert bad.returncode != 0 and "has no range 1" in bad.stderr and "Traceback" not in bad.stderr


def test_the_policy_splits_a_hot_range_and_moves_a_half_to_a_new_worker(tmp_path: object) -> None:
    c = Cluster(str(tmp_path), workers=2, master_args=["--rebalance-hold-s", "2", "--rebalance-cooldown-s", "4",
                                                       "--rebalance-min-rate", "50"])
    c.start()
    try:
        c.wait_ready(60)
        out = os.path.join(c.data_dir, "out")
        topo = wordcount.topology(out, name="skew", key_ranges=1)
        topo.computations["counter"] = dataclasses.replace(topo.computations["counter"], rebalance=True)
        c.client.submit(topo)
        c.wait_assigned()
        old = {w["id"] for w in c.client.status()["workers"]}
        c.add_worker()
        c.add_worker()
        wait_until(lambda: len(c.client.status()["workers"]) == 4, 30, "4 workers")
        new = {w["id"] for w in c.client.status()["workers"]} - old
        rng = random.Random(5)
        words = [f"w{i}" for i in range(300)]
        weights = [1 / (i + 1) for i in range(len(words))]  # Zipf: a few words are most of the load
        sent: list[str] = []

        def spread() -> bool:
            counters = [t for t in c.client.status()["tablets"] if t["computation"] == "counter"]
            return len(counters) >= 2 and any(t["primary"] in new for t in counters)

        with Injector(c.masters_arg, "lines", "skew", batch_size=500) as inj:
            deadline = time.monotonic() + 120
            while not spread():
                assert time.monotonic() < deadline, f"no split placed on a new worker: {c.client.status()}"
                for _ in range(500):
                    line = " ".join(rng.choices(words, weights, k=4))
                    sent.append(line)
                    inj.send(b"", line.encode(), 1_700_000_000_000_000 + len(sent))
                inj.flush()
        doc = c.client.status()
        assert any("policy:" in r["what"] and "split counter/" in r["what"] for r in doc["reshards"]), doc["reshards"]
        expected = oracle(sent)
        assert settled_word_counts(out, expected, 120) == expected
    finally:
        c.close()
