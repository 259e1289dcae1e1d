"""Low watermarks, event-time timers and late data on real processes (issue 4)."""

from __future__ import annotations

import collections
import os
import random
import threading

import pytest

from examples import windows
from injectors import Injector
from runtime import Computation, Context, Record, Topology
from runtime.sinks import read_file_sink
from tests.harness import Cluster, etcd_history, wait_until

BASE = 1_700_000_000_000_000
SECOND = 1_000_000


def _events(n: int, keys: int, seed: int, disorder_us: int = 2 * SECOND) -> list[tuple[bytes, int]]:
    """(key, timestamp) pairs advancing ~1 ms each, shuffled within ``disorder_us``."""
    rng = random.Random(seed)
    out = [(f"k{rng.randrange(keys)}".encode(), BASE + i * 1000 + rng.randrange(disorder_us)) for i in range(n)]
    return out


def _send(inj: Injector, events: list[tuple[bytes, int]], disorder_us: int = 2 * SECOND,
          every: int = 200) -> None:
    for i, (key, ts) in enumerate(events):
        inj.send(key, b"", ts)
        if i % every == every - 1:
            inj.flush()
            # Bounded disorder: nothing older than (newest base time - disorder) will follow.
            inj.advance_watermark(BASE + i * 1000 - disorder_us)


def _oracle(*streams: list[tuple[bytes, int]]) -> dict[tuple[str, int], int]:
    c: collections.Counter[tuple[str, int]] = collections.Counter()
    for events in streams:
        for key, ts in events:
            c[(key.decode(), ts - ts % SECOND)] += 1
    return dict(c)


def _windows(out: str) -> dict[tuple[str, int], int]:
    got: dict[tuple[str, int], int] = {}
    for row in read_file_sink(out):
        start, count = str(row["value"]).split(",")
        key = (str(row["key"]), int(start))
        assert key not in got, f"window {key} emitted twice"
        got[key] = int(count)
    return got


def _status(cluster: Cluster, computation: str) -> dict[str, object]:
    return dict(cluster.client.status()["computations"][computation])


def test_window_counts_from_two_out_of_order_injectors_equal_the_oracle(cluster: Cluster) -> None:
    out = os.path.join(cluster.data_dir, "windows")
    cluster.client.submit(windows.topology(out))
    cluster.wait_assigned()
    a, b = _events(6000, 20, seed=1), _events(4000, 20, seed=2)
    expected = _oracle(a, b)
    with Injector(cluster.masters_arg, "events", "source-a", batch_size=500) as ia, \
            Injector(cluster.masters_arg, "events", "source-b", batch_size=500) as ib:
        threads = [threading.Thread(target=_send, args=(ia, a)), threading.Thread(target=_send, args=(ib, b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    wait_until(lambda: len(_windows(out)) >= len(expected), 120, f"{len(expected)} windows")
    assert _windows(out) == expected
    st = _status(cluster, "window_counter")
    assert st["late"] == 0


def test_a_slow_injector_holds_every_window_back(cluster: Cluster) -> None:
    """The paper's "delayed or not there?": a registered injector that does not advance
    holds the watermark, so no window fires, however far the other one gets."""
    out = os.path.join(cluster.data_dir, "windows")
    cluster.client.submit(windows.topology(out))
    cluster.wait_assigned()
    fast = _events(2000, 5, seed=3)
    slow = Injector(cluster.masters_arg, "events", "slow-source")
    try:
        with Injector(cluster.masters_arg, "events", "fast-source", batch_size=500) as inj:
            _send(inj, fast)
        # The master has seen everything: the fast injector finished, all records are processed ...
        wait_until(lambda: _status(cluster, "window_counter")["processed"] == len(fast)
                   and "slow-source" in str(_status(cluster, "window_counter")["held_by"]),
                   60, "the slow injector to be named as the holder")
        # ... and still no window fired.
        assert _windows(out) == {}
        assert _status(cluster, "window_counter")["low_watermark"] < BASE
        slow.send(b"k0", b"", BASE + 500_000)
        slow.finish()
    finally:
        slow.close()
    expected = _oracle(fast, [(b"k0", BASE + 500_000)])
    wait_until(lambda: len(_windows(out)) >= len(expected), 60, "the windows to fire")
    assert _windows(out) == expected


def test_published_watermarks_never_decrease_across_failover_and_worker_kill(tmp_path: object) -> None:
    c = Cluster(str(tmp_path), masters=2, workers=3)
    c.start()
    try:
        c.wait_ready(60)
        out = os.path.join(c.data_dir, "windows")
        c.client.submit(windows.topology(out))
        c.wait_assigned()
        events = _events(9000, 10, seed=4)
        with Injector(c.masters_arg, "events", "src", batch_size=300) as inj:
            _send(inj, events[:3000])
            leader = c.client.status()["masters"]["leader"]
            c.kill(next(m for m in c.masters if m.address == leader), graceful=False)
            _send(inj, events[3000:6000])
            c.kill_worker(c.workers[0], graceful=False)
            _send(inj, events[6000:])
        expected = _oracle(events)
        wait_until(lambda: len(_windows(out)) >= len(expected), 120, "every window")
        assert _windows(out) == expected

        def published() -> dict[str, list[int]]:
            per_key: dict[str, list[int]] = collections.defaultdict(list)
            for key, value, _ in etcd_history(c.etcd_url, "/millstream/watermarks/"):
                per_key[key].append(int(value))
            return per_key

        # Each computation's watermark moved while the run went on: published twice or more.
        # How many values the leader's ticks publish depends on how fast the input goes (3 on
        # a loaded machine), and the sink's last one may follow the last window by a tick.
        names = {f"/millstream/watermarks/{name}" for name in ("window_counter", "window_sink")}
        wait_until(lambda: names <= set(p := published()) and all(len(v) >= 2 for v in p.values()), 30,
                   "each computation's watermark to be published twice or more")
        for key, values in published().items():
            assert values == sorted(values), f"{key} moved backwards: {values}"
    finally:
        c.close()


class Count(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        n = int(ctx.state.get() or b"0") + 1
        ctx.state.set(str(n).encode())
        ctx.produce("late_out", record.value)


@pytest.mark.parametrize("policy", ["process", "drop"])
def test_late_records_are_counted_and_handled_per_policy(cluster: Cluster, policy: str) -> None:
    out = os.path.join(cluster.data_dir, "late")
    topo = Topology(f"late-{policy}")
    topo.add_computation(f"late_{policy}", "tests.e2e.test_watermarks:Count", inputs={"ev": None},
                         outputs=["late_out"], late_records=policy)
    topo.add_computation("late_sink", "runtime.sinks:FileSink", inputs={"late_out": None},
                         params={"path": out})
    cluster.client.submit(topo)
    cluster.wait_assigned()
    comp = f"late_{policy}"
    with Injector(cluster.masters_arg, "ev", "on-time") as inj:
        for i in range(10):
            inj.send(b"k%d" % i, b"on-time", BASE + i)
        inj.advance_watermark(BASE + 10 * SECOND)
        # Unacknowledged records hold the injector's watermark back ...
        assert inj.effective_watermark == BASE
        inj.flush()  # ... until they are committed.
        wait_until(lambda: _status(cluster, comp)["watermark_seen"] >= BASE + 10 * SECOND, 30,
                   "every tablet to see the watermark pass the on-time records")
        for i in range(5):
            inj.send(b"k%d" % i, b"late", BASE + i)  # below the watermark: late
    wait_until(lambda: _status(cluster, comp)["late"] == 5, 30, "5 late records to be counted")
    wait_until(lambda: len(list(read_file_sink(out))) >= 10, 30, "the on-time records")
    values = collections.Counter(str(r["value"]) for r in read_file_sink(out))
    if policy == "process":
        wait_until(lambda: len(list(read_file_sink(out))) >= 15, 30, "the late records")
        assert collections.Counter(str(r["value"]) for r in read_file_sink(out)) == {"on-time": 10, "late": 5}
    else:
        assert values == {"on-time": 10}
        assert _status(cluster, comp)["processed"] == 10
