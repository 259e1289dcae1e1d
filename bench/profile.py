"""cProfile of the record path in one process: a real :class:`worker.tablet.Tablet` on a
real RocksDB (fsync per commit, as deployed), fed W1 records as a worker's gRPC
servicer would (a serialized ``DeliverRequest`` parsed and converted), with its
productions serialized as the worker's sender would. No network, no second process:
what remains is the per-record CPU cost of one exactly-once stage.

Both threads of the record path are profiled: the event loop's and the tablet's own
(worker/runner.py), whose user code, dedup and commits a profile of the loop alone shows
only as the loop waiting. Time spent blocked (a thread waiting for the other) is left out
of the shares and reported apart, as ``waiting``.
"""

from __future__ import annotations

import cProfile
import inspect
import os
import pstats
import shutil
import time
from typing import Any

from bench.generator import w1_keys
from runtime.imports import CodePolicy
from runtime.record import Record, producer_prefix, sequence_id
from runtime.routing import RoutingTable
from runtime.wire import from_proto, to_proto
from runtime.wire import millstream_pb2 as pb
from worker.core import WorkerLimits

try:  # the record path takes columns since issue 29 (bench/ab_commits.sh runs older commits too)
    from runtime.columns import of_request
    _COLUMNS = True
except ImportError:
    _COLUMNS = False

_LIMITS = WorkerLimits(max_queued_records=1 << 30, max_unacked=1 << 30, max_batch_records=1 << 30)


class _Host:
    """The worker as a tablet sees it; productions are encoded and acknowledged at once."""

    def __init__(self, routing: pb.Routing) -> None:
        self.routing = RoutingTable(routing)
        self.limits = _LIMITS
        self.code_policy = CodePolicy(("bench", "runtime"))  # runtime: a flow's stage
        self.watermarks_known = True
        self.waiting_bytes = 0  # deliveries waiting for room (worker/tablet.py)
        self.encoded_bytes = 0
        self._ack_productions: bool | None = None

    def queued_bytes(self) -> int:
        return 0  # one tablet: its own bound is the worker's

    def lease_valid(self) -> bool:
        return True

    def watermark(self, computation: str) -> int:
        return START_OF_TIME

    def send(self, productions: list[Any], owner: Any) -> None:
        if _COLUMNS:  # shipments, as worker/sender.py and worker/peers.py encode them
            from runtime.columns import Columns
            req = pb.DeliverRequest(computation="sink", key_range=0, token=1,
                                    columns=Columns.concat([s.cols for s in productions]).to_proto())
        else:
            req = pb.DeliverRequest(computation="sink", key_range=0, token=1,
                                    records=[to_proto(p.record) for p in productions])
        self.encoded_bytes += len(req.SerializeToString())
        if self._ack_productions is None:
            self._ack_productions = bool({"productions", "shipments"} & set(inspect.signature(owner.acked).parameters))
        if self._ack_productions:
            owner.acked(productions)
        else:  # older Tablet.acked(ckeys)
            owner.acked([p.ckey or b"" for p in productions])


# This driver also runs an older commit's runtime (bench/ab.py copies it there), which has
# neither runtime.record.MIN_TIME nor typed engine options: it names the start of time itself,
# and sets the options only where the wire has them (the older worker takes its defaults).
START_OF_TIME = -(1 << 63)


def _engine_options(route: Any) -> None:
    if hasattr(pb, "EngineOptions"):
        route.options.CopyFrom(pb.EngineOptions(fsync=True, dedup_retention_s=600, replication=1))


def _routing() -> pb.Routing:
    r = pb.Routing(version=1)
    c = r.computations.add(name="count1", topology="p", code="bench.jobs:ChainedCounter",
                           outputs=["s1"], key_ranges=1, exactly_once=True, productions="strong")
    _engine_options(c)
    c.params["out"] = "s1"
    c.inputs.add(stream="in", key_extractor="")
    c.assignments.add(key_range=0, worker_id="w", address="local", token=1)
    s = r.computations.add(name="sink", topology="p", code="bench.jobs:ArrivalSink", outputs=[],
                           key_ranges=1, exactly_once=True, productions="strong")
    _engine_options(s)
    s.inputs.add(stream="s1", key_extractor="")
    s.assignments.add(key_range=0, worker_id="w", address="local", token=1)
    return r


def flow_routing(steps: int) -> pb.Routing:
    """:func:`_routing` with W1's stage written as a flow (bench/flows.py): ``steps``
    ChainedCounter ``process`` steps fused into one computation, writing to the sink's stream."""
    from bench.flows import w1_flow_topology

    spec = w1_flow_topology("p", steps, "unused", 1, output="counts").computations["count1"]
    r = _routing()
    stage, sink = r.computations
    stage.code = spec.code
    stage.params.clear()
    stage.params.update(spec.params)
    del stage.outputs[:]
    stage.outputs.extend(spec.outputs)
    del sink.inputs[:]
    sink.inputs.add(stream=spec.outputs[0], key_extractor="")
    return r


# Where a thread of the record path blocks for the other: time, not work.
_BLOCKING = ("<method 'acquire' of '_thread.lock' objects>", "<method 'get' of '_queue.SimpleQueue' objects>")


class Timing:
    """What one :func:`_drive` measured, per record: wall time and the CPU of every thread of
    the process (the tablet's own, the loop's, RocksDB's), both over the deliveries alone:
    not the imports, the tablet's opening and closing, nor the making of the requests."""

    wall_us = 0.0
    cpu_us = 0.0


def requests(records: int, batch: int) -> tuple[list[bytes], bytes, list[bytes]]:
    """W1's keys, the producer and the serialized deliveries :func:`_drive` sends (apart, so
    bench/instructions.py can count what making them costs)."""
    keys = w1_keys(10_000, records / 10_000, seed=3)
    prefix = producer_prefix("profile")
    wire = []
    for lo in range(0, len(keys), batch):
        part = keys[lo:lo + batch]
        if _COLUMNS:
            req = pb.DeliverRequest(computation="count1", key_range=0, token=1, columns=pb.Columns(
                keys=part, values=[b"%d" % time.time_ns() for _ in part], timestamps=[1] * len(part),
                producer=prefix, seqs=range(lo + 1, lo + 1 + len(part))))
            req.orders.add(producer=prefix, after=0, token=0)
        else:  # before issue 29: rows, ids of no listed producer
            req = pb.DeliverRequest(computation="count1", key_range=0, token=1, records=[
                to_proto(Record(k, b"%d" % time.time_ns(), 1, sequence_id(prefix, lo + i)))
                for i, k in enumerate(part)])
        wire.append(req.SerializeToString())
    return keys, prefix, wire


async def _drive(path: str, records: int, batch: int, prof: cProfile.Profile | None,
                 thread_prof: cProfile.Profile | None = None, routing: pb.Routing | None = None,
                 timing: Timing | None = None) -> float:
    """Deliver ``records`` W1 records in batches of ``batch`` to one tablet at ``path``; the
    wall µs per record (with ``timing``, that and the CPU µs per record too)."""
    from worker.tablet import Tablet

    routing = routing or _routing()
    host = _Host(routing)
    tablet = Tablet(host, routing.computations[0], 0, 1, path)  # type: ignore[arg-type]
    await tablet.start()
    keys, prefix, wire = requests(records, batch)
    try:
        assert tablet.thread is not None
        if thread_prof is not None:
            await tablet.thread.run(thread_prof.enable)  # profiles the thread that runs it
        t0 = time.perf_counter()
        cpu0 = time.process_time()
        if prof is not None:
            prof.enable()
        for raw in wire:
            req = pb.DeliverRequest.FromString(raw)
            if _COLUMNS:  # as worker/server.py admits it
                answer = await tablet.deliver(of_request(req), {o.producer: (o.after, o.token) for o in req.orders})
            else:  # sequenced, as an injector's records are
                answer = await tablet.deliver([from_proto(r) for r in req.records], {prefix: (0, 0)})  # type: ignore[arg-type]
            status = answer[0] if isinstance(answer, tuple) else answer  # (status, duplicates) since 4f0e072
            assert status == 0, answer
        if prof is not None:
            prof.disable()
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        if thread_prof is not None:
            await tablet.thread.run(thread_prof.disable)
        if timing is not None:
            timing.wall_us = elapsed / len(keys) * 1e6
            timing.cpu_us = cpu / len(keys) * 1e6
        return elapsed / len(keys) * 1e6
    finally:
        await tablet.close()


def profile_record_path(root: str, records: int = 20_000, batches: tuple[int, ...] = (10, 1000),
                        top: int = 12, flow_steps: int = 0) -> dict[str, Any]:
    """Per-record cost with and without cProfile, and the functions that dominate; with
    ``flow_steps``, of W1's stage as a flow of that many fused ``process`` steps."""
    import uvloop

    routing = flow_routing(flow_steps) if flow_steps else None
    runs = []
    for batch in batches:
        n = records if batch >= 100 else records // 4
        path = os.path.join(root, f"profile-{batch}")
        shutil.rmtree(path, ignore_errors=True)
        wall = uvloop.run(_drive(path, n, batch, None, routing=routing))
        shutil.rmtree(path, ignore_errors=True)
        prof, thread_prof = cProfile.Profile(), cProfile.Profile()
        profiled = uvloop.run(_drive(path, n, batch, prof, thread_prof, routing=routing))
        shutil.rmtree(path, ignore_errors=True)
        stats = pstats.Stats(prof)
        stats.add(thread_prof)  # both threads' functions, one table
        entries = stats.stats.items()  # type: ignore[attr-defined]
        waiting = sum(v[2] for fn, v in entries if _name(fn) in _BLOCKING)
        working = [(fn, v) for fn, v in entries if _name(fn) not in _BLOCKING]
        total = sum(v[2] for _, v in working)
        rows = sorted(working, key=lambda kv: -kv[1][2])
        runs.append({
            "batch": batch, "records": n, "us_per_record": round(wall, 1),
            "us_per_record_profiled": round(profiled, 1),
            "cpu_us_per_record_profiled": round(total / n * 1e6, 1),
            "waiting_us_per_record": round(waiting / n * 1e6, 1),
            "top": [{"function": _name(fn), "calls_per_record": round(v[1] / n, 2),
                     "self_us_per_record": round(v[2] / n * 1e6, 2), "share": round(v[2] / total, 3)}
                    for fn, v in rows[:top]],
        })
    return {"runs": runs}


def _name(fn: tuple[str, int, str]) -> str:
    file, line, func = fn
    if file == "~":
        return func
    parts = file.split(os.sep)
    short = "/".join(parts[-2:]) if len(parts) > 1 else file
    return f"{short}:{line}({func})"


if __name__ == "__main__":
    import argparse
    import json
    import tempfile

    p = argparse.ArgumentParser(description="cProfile of the in-process record path (one tablet, real RocksDB)")
    p.add_argument("--flow-steps", type=int, default=0, help="W1's stage as a flow of this many process steps")
    p.add_argument("--batch", type=int, action="append", help="batch size (repeat; default 10 and 1000)")
    p.add_argument("--top", type=int, default=15)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(profile_record_path(tmp, batches=tuple(args.batch or (10, 1000)), top=args.top,
                                             flow_steps=args.flow_steps), indent=1))
