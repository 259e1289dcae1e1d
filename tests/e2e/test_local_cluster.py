"""LocalCluster's own start-up: etcd cannot bind port 0, so a port taken between the probe
and etcd's bind must cost a retry, not a failed test run (the CI failure of session 3)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from runtime import cluster as cluster_module
from runtime.cluster import LocalCluster, free_port


def test_etcd_starts_again_on_new_ports_when_one_was_taken(tmp_path: object,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    busy = taken.getsockname()[1]
    ports: Iterator[int] = iter([busy, busy])  # the first attempt's client and peer ports

    monkeypatch.setattr(cluster_module, "free_port", lambda: next(ports, None) or free_port())
    c = LocalCluster(str(tmp_path), workers=0)
    try:
        url = c.start_etcd()
        assert not url.endswith(f":{busy}")
        assert "address already in use" in open(os.path.join(str(tmp_path), "logs", "etcd.log")).read()
    finally:
        c.close()
        taken.close()
