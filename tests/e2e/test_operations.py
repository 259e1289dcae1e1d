"""Operating a cluster: `millstream up`, the web page and metrics, graceful leave, fenced masters."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request

import pytest

from master.scheduler import Ownership
from master.store import EtcdConfig, EtcdStore, NotLeaderError
from runtime.cluster import LocalCluster, wait_until
from tests.harness import ETCD_BINARY, Cluster

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _get(url: str) -> tuple[str, str]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.headers["Content-Type"], r.read().decode()


def test_master_web_page_status_json_and_metrics(cluster: Cluster) -> None:
    from examples import wordcount

    cluster.client.submit(wordcount.topology(os.path.join(cluster.data_dir, "out")))
    leader = cluster.client.status()["masters"]["leader"]
    master = next(m for m in cluster.masters if m.address == leader)
    base = next(line.split(" on ", 1)[1].strip() for line in master.lines if "web page" in line)
    ctype, page = _get(base)
    assert ctype.startswith("text/html") and "status.json" in page
    _, doc = _get(base + "status.json")
    status = json.loads(doc)
    assert set(status["computations"]) == {"splitter", "counter", "counts_sink"}
    assert {t["computation"] for t in status["tablets"]} == {"splitter", "counter", "counts_sink"}
    wait_until(lambda: "millstream_low_watermark_us{" in _get(base + "metrics")[1], 30,
               "the watermark gauges")
    assert "millstream_master_is_leader 1.0" in _get(base + "metrics")[1]
    # Replication: every tablet says where its copies are; the page shows them; gauges exist.
    for t in status["tablets"]:
        assert {"primary", "followers", "in_sync", "token", "start", "end", "health"} <= set(t), t
        assert t["primary"] and t["primary"] not in t["followers"] and t["primary"] in t["in_sync"]
    assert "followers" in page and "in sync" in page
    wait_until(lambda: all(t["health"] == "ok" for t in json.loads(_get(base + "status.json")[1])["tablets"]),
               30, "every tablet replicated")
    assert "millstream_under_replicated_tablets 0.0" in _get(base + "metrics")[1]


def test_a_worker_stopped_cleanly_hands_its_tablets_over_at_once(tmp_path: object) -> None:
    # A 60 s lease: only the worker's LeaveWorker call can explain a prompt move.
    c = Cluster(str(tmp_path), workers=2, lease_ms=60_000)
    c.start()
    try:
        c.wait_ready(60)
        from examples import wordcount

        c.client.submit(wordcount.topology(os.path.join(c.data_dir, "out")))
        c.wait_assigned()
        leaving = c.workers[0]
        c.kill(leaving, graceful=True)
        wait_until(lambda: len(c.client.status()["workers"]) == 1, 15, "the worker to leave")
        c.wait_assigned(15)
        survivor = c.client.status()["workers"][0]["id"]
        assert all(t["worker"] == survivor for t in c.client.status()["tablets"])
    finally:
        c.close()


def test_a_deposed_leader_can_change_nothing(tmp_path: object) -> None:
    cluster = LocalCluster(str(tmp_path), masters=0, workers=0, etcd_binary=ETCD_BINARY)
    cluster.start()
    try:
        old, new = EtcdStore(EtcdConfig.parse(cluster.etcd_url)), EtcdStore(EtcdConfig.parse(cluster.etcd_url))
        assert old.campaign({"id": "old", "address": "a:1"}, ttl_s=2)
        assert not new.campaign({"id": "new", "address": "b:1"}, ttl_s=2)
        old.put_tablets({("c", 0): Ownership("w1", 1)})
        old._lease.revoke()  # its lease is gone, as after a long pause
        wait_until(lambda: new.campaign({"id": "new", "address": "b:1"}, ttl_s=2), 10, "a new leader")
        new.put_tablets({("c", 0): Ownership("w2", 2)})
        with pytest.raises(NotLeaderError, match="refused by etcd"):
            old.put_tablets({("c", 0): Ownership("w1", 3)})
        assert new.load().tablets[("c", 0)] == Ownership("w2", 2)
        old.close()
        new.close()
    finally:
        cluster.close()


def test_millstream_up_runs_a_cluster_and_stops_it_all(tmp_path: object) -> None:
    data = os.path.join(str(tmp_path), "data")
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.Popen([sys.executable, "-m", "cli", "--log-level", "WARNING", "up",
                             "--workers", "2", "--port", "0", "--data-dir", data],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    lines: list[str] = []
    assert proc.stdout is not None
    threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True).start()
    try:
        wait_until(lambda: any(line.startswith("ready:") for line in lines), 90, "`millstream up` to be ready")
        masters = next(line for line in lines if line.startswith("ready:")).split("=", 1)[1].split()[0]
        status = subprocess.run([sys.executable, "-m", "cli", "status", "--masters", masters, "--json"],
                                capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
        assert status.returncode == 0, status.stderr
        assert len(json.loads(status.stdout)["workers"]) == 2
        children = _descendants(proc.pid)
        assert len(children) >= 4  # etcd, a master, two workers
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    assert proc.returncode == 0
    wait_until(lambda: not any(_alive(p) for p in children), 15, "every child to exit")


def _descendants(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-eo", "pid=,ppid="], capture_output=True, text=True).stdout.split("\n")
    pairs = [tuple(map(int, line.split())) for line in out if line.strip()]
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        kids = [p for p, pp in pairs if pp == parent]
        found += kids
        frontier += kids
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


def test_a_stopping_worker_drains_its_tablets_even_without_replicas(tmp_path: object) -> None:
    """replication=1: a stopping worker's tablets have no follower to promote. It drains
    instead: while it still serves them, each moves to a worker that catches up first. A
    60 s lease: nothing but the drain can explain a prompt, lossless move."""
    from tests.e2e.wordcount_run import run_wordcount

    with Cluster(str(tmp_path), workers=2, lease_ms=60_000, replication=1).running() as c:
        leaving = c.workers[0]

        def stop() -> None:
            c.kill(leaving, graceful=True)
            wait_until(lambda: len(c.client.status()["workers"]) == 1, 15, "the worker to leave")

        run_wordcount(c, n_lines=3000, midway=stop, name="drain")
        assert "primaries left to move" in open(leaving.log_path).read()
        assert all(t["health"] == "ok" and t["followers"] == [] for t in c.client.status()["tablets"])
