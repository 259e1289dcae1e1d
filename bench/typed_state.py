"""What an append costs as one key's list grows: ``python -m bench.typed_state [N]``.

One key receives N records (default 100,000) through the real record path of an in-process
worker (its batches, commits to RocksDB, fsync off as for at-least-once computations, so the
figure is the state's cost rather than the disk's). Two computations do the same thing: one
appends to a ``ListState`` (one RocksDB entry per element), the other keeps the list as one
JSON document in ``ctx.state`` and rewrites it on every record (what examples/windows.py
used to do). Prints one JSON line per tenth of the run: the list's size and the microseconds
per record over that tenth, with the load average.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time

from runtime import Computation, Context, ListState, Record, codecs
from runtime.wire import millstream_pb2 as pb
from worker.core import WorkerCore, WorkerLimits

BATCH = 1000


class Appender(Computation):
    seen = ListState("seen", codecs.INT)

    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.state_of(self.seen).append(len(record.value))


class Rewriter(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        seen = json.loads(ctx.state.get() or b"[]")
        seen.append(len(record.value))
        ctx.state.set(json.dumps(seen).encode())


def _routing(code: str) -> pb.Routing:
    r = pb.Routing(version=1)
    c = r.computations.add(name="c", code=code, key_ranges=1, exactly_once=False, productions="strong",
                           late_records="process",
                           options=pb.EngineOptions(fsync=False, dedup_retention_s=600, replication=1))
    c.inputs.add(stream="in")
    c.assignments.add(key_range=0, worker_id="w", address="self:1", token=1)
    return r


async def _run(code: str, n: int, deadline_s: float) -> list[dict[str, float]]:
    async def nowhere(*args: object) -> int:
        raise AssertionError("local only")

    with tempfile.TemporaryDirectory() as tmp:
        core = WorkerCore(tmp, "self:1", nowhere, WorkerLimits(max_batch_records=BATCH))  # type: ignore[arg-type]
        core.worker_id = "w"
        core.renewed(core.now_ms(), 3_600_000)
        await core.apply_routing(_routing(code))
        out, step, started = [], max(BATCH, n // 10), time.monotonic()
        for lo in range(0, n, step):
            t0 = time.perf_counter()
            for b in range(lo, min(n, lo + step), BATCH):
                records = [Record(b"key", b"x", 1_700_000_000_000_000 + i, (i + 1).to_bytes(16, "big"))
                           for i in range(b, min(n, b + BATCH))]
                await core.deliver("c", 0, 1, records)
            took = time.perf_counter() - t0
            out.append({"size": min(n, lo + step), "us_per_record": round(took / step * 1e6, 1)})
            if time.monotonic() - started > deadline_s:
                break  # the rewriting one grows quadratically: stop it before it takes all day
        await core.close_all()
        return out


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    for name, code in (("ListState.append", "bench.typed_state:Appender"),
                       ("JSON rewrite of ctx.state", "bench.typed_state:Rewriter")):
        for row in asyncio.run(_run(code, n, deadline_s=120)):
            print(json.dumps({"what": name, **row, "load": round(os.getloadavg()[0], 2)}), flush=True)


if __name__ == "__main__":
    main()
