"""Every metric millstream exports, in one place (Prometheus format)."""

from __future__ import annotations

import asyncio
import bisect
import ctypes
import gc
import os
import ssl as ssl_module
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from time import perf_counter
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from runtime import http
from runtime.kernels import count_into

RECORDS = Counter("millstream_records_processed", "New input records processed", ["computation"])
DUPLICATES = Counter("millstream_duplicates_dropped", "Input records dropped as duplicates", ["computation"])
LATE = Counter("millstream_late_records", "Records below the watermark on arrival", ["computation"])
DEAD = Counter("millstream_dead_lettered", "Records sent to the dead-letter stream", ["computation"])
BUSY = Counter("millstream_busy_refusals", "Deliveries refused with BUSY (backpressure)", ["computation"])
FENCED = Counter("millstream_fenced_commits", "Commits refused because the lease expired", ["computation"])
STALE = Counter("millstream_stale_refusals", "Actions refused for a stale sequencer token", ["action"])
COMMIT_SECONDS = Histogram("millstream_commit_seconds", "Time of one atomic batch commit", ["computation"],
                           buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25))
WATERMARK = Gauge("millstream_low_watermark_us", "Published low watermark (master)", ["computation"])
WATERMARK_LAG = Gauge("millstream_watermark_lag_seconds", "Wall clock minus low watermark (master)",
                      ["computation"])
LEADER = Gauge("millstream_master_is_leader", "1 while this master leads")
WORKERS = Gauge("millstream_workers", "Live workers known to the leader")
SENT = Counter("millstream_productions_acked", "Productions acknowledged by their receiver", ["computation"])
USER_BUCKETS = (0.00001, 0.00005, 0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0)
BATCH_SECONDS = Histogram("millstream_batch_seconds", "Time of one batch, user code to durable commit",
                          ["computation"], buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                    0.25, 0.5, 1, 5))
WINDOW_FIRE_SECONDS = Histogram("millstream_window_fire_seconds", "Time a flow's event-time step (window, join) "
                                "spent firing what one watermark advance made due, per tablet: how long "
                                "it stalled its tablet", ["step"],
                                buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1))
WINDOW_FIRE_CPU_SECONDS = Histogram("millstream_window_fire_cpu_seconds", "CPU time the tablet's thread spent "
                                    "in the firings of millstream_window_fire_seconds: the firing's own work; "
                                    "the rest of that time the thread waited for the interpreter lock or a core",
                                    ["step"], buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1))
WINDOW_FIRE_QUEUED_SECONDS = Histogram("millstream_window_fire_queued_seconds", "Time the tablet's thread "
                                       "waited for a core (the kernel's run queue) in the firings of "
                                       "millstream_window_fire_seconds; wall time over this and their CPU "
                                       "it was blocked: on the interpreter lock, mostly (Linux only)", ["step"],
                                       buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1))
WINDOWS_FIRED = Counter("millstream_windows_fired", "Windows (per key) a flow's event-time steps fired", ["step"])
DELIVERIES_PER_CALL = Histogram("millstream_deliveries_per_call", "Tablets' deliveries carried by one Deliver "
                                "or DeliverMany call this worker received, by sender (injector, worker)",
                                ["sender"], buckets=(1, 2, 4, 8, 16, 32, 64))
REPLICAS_PER_CALL = Histogram("millstream_replicated_tablets_per_call", "Tablets' Replicate requests carried by "
                              "one Replicate or ReplicateMany call or replication stream frame this worker received as a follower",
                              buckets=(1, 2, 4, 8, 16, 32, 64))
DELIVER_CALLS = Counter("millstream_deliver_calls", "Deliver or DeliverMany calls (unary) and delivery stream "
                        "frames (frame) this worker received", ["carrier"])
REPLICATE_CALLS = Counter("millstream_replicate_calls", "Replicate or ReplicateMany calls (unary) and "
                          "replication stream frames (frame) this worker received as a follower", ["carrier"])
SLOW_CALLS = Counter("millstream_slow_user_calls", "Calls of user code that took over a second",
                     ["computation"])
# Liveness: each of these stays at zero on a healthy cluster, however busy (docs/operations.md).
LEASE_LOST = Counter("millstream_worker_lease_lost", "Times this worker self-fenced: its lease lapsed")
REREGISTERED = Counter("millstream_worker_reregistrations", "Times this worker registered again after "
                       "the master forgot it")
TABLET_OPENS = Counter("millstream_tablet_opens", "Tablets opened on this worker", ["computation"])
TABLET_FAILURES = Counter("millstream_tablet_batch_failures", "Batches that failed and reopened their tablet",
                          ["computation"])
WORKER_EXPIRIES = Counter("millstream_worker_lease_expiries", "Workers the leader dropped for a missed lease")
ETCD_DB_BYTES = Gauge("millstream_etcd_db_bytes", "Size of etcd's database (leader master)")
OUT_OF_ORDER = Counter("millstream_out_of_order_deliveries", "Deliveries refused until an earlier one of "
                       "the same producer commits", ["computation"])
DEDUP_FILTER_BYTES = Gauge("millstream_dedup_filter_bytes", "Bloom filters over opaque ids kept for "
                           "dedup_retention", ["computation", "key_range"])
DEDUP_PRODUCERS = Gauge("millstream_dedup_producers", "Producers with a mark (highest committed "
                        "sequence) in a tablet", ["computation", "key_range"])
TABLET_MOVES = Counter("millstream_tablet_moves", "Tablets given to another worker (a new token)", ["reason"])
# Replication (docs/replication.md)
REPLICATION_SECONDS = Histogram("millstream_replication_seconds", "Time from a local commit to its "
                                "acknowledgement by every in-sync follower", ["computation"],
                                buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1, 5))
REPLICATION_RPC_SECONDS = Histogram("millstream_replication_rpc_seconds", "One Replicate call to a follower, "
                                    "sent to answered (primary side)", ["computation"],
                                    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1, 5))
REPLICATION_LAG = Gauge("millstream_replication_lag_commits", "Commits a follower has not acknowledged "
                        "(primary side)", ["computation", "key_range", "follower"])
REPLICATION_REFUSED = Counter("millstream_replication_refused", "Commits of a primary refused by a follower "
                              "that has seen a newer token (a zombie primary)", ["computation"])
FOLLOWER_REFUSALS = Counter("millstream_follower_refusals", "Replicated commits or snapshots this worker "
                            "refused as a follower", ["reason"])
SNAPSHOTS_SENT = Counter("millstream_snapshots_sent", "Checkpoints sent to followers to catch up",
                         ["computation"])
IN_SYNC_CHANGES = Counter("millstream_in_sync_changes", "Followers joining or leaving an in-sync set "
                          "(primary side)", ["change"])
UNDER_REPLICATED = Gauge("millstream_under_replicated_tablets", "Tablets with fewer in-sync copies than "
                         "their replication factor (leader master)")
UNAVAILABLE = Gauge("millstream_unavailable_tablets", "Tablets that existed and have no live in-sync copy "
                    "(leader master): they wait for one to come back")


def forget_range(computation: str, key_range: int, followers: Iterable[str] = ()) -> None:
    """Drop one tablet's per-range gauges: it closed on this worker (moved, split, merged,
    reopening, or its job gone), and a stale value must not stay exported for ever."""
    labels = (computation, str(key_range))
    DEDUP_FILTER_BYTES.remove(*labels)
    DEDUP_PRODUCERS.remove(*labels)
    for follower in followers:
        REPLICATION_LAG.remove(*labels, follower)


class ThreadHistogram:
    """A histogram written by one thread without locks (one observation per call of user
    code is too often for prometheus_client's locked Histogram); read by the collector."""

    __slots__ = ("computation", "counts", "sum")

    def __init__(self, computation: str) -> None:
        self.computation = computation
        self.counts = [0] * (len(USER_BUCKETS) + 1)
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(USER_BUCKETS, seconds)] += 1
        self.sum += seconds

    def observe_many(self, seconds: list[float]) -> None:
        """Each of ``seconds`` (a batch's calls, recorded as they ran and counted here once)."""
        self.sum += count_into(self.counts, USER_BUCKETS, seconds)


class _UserCodeHistograms(Collector):
    """``millstream_user_code_seconds``: the sum of every tablet's :class:`ThreadHistogram`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._children: list[ThreadHistogram] = []

    def child(self, computation: str) -> ThreadHistogram:
        h = ThreadHistogram(computation)
        with self._lock:
            self._children.append(h)
        return h

    def collect(self) -> Iterator[HistogramMetricFamily]:
        with self._lock:
            children = list(self._children)
        totals: dict[str, tuple[list[int], float]] = {}
        for h in children:
            counts, total = totals.get(h.computation, ([0] * len(h.counts), 0.0))
            totals[h.computation] = ([a + b for a, b in zip(counts, h.counts, strict=True)], total + h.sum)
        fam = HistogramMetricFamily("millstream_user_code_seconds",
                                    "Time of one call of user code (one record or timer)",
                                    labels=["computation"])
        for comp, (counts, total) in sorted(totals.items()):
            cumulative, buckets = 0, []
            for bound, n in zip([*map(str, USER_BUCKETS), "+Inf"], counts, strict=True):
                cumulative += n
                buckets.append((bound, cumulative))
            fam.add_metric([comp], buckets, total)
        yield fam


_USER = _UserCodeHistograms()
REGISTRY.register(_USER)


@dataclass(frozen=True)
class TabletMetrics:
    records: Counter
    duplicates: Counter
    late: Counter
    dead_lettered: Counter
    busy: Counter
    fenced: Counter
    commit_seconds: Histogram
    sent: Counter
    user_seconds: ThreadHistogram
    batch_seconds: Histogram
    slow_calls: Counter
    out_of_order: Counter
    stale_producers: Counter


def tablet(computation: str) -> TabletMetrics:
    """The metric children of one computation."""
    return TabletMetrics(
        RECORDS.labels(computation), DUPLICATES.labels(computation), LATE.labels(computation),
        DEAD.labels(computation), BUSY.labels(computation), FENCED.labels(computation),
        COMMIT_SECONDS.labels(computation), SENT.labels(computation), _USER.child(computation),
        BATCH_SECONDS.labels(computation), SLOW_CALLS.labels(computation),
        OUT_OF_ORDER.labels(computation), STALE.labels("producer"),
    )


GC_PAUSE_SECONDS = Histogram("millstream_gc_pause_seconds", "Time of one collection of Python's cyclic "
                             "garbage collector of generation 1 or 2 (the oldest): every thread of the "
                             "process waits for it", ["generation"],
                             buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1))


_GC_WATCHED = False


class _Fd:
    """A file descriptor, closed with its last reference (a thread's, when it ends)."""

    def __init__(self, path: str) -> None:
        try:
            self.fd = os.open(path, os.O_RDONLY)
        except OSError:
            self.fd = -1

    def __del__(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)


class _Schedstat(threading.local):
    """The calling thread's ``/proc/thread-self/schedstat``, opened once per thread and closed
    when it ends, read with ``pread`` through :class:`ctypes.PyDLL`: a call that keeps the
    interpreter lock. A read through Python's files releases it, and on a busy worker the
    thread may then wait for it again, in the very firing it measures."""

    def __init__(self) -> None:
        self.file = _Fd("/proc/thread-self/schedstat")
        self.buf = ctypes.create_string_buffer(128)

    def queued(self) -> float | None:
        if self.file.fd < 0 or _PREAD is None:
            return None
        n = _PREAD(self.file.fd, self.buf, 127, 0)
        fields = self.buf.raw[:max(n, 0)].split()
        return int(fields[1]) / 1e9 if len(fields) > 1 else None


def _pread() -> Any:
    try:
        f = ctypes.PyDLL(None).pread
    except (OSError, AttributeError):
        return None
    f.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_long)
    f.restype = ctypes.c_ssize_t
    return f


_PREAD = _pread()
_SCHEDSTAT = _Schedstat()


def queued_seconds() -> float | None:
    """How long the calling thread has waited for a core, in all (the kernel's run queue:
    ``/proc/thread-self/schedstat``); None where the kernel does not say."""
    return _SCHEDSTAT.queued()


def watch_gc() -> None:
    """Observe the pauses of the collector's older generations (a worker's, a master's)
    into :data:`GC_PAUSE_SECONDS`. Generation 0's many short collections are only counted
    (``python_gc_collections_total``, prometheus_client's own)."""
    global _GC_WATCHED
    if _GC_WATCHED:
        return
    _GC_WATCHED = True
    children = {1: GC_PAUSE_SECONDS.labels("1"), 2: GC_PAUSE_SECONDS.labels("2")}
    started = [0.0]  # collections never overlap (one at a time, under the GIL)

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if info["generation"]:
            if phase == "start":
                started[0] = perf_counter()
            else:
                children[info["generation"]].observe(perf_counter() - started[0])

    gc.callbacks.append(on_gc)


UNAUTHORIZED = (b"this worker's /metrics asks for its token (the worker's --metrics-token): send "
                b"Authorization: Bearer TOKEN (Prometheus: authorization.credentials_file)\n")


def encoder_for(accept: str) -> tuple[Callable[[Any], bytes], str]:
    """The exposition ``accept`` (a request's ``Accept``) asks for, and its content type:
    OpenMetrics for Prometheus, which asks for it first, else the text format (as
    prometheus_client's own server answers; an ``Accept`` it cannot read too)."""
    try:
        return choose_encoder(accept)  # type: ignore[no-any-return]
    except Exception:  # (e.g. "text/plain;version=x": a TypeError inside it)
        return choose_encoder("")  # type: ignore[no-any-return]


def exposition(accept: str) -> tuple[str, bytes]:
    """The metrics as ``accept`` asks for them (:func:`encoder_for`), and their content type."""
    encoder, content_type = encoder_for(accept)
    return content_type, encoder(REGISTRY)


async def serve(listen: str, *, token: str | None = None,
                ssl: ssl_module.SSLContext | None = None) -> tuple[http.Server, str]:
    """Expose the metrics on ``HOST:PORT`` (``/metrics``, or any path but ``/favicon.ico``, as
    prometheus_client's own server did), over HTTPS with ``ssl`` and asking for ``token`` if
    given (runtime/http.py); returns the server and its bound address (port 0: the OS picks).

    The text is made off the event loop, on a thread of its own (not the loop's default
    executor, which the record path's file writes use), once for the scrapes that ask meanwhile."""
    loop = asyncio.get_running_loop()
    pool = ThreadPoolExecutor(1, thread_name_prefix="metrics")
    making: dict[str, asyncio.Future[bytes]] = {}  # content type -> the exposition being made in it

    async def route(request: http.Request) -> tuple[int, str, bytes]:
        if request.path == "/favicon.ico":
            return 404, "text/plain", b"not found\n"
        encoder, content_type = encoder_for(request.headers.get("accept", ""))
        made = making.get(content_type)
        if made is None:
            made = making[content_type] = loop.run_in_executor(pool, encoder, REGISTRY)
            made.add_done_callback(lambda _: making.pop(content_type, None))
        return 200, content_type, await asyncio.shield(made)

    server, address = await http.serve(listen, route, token=token, ssl=ssl, unauthorized=UNAUTHORIZED)
    server.on_close(lambda: pool.shutdown(wait=False, cancel_futures=True))
    return server, address
