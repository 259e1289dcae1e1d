"""The injector sends on its own after its linger: a loop of ``send`` calls, with no
``flush()``, gets its records committed (issue 16, part 1)."""

from __future__ import annotations

import os

from injectors import Injector
from runtime import Topology
from runtime.sinks import read_file_sink
from tests.harness import Cluster, wait_until

BASE = 1_700_000_000_000_000


def test_sent_records_are_committed_without_flush_and_flush_still_waits(cluster: Cluster) -> None:
    out = os.path.join(cluster.data_dir, "linger")
    topo = Topology("linger").add_computation("linger-sink", "runtime.sinks:FileSink", inputs={"linger-in": None},
                                              params={"path": out})
    cluster.client.submit(topo)
    cluster.wait_assigned()
    with Injector(cluster.masters_arg, "linger-in", "linger-src", linger_ms=5) as inj:
        for i in range(10):  # far below batch_size: only the linger can send these
            inj.send(b"k%d" % i, b"v%d" % i, BASE + i)
        wait_until(lambda: len(list(read_file_sink(out))) == 10, 30,
                   "the records to be committed without a flush")
        for i in range(10, 2_500):  # several rounds, some while others are in flight
            inj.send(b"k%d" % (i % 50), b"v%d" % i, BASE + i)
        inj.flush()  # returns once every record sent before it is committed
        assert len(list(read_file_sink(out))) == 2_500
    values = sorted(str(r["value"]) for r in read_file_sink(out))
    assert values == sorted(f"v{i}" for i in range(2_500)), "each record once"


def test_a_sparse_sender_gets_every_record_out_without_flush(cluster: Cluster) -> None:
    """One record at a time, each sent only once the one before is committed: every send
    finds the queue empty and the round thread idle, and must still wake it."""
    out = os.path.join(cluster.data_dir, "sparse")
    topo = Topology("sparse").add_computation("sparse-sink", "runtime.sinks:FileSink", inputs={"sparse-in": None},
                                              params={"path": out})
    cluster.client.submit(topo)
    cluster.wait_assigned()
    with Injector(cluster.masters_arg, "sparse-in", "sparse-src", linger_ms=5) as inj:
        for i in range(5):
            inj.send(b"k%d" % i, b"v%d" % i, BASE + i)
            wait_until(lambda i=i: len(list(read_file_sink(out))) == i + 1, 30,
                       f"record {i} to be committed without a flush")
