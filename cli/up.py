"""``millstream up``: a whole local cluster in the foreground until Ctrl-C or SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
from types import FrameType

from runtime.client import Client
from runtime.cluster import LocalCluster, local_modules
from runtime.errors import MillstreamError
from runtime.etcd_binary import show
from runtime.imports import CodePolicy


def _free(port: int) -> bool:
    """Whether nothing listens on ``port``: a port left in TIME-WAIT by the last ``up`` is
    free (the master binds it as gRPC does, with SO_REUSEADDR)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def console_of(cluster: LocalCluster) -> str:
    """The leader's web page (a follower's says only that it is not the leader)."""
    pages = {m.address: m.http for m in cluster.masters if m.http}
    try:
        with Client(cluster.masters_arg, timeout=10, security=cluster.security) as c:
            leader = c.status()["masters"]["leader"]
    except MillstreamError:
        leader = ""
    return pages.get(leader) or next(iter(pages.values()), "")


def run_up(data_dir: str, *, masters: int, workers: int, lease_ms: int, port: int = 7070,
           etcd_binary: str | None = None, log_format: str = "text", allow_code: str | None = None) -> int:
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # a second Ctrl-C ends `up` at once (its daemons die with it)

    # The daemons have sessions of their own (runtime/cluster.py): Ctrl-C, SIGTERM and a closed
    # terminal (SIGHUP) reach `up`, which stops them in order.
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, on_signal)
    CodePolicy.parse(allow_code)  # a prefix that cannot be one: refused now, not by every worker
    if port and not _free(port):
        print(f"port {port} is taken; the first master takes a port chosen by the OS", file=sys.stderr)
        port = 0
    # Workers load the modules of this directory as they are now, and those of --allow-code.
    here = local_modules(os.getcwd())
    cluster = LocalCluster(data_dir, masters=masters, workers=workers, lease_ms=lease_ms, master_port=port,
                           etcd_binary=etcd_binary, daemon_args=["--log-format", log_format],
                           allow_code=",".join(filter(None, [*here, *(p.strip() for p in (allow_code or "").split(","))])))
    try:
        cluster.start()
        cluster.wait_ready(60)
        server = cluster.etcd_server
        assert server is not None  # started
        print(f"etcd     {cluster.etcd_url}   etcd {show(server.version)} ({server.path})")
        for m in cluster.masters:
            print(f"master   {m.address}   web page {m.http or '-'}")
        for w in cluster.workers:
            print(f"worker   {w.address}")
        print(f"data     {cluster.data_dir}")
        loads = ", ".join(cluster.allow_code.split(",")) or "nothing of yours"
        print(f"code     workers load {loads} (and millstream's own); a module written here later needs "
              "`up --allow-code` or a restart")
        console = console_of(cluster)
        if console:
            print(f"console  {console}   (throughput, lag and watermarks over time, the graph, tablets; "
                  f"/metrics for Prometheus)")
        print(f"\nready: export MILLSTREAM_MASTERS={cluster.masters_arg}   (Ctrl-C stops everything)",
              flush=True)
        while not stop.wait(0.5):
            dead = [p.name for p in cluster.processes() if not p.alive()]
            if dead:
                print(f"millstream: {', '.join(dead)} exited; stopping the cluster", file=sys.stderr)
                return 1
        return 0
    finally:
        cluster.close()
        print("stopped", flush=True)
