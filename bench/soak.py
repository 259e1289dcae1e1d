"""The soak run: does a long stream keep flat disk and memory? (issue 11)

A two-stage exactly-once pipeline (``bench.jobs:ChainedCounter`` twice, 10,000 keys) is fed
by one default :class:`~injectors.Injector` (sequenced ids) at a fixed rate. Every
``sample_s`` the run records the records sent, the bytes of the workers' state directory
(RocksDB files, and its table files alone), the workers' resident memory and their Bloom-filter gauge
(``millstream_dedup_filter_bytes``). After the run, with the cluster stopped, it opens
every tablet's store and measures its dedup data (``TabletStore.dedup_bytes``). The
slopes are least-squares fits over the samples after warm-up (the first third), in bytes
per million records: a bounded stream shows a slope near zero once RocksDB's compactions
keep up. Run it with ``millstream bench --only soak`` (``--quick`` for a short one)."""

from __future__ import annotations

import glob
import os
import re
import time
import urllib.request
from typing import Any

from bench import workloads
from injectors import Injector
from runtime import Topology
from runtime.client import Client
from runtime.cluster import LocalCluster

KEYS = 10_000


def soak_topology() -> Topology:
    t = Topology("soak")
    t.add_computation("stage1", "bench.jobs:ChainedCounter", inputs={"in": None}, outputs=["s1"],
                      key_ranges=4, params={"out": "s1"})
    t.add_computation("stage2", "bench.jobs:ChainedCounter", inputs={"s1": None}, outputs=["s2"],
                      key_ranges=4, params={"out": "s2"})
    return t


def _dir_bytes(path: str, pattern: str = "*") -> int:
    return sum(os.path.getsize(f) for f in glob.glob(os.path.join(path, "**", pattern), recursive=True)
               if os.path.isfile(f))


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _gauge(c: LocalCluster, name: str) -> float:
    total = 0.0
    for w in c.workers:
        port = next((line.rsplit(":", 1)[1] for line in w.lines if " metrics on " in line), None)
        if port is None or not w.alive():
            continue
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
        total += sum(float(m) for m in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))
    return total


def slope_per_million(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of ``ys`` over ``xs`` (records), in units per million records."""
    n = len(xs)
    if n < 3:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    if var == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var * 1e6


# The key prefixes of dedup data in a tablet store: H (producer marks) and O (opaque ids)
# since issue 11; D (one id per record) and G (producer tokens) before it, so that the same
# command measures a checkout from before the change (``python -m bench.soak`` from there).
DEDUP_PREFIXES = (b"H", b"O", b"D", b"G")


def store_dedup_bytes(state_dir: str) -> dict[str, int]:
    """Dedup bytes (keys and values) of every tablet store under ``state_dir``, as RocksDB
    returns them (uncompressed); the cluster must be stopped."""
    from rocksdict import AccessType, Options, Rdict

    out = {}
    for path in sorted(glob.glob(os.path.join(state_dir, "**", "CURRENT"), recursive=True)):
        d = os.path.dirname(path)
        db = Rdict(d, options=Options(raw_mode=True), access_type=AccessType.read_only())
        try:
            total = 0
            for prefix in DEDUP_PREFIXES:
                it = db.iter()
                it.seek(prefix)
                while it.valid() and it.key().startswith(prefix):
                    total += len(it.key()) + len(it.value())
                    it.next()
            out[os.path.relpath(d, state_dir)] = total
        finally:
            db.close()
    return out


def run_soak(root: str, cfg: workloads.BenchConfig, records: int, rate: int,
             sample_s: float = 10.0) -> dict[str, Any]:
    samples: list[dict[str, Any]] = []
    with workloads.cluster(root, "soak", cfg) as c:
        with Client(c.masters_arg, timeout=30) as cl:
            cl.submit(soak_topology())  # the injector waits (BUSY) while the tablets open
        t0 = time.monotonic()
        next_sample = t0
        load = os.getloadavg()
        with Injector(c.masters_arg, "in", "soak", batch_size=1000) as inj:
            for i in range(records):
                if i % 1000 == 0:
                    due = t0 + i / rate
                    now = time.monotonic()
                    if due > now:
                        time.sleep(due - now)  # pacing the open-loop sender, not a wait
                    if now >= next_sample:
                        next_sample = now + sample_s
                        samples.append({
                            "t_s": round(now - t0, 1), "records": i,
                            "state_bytes": _dir_bytes(c.state_dir),
                            # Table files only: the write-ahead log grows and is dropped with
                            # every memtable flush (a saw-tooth of ~64 MiB per tablet).
                            "sst_bytes": _dir_bytes(c.state_dir, "*.sst"),
                            "worker_rss": sum(_rss(w.popen.pid) for w in c.workers if w.alive()),
                            "bloom_bytes": _gauge(c, "millstream_dedup_filter_bytes"),
                        })
                inj.send(b"k%d" % (i * 7919 % KEYS), b"%d" % i, 1_700_000_000_000_000 + i)
        elapsed = time.monotonic() - t0
        state_dir = c.state_dir
    dedup = store_dedup_bytes(state_dir)
    warm = samples[len(samples) // 3:]
    xs = [float(s["records"]) for s in warm]
    return {
        "records": records, "rate": rate, "achieved_rps": round(records / elapsed),
        "loadavg_at_start": load, "loadavg_at_end": os.getloadavg(), "samples": samples,
        "slope_state_bytes_per_1m": slope_per_million(xs, [float(s["state_bytes"]) for s in warm]),
        "slope_sst_bytes_per_1m": slope_per_million(xs, [float(s["sst_bytes"]) for s in warm]),
        "slope_worker_rss_per_1m": slope_per_million(xs, [float(s["worker_rss"]) for s in warm]),
        "slope_bloom_bytes_per_1m": slope_per_million(xs, [float(s["bloom_bytes"]) for s in warm]),
        "dedup_bytes_by_tablet": dedup,
        "dedup_bytes_per_1m_records": round(sum(dedup.values()) * 1e6 / max(1, 2 * records), 1),
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.soak RECORDS RATE``: one soak run, printed as JSON (for before/after
    runs from two checkouts, like bench.w1_single)."""
    import argparse
    import json
    import shutil
    import tempfile

    p = argparse.ArgumentParser(prog="python -m bench.soak")
    p.add_argument("records", type=int)
    p.add_argument("rate", type=int)
    p.add_argument("--sample-s", type=float, default=30.0)
    args = p.parse_args(argv)
    root_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root_dir, os.environ.get("PYTHONPATH")]))
    root = tempfile.mkdtemp(prefix="millstream-soak-")
    try:
        r = run_soak(root, workloads.BenchConfig.make(False), args.records, args.rate, args.sample_s)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
