"""A savepoint is a consistent cut (review N1, N2), on real processes: a job whose first
computation's wall-clock timer produces downstream while a steady injection runs; the leader
is killed while the client copies the tablets (so the copy is slow, and a new leader must
keep the pause), or a tablet's primary is (its copy comes from the new primary); the job is
cancelled, restored and its injection continued; every record's output and every timer's
output is in the sink exactly once."""

from __future__ import annotations

import collections
import os
import threading
from typing import Any

import pytest

from injectors import Injector
from runtime import savepoint
from runtime.sinks import read_file_sink
from runtime.topology import Topology
from tests.harness import Cluster, wait_until

BASE_TS = 1_700_000_000_000_000


def _topology(out: str) -> Topology:
    topo = Topology("tick")
    topo.add_computation("ticker", "tests.jobs:Ticker", inputs={"ticks.in": None}, outputs=["ticks.out"],
                         params={"out": "ticks.out", "ms": "20"}, key_ranges=1)
    topo.add_computation("ticks_sink", "runtime.sinks:FileSink", inputs={"ticks.out": None},
                         params={"path": out}, key_ranges=1)
    return topo


class Feed:
    """Sends ``0, 1, 2, ...`` to ``ticks.in`` every few ms from a thread until stopped."""

    def __init__(self, cluster: Cluster) -> None:
        self.inj = Injector(cluster.masters_arg, "ticks.in", "feed", batch_size=50, security=cluster.security)
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.004):  # the injection's pace, not a test wait
            self.inj.send(b"k", str(self.sent).encode(), BASE_TS + self.sent * 1000)
            self.sent += 1

    def stop(self, flush: bool = True) -> int:
        """Stop sending; with ``flush``, once everything sent is committed. Returns how many."""
        self._stop.set()
        self._thread.join()
        try:
            if flush:
                self.inj.flush()
        finally:
            self.inj.close()
        return self.sent


def test_a_savepoint_taken_through_a_leader_failover_restores_every_output_once(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with Cluster(str(tmp_path), masters=2, workers=2).running() as c:
        out = os.path.join(c.data_dir, "ticks")
        c.client.submit(_topology(out))
        c.wait_assigned()
        feed = Feed(c)
        try:
            wait_until(lambda: sum(1 for r in read_file_sink(out) if r["value"].startswith("t ")) >= 5, 60,
                       "the ticker's timer to fire a few times")

            fetch = savepoint._fetch
            copied: list[str] = []

            def fetch_then_kill_the_leader(client: Any, t: Any, target: str) -> None:
                fetch(client, t, target)
                copied.append(t.computation)
                if len(copied) == 1:  # the ticker is copied (upstream first); the sink is not yet
                    leader = c.client.status()["masters"]["leader"]
                    c.kill(next(m for m in c.masters if m.address == leader), graceful=False)
                    wait_until(lambda: c.client.status()["masters"]["leader"] not in ("", leader), 60, "a new leader")

            monkeypatch.setattr(savepoint, "_fetch", fetch_then_kill_the_leader)
            saved = os.path.join(c.data_dir, "savepoint")
            manifest = c.client.savepoint("tick", saved)
            assert copied == ["ticker", "ticks_sink"] and len(manifest["tablets"]) == 2
        except BaseException:
            feed.stop(flush=False)
            raise
        sent = feed.stop()

        _restore_and_continue(c, out, saved, sent)


def test_a_savepoint_whose_primary_is_lost_during_the_copy_copies_the_new_primary(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pause holds the job still, not its machines: the sink tablet's primary is killed
    just before the client asks it for its copy. The tablet fails over to its in-sync
    follower, which holds the same commit; the client copies it from there under its new
    token, the leader's check passes, and the restored job has every output once. (Before,
    the savepoint failed: "take the savepoint again".)"""
    with Cluster(str(tmp_path), workers=2).running() as c:
        out = os.path.join(c.data_dir, "ticks")
        c.client.submit(_topology(out))
        c.wait_assigned()
        feed = Feed(c)
        try:
            wait_until(lambda: sum(1 for r in read_file_sink(out) if r["value"].startswith("t ")) >= 5, 60,
                       "the ticker's timer to fire a few times")
            fetch = savepoint._fetch
            asked: list[tuple[str, str, int]] = []

            def kill_the_sinks_primary_first(client: Any, t: Any, target: str) -> None:
                asked.append((t.computation, t.address, t.token))
                if t.computation == "ticks_sink" and len(asked) == 2:
                    c.kill(next(w for w in c.workers if w.address == t.address), graceful=False)
                fetch(client, t, target)

            monkeypatch.setattr(savepoint, "_fetch", kill_the_sinks_primary_first)
            saved = os.path.join(c.data_dir, "savepoint")
            manifest = c.client.savepoint("tick", saved)
        except BaseException:
            feed.stop(flush=False)
            raise
        sent = feed.stop()
        sinks = [(address, token) for name, address, token in asked if name == "ticks_sink"]
        assert len(sinks) >= 2 and sinks[-1][0] != sinks[0][0] and sinks[-1][1] > sinks[0][1], asked
        [saved_sink] = [t for t in manifest["tablets"] if t["computation"] == "ticks_sink"]
        assert saved_sink["token"] == sinks[-1][1], "the copy's token is the new primary's"
        _restore_and_continue(c, out, saved, sent)


def _restore_and_continue(c: Cluster, out: str, saved: str, sent: int) -> None:
    """Cancel the job, restore it from ``saved`` and send everything again and more: every
    record's output and every timer's output is in the sink exactly once."""
    c.client.cancel("tick")
    assert c.client.restore(saved) == "tick"
    c.wait_assigned()
    # The injection continues: the same injector sends everything again (what the savepoint
    # holds counts once, by its ids), then more.
    more = 200
    inj = Injector(c.masters_arg, "ticks.in", "feed", batch_size=50, security=c.security)
    try:
        for i in range(sent + more):
            inj.send(b"k", str(i).encode(), BASE_TS + i * 1000)
        inj.flush()
    finally:
        inj.close()

    def values() -> list[str]:
        return [str(r["value"]) for r in read_file_sink(out)]

    wait_until(lambda: {v for v in values() if v.startswith("r ")} >= {f"r {i}" for i in range(sent + more)},
               120, "every record's output in the sink")
    counts = collections.Counter(values())
    twice = sorted((v for v, n in counts.items() if n > 1), key=lambda v: (v[0], int(v[2:])))
    assert not twice, f"in the sink more than once: {twice[:10]}"
    assert {v for v in counts if v.startswith("r ")} == {f"r {i}" for i in range(sent + more)}
    ticks = sorted(int(v[2:]) for v in counts if v.startswith("t "))
    assert ticks == list(range(1, len(ticks) + 1)), f"timer outputs missing: {sorted(set(range(1, ticks[-1] + 1)) - set(ticks))[:10]}"
