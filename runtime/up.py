"""``millstream up``: a whole local cluster in the foreground until Ctrl-C or SIGTERM."""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType

from runtime.cluster import LocalCluster


def run_up(data_dir: str, *, masters: int, workers: int, lease_ms: int) -> int:
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    cluster = LocalCluster(data_dir, masters=masters, workers=workers, lease_ms=lease_ms)
    try:
        cluster.start()
        cluster.wait_ready(60)
        print(f"etcd     {cluster.etcd_url}")
        for m in cluster.masters:
            print(f"master   {m.address}")
        for w in cluster.workers:
            print(f"worker   {w.address}")
        print(f"data     {cluster.data_dir}")
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
