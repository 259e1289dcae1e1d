"""The workloads, each on a fresh :class:`~runtime.cluster.LocalCluster` (real etcd,
master and worker processes): W1 latency, recovery after SIGKILL, W2 throughput,
watermark lag (sampled during W1), and memory.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from bench import flows, generator, latency, worker_metrics
from bench.cpu import CpuMeter
from bench.jobs import ArrivalSink  # noqa: F401  (workers import it by path)
from injectors import END_OF_TIME, Injector
from runtime import Topology
from runtime.client import Client
from runtime.cluster import LocalCluster, Process, wait_until
from runtime.keyspace import range_of
from runtime.topology import Productions

log = logging.getLogger(__name__)
WARMUP_PREFIX = b"warm"


@dataclass(frozen=True)
class BenchConfig:
    """Sizes of one ``millstream bench`` run (``--quick`` shrinks them)."""

    quick: bool
    w1_seconds: float
    w1_rates: tuple[int, ...]
    recovery_seconds: float
    w2_records: int
    w2_timeout_s: float
    memory_keys: int
    workers: int = 2
    lease_ms: int = 3000
    key_ranges: int = 4
    warmup_s: float = 1.0
    replication: int = 2  # copies of every tablet (the master's default)

    @classmethod
    def make(cls, quick: bool) -> BenchConfig:
        if quick:
            return cls(True, 4.0, (1_000, 10_000), 8.0, 100_000, 120.0, 100_000)
        return cls(False, 30.0, (1_000, 10_000), 30.0, 2_000_000, 420.0, 1_000_000)


# ------------------------------------------------------------- the cluster


@contextmanager
def cluster(root: str, name: str, cfg: BenchConfig) -> Iterator[LocalCluster]:
    """A fresh cluster under ``root/name``; always closed, nothing left running."""
    data = os.path.join(root, name)
    shutil.rmtree(data, ignore_errors=True)
    with LocalCluster(data, workers=cfg.workers, lease_ms=cfg.lease_ms, allow_code="bench",
                      replication=cfg.replication).running() as c:
        yield c


def peak_rss(c: LocalCluster) -> dict[str, int]:
    """VmHWM (peak resident set, bytes) of every live process of the cluster, by name."""
    out = {}
    for p in c.processes():
        try:
            with open(f"/proc/{p.popen.pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        out[p.name] = int(line.split()[1]) * 1024
        except OSError:
            continue
    return out


def wait_tablets_open(c: LocalCluster, client: Client, stream: str, sink_dir: str,
                      keys: int = 64, timeout: float = 60.0) -> None:
    """Send a few warm-up records (keys ``warm*``) and wait until each has come out."""
    with Injector(c.masters_arg, stream, f"warmup-{stream}", timeout=timeout) as inj:
        for i in range(keys):
            inj.send(WARMUP_PREFIX + b"%d" % i, b"%d" % time.time_ns(), time.time_ns() // 1000)
    wait_until(lambda: latency.count_lines(sink_dir) >= keys, timeout, "the warm-up records to come out")


# ---------------------------------------------------------------- status docs


def find_watermark(doc: dict[str, Any], computation: str) -> int | None:
    """The low watermark (µs) of ``computation`` in a status document, wherever the master
    puts it (``watermarks``, ``computations`` or under ``topologies``); None if absent."""
    wm = doc.get("watermarks")
    if isinstance(wm, dict) and computation in wm:
        return _as_int(wm[computation])
    for holder in _computation_docs(doc):
        c = holder.get(computation)
        if isinstance(c, dict):
            for k in ("low_watermark", "watermark", "lwm", "low_watermark_us"):
                if k in c:
                    return _as_int(c[k])
    return None


def _computation_docs(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if isinstance(doc.get("computations"), dict):
        yield doc["computations"]
    if isinstance(doc.get("computations"), list):
        yield {str(c.get("name")): c for c in doc["computations"] if isinstance(c, dict)}
    for t in (doc.get("topologies") or {}).values():
        if isinstance(t, dict) and isinstance(t.get("computations"), dict):
            yield t["computations"]


def _as_int(v: Any) -> int | None:
    if isinstance(v, dict):
        for k in ("low_watermark", "watermark", "value", "us"):
            if k in v:
                return _as_int(v[k])
        return None
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


class StatusSampler:
    """Polls the master's status every ``interval`` s on a thread, calling ``each(doc, t_ns)``."""

    def __init__(self, masters: str, each: Callable[[dict[str, Any], int], None], interval: float = 0.25):
        self.client = Client(masters, timeout=5)
        self.each = each
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                doc = self.client.status()
            except Exception as e:  # a failing master must not end the benchmark
                log.debug("status poll failed: %s", e)
                continue
            self.each(doc, time.time_ns())

    def __enter__(self) -> StatusSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.client.close()


# ---------------------------------------------------------------------- W1


@dataclass(frozen=True)
class W1Variant:
    name: str
    stages: int = 1
    exactly_once: bool = True
    productions: Productions = "strong"
    flush_each_tick: bool = True  # False: the sender only calls send(), as a user's loop does
    flow: bool = False  # a Dataflow whose stages fuse into one computation (bench/flows.py)

    def describe(self) -> str:
        mode = "exactly-once" if self.exactly_once else "at-least-once"
        sender = "" if self.flush_each_tick else ", send() only (the injector's linger, no flush)"
        if self.flow:
            return f"a flow of {self.stages} process step(s) fused in one computation, {mode}{sender}"
        return f"{self.stages} stage(s), {mode}, {self.productions} productions{sender}"


W1_VARIANTS = (
    W1Variant("eo-strong-fsync"),
    W1Variant("eo-send-only", flush_each_tick=False),
    W1Variant("eo-weak", productions="weak"),
    W1Variant("at-least-once", exactly_once=False),
    W1Variant("eo-2-stages", stages=2),
    W1Variant("eo-3-stages", stages=3),
    W1Variant("flow-1-stage", flow=True),
    W1Variant("flow-3-stages", stages=3, flow=True),
)


def w1_topology(v: W1Variant, sink_dir: str, key_ranges: int) -> Topology:
    if v.flow:
        return flows.w1_flow_topology(f"w1-{v.name}", v.stages, sink_dir, key_ranges)
    t = Topology(f"w1-{v.name}")
    stream = "in"
    for i in range(1, v.stages + 1):
        out = f"s{i}"
        t.add_computation(f"count{i}", "bench.jobs:ChainedCounter", inputs={stream: None},
                          outputs=[out], key_ranges=key_ranges, exactly_once=v.exactly_once,
                          productions=v.productions, params={"out": out})
        stream = out
    # The observer: exactly once (so counts can be checked) but without fsync.
    t.add_computation("sink", "bench.jobs:ArrivalSink", inputs={stream: None},
                      key_ranges=key_ranges, fsync=False, params={"path": sink_dir})
    return t


def run_w1(root: str, cfg: BenchConfig, v: W1Variant, rate: int, *,
           kill_at_s: float | None = None, seconds: float | None = None) -> dict[str, Any]:
    """One W1 run; with ``kill_at_s``, SIGKILL a worker that far into the run (recovery)."""
    seconds = cfg.w1_seconds if seconds is None else seconds
    name = f"w1-{v.name}-{rate}" + ("-recovery" if kill_at_s is not None else "")
    keys = generator.w1_keys(rate, seconds)
    result: dict[str, Any] = {"variant": v.name, "description": v.describe(), "rate": rate,
                              "seconds": seconds, "records": len(keys)}
    with cluster(root, name, cfg) as c:
        sink_dir = os.path.join(c.data_dir, "arrivals")
        with Client(c.masters_arg, timeout=30) as client:
            client.submit(w1_topology(v, sink_dir, cfg.key_ranges))
            wait_tablets_open(c, client, "in", sink_dir)
            before = {(t["computation"], t["key_range"]): t["worker"] for t in client.status()["tablets"]}
        wm_samples: list[tuple[int, int | None]] = []
        owners: list[tuple[int, dict[tuple[str, int], str], set[str]]] = []

        def sample(doc: dict[str, Any], t_ns: int) -> None:
            wm_samples.append((t_ns, find_watermark(doc, "sink")))
            if kill_at_s is not None:
                owners.append((t_ns, {(t["computation"], t["key_range"]): t["worker"]
                                      for t in doc["tablets"]}, {w["id"] for w in doc["workers"]}))

        killer = None
        kill_info: dict[str, Any] = {}
        if kill_at_s is not None:
            killer = threading.Thread(target=_kill_later, args=(c, kill_at_s, kill_info), daemon=True)
        with StatusSampler(c.masters_arg, sample), CpuMeter() as meter:
            if killer is not None:
                killer.start()
            stats = latency.paced_send(c.masters_arg, "in", name, keys, rate, flush_each_tick=v.flush_each_tick)
            if killer is not None:
                killer.join()
            expected = stats.sent + 64
            try:
                wait_until(lambda: latency.count_lines(sink_dir) >= expected, 120, "every output")
            except TimeoutError as e:
                result["error"] = str(e)
        time.sleep(0.5)  # let any (wrong) extra output land before counting
        assert meter.figures is not None
        # A busy machine is recognisable: the CPU of everything else next to the run's own.
        result["cpu"] = meter.figures.as_dict()
        result["peak_rss_bytes"] = peak_rss(c)
        pages, unread = worker_metrics.scrape(c)
        if unread:  # a worker killed by the run (recovery): the figures are the survivors'
            result["metrics_unread"] = unread
        result["batches"] = worker_metrics.batch_breakdown(list(pages.values()))  # where a round's time goes
        result["received"] = worker_metrics.received(list(pages.values()))  # and its messages
        arrivals = [a for a in latency.read_arrivals(sink_dir) if not a.key.startswith(WARMUP_PREFIX)]
    check = latency.check_exact(arrivals, stats.per_key)
    warm_end = stats.start_ns + int(cfg.warmup_s * 1e9)
    steady = [a.latency_ms for a in arrivals if a.sched_ns >= warm_end]
    result.update({
        "latency_ms": latency.percentiles(steady),
        "hops_ms": latency.hops(a for a in arrivals if a.sched_ns >= warm_end),
        "sender": {"flushes": stats.flushes, "mean_batch": round(stats.sent / max(1, stats.flushes), 1),
                   "max_batch": stats.max_batch, "max_behind_ms": round(stats.max_behind_ms, 1)},
        "timeline_max_latency_ms": latency.latency_timeline(arrivals, stats.start_ns, 1000),
        "achieved_rate": round(stats.sent / max(1e-9, (stats.end_ns - stats.start_ns) / 1e9)),
        "exactness": check.__dict__ | {"exact": check.exact},
    })
    result["watermark_lag_ms"] = _watermark_lag(wm_samples, stats.start_ns + int(cfg.warmup_s * 1e9),
                                                stats.end_ns)
    if kill_at_s is not None:
        result["recovery"] = _recovery(kill_info, before, owners, arrivals, cfg, stats.start_ns)
    return result


def _kill_later(c: LocalCluster, at_s: float, info: dict[str, Any]) -> None:
    time.sleep(at_s)  # the benchmark's schedule: the kill happens this far into the run
    victim: Process = c.workers[0]
    with Client(c.masters_arg, timeout=10) as client:
        ids = {w["address"]: w["id"] for w in client.status()["workers"]}
    info["worker_id"] = ids.get(victim.address, "")
    info["kill_ns"] = time.time_ns()
    c.kill(victim, graceful=False)
    info["killed_ns"] = time.time_ns()
    # The host is lost with its disk: its tablets survive only on their followers.
    shutil.rmtree(victim.state_dir, ignore_errors=True)
    info["disk_deleted"] = not os.path.exists(victim.state_dir)


def _watermark_lag(samples: list[tuple[int, int | None]], start_ns: int, end_ns: int) -> dict[str, Any]:
    lags = [(t - wm * 1000) / 1e6 for t, wm in samples if wm is not None and start_ns <= t <= end_ns
            and -(1 << 62) < wm < END_OF_TIME]
    if not samples or all(wm is None for _, wm in samples):
        return {"available": False, "why": "the master's status has no per-computation low watermark yet"}
    if not lags:
        return {"available": False, "why": "no watermark was published during the steady-state window"}
    return {"available": True, "samples": len(lags)} | latency.percentiles(lags, (50, 95))


def _recovery(kill: dict[str, Any], before: dict[tuple[str, int], str],
              owners: list[tuple[int, dict[tuple[str, int], str], set[str]]],
              arrivals: list[latency.Arrival], cfg: BenchConfig, origin_ns: int) -> dict[str, Any]:
    if "kill_ns" not in kill:
        return {"error": "the worker was not killed (the run ended first)"}
    kill_ns, victim = kill["kill_ns"], kill["worker_id"]
    moved = sorted(k for k, w in before.items() if w == victim)
    reassigned = next((t for t, own, live in owners if t > kill_ns and victim not in live
                       and all(own.get(k) in live for k in moved)), None)
    ranges = {comp: {r for (c, r) in moved if c == comp} for comp in {c for c, _ in moved}}

    def through_victim(key: bytes) -> bool:
        return any(range_of(key, cfg.key_ranges) in rs for rs in ranges.values())

    first = min((a.arrival_ns for a in arrivals if a.arrival_ns > kill["killed_ns"]
                 and through_victim(a.key)), default=None)
    pre = [a.latency_ms for a in arrivals if origin_ns + cfg.warmup_s * 1e9 <= a.sched_ns < kill_ns]
    post = [a.latency_ms for a in arrivals if kill_ns <= a.sched_ns < kill_ns + 10e9]
    return {
        "killed_worker": victim,
        "disk_deleted": bool(kill.get("disk_deleted")),
        "tablets_moved": [f"{c}/{r}" for c, r in moved],
        "reassigned_after_s": None if reassigned is None else round((reassigned - kill_ns) / 1e9, 2),
        "serving_again_after_s": None if first is None else round((first - kill_ns) / 1e9, 2),
        "latency_before_kill_ms": latency.percentiles(pre),
        "latency_10s_after_kill_ms": latency.percentiles(post),
        "timeline_max_latency_ms": latency.latency_timeline(arrivals, origin_ns, 500),
        "kill_at_s": round((kill_ns - origin_ns) / 1e9, 2),
    }


# ---------------------------------------------------------------------- W2


def w2_topology(sink_dir: str, key_ranges: int, prefix: str = "") -> Topology:
    t = Topology(f"{prefix}w2")
    t.add_computation(f"{prefix}window", "bench.jobs:WindowCounter", inputs={f"{prefix}events": None},
                      outputs=[f"{prefix}windows"], key_ranges=key_ranges,
                      params={"out": f"{prefix}windows"})
    t.add_computation(f"{prefix}spike", "bench.jobs:SpikeDetector", inputs={f"{prefix}windows": None},
                      outputs=[f"{prefix}spikes"], key_ranges=key_ranges,
                      params={"out": f"{prefix}spikes"})
    t.add_computation(f"{prefix}sink", "bench.jobs:ArrivalSink", inputs={f"{prefix}spikes": None},
                      key_ranges=key_ranges, fsync=False, params={"path": sink_dir})
    return t


def _timers_fire(c: LocalCluster, client: Client, root: str, timeout: float) -> bool:
    """A tiny probe pipeline: does an event-time window fire once its injector finishes?"""
    sink = os.path.join(root, "probe-spikes")
    client.submit(w2_topology(sink, 1, prefix="probe_"))
    base = 1_700_000_000 * generator.SECOND_US
    with Injector(c.masters_arg, "probe_events", "probe") as inj:
        for sec, n in ((0, 1), (1, 1), (2, 20)):
            for _ in range(n):
                inj.send(b"probe", b"1", base + sec * generator.SECOND_US + 1)
        inj.advance_watermark(base + 3 * generator.SECOND_US)
    try:
        wait_until(lambda: latency.count_lines(sink) >= 1, timeout, "the probe's spike")
        return True
    except TimeoutError:
        return False


def run_w2(root: str, cfg: BenchConfig, data: generator.W2Data | None = None,
           oracle: generator.W2Oracle | None = None, *, flow: bool = False) -> dict[str, Any]:
    """W2 on a fresh cluster: records over the time from the first send to the last spike's
    arrival, spikes checked against the oracle. ``flow=False``: the classic three computations
    (:func:`w2_topology`) fed by two closed-loop injectors; ``flow=True``: W2 as a user writes it
    on a flow (:func:`bench.jobs.w2_flow`) fed by one injector's ``send()`` loop
    (:func:`bench.flows.inject_as_user`), with the window firings' stalls read from the workers."""
    from bench.jobs import w2_flow

    data = data or generator.w2_data(cfg.w2_records)
    oracle = oracle or generator.w2_oracle(data)
    result: dict[str, Any] = {"records": len(data.keys), "windows": len(oracle.windows),
                              "spikes_expected": len(oracle.spikes),
                              "events_per_event_second": data.events_per_second,
                              "disorder_s": data.disorder_us / 1e6,
                              "variant": "flow" if flow else "classic",
                              "sender": (f"one Injector (default batching), send() per record, advance_watermark "
                                         f"every {flows.WATERMARK_EVERY:,} records") if flow else
                                        "two closed-loop injector threads, rounds of 4,000"}
    with cluster(root, "w2-flow" if flow else "w2", cfg) as c:
        sink_dir = os.path.join(c.data_dir, "spikes")
        with Client(c.masters_arg, timeout=30) as client:
            if flow:
                client.submit(w2_flow(sink_dir, key_ranges=cfg.key_ranges))
            else:
                if not _timers_fire(c, client, c.data_dir, 20.0):
                    result["available"] = False
                    result["why"] = ("event-time timers did not fire within 20 s of an injector finishing "
                                     "(low watermarks are not computed by the master yet)")
                    return result
                client.submit(w2_topology(sink_dir, cfg.key_ranges))
        result["available"] = True
        with CpuMeter() as meter:  # the whole tree: this process (the injector), etcd, master, workers
            t0 = time.time_ns()
            injected = (flows.inject_as_user(c.masters_arg, data) if flow
                        else _inject_fast(c.masters_arg, data, threads=2))
            t_inj = time.time_ns()
            try:
                wait_until(lambda: latency.count_lines(sink_dir) >= len(oracle.spikes),
                           cfg.w2_timeout_s, "every spike")
            except TimeoutError as e:
                result["error"] = str(e)
        assert meter.figures is not None
        result["cpu"] = meter.figures.as_dict()
        result["records_per_cpu_s"] = round(len(data.keys) / max(1e-9, meter.figures.ours_s))
        got = latency.count_lines(sink_dir)
        t_end = max((a.arrival_ns for a in latency.read_spikes(sink_dir)), default=time.time_ns())
        time.sleep(1.0)  # anything extra (a doubled spike) lands now
        result["peak_rss_bytes"] = peak_rss(c)
        if flow:
            result["window_fire"] = flows.window_fire_stalls(c)
        spikes = latency.read_spikes(sink_dir)
    observed = Counter((a.key, a.window) for a in spikes)
    expected = Counter(oracle.spikes)
    result.update({
        "injected": injected,
        "injection_rate": round(injected / ((t_inj - t0) / 1e9)),
        "elapsed_s": round((t_end - t0) / 1e9, 2),
        "throughput_rps": round(len(data.keys) / ((t_end - t0) / 1e9)) if got else None,
        "spikes_observed": sum(observed.values()),
        "oracle_equal": observed == expected and all(
            oracle.windows.get((a.key, a.window)) == a.count for a in spikes),
    })
    return result


def _inject_fast(masters: str, data: generator.W2Data, threads: int) -> int:
    """Closed-loop injection as fast as the cluster accepts it, from ``threads`` injectors."""
    done = [0] * threads
    errors: list[BaseException] = []

    def one(t: int) -> None:
        try:
            # Rounds of 4,000 leave as soon as they are full, while the next fill: no flush.
            batch = 4000
            with Injector(masters, "events", f"w2-{t}", batch_size=batch, timeout=300) as inj:
                for i in range(t, len(data.keys), threads):
                    inj.send(data.keys[i], b"", data.timestamps[i])
                    if (i // threads) % batch == batch - 1:
                        inj.advance_watermark(data.watermark_after(i))  # held by what is queued
                        done[t] = i
                done[t] = len(data.keys)
        except BaseException as e:  # reported by the caller
            errors.append(e)

    ts = [threading.Thread(target=one, args=(t,)) for t in range(threads)]
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    if errors:
        raise errors[0]
    return len(data.keys)


# ------------------------------------------------------------------ memory


def rocksdb_bytes_per_million_keys(root: str, n_keys: int) -> dict[str, Any]:
    """Write ``n_keys`` of W1-like state (a count per key) through TabletStore, flush, measure."""
    from worker.storage import Commit, TabletStore

    out: dict[str, Any] = {"keys_written": n_keys}
    for label, with_ids in (("state_only", False), ("state_plus_opaque_id", True)):
        path = os.path.join(root, f"rocksdb-{label}")
        shutil.rmtree(path, ignore_errors=True)
        store = TabletStore(path, 1, sync=False)
        batch = 1000
        for lo in range(0, n_keys, batch):
            c = Commit(seq=store.seq)
            for i in range(lo, min(n_keys, lo + batch)):
                c.state[b"k%09d" % i] = b"%d" % (i % 1000 + 1)
                if with_ids:
                    c.opaque_ids.append(i.to_bytes(16, "big"))
            store.commit(c)
        store.db.flush()
        store.db.compact_range(None, None)
        store.close()
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs
                   if not f.startswith("LOG"))
        out[label] = {"dir_bytes": size, "bytes_per_1m_keys": round(size * 1_000_000 / n_keys)}
        shutil.rmtree(path, ignore_errors=True)
    return out
