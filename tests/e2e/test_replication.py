"""Replicated tablet state on private disks (DESIGN.md §5, docs/replication.md).

Every worker has its own state directory; a host loss is a SIGKILL plus the deletion of
that directory. The word count's results must stay exact through all of it.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from cli.demo import oracle, sample_lines
from examples import wordcount
from runtime.cluster import Process
from runtime.sinks import read_file_sink
from tests.e2e.wordcount_run import inject_lines, run_wordcount
from tests.harness import Cluster, metric, wait_until


def _tablets(c: Cluster) -> list[dict[str, Any]]:
    return list(c.client.status()["tablets"])


def _worker_id(c: Cluster, proc: Process) -> str:
    return next(w["id"] for w in c.client.status()["workers"] if w["address"] == proc.address)


def _healthy(c: Cluster) -> bool:
    """Every tablet has its replication factor in sync (the cluster has enough workers)."""
    return all(t["health"] == "ok" for t in _tablets(c))


def _lose_host(c: Cluster, victim: Process) -> str:
    """SIGKILL a worker and delete its disk; wait until none of its copies count."""
    wid = _worker_id(c, victim)
    c.kill_worker(victim, graceful=False)
    shutil.rmtree(victim.state_dir)
    wait_until(lambda: all(t["primary"] != wid and wid not in t["followers"] for t in _tablets(c))
               and all(t["primary"] for t in _tablets(c)), 30, "the lost host's tablets to fail over")
    return wid


@pytest.fixture
def trio(tmp_path: object) -> Iterator[Cluster]:
    with Cluster(str(tmp_path), workers=3).running() as c:
        yield c


def test_every_worker_has_its_own_disk_and_every_tablet_a_follower(trio: Cluster) -> None:
    c = trio
    dirs = {w.state_dir for w in c.workers}
    assert len(dirs) == 3 and all(os.path.isfile(os.path.join(d, "worker.id")) for d in dirs)
    run_wordcount(c, n_lines=500, name="layout")
    wait_until(lambda: _healthy(c), 30, "every tablet to have an in-sync follower")
    for t in _tablets(c):
        assert len(t["followers"]) == 1 and t["followers"][0] != t["primary"]
        assert set(t["in_sync"]) == {t["primary"], *t["followers"]}
        assert t["start"] < t["end"]
    # Followers count the tablets each Replicate or ReplicateMany call carried (several, when
    # commits of several tablets left their primary's loop in one turn: worker/peers.py).
    calls = sum(metric(w, "millstream_replicated_tablets_per_call_count") for w in c.workers)
    carried = sum(metric(w, "millstream_replicated_tablets_per_call_sum") for w in c.workers)
    assert carried >= calls > 0


def test_host_lost_with_its_disk_mid_run_is_exact(trio: Cluster) -> None:
    c = trio
    run_wordcount(c, n_lines=4000, midway=lambda: _lose_host(c, c.workers[0]), name="lost")
    assert not any(t["health"] == "unavailable" for t in _tablets(c))


def test_a_flow_whose_sink_runs_in_its_stage_is_exact_through_a_host_lost_with_its_disk(trio: Cluster) -> None:
    """The word count on a flow: its sink is fused into the counting stage, so the sink's
    output is cut back by the promoted follower's restore, from the meta its commit carried."""
    c = trio
    out = os.path.join(c.data_dir, "out-flow-lost")
    flow = wordcount.flow(out, name="lostflow")
    assert flow.topology().computations["lostflow.counts"].code == "runtime.flows.stage:SinkStage"
    c.client.submit(flow)
    c.wait_assigned()
    lines = sample_lines(3000, seed=9)
    expected = oracle(lines)
    inject_lines(c.masters_arg, "flow-source", lines, repeat_every=5, midway=lambda: _lose_host(c, c.workers[0]))
    total = sum(expected.values())
    wait_until(lambda: len(list(read_file_sink(out))) >= total, 120, f"{total} counts")
    rows = list(read_file_sink(out))
    assert wordcount.final_counts(rows) == expected
    assert len(rows) == total  # every running count once: none lost, none written twice
    assert not any(t["health"] == "unavailable" for t in _tablets(c))


def test_host_back_on_an_empty_disk_at_the_same_address_is_exact(trio: Cluster) -> None:
    c = trio
    victim = c.workers[1]

    def replace() -> None:
        old = _lose_host(c, victim)
        new = c.restart_worker(victim, wipe=True)
        wait_until(lambda: any(w["address"] == new.address for w in c.client.status()["workers"]), 30,
                   "the replacement to register")
        assert _worker_id(c, new) != old  # an empty disk is a new worker: its copies start empty

    run_wordcount(c, n_lines=4000, midway=replace, name="empty")
    wait_until(lambda: _healthy(c), 30, "the replacement to catch up")


def test_two_hosts_lost_one_after_the_other_is_exact(trio: Cluster) -> None:
    c = trio

    def lose_two() -> None:
        _lose_host(c, c.workers[0])
        # Re-replication restores a follower for every tablet on the two workers left ...
        wait_until(lambda: _healthy(c), 60, "re-replication after the first loss")
        # ... so the second loss costs nothing either.
        _lose_host(c, c.workers[1])

    run_wordcount(c, n_lines=4000, midway=lose_two, name="two")
    assert all(t["health"] == "under-replicated" for t in _tablets(c))  # one worker left


def _faulty_cluster(tmp_path: Any, n: int = 3) -> tuple[Cluster, list[str]]:
    c = Cluster(str(tmp_path), workers=0)
    c.start()
    faults = []
    for i in range(n):
        path = os.path.join(c.data_dir, f"faults-{i}")
        open(path, "w").close()
        faults.append(path)
        c.add_worker(env={"MILLSTREAM_FAULTS": path})
    c.wait_ready(60)
    return c, faults


class _Background:
    """Runs a disruption on its own thread, so the injection goes on while it happens."""

    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.fn()
        except BaseException as e:  # re-raised by join()
            self.error = e

    def start(self) -> None:
        self.thread.start()

    def join(self) -> None:
        self.thread.join(120)
        assert not self.thread.is_alive(), "the disruption did not finish"
        if self.error is not None:
            raise self.error


def test_a_paused_primary_past_its_lease_is_refused_by_its_followers(tmp_path: Any) -> None:
    """A primary is SIGSTOPped while a batch of its runs slow user code, past its lease; its
    follower is promoted. The fault hook makes its batches skip the lease check, so when it
    wakes, that batch really tries to commit: its follower, now the primary, refuses it."""
    c, faults = _faulty_cluster(tmp_path)
    try:
        paused: list[Process] = []

        def pause_in_a_slow_batch() -> None:
            by_address = {w.address: (w, f) for w, f in zip(c.workers, faults, strict=True)}

            def slow_primary() -> tuple[Process, str, str] | None:
                doc = c.client.status()
                owners = {t["key_range"]: (t["primary"], t["address"]) for t in doc["tablets"]
                          if t["computation"] == "counter"}
                for k in doc["computations"]["counter"]["slow_keys"]:
                    wid, address = owners[k["key_range"]]
                    if k["running"] and address in by_address:
                        return by_address[address][0], by_address[address][1], wid
                return None

            wait_until(lambda: slow_primary() is not None, 60, "a counter batch in slow user code")
            found = slow_primary()
            assert found is not None
            zombie, fault_file, wid = found
            with open(fault_file, "w") as f:
                f.write("ignore-lease\n")
            c.pause(zombie)
            paused.append(zombie)
            wait_until(lambda: all(t["primary"] != wid for t in _tablets(c)), 30,
                       "the zombie's tablets to be promoted elsewhere")
            c.resume(zombie)
            wait_until(lambda: metric(zombie, "millstream_replication_refused") > 0, 30,
                       "the zombie's late commit to be refused")
            with open(fault_file, "w"):
                pass

        disruption = _Background(pause_in_a_slow_batch)
        topo_counter = "tests.jobs:SlowCounter"
        run_wordcount(c, n_lines=6000, midway=disruption.start, name="zombie", counter=topo_counter,
                      counter_params={"every": "1000", "sleep": "3"})
        disruption.join()
        zombie = paused[0]
        assert "refused our commits" in open(zombie.log_path).read()
        assert sum(metric(w, "millstream_follower_refusals") for w in c.workers if w is not zombie) > 0
    finally:
        c.close()


def test_a_cut_between_primary_and_follower_loses_no_acknowledged_commit(tmp_path: Any) -> None:
    """Replication from one worker to the others is cut from the start (the fault hook): its
    primaries drop those followers from their in-sync sets through the leader, and go on;
    no tablet changes primary while the old one lives. Then the cut heals, the followers
    catch up, and the primary's host is lost: a follower takes over each of its tablets
    with every acknowledged commit (the counts are exact)."""
    c, faults = _faulty_cluster(tmp_path)
    try:
        primary = c.workers[0]
        with open(faults[0], "w") as f:
            f.writelines(f"block {w.address}\n" for w in c.workers[1:])
        pid = _worker_id(c, primary)

        def heal_and_lose() -> None:
            wait_until(lambda: any(t["primary"] == pid and len(t["in_sync"]) == 1 for t in _tablets(c)), 30,
                       "a cut follower to leave an in-sync set")
            for t in _tablets(c):
                assert t["token"] == 1, t  # no second primary, ever: nothing changed hands
            with open(faults[0], "w"):
                pass
            wait_until(lambda: _healthy(c), 60, "the followers to catch up once the cut heals")
            _lose_host(c, primary)

        run_wordcount(c, n_lines=4000, midway=heal_and_lose, name="cut")
        log = open(primary.log_path).read()
        assert "removing it from the in-sync set" in log
    finally:
        c.close()


def test_idle_tablets_replicate_again_after_a_follower_restarts_on_its_disk(trio: Cluster) -> None:
    """A restarted follower holds copies it may have missed commits for: the leader drops it
    from the in-sync sets, and its primaries, though idle (no commit to notice with), have it
    prove its copy or catch up, then add it again."""
    c = trio
    run_wordcount(c, n_lines=500, name="idle")
    wait_until(lambda: _healthy(c), 30, "every tablet replicated")
    victim = c.workers[2]
    wid = _worker_id(c, victim)
    followed = [t for t in _tablets(c) if wid in t["followers"]]
    assert followed
    c.kill_worker(victim, graceful=False)
    back = c.restart_worker(victim)
    wait_until(lambda: any(w["address"] == back.address for w in c.client.status()["workers"]), 30,
               "the worker to come back")
    assert _worker_id(c, back) == wid  # the same disk: the same worker
    wait_until(lambda: _healthy(c), 60, "the idle tablets to replicate again")


def test_a_primary_handed_to_its_only_in_sync_follower_stays_in_its_in_sync_set(tmp_path: Any) -> None:
    """A rebalance hands a primary to its in-sync follower between batches. The old primary's files continue
    as the new primary's follower copy (worker/replica.py): it never leaves the in-sync set
    and takes no snapshot, so the tablet keeps two copies through the handover. (It used to
    be dropped at the new primary's first commit and fed a snapshot, leaving one in-sync
    copy meanwhile; the chaos suite once lost that host then, and the tablet was unavailable.)"""
    with Cluster(str(tmp_path), workers=2).running() as c:
        moved: dict[str, Any] = {}

        out = os.path.join(c.data_dir, "out-handover")
        done = sum(oracle(sample_lines(4000, seed=11)[:2001]).values())  # what midway has sent

        def hand_over() -> None:
            # Once what was sent is counted, the tablet is between batches: the old primary
            # holds no commit the follower lacks. (A move in the middle of a batch fences
            # it: its commit is written there and acknowledged nowhere, and that copy takes
            # a snapshot, as it must: the chaos suite covers that.)
            wait_until(lambda: len(list(read_file_sink(out))) >= done, 60, "the first half to be counted")
            wait_until(lambda: _healthy(c), 30, "every tablet to have an in-sync follower")
            t = next(t for t in _tablets(c) if t["computation"] == "counter")
            new = next(w for w in c.workers if _worker_id(c, w) == t["followers"][0])
            moved.update(tablet=t, new=new, snapshots=metric(new, "millstream_snapshots_sent"),
                         leaves=metric(new, "millstream_in_sync_changes", 'change="leave"'))
            assert c.client.move("counter", t["key_range"], new.address) == t["token"] + 1
            wait_until(lambda: _tablet(c, t)["primary"] == t["followers"][0], 30, "the handover")

        run_wordcount(c, n_lines=4000, midway=hand_over, name="handover")
        t, new = moved["tablet"], moved["new"]
        after = _tablet(c, t)
        assert (after["primary"], after["token"]) == (t["followers"][0], t["token"] + 1)
        assert set(after["in_sync"]) == {t["primary"], t["followers"][0]}, after
        assert metric(new, "millstream_snapshots_sent") == moved["snapshots"]
        assert metric(new, "millstream_in_sync_changes", 'change="leave"') == moved["leaves"]
        # The new primary's host is lost: the old primary takes the tablet back.
        _lose_host(c, new)
        assert _tablet(c, t)["primary"] == t["primary"]


def _tablet(c: Cluster, t: dict[str, Any]) -> dict[str, Any]:
    return next(x for x in _tablets(c) if (x["computation"], x["key_range"]) == (t["computation"], t["key_range"]))
