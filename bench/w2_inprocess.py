"""W2 (1-s event-time windows per key + spike detection + sink) through real millstream Tablets
in ONE process (from the performance study, reviews/2026-11-performance-study; runs against
the record path before and after issue 29, so bench/ab.py can compare commits), no gRPC, no replication, no injector: what the three stages cost per input
record in CPU, and how many interpreter-level calls that is, split by stage.

Uses the worker's own classes (worker.tablet.Tablet, real RocksDB with fsync per commit, the
benchmark's bench.jobs computations); a stand-in host delivers each tablet's productions to the
next tablet in-process and acknowledges them, and raises the input watermark as the W2
injector would (bench.generator.W2Data.watermark_after).

    python -m bench.w2_inprocess --records 20000
    python -m bench.w2_inprocess --records 400000                      # a quiet machine (~20-40 s)
    python -m bench.w2_inprocess --records 100000 --profile --top 40   # + call counts per input record
    python -m bench.w2_inprocess --records 100000 --flow               # W2 as a Dataflow (bench.jobs.w2_flow)

What it shows: the in-process floor of today's W2 path (a cluster adds the injector, gRPC,
replication and two processes sharing two cores), and with --profile how the cost splits
between record processing, timers (set, fire, delete), productions and commits.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import tempfile
import time
from collections import Counter
from typing import Any

import uvloop

from bench import generator, latency
from runtime.imports import CodePolicy
from runtime.record import END_OF_TIME, MIN_TIME, Record, producer_prefix, sequence_id
from runtime.routing import RoutingTable
from runtime.wire import millstream_pb2 as pb
from worker.core import WorkerLimits

try:  # deliveries are columns and productions shipments since issue 29
    from runtime.columns import Columns
except ImportError:
    Columns = None  # type: ignore[assignment,misc]

LIMITS = WorkerLimits(max_queued_records=1 << 30, max_unacked=1 << 30)
END = END_OF_TIME


def flow_routing(sink_dir: str) -> tuple[pb.Routing, str, str]:
    """The routing of W2 as a flow (bench.jobs.w2_flow): its computations, one range each; and
    the names of its first computation and of its last (the stage its sink is fused into)."""
    from bench.jobs import w2_flow

    topo = w2_flow(sink_dir, key_ranges=1).topology()
    r = pb.Routing(version=1)
    for spec in topo.computations.values():
        c = r.computations.add(name=spec.name, topology="w2", code=spec.code, outputs=spec.outputs,
                               key_ranges=1, exactly_once=True, productions="strong",
                               options=pb.EngineOptions(fsync=not spec.name.endswith(".sink"),
                                                        dedup_retention_s=600, replication=1))
        c.params.update(spec.params)
        for stream, ex in spec.inputs.items():
            c.inputs.add(stream=stream, key_extractor=ex or "")
        c.assignments.add(key_range=0, worker_id="w", address="local", token=1)
    names = list(topo.computations)
    return r, names[0], names[-1]


def routing(sink_dir: str) -> pb.Routing:
    r = pb.Routing(version=1)
    for name, code, inp, out, params in (
            ("window", "bench.jobs:WindowCounter", "events", "windows", {"out": "windows"}),
            ("spike", "bench.jobs:SpikeDetector", "windows", "spikes", {"out": "spikes"}),
            ("sink", "bench.jobs:ArrivalSink", "spikes", None, {"path": sink_dir})):
        c = r.computations.add(name=name, topology="w2", code=code, outputs=[out] if out else [],
                               key_ranges=1, exactly_once=True, productions="strong",
                               options=pb.EngineOptions(fsync=name != "sink", dedup_retention_s=600, replication=1))
        for k, v in params.items():
            c.params[k] = v
        c.inputs.add(stream=inp, key_extractor="")
        c.assignments.add(key_range=0, worker_id="w", address="local", token=1)
    return r


class Host:
    def __init__(self, r: pb.Routing) -> None:
        self.routing = RoutingTable(r)
        self.routing.load_extractors({})
        self.limits = LIMITS
        self.code_policy = CodePolicy(("bench", "runtime.flows"))
        self.worker_id = "w"
        self.watermarks_known = True
        self.waiting_bytes = 0  # deliveries waiting for room (worker/tablet.py)
        self.wm = MIN_TIME
        self.tablets: dict[str, Any] = {}
        self.inflight: set[asyncio.Task[None]] = set()
        self.delivered: Counter[str] = Counter()

    def queued_bytes(self) -> int:
        return 0  # one tablet: its own bound is the worker's

    def lease_valid(self) -> bool:
        return True

    def watermark(self, computation: str) -> int:
        return self.wm

    def send(self, productions: list[Any], owner: Any) -> None:
        by: dict[str, list[Any]] = {}
        for p in productions:
            by.setdefault(p.computation, []).append(p)
        for comp, ps in by.items():
            if comp not in self.tablets:  # a stream nobody reads here (late, dead letters)
                owner.acked(ps, None)
                continue
            t = asyncio.get_running_loop().create_task(self._deliver(comp, ps, owner))
            self.inflight.add(t)
            t.add_done_callback(self.inflight.discard)

    async def _deliver(self, comp: str, ps: list[Any], owner: Any) -> None:
        if Columns is not None:
            orders = {p: (0, owner.token) for s in ps for p in s.producers}
            records: Any = Columns.concat([s.cols for s in ps])
        else:
            orders = {p.producer: (0, owner.token) for p in ps if p.producer is not None}
            records = [p.record for p in ps]
        while True:
            answer = await self.tablets[comp].deliver(records, orders)
            if (answer[0] if isinstance(answer, tuple) else answer) == 0:
                break
            await asyncio.sleep(0.001)
        self.delivered[comp] += len(records)
        owner.acked(ps, None)

    def advance(self, wm: int) -> None:
        if wm > self.wm:
            self.wm = wm
            for t in self.tablets.values():
                t.watermark_advanced()

    def idle(self) -> bool:
        if self.inflight:
            return False
        for t in self.tablets.values():
            if t.running or t.inbox or t.outbox.unacked or t._due_event_timers():
                return False
        return True


def requests(n: int, batch: int) -> tuple[generator.W2Data, bytes, list[tuple[int, Any]]]:
    """W2's first ``n`` records and the deliveries :func:`drive` sends them in: the data, the
    injector's producer prefix, and (first record's index, the delivery) per ``batch``
    (``bench.instructions --workload w2-flow`` counts this apart, to leave it out)."""
    data = generator.w2_data(n)
    prefix = producer_prefix("w2-inproc")
    wire = []
    for lo in range(0, n, batch):
        recs: Any = [Record(k, b"", t, sequence_id(prefix, lo + j + 1))
                     for j, (k, t) in enumerate(zip(data.keys[lo:lo + batch], data.timestamps[lo:lo + batch], strict=True))]
        if Columns is not None:
            recs = Columns.of_records(recs, prefix)
        wire.append((lo, recs))
    return data, prefix, wire


async def drive(root: str, n: int, batch: int, prof: cProfile.Profile | None, flow: bool = False) -> dict[str, Any]:
    from worker.tablet import Tablet

    data, prefix, wire = requests(n, batch)
    sink_dir = os.path.join(root, "spikes")
    if flow:
        r, first, last = flow_routing(sink_dir)
    else:
        r, first, last = routing(sink_dir), "window", "sink"
    host = Host(r)
    for c in r.computations:
        tab = Tablet(host, c, 0, 1, os.path.join(root, c.name))  # type: ignore[arg-type]
        await tab.start()
        host.tablets[c.name] = tab
    threads = [t.thread for t in host.tablets.values()]
    tprofs = []
    if prof is not None:
        for th in threads:
            p = cProfile.Profile()
            tprofs.append(p)
            await th.run(p.enable)
        prof.enable()
    c0, t0 = time.process_time(), time.perf_counter()
    window = host.tablets[first]
    for lo, recs in wire:
        after = lo
        st = await window.deliver(recs, {prefix: (after, 0)})
        assert (st[0] if isinstance(st, tuple) else st) == 0, st
        host.advance(data.watermark_after(lo + len(recs) - 1))
    host.advance(END)
    while not host.idle():
        await asyncio.sleep(0.002)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    if prof is not None:
        prof.disable()
        for th, p in zip(threads, tprofs, strict=True):
            await th.run(p.disable)
    out = {"records": n, "batch": batch, "wall_us_per_record": elapsed / n * 1e6,
           "cpu_us_per_record": cpu / n * 1e6, "rec_per_s": n / elapsed,
           "windows_delivered": host.delivered.get("spike", 0),
           # a flow's sink runs in its stage: nothing is delivered to it, read what it wrote
           "spikes_delivered": host.delivered[last] if last in host.delivered else len(latency.read_spikes(sink_dir)),
           "timers_left": {k: len(t.timers) for k, t in host.tablets.items()}}
    for t in host.tablets.values():
        await t.close()
    out["_profiles"] = (prof, tprofs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--flow", action="store_true", help="W2 as a Dataflow (bench.jobs.w2_flow)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="perfstudy-w2-") as root:
        prof = cProfile.Profile() if a.profile else None
        res = uvloop.run(drive(root, a.records, a.batch, prof, a.flow))
    profs = res.pop("_profiles")
    for k, v in res.items():
        print(f"{k}: {v:.2f}" if isinstance(v, float) else f"{k}: {v}")
    if prof is not None:
        from bench.profile import _name
        st = pstats.Stats(profs[0])
        for p in profs[1]:
            st.add(p)
        entries = list(st.stats.items())  # type: ignore[attr-defined]
        n = a.records
        total = sum(v[1] for _, v in entries)
        print(f"\n{total / n:.1f} interpreter-level calls per input record (both threads; profiled)")
        print(f"{'calls/rec':>10} {'self us/rec':>12} {'cum us/rec':>11}  function")
        for fn, v in sorted(entries, key=lambda kv: -kv[1][2])[:a.top]:
            print(f"{v[1] / n:10.3f} {v[2] / n * 1e6:12.2f} {v[3] / n * 1e6:11.2f}  {_name(fn)}")


if __name__ == "__main__":
    main()
