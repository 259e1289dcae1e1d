"""Fixed costs under the record path, measured apart from it::

    python -m bench.overhead rpc            # a bare gRPC round trip on this machine
    python -m bench.overhead cpu [RATE...]  # CPU of each process: idle, then at each rate
    python -m bench.overhead fsync          # one small append + fdatasync, as a commit pays
    python -m bench.overhead inflight       # an injector's rounds: 1 vs 4 in flight, with and
                                            # without a network round trip to the workers
    python -m bench.overhead recordpath [BATCH...]  # us per record of one stage, in process
    python -m bench.overhead recordfloor    # ... of a stage that does nothing, and of W1's user code alone
    python -m bench.overhead recordparts    # ... of stages that do one thing each: read, write, produce
    python -m bench.overhead writes         # a replicated commit's writes: encode, and apply at a follower
    python -m bench.overhead follower       # a follower's copy: W2's commits one by one, or logged (bench/followerwrites.py)
    python -m bench.overhead kernels        # routing's per-record kernels: compiled against their reference

``rpc``: a grpc.aio server on uvloop with an empty handler (the worker's Ping) in its own
process, and a blocking client: the round trip back to back, and with 2 ms between calls
(as a paced sender at 1,000 rec/s leaves them). No millstream code on either side: the
floor that every hop of the record path (injector → worker, worker → worker) pays here.

``cpu``: the W1 topology (one exactly-once stage and the sink, one copy) on a local
cluster; the CPU seconds each process (etcd, master, workers, this one) spends in 10 s
with no injector, then in 10 s of W1's paced sender at each RATE (flush per tick).
docs/performance.md quotes both.

``fsync``: 200-byte appends to a file in a fresh temporary directory (where the benchmark's
state goes), each followed by ``fdatasync``: what one fsynced RocksDB commit of a small batch
pays the disk, and so the most that group commit (one sync for several tablets' batches)
could save per batch on this machine.

``writes``: a replicated commit shaped like one of W2's window step (690 puts of ~30-byte
keys and ~35-byte values, then 180 deletes): CPU µs per write of the primary's
``encode_ops`` and of the follower's ``apply_ops`` into a ``WriteBatch``; then, apart, what
RocksDB's write of such commits costs per put, for keys in hash order (as window
accumulators' are) and in ascending order. It uses only those two functions, so the A/B (``--ab-figures
replica-writes``) runs it against older commits too.

``kernels``: each function of ``runtime/kernels.py`` on an injector round's worth of
records (4,000 keys of 12 bytes, 4 key ranges), its pure-Python reference and its compiled
version (``runtime/_kernels.c``) alternately, best of 5 runs of 50 calls: nanoseconds per key.

``inflight``: W1's topology (one copy) takes a bulk injection (``--records`` records in full
rounds of 1,000, ``finish()`` at the end) from an injector with ``max_in_flight`` 1 and 4,
alternately, with no added delay and with the fault hook making each injector delivery wait
``--delay-ms`` before the worker takes it (a network between the injector's host and the
cluster; loopback has none, and this kernel has no netem). Records per second until
``finish()`` returned, and the CPU seconds of the whole process tree.

``recordpath``: ``bench.profile``'s record path (one exactly-once stage on a real RocksDB,
fsync per commit, fed and producing serialized deliveries; no network, no other process),
10,000 records in batches of each BATCH (default 100): microseconds per record without a
profiler, wall and CPU (every thread of the process), both over the deliveries alone (not the
imports, the tablet's opening, nor the making of the requests); the wall figure also holds
the fsyncs, which move with the disk from run to run. It exists in checkouts back to before issue 9, so this file copied into an older
one (as bench/ab_commits.sh does with w1_single.py) compares the record path's own cost.

``recordfloor``: what bounds that record path from below, CPU µs per record and as shares of
the whole path measured in the same rounds (three, interleaved): the same driver with a stage
that does nothing (the runtime's own work per record: dedup, a ``Record``, the call, the
commit), and W1's ``ChainedCounter.process_record`` called alone on a bare context (state in
a dict, productions in a list): the user code's own cost.

``recordparts``: the record path's driver with stages that each do one thing per record (read
the key's state; write it; both, as W1 counts; produce one record, routed, checkpointed and
encoded as a delivery to the sink, which the driver's host acknowledges at once: no sink stage
runs), beside a stage that does nothing and W1's own: what each part of a per-record stage
costs, CPU µs per record, medians of three interleaved rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from runtime import Computation, Context, Record


def _serve() -> None:
    import grpc
    import uvloop

    from runtime.wire import millstream_pb2 as pb
    from runtime.wire import millstream_pb2_grpc as rpc

    class Pinged(rpc.WorkerServicer):
        async def Ping(self, request: pb.PingRequest, context: Any) -> pb.PingResponse:
            return pb.PingResponse(worker_id="bare")

    async def serve() -> None:
        server = grpc.aio.server()
        rpc.add_WorkerServicer_to_server(Pinged(), server)  # type: ignore[no-untyped-call]
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        print(port, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent closes it
        await server.stop(0)

    uvloop.run(serve())


def _quantiles(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {p: round(xs[min(len(xs) - 1, int(len(xs) * q))], 3) for p, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))}


def rpc_floor(calls: int = 1000) -> dict[str, Any]:
    import grpc

    from runtime.wire import millstream_pb2 as pb
    from runtime.wire import millstream_pb2_grpc as rpc

    server = subprocess.Popen([sys.executable, "-m", "bench.overhead", "_serve"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        stub = rpc.WorkerStub(channel)  # type: ignore[no-untyped-call]
        out: dict[str, Any] = {"loadavg_start": os.getloadavg()}
        for name, gap in (("back_to_back_ms", 0.0), ("every_2ms_ms", 0.002)):
            xs = []
            for _ in range(calls):
                t = time.perf_counter()
                stub.Ping(pb.PingRequest(), timeout=5)
                xs.append((time.perf_counter() - t) * 1000)
                if gap:
                    time.sleep(gap)
            out[name] = _quantiles(xs)
        channel.close()
        out["loadavg_end"] = os.getloadavg()
        return out
    finally:
        if server.stdin is not None:
            server.stdin.close()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def fsync_cost(syncs: int = 500) -> dict[str, Any]:
    out: dict[str, Any] = {"loadavg_start": os.getloadavg()}
    root = tempfile.mkdtemp(prefix="millstream-fsync-")
    try:
        fd = os.open(os.path.join(root, "log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        xs = []
        for _ in range(syncs):
            os.write(fd, b"x" * 200)
            t = time.perf_counter()
            os.fdatasync(fd)
            xs.append((time.perf_counter() - t) * 1000)
        os.close(fd)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out["fdatasync_ms"] = _quantiles(xs)
    out["loadavg_end"] = os.getloadavg()
    return out


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def process_cpu(rates: list[int], seconds: float = 10.0) -> dict[str, Any]:
    from bench import generator, latency, workloads
    from runtime.client import Client

    cfg = dataclasses.replace(workloads.BenchConfig.make(False), replication=1)
    variant = next(v for v in workloads.W1_VARIANTS if v.name == "eo-strong-fsync")
    root = tempfile.mkdtemp(prefix="millstream-overhead-")
    out: dict[str, Any] = {"loadavg_start": os.getloadavg(), "seconds": seconds, "runs": []}
    try:
        with workloads.cluster(root, "overhead", cfg) as c:
            sink = os.path.join(c.data_dir, "arrivals")
            with Client(c.masters_arg, timeout=30) as client:
                client.submit(workloads.w1_topology(variant, sink, cfg.key_ranges))
                workloads.wait_tablets_open(c, client, "in", sink)
            pids = {p.name: p.popen.pid for p in c.processes()}
            for rate in [0, *rates]:
                before = {n: _cpu_s(p) for n, p in pids.items()}
                mine, t0 = _own_cpu_s(), time.monotonic()
                if rate:
                    latency.paced_send(c.masters_arg, "in", f"overhead-{rate}", generator.w1_keys(rate, seconds), rate)
                else:
                    time.sleep(seconds)  # the measurement: an idle cluster for this long
                wall = time.monotonic() - t0
                cpu = {n: round(_cpu_s(p) - before[n], 2) for n, p in pids.items()}
                cpu["this process"] = round(_own_cpu_s() - mine, 2)
                out["runs"].append({"rate": rate, "wall_s": round(wall, 1), "cpu_s": cpu,
                                    "cores": round(sum(cpu.values()) / wall, 2)})
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out["loadavg_end"] = os.getloadavg()
    return out


def rounds_in_flight(records: int, delay_ms: float, repeats: int = 2) -> dict[str, Any]:
    from bench import generator, workloads
    from bench.cpu import CpuMeter
    from injectors import Injector
    from runtime.client import Client

    cfg = dataclasses.replace(workloads.BenchConfig.make(False), replication=1)
    variant = next(v for v in workloads.W1_VARIANTS if v.name == "eo-strong-fsync")
    root = tempfile.mkdtemp(prefix="millstream-inflight-")
    faults = os.path.join(root, "faults")
    open(faults, "w").close()
    os.environ["MILLSTREAM_FAULTS"] = faults  # read by the workers this process starts
    keys = generator.w1_keys(records, 1)
    out: dict[str, Any] = {"loadavg_start": os.getloadavg(), "records": records, "delay_ms": delay_ms,
                           "runs": []}
    try:
        with workloads.cluster(root, "inflight", cfg) as c:
            sink = os.path.join(c.data_dir, "arrivals")
            with Client(c.masters_arg, timeout=30) as client:
                client.submit(workloads.w1_topology(variant, sink, cfg.key_ranges))
                workloads.wait_tablets_open(c, client, "in", sink)
            n = 0
            for _ in range(repeats):
                for delay in (0.0, delay_ms):
                    with open(faults, "w") as f:
                        f.write(f"delay-injector {delay}\n" if delay else "")
                    time.sleep(0.2)  # the workers re-read the hook's file every 50 ms
                    for in_flight in (1, 4):
                        n += 1
                        with CpuMeter() as meter:
                            t0 = time.monotonic()
                            with Injector(c.masters_arg, "in", f"inflight-{n}", max_in_flight=in_flight,
                                          timeout=120) as inj:
                                for i, key in enumerate(keys):
                                    inj.send(key, b"0", 1_700_000_000_000_000 + i)
                                peak = inj.peak_in_flight
                            wall = time.monotonic() - t0
                        assert meter.figures is not None
                        out["runs"].append({"delay_ms": delay, "max_in_flight": in_flight, "peak_in_flight": peak,
                                            "records_per_s": round(records / wall),
                                            "cpu_s": round(meter.figures.ours_s, 2),
                                            "foreign_cpu_s": round(meter.figures.foreign_s, 2)})
    finally:
        os.environ.pop("MILLSTREAM_FAULTS", None)
        shutil.rmtree(root, ignore_errors=True)
    out["loadavg_end"] = os.getloadavg()
    return out


def record_path(batches: list[int], records: int = 10_000, flow_steps: int = 0) -> dict[str, Any]:
    """CPU per record of W1's stage and its sink in one process (bench/profile.py), by batch
    size; with ``flow_steps``, the stage is a flow of that many fused ``process`` steps."""
    import uvloop

    from bench.profile import Timing, _drive, flow_routing

    wall: dict[str, float] = {}
    cpu: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="millstream-recordpath-") as tmp:
        for batch in batches:
            path = os.path.join(tmp, f"b{batch}")
            routing = flow_routing(flow_steps) if flow_steps else None
            timing = Timing()
            uvloop.run(_drive(path, records, batch, None, routing=routing, timing=timing))
            wall[str(batch)] = round(timing.wall_us, 1)
            # CPU of every thread of this process over the deliveries (the fsyncs' waits are
            # not in it): the figure to compare on a machine whose disk latency moves from run
            # to run. It once also held the first run's imports, the requests' making and the
            # tablet's opening and closing, which weigh the same on both sides of an A/B.
            cpu[str(batch)] = round(timing.cpu_us, 1)
            shutil.rmtree(path, ignore_errors=True)
    return {"us_per_record": wall, "cpu_us_per_record": cpu, "flow_steps": flow_steps, "loadavg": os.getloadavg()}


class Nothing(Computation):
    """A stage that does nothing with its records: what is left is the runtime's own work."""

    def process_record(self, ctx: Context, record: Record) -> None:
        pass


class _BareContext:
    """The least a context can be for ChainedCounter: state in a dict, productions in a list
    (no checks, no undo, no routing): what its own code costs, without the runtime's."""

    def __init__(self) -> None:
        self.state = self
        self.key = b""
        self.values: dict[bytes, bytes] = {}
        self.out: list[tuple[str, bytes, bytes]] = []

    def get(self) -> bytes | None:
        return self.values.get(self.key)

    def set(self, value: bytes) -> None:
        self.values[self.key] = value

    def produce(self, stream: str, value: bytes) -> None:
        self.out.append((stream, self.key, value))


def record_floor(batch: int = 1_000, records: int = 20_000, runs: int = 3) -> dict[str, Any]:
    """What bounds the record path from below, CPU µs per record, each the median of ``runs``
    rounds of three, interleaved (this machine's speed moves by 2x from one minute to the
    next, so the shares of the whole path, per round, are the figures to read): the record
    path of :func:`record_path` (``whole_path``); the same driver with a stage that does
    nothing (``runtime_only``: dedup, a ``Record``, the call, the commit); and ChainedCounter's
    ``process_record`` called alone on a bare context (``user_code_only``)."""
    import statistics

    import uvloop

    from bench.generator import w1_keys
    from bench.jobs import ChainedCounter
    from bench.profile import Timing, _drive, _routing

    nothing_routing = _routing()
    nothing_routing.computations[0].code = "bench.overhead:Nothing"
    counter = ChainedCounter()
    counter.setup({"out": "s1"})
    made = [Record(k, b"%d" % time.time_ns(), 1, b"%016d" % i)
            for i, k in enumerate(w1_keys(10_000, records / 10_000, seed=3))]
    whole: list[float] = []
    nothing: list[float] = []
    alone: list[float] = []
    ctx = _BareContext()
    with tempfile.TemporaryDirectory(prefix="millstream-recordfloor-") as tmp:
        for i in range(runs):
            for routing, into in ((_routing(), whole), (nothing_routing, nothing)):
                timing = Timing()
                path = os.path.join(tmp, f"{i}-{len(into)}-{id(into)}")
                uvloop.run(_drive(path, records, batch, None, routing=routing, timing=timing))
                into.append(timing.cpu_us)
            ctx = _BareContext()
            fn = counter.process_record
            started = time.process_time()
            for r in made:
                ctx.key = r.key
                fn(ctx, r)  # type: ignore[arg-type]
            alone.append((time.process_time() - started) / len(made) * 1e6)
    return {"whole_path_cpu_us_per_record": round(statistics.median(whole), 2),
            "runtime_only_cpu_us_per_record": round(statistics.median(nothing), 2),
            "user_code_only_cpu_us_per_record": round(statistics.median(alone), 2),
            "runtime_only_share": round(statistics.median(n / w for n, w in zip(nothing, whole, strict=True)), 3),
            "user_code_only_share": round(statistics.median(a / w for a, w in zip(alone, whole, strict=True)), 3),
            "user_code_productions": len(ctx.out), "batch": batch, "records": records, "runs": runs,
            "loadavg": os.getloadavg()}


def replica_writes(commits: int = 300) -> dict[str, Any]:
    """CPU µs per write of encoding a W2-shaped commit's writes and of applying them at a
    follower (see the module docstring)."""
    import random

    from rocksdict import WriteBatch

    from worker.storage import DELETE, PUT, apply_ops, encode_ops

    rnd = random.Random(7)
    ops = ([(PUT, rnd.randbytes(30), rnd.randbytes(35)) for _ in range(690)]
           + [(DELETE, rnd.randbytes(30), b"") for _ in range(180)])
    started = time.process_time()
    for _ in range(commits):
        data = encode_ops(ops)
    encoded = time.process_time()
    for _ in range(commits):
        apply_ops(WriteBatch(raw_mode=True), data)
    applied = time.process_time()
    n = commits * len(ops)
    return {"writes_per_commit": len(ops), "encode_cpu_us_per_write": round((encoded - started) / n * 1e6, 3),
            "apply_cpu_us_per_write": round((applied - encoded) / n * 1e6, 3),
            "rocksdb_write_us_per_put": _rocksdb_puts(commits), "loadavg": os.getloadavg()}


def _rocksdb_puts(commits: int, per_commit: int = 690, keys: int = 50_000) -> dict[str, float]:
    """µs of ``Rdict.write`` per put (the memtable insert and the WAL append; rocksdict holds
    the GIL through it), for commits of ``per_commit`` puts into a fresh RocksDB: keys drawn
    from ``keys`` hashed keys (as window accumulators' are: they start with their key's hash),
    against keys in ascending order."""
    import hashlib
    import random

    from rocksdict import Options, Rdict, WriteBatch, WriteOptions

    rnd = random.Random(7)
    hashed = [hashlib.blake2b(b"%d" % i, digest_size=8).digest() + b"window-state" for i in range(keys)]
    value = rnd.randbytes(35)
    out = {}
    for order in ("hashed", "ascending"):
        with tempfile.TemporaryDirectory(prefix="millstream-writes-") as d:
            opts = Options(raw_mode=True)
            opts.create_if_missing(True)
            db = Rdict(os.path.join(d, "db"), options=opts)
            spent = 0.0
            for c in range(commits):
                wb = WriteBatch(raw_mode=True)
                for j in range(per_commit):
                    key = (rnd.choice(hashed) + c.to_bytes(4, "big") if order == "hashed"
                           else (c * per_commit + j).to_bytes(8, "big") + b"window-state")
                    wb.put(key, value)
                t = time.perf_counter()
                db.write(wb, WriteOptions())
                spent += time.perf_counter() - t
            db.close()
        out[order] = round(spent / (commits * per_commit) * 1e6, 3)
    return out


def kernel_costs(n: int = 4_000, calls: int = 50, repeats: int = 5) -> dict[str, Any]:
    """ns per key of each routing kernel, reference against compiled (None where not built)."""
    from runtime import kernels
    from runtime.keyspace import first_cut

    rng = random.Random(7)
    keys = [rng.randbytes(12) for _ in range(n)]
    hashes = kernels.key_hashes_py(keys)
    cut = first_cut(4)  # a computation's first 4 key ranges
    ids = sorted(cut)
    starts = [cut[i][0] for i in ids]
    ranges = kernels.ranges_of_py(hashes, starts, ids)
    taken = kernels.group_py(ranges)[0]
    cases: dict[str, tuple[Callable[[], object], Callable[[], object], int]] = {
        "key_hashes": (lambda: kernels.key_hashes_py(keys), lambda: kernels.key_hashes(keys), n),
        "ranges_of": (lambda: kernels.ranges_of_py(hashes, starts, ids), lambda: kernels.ranges_of(hashes, starts, ids), n),
        "group": (lambda: kernels.group_py(ranges), lambda: kernels.group(ranges), n),
        "take": (lambda: kernels.take_py(keys, taken), lambda: kernels.take(keys, taken), len(taken)),
    }
    out: dict[str, Any] = {"compiled": kernels.COMPILED, "keys": n}
    for name, (reference, compiled, per_call) in cases.items():
        best = {"reference": float("inf"), "compiled": float("inf")}
        for _ in range(repeats):
            for side, fn in (("reference", reference), ("compiled", compiled)):
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                best[side] = min(best[side], (time.perf_counter() - t0) / calls / per_call * 1e9)
        out[name] = {"reference_ns": round(best["reference"], 1),
                     "compiled_ns": round(best["compiled"], 1) if kernels.COMPILED else None}
    out["loadavg"] = os.getloadavg()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.overhead")
    p.add_argument("what", choices=["rpc", "cpu", "fsync", "inflight", "recordpath", "recordfloor", "recordparts",
                                    "writes", "follower",
                                    "kernels", "_serve"])
    p.add_argument("rates", nargs="*", type=int, default=None,
                   help="cpu: rates (default 1000 10000); recordpath: batch sizes (default 100)")
    p.add_argument("--records", type=int, default=None,
                   help="inflight: records per injection (default 50,000); recordpath: records (default 10,000)")
    p.add_argument("--delay-ms", type=float, default=5.0, help="inflight: the injector's round trip to add")
    p.add_argument("--flow-steps", type=int, default=0,
                   help="recordpath: W1's stage as a flow of this many fused process steps (default: classic)")
    args = p.parse_args(argv)
    if args.what == "_serve":
        _serve()
        return 0
    if args.what == "fsync":
        print(json.dumps(fsync_cost()))
    elif args.what == "recordpath":
        print(json.dumps(record_path(args.rates or [100], args.records or 10_000, args.flow_steps)))
    elif args.what == "recordfloor":
        print(json.dumps(record_floor((args.rates or [1_000])[0], args.records or 20_000)))
    elif args.what == "recordparts":
        from bench.recordparts import record_parts

        print(json.dumps(record_parts((args.rates or [1_000])[0], args.records or 20_000)))
    elif args.what == "follower":
        from bench.followerwrites import follower_writes

        print(json.dumps(follower_writes()))
    elif args.what == "writes":
        print(json.dumps(replica_writes()))
    elif args.what == "kernels":
        print(json.dumps(kernel_costs()))
    elif args.what == "inflight":
        print(json.dumps(rounds_in_flight(args.records or 50_000, args.delay_ms)))
    else:
        print(json.dumps(rpc_floor() if args.what == "rpc" else process_cpu(args.rates or [1000, 10000])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
