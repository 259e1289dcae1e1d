"""W2 on Bytewax, as a Bytewax user writes it: one dataflow on one worker (``run_main``), or on
one worker in each of ``--processes`` processes (``cluster_main``, as ``python -m
bytewax.testing -p N`` starts them), the operators of ``bytewax.operators`` and ``bytewax.operators.windowing``.

Runs in the Bytewax virtualenv (bench/bytewax_env.py makes it), not in the project's: it
imports Bytewax, the standard library and, from this checkout, only bench/generator.py's
``spike_step`` (the function W2's oracle and millstream's spike step share; pure Python).

The dataflow:

- ``op.input``: a one-partition ``FixedPartitionedSource`` over INPUT's ``key,ts_us`` lines
  (read into memory before the run starts), parsing ``BATCH`` lines per ``next_batch`` into
  ``(key, datetime)``; its snapshot is the line offset, so with recovery on a resumed run reads on
  from the last snapshot (what recovery needs of a source). One partition in a cluster too: with
  a partition per process (lines ``i, i + N, ...``) Bytewax 0.21 was not exact (a scratch run of
  this job: windows short of records, spikes missed and made up). Its event clock follows
  the items a key has seen, so a partition that runs ahead makes the other's items late; one
  source, exchanged by key, keeps each key's items in their order.
- ``op.key_on`` by key, then ``fold_window`` counting per one-second ``TumblingWindower``
  window, on an ``EventClock`` with 2 s of allowed disorder (W2's generator displaces records up
  to 2 s; the Spark and Flink peers wait as long). The clock is set up for replaying a bounded,
  recorded stream: its watermark follows the events only (a fixed ``now_getter``), and the
  runtime is not woken on system time to close windows (``to_system_utc`` returns None: new
  items and the end of the input close them). ``fold_window`` is ``ordered`` (its default),
  which also makes a key's windows close in window order, as the spike stage needs.
- ``op.stateful_map``: each key's windows through ``spike_step`` (the EWMA), ``op.filter_map``
  keeps the spikes, ``op.output`` writes ``key window_start_us count`` lines to OUT.

Recovery (``--recovery DIR``): Bytewax's SQLite recovery, one partition per process made in
DIR before the run, a snapshot at every epoch, epochs of ``--epoch-s`` seconds (1 s).

With ``--processes N`` (N > 1) this script starts N copies of itself (``--proc-id``), one per
process of the cluster, on ports the OS gave (free when asked, taken by the processes a moment
later); each reads the input and builds the dataflow, says ``READY``, and starts
``cluster_main`` when told ``go``, so that loading the input is no more in the run time than
with one process. The run time holds the cluster's connecting: a process that dials another
before it listens retries after 1 s (Bytewax prints that on stdout; the processes' own output
goes to stderr once ready), ~1 s of the ~40 s W2 takes on two processes here. Each process's worker writes its own OUT.<i>; they are joined into OUT once all have
ended.

Prints ``RUNNING`` just before the dataflow starts (the peer meters CPU from there), then one
JSON line: the dataflow's run time, its processes and Bytewax's version.

Usage: python w2_job.py INPUT OUT [--recovery DIR] [--epoch-s 1] [--batch 1000] [--processes 1]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
SECOND = timedelta(seconds=1)


def build(lines: list[bytes], out: str, batch: int) -> Any:
    import bytewax.operators as op  # type: ignore[import-not-found]
    import bytewax.operators.windowing as win  # type: ignore[import-not-found]
    from bytewax.dataflow import Dataflow  # type: ignore[import-not-found]
    from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition  # type: ignore[import-not-found]
    from bytewax.outputs import DynamicSink, StatelessSinkPartition  # type: ignore[import-not-found]

    sys.path.insert(0, ROOT)
    from bench.generator import spike_step

    class LinesPartition(StatefulSourcePartition):  # type: ignore[misc]
        def __init__(self, offset: int) -> None:
            self.offset = offset

        def next_batch(self) -> list[tuple[str, datetime]]:
            lo = self.offset
            if lo >= len(lines):
                raise StopIteration()
            self.offset = hi = min(len(lines), lo + batch)
            out = []
            for line in lines[lo:hi]:
                key, ts = line.split(b",")
                out.append((key.decode(), EPOCH + timedelta(microseconds=int(ts))))
            return out

        def snapshot(self) -> int:
            return self.offset

    class LinesSource(FixedPartitionedSource):  # type: ignore[misc]
        def list_parts(self) -> list[str]:
            return ["lines"]

        def build_part(self, step_id: str, for_part: str, resume_state: int | None) -> LinesPartition:
            return LinesPartition(resume_state or 0)

    class LinesSinkPartition(StatelessSinkPartition):  # type: ignore[misc]
        def __init__(self, path: str) -> None:
            self.f = open(path, "a")  # noqa: SIM115  (closed by close())

        def write_batch(self, items: list[tuple[str, tuple[int, int]]]) -> None:
            self.f.writelines(f"{key} {start} {count}\n" for key, (start, count) in items)

        def close(self) -> None:
            self.f.close()

    class LinesSink(DynamicSink):  # type: ignore[misc]
        def build(self, step_id: str, worker_index: int, worker_count: int) -> LinesSinkPartition:
            return LinesSinkPartition(out if worker_count == 1 else f"{out}.{worker_index}")

    def key_of(event: tuple[str, datetime]) -> str:
        return event[0]

    def time_of(event: tuple[str, datetime]) -> datetime:
        return event[1]

    def replay_now() -> datetime:
        return EPOCH

    def no_wake_up(_: datetime) -> None:
        return None

    def zero() -> int:
        return 0

    def one_more(n: int, _: Any) -> int:
        return n + 1

    def add(a: int, b: int) -> int:
        return a + b

    def spike(ewma: float | None, window: tuple[int, int]) -> tuple[float, tuple[int, int, bool]]:
        window_id, count = window
        is_spike, ewma = spike_step(ewma, count)
        return ewma, (window_id * 1_000_000, count, is_spike)  # window id: seconds since the epoch

    def spikes_only(w: tuple[int, int, bool]) -> tuple[int, int] | None:
        return (w[0], w[1]) if w[2] else None

    flow = Dataflow("w2")
    events = op.input("events", flow, LinesSource())
    keyed = op.key_on("key", events, key_of)
    clock = win.EventClock(time_of, wait_for_system_duration=2 * SECOND, now_getter=replay_now,
                           to_system_utc=no_wake_up)
    windower = win.TumblingWindower(length=SECOND, align_to=EPOCH)
    counts = win.fold_window("count", keyed, clock, windower, zero, one_more, add)
    scored = op.stateful_map("spike", counts.down, spike)
    op.output("out", op.filter_map_value("spikes", scored, spikes_only), LinesSink())
    return flow


def _recovery(path: str | None, epoch_s: float, partitions: int, init: bool) -> dict[str, Any]:
    """``run_main``/``cluster_main``'s recovery arguments (none without ``path``); ``init`` makes
    the partitions first (once, before any process starts)."""
    if not path:
        return {}
    from pathlib import Path

    from bytewax.recovery import RecoveryConfig, init_db_dir  # type: ignore[import-not-found]

    if init:
        os.makedirs(path, exist_ok=True)
        init_db_dir(Path(path), partitions)
    return {"recovery_config": RecoveryConfig(Path(path)), "epoch_interval": timedelta(seconds=epoch_s)}


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _cluster(a: argparse.Namespace) -> float:
    """Start ``a.processes`` copies of this script as one Bytewax cluster; the run time of the
    dataflow (from every process being ready to the last one's end). Joins their outputs."""
    addresses = ",".join(f"127.0.0.1:{port}" for port in _free_ports(a.processes))
    _recovery(a.recovery, a.epoch_s, a.processes, init=True)
    common = [a.input, a.out, "--batch", str(a.batch), "--epoch-s", str(a.epoch_s), "--processes",
              str(a.processes), "--addresses", addresses] + (["--recovery", a.recovery] if a.recovery else [])
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), *common, "--proc-id", str(i)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE) for i in range(a.processes)]
    try:
        for proc in procs:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != b"READY":  # it says nothing else before
                proc.kill()
                raise SystemExit(f"a process of the cluster did not start (exit {proc.wait()})")
        print("RUNNING", flush=True)
        t0 = time.perf_counter()
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
            proc.stdin.close()
        codes = [proc.wait() for proc in procs]
        run_s = time.perf_counter() - t0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    if any(codes):
        raise SystemExit(f"a process of the cluster failed: exits {codes}")
    with open(a.out, "ab") as joined:
        for i in range(a.processes):
            part = f"{a.out}.{i}"
            if os.path.exists(part):
                with open(part, "rb") as f:
                    joined.write(f.read())
                os.remove(part)
    return run_s


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="w2_job.py")
    p.add_argument("input")
    p.add_argument("out")
    p.add_argument("--recovery", default=None, metavar="DIR")
    p.add_argument("--epoch-s", type=float, default=1.0)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--processes", type=int, default=1)
    p.add_argument("--proc-id", type=int, default=None, help=argparse.SUPPRESS)   # one process of a cluster
    p.add_argument("--addresses", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    from importlib.metadata import version

    if a.processes > 1 and a.proc_id is None:
        with open(a.input, "rb") as f:
            records = f.read().count(b"\n")
        for path in [a.out] + [f"{a.out}.{i}" for i in range(a.processes)]:
            open(path, "w").close()
        run_s = _cluster(a)
    else:
        with open(a.input, "rb") as f:
            lines = f.read().splitlines()
        records = len(lines)
        if a.proc_id is None:
            open(a.out, "w").close()
        flow = build(lines, a.out, a.batch)
        kwargs = _recovery(a.recovery, a.epoch_s, 1, init=a.proc_id is None)
        if a.proc_id is not None:  # one process of a cluster (_cluster started it)
            from bytewax.testing import cluster_main  # type: ignore[import-not-found]

            print("READY", flush=True)
            os.dup2(2, 1)  # from here on, what is printed goes to the job's log, not to a pipe no one reads
            if sys.stdin.readline().strip() != "go":
                return 1  # the parent is gone
            cluster_main(flow, a.addresses.split(","), a.proc_id, **kwargs)
            return 0
        from bytewax.testing import run_main  # type: ignore[import-not-found]

        print("RUNNING", flush=True)
        t0 = time.perf_counter()
        run_main(flow, **kwargs)
        run_s = time.perf_counter() - t0
    print(json.dumps({"run_s": run_s, "bytewax_version": version("bytewax"), "records": records,
                      "batch": a.batch, "processes": a.processes}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
