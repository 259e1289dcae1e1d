"""One hop in-process: ``python -m bench.hop [N]``.

A record delivered to an exactly-once ``Echo`` tablet (fsync on), committed, produced to a
``Collector`` tablet and committed there, one at a time, on one in-process worker core (real
RocksDB, no network, no other process). Prints the p50 and mean of N round trips in ms (the
first 100 left out). It isolates what the record path itself costs per batch from what a
shared 2-core machine adds in a cluster run; run it from two checkouts to compare them.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time

from runtime import Computation, Context, Record
from runtime.wire import millstream_pb2 as pb
from worker.core import WorkerCore, WorkerLimits

BASE = 1_700_000_000_000_000


class Echo(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.produce("out", record.value)


class Collector(Computation):
    seen = 0

    def process_record(self, ctx: Context, record: Record) -> None:
        Collector.seen += 1


def _routing() -> pb.Routing:
    r = pb.Routing(version=1)
    for name, code, inputs, outputs in (("echo", "bench.hop:Echo", ["in"], ["out"]),
                                        ("collect", "bench.hop:Collector", ["out"], [])):
        c = r.computations.add(name=name, code=code, outputs=outputs, key_ranges=1, exactly_once=True,
                               productions="strong", late_records="process",
                               # as a leader resolves them (runtime/engine.py): fsync, one copy
                               options=pb.EngineOptions(fsync=True, dedup_retention_s=600.0, replication=1))
        for s in inputs:
            c.inputs.add(stream=s)
        c.assignments.add(key_range=0, worker_id="w", address="self:1", token=1)
    return r


async def _run(n: int) -> list[float]:
    async def nowhere(*args: object) -> tuple[int, tuple[str, int] | None]:
        raise AssertionError("everything is local")

    with tempfile.TemporaryDirectory(prefix="millstream-hop-") as tmp:
        core = WorkerCore(tmp, "self:1", nowhere, WorkerLimits())
        core.worker_id = "w"
        core.renewed(core.now_ms(), 600_000)
        import bench.hop as loaded  # the module the tablets import (not __main__)

        sink = loaded.Collector
        sink.seen = 0
        await core.apply_routing(_routing())
        out = []
        for i in range(n):
            t0 = time.perf_counter()
            rec = Record(b"k", b"v%d" % i, BASE + i, i.to_bytes(16, "big"))
            while await core.deliver("echo", 0, 1, [rec]) != 0:  # BUSY while the tablet opens
                await asyncio.sleep(0.001)
            while sink.seen <= i:
                await asyncio.sleep(0)  # until the collector has committed it
            out.append(time.perf_counter() - t0)
        await core.close_all()
    return out[100:]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    lat = asyncio.run(_run(int(args[0]) if args else 1500))
    print(f"hop p50 {statistics.median(lat) * 1000:.3f} ms, mean {statistics.mean(lat) * 1000:.3f} ms, "
          f"n {len(lat)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
