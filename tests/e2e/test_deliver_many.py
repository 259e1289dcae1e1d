"""One call per receiving worker (``Worker.DeliverMany``): an injector's round and a
worker's productions to its peer carry several tablets' deliveries in one call, which the
receiver checks whole before handing any of it over, then commits side by side."""

from __future__ import annotations

import os

import grpc
import pytest

from cli.demo import oracle, sample_lines
from examples import wordcount
from injectors import Injector
from runtime import delivery
from runtime.client import Client
from runtime.record import Record
from runtime.sinks import read_file_sink
from runtime.topology import Topology
from runtime.wire import millstream_pb2 as pb
from runtime.wire import millstream_pb2_grpc as rpc
from tests.harness import Cluster, metric, wait_until

BASE_TS = 1_700_000_000_000_000


def test_rounds_and_productions_reach_each_worker_in_one_call_exactly_once(tmp_path: object) -> None:
    with Cluster(str(tmp_path), workers=2).running() as c:
        out = os.path.join(c.data_dir, "out")
        c.client.submit(wordcount.topology(out, key_ranges=4))
        c.wait_assigned()
        lines = sample_lines(400, seed=7)
        with Injector(c.masters_arg, "lines", "many-src", batch_size=50, timeout=120) as inj:
            for i, line in enumerate(lines):
                inj.send(str(i % 31).encode(), line.encode(), BASE_TS + i)
        want = oracle(lines)
        total = sum(want.values())
        wait_until(lambda: len(list(read_file_sink(out))) >= total, 120, f"{total} counts")
        rows = list(read_file_sink(out))
        assert wordcount.final_counts(rows) == want and len(rows) == total
        for sender in ("injector", "worker"):
            where = f'sender="{sender}"'
            calls = sum(metric(w, "millstream_deliveries_per_call_count", where) for w in c.workers)
            carried = sum(metric(w, "millstream_deliveries_per_call_sum", where) for w in c.workers)
            assert carried > calls > 0, (f"{sender}s: {carried:.0f} deliveries in {calls:.0f} calls: none "
                                         "carried several tablets'")


def test_one_malformed_delivery_refuses_the_whole_call_and_commits_none_of_it(tmp_path: object) -> None:
    with Cluster(str(tmp_path), workers=1).running() as c:
        out = os.path.join(c.data_dir, "out")
        topo = Topology("many").add_computation("many-sink", "runtime.sinks:FileSink", inputs={"many-in": None},
                                                params={"path": out}, key_ranges=2)
        c.client.submit(topo)
        c.wait_assigned()
        routing = Client(c.masters_arg).routing()
        comp = next(x for x in routing.computations if x.name == "many-sink")
        tablets = sorted((a.key_range, a.address, a.token) for a in comp.assignments)
        assert len(tablets) == 2 and tablets[0][1] == tablets[1][1]

        def req(kr: int, token: int, n: int, first: int, id_bytes: int = 16) -> pb.DeliverRequest:
            recs = [Record(b"k%d" % i, b"v%d" % i, BASE_TS + i, (first + i).to_bytes(id_bytes, "big"))
                    for i in range(n)]
            return delivery.request("many-sink", kr, token, recs, sender="injector/test")

        with grpc.insecure_channel(tablets[0][1]) as ch:
            stub = rpc.WorkerStub(ch)
            bad = pb.DeliverManyRequest(deliveries=[req(tablets[0][0], tablets[0][2], 3, 100),
                                                    req(tablets[1][0], tablets[1][2], 2, 200, id_bytes=5)])
            with pytest.raises(grpc.RpcError) as refused:
                stub.DeliverMany(bad, timeout=30)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert f"many-sink/{tablets[1][0]} refused" in (refused.value.details() or "")
            good = pb.DeliverManyRequest(deliveries=[req(tablets[0][0], tablets[0][2], 3, 300),
                                                     req(tablets[1][0], tablets[1][2], 4, 400)])
            # A tablet still opening answers BUSY (a loaded machine): retry as a sender would, with
            # the same ids, so a tablet that already committed its part recognises the duplicates.
            answers: list[pb.DeliverResponse] = []

            def committed() -> bool:
                answers[:] = stub.DeliverMany(good, timeout=30).answers
                return all(a.status != pb.DeliverResponse.BUSY for a in answers)
            wait_until(committed, 60, "the good call past BUSY")
        assert [a.status for a in answers] == [pb.DeliverResponse.OK, pb.DeliverResponse.OK]
        # Only the good call's seven records: nothing of the refused call was handed over.
        assert sorted(str(r["value"]) for r in read_file_sink(out)) == sorted(
            [f"v{i}" for i in range(3)] + [f"v{i}" for i in range(4)])
