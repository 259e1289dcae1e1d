"""The master's core: topologies, worker liveness, placement, routing and status.

Knows nothing of gRPC. The leader owns the truth in memory, mirrored to etcd
through :class:`~master.store.EtcdStore`; after a failover the next leader
rebuilds it all from etcd with :meth:`MasterCore.become_leader`.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import logging
import re
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from master.code import check_loadable
from master.jobs import CANCELLED, DRAINED, PAUSE_LIMIT_S, RUNNING, Job, Pause, closed_streams, input_streams
from master.ranges import KeyRange, Ranges
from master.rebalance import Policy, Rebalancer
from master.scheduler import Ownership, TabletKey, replan, replication_health
from master.store import Change, EtcdStore
from master.watermarks import (
    END_OF_TIME,
    MIN,
    Settler,
    TabletReport,
    Watermark,
    compute,
    inputs,
    publish,
    with_idleness,
)
from runtime import metrics
from runtime.client import check_topology_size
from runtime.errors import (
    ConfigError,
    MillstreamError,
    RoleError,
    StaleTokenError,
    TopologyError,
    WorkerIdentityError,
)
from runtime.keyspace import wire_end
from runtime.topology import RESERVED_PARAM_PREFIX, ComputationSpec, Topology, validate_against
from runtime.wire import millstream_pb2 as pb

log = logging.getLogger(__name__)


FINISHED = "finished injectors of "  # marker injector name prefix, one per stream


MAX_INJECTOR_NAME_BYTES = 512
MAX_INCARNATION_CHARS = 64
STREAM_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")
WORKER_ID = re.compile(r"^[0-9a-f]{12}$")
ZONE = re.compile(r"^[A-Za-z0-9_.\-]{0,63}$")
MODULE_PREFIX = re.compile(r"[A-Za-z_]\w{0,127}(\.[A-Za-z_]\w{0,127}){0,15}")


def check_injector_name(name: str) -> None:
    """Injector names are stored in etcd and shown on the web page: bounded and printable."""
    if not name:
        raise ConfigError("an injector needs a name (it seeds its record ids and holds its watermark)")
    if len(name.encode("utf-8", "replace")) > MAX_INJECTOR_NAME_BYTES:
        raise ConfigError(f"injector name of {len(name.encode('utf-8', 'replace')):,} bytes is too long; "
                          f"use at most {MAX_INJECTOR_NAME_BYTES} bytes")
    if not name.isprintable():
        raise ConfigError(f"injector name {name[:80]!r} has control characters; use printable text")
    if name.startswith(FINISHED):
        raise ConfigError(f"injector name {name[:80]!r} starts with {FINISHED!r}, the leader's marker "
                          "of finished injectors; choose another name")


class UnknownWorkerError(MillstreamError):
    """A heartbeat from a worker whose lease has already expired."""


@dataclass(frozen=True)
class MasterConfig:
    """Timing settings of the master."""

    lease_ms: int = 3000
    tick_ms: int = 50
    # Extra margin before a reported increase counts (master.watermarks.Settler). Receipts
    # already make hand-overs exact (see docs/time.md); this is only a safety margin.
    settle_ms: int = 0
    # A tablet silent for this long (its worker died or stalled right after a commit its
    # last report predates) holds its computation at the published watermark.
    report_timeout_ms: int = 500
    # etcd upkeep: its size is read this often, and it is defragmented (at most hourly)
    # once it holds more than this (compaction alone does not shrink the file).
    etcd_check_s: float = 10.0
    # An injector silent this long is flagged stale in status (it still holds its stream).
    injector_stale_s: float = 600.0
    # An injector silent this long is gone (a live Injector reports every 10 s, idle or not):
    # its name is released as an operator's release would (review G4). 0: never.
    injector_expiry_s: float = 86_400.0
    defrag_above_bytes: int = 512 << 20
    # Copies of every tablet (primary included) unless its computation says otherwise.
    replication: int = 2
    # Split hot ranges and merge cold ones (master/rebalance.py) unless a computation says.
    rebalance: bool = False
    policy: Policy = Policy()


class MasterCore:
    """Leader-side logic. Every mutating call persists to etcd before it is visible."""

    def __init__(self, store: EtcdStore, config: MasterConfig, now_ms: Callable[[], float]) -> None:
        self.store = store
        self.config = config
        self.now_ms = now_ms
        self.topologies: dict[str, Topology] = {}  # those of cancelled jobs too, while their state is kept
        self.jobs: dict[str, Job] = {}             # jobs not running (master/jobs.py); absent: running
        self.dropped: dict[str, int] = {}          # computation -> range ids below this were deleted
        self.routing_seen: dict[str, int] = {}     # worker -> newest routing version it applied
        self.workers: dict[str, str] = {}          # id -> address
        self.zones: dict[str, str] = {}            # id -> failure domain ("" = none)
        self.code: dict[str, tuple[str, ...]] = {}  # id -> module prefixes it loads code from (master/code.py)
        self.identities: dict[str, str] = {}       # id -> SHA-256 of the secret issued to it
        self.pinned: dict[TabletKey, str] = {}     # operator moves waiting for their target to catch up
        self.holding: dict[TabletKey, str] = {}    # kept on a worker while a merge waits for them there
        self.draining: set[str] = set()            # workers stopping: their primaries move first
        self.heard: set[str] = set()               # workers that reported since this master leads
        self.last_seen: dict[str, float] = {}      # id -> ms of the last heartbeat received
        self.tablets: dict[TabletKey, Ownership] = {}
        self.ranges: dict[str, Ranges] = {}        # computation -> its key ranges (master/ranges.py)
        self.reshards: list[tuple[float, str]] = []  # recent splits and merges (ms, what), for status
        self.rebalancer = Rebalancer(config.policy)
        self.load_medians: dict[TabletKey, int] = {}  # where each tablet's recent load divides evenly
        self.autoscaling: asyncio.Task[None] | None = None  # a policy decision being carried out
        self.version = 0
        self.closed = False
        self.report_time: dict[TabletKey, float] = {}
        self.reported_seq: dict[str, int] = {}
        self.reports: dict[TabletKey, TabletReport] = {}
        self.settler = Settler(config.settle_ms)
        self.injectors: dict[str, tuple[str, int]] = {}  # name -> (stream, min over incarnations)
        # name -> incarnation -> watermark: each live Injector object under a name holds the
        # stream on its own (review W4); "" is a client that sends no incarnation.
        self.injector_incarnations: dict[str, dict[str, int]] = {}
        # name -> its incarnations that report themselves idle (docs/time.md, "Idle sources").
        # Not persisted: a live injector repeats it within 10 s of a new leader.
        self.injector_idle: dict[str, set[str]] = {}
        self.expired_injectors: list[tuple[float, str, str, int]] = []  # recent (ms, name, stream, watermark)
        self.published: dict[str, int] = {}
        # What each computation acts on (master/watermarks.py, inputs): not persisted, it
        # follows from the published values and the injectors, and only ever rises here.
        self.input_published: dict[str, int] = {}
        self.computed: dict[str, Watermark] = {}
        self.counters: dict[str, dict[str, int]] = {}    # computation -> totals
        self._last_counts: dict[TabletKey, tuple[int, tuple[int, ...]]] = {}
        self._dirty_injectors: set[str] = set()
        self._backlog: dict[TabletKey, int] = {}
        self.in_flight: dict[TabletKey, int] = {}   # records queued or running + unacknowledged productions
        # Jobs whose input is paused for a savepoint (master/lifecycle.py; stored in etcd). Their
        # watermarks do not advance and their tablets fire no timers.
        self.paused: dict[str, Pause] = {}
        # tablet -> (the routing version its worker had applied when it took the tablet's last
        # report, the commits its storage held): a savepoint's check that nothing ran
        self.report_marks: dict[TabletKey, tuple[int, int]] = {}
        self._seen: dict[TabletKey, int] = {}
        self.stale_reports = 0
        # worker -> tablet -> (error, attempts, seconds): tablets it is given but cannot run
        self.problems: dict[str, dict[TabletKey, tuple[str, int, float]]] = {}
        self._slow: dict[TabletKey, tuple[float, list[tuple[bytes, float, bool]]]] = {}
        # Liveness counters since this master began leading (docs/operations.md): on a
        # healthy cluster, however busy, only joins move tablets and nothing expires.
        self.liveness = {"registrations": 0, "lease_expiries": 0, "tablet_moves": 0}
        self.etcd_db_bytes = 0
        self.injector_seen: dict[str, float] = {}  # name -> when its last report arrived
        self._etcd_checked = -1e18
        self._gauged_at = -1e18
        self._replan_soon = False  # a worker became eligible for copies: re-plan next tick
        self._defragged = -1e18
        self.upkeep: asyncio.Task[None] | None = None  # etcd's size check and defragment, off the tick
        self._changed = asyncio.Condition()
        self._lock = asyncio.Lock()

    async def _io(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.to_thread(fn, *args)

    async def become_leader(self) -> None:
        """Load everything from etcd; every known worker gets a fresh lease period."""
        snap = await self._io(self.store.load)
        self.topologies = {n: Topology.from_json(doc, stored=True) for n, doc in snap.topologies.items()}
        self.jobs = {n: Job.from_doc(doc) for n, doc in snap.jobs.items()}
        self.dropped = dict(snap.dropped)
        self.workers = dict(snap.workers)
        self.zones = dict(snap.zones)
        self.code = dict(snap.code)
        self.identities = dict(snap.identities)
        now = self.now_ms()
        self.last_seen = {w: now for w in self.workers}
        self.tablets = dict(snap.tablets)
        self.ranges = {s.name: snap.ranges.get(s.name) or Ranges.first(s.key_ranges)
                       for t in self.topologies.values() for s in t.computations.values()}
        self.published = dict(snap.watermarks)
        # A savepoint being taken stays paused (its client renews or ends it here now).
        self.paused = {n: Pause.from_doc(d, now + PAUSE_LIMIT_S * 1000) for n, d in snap.pauses.items()
                       if n in self.topologies}
        self.injectors = dict(snap.injectors)
        self.injector_incarnations = {
            n: dict(snap.injector_incarnations.get(n) or {"": wm}) for n, (_, wm) in snap.injectors.items()}
        self.injector_seen = {n: now for n in self.injectors}  # silent from now, for expiry
        wanted = {k for t in self.topologies.values() for s in t.computations.values()
                  for k in self._keys(s)}
        await self._collect(wanted, set(snap.ranges) | set(snap.watermarks))
        # Tablets a new topology wants that are not written yet (a change interrupted after
        # its topology was, see EtcdStore.apply; or one written before that order): new
        # tablets, placed now.
        if wanted - set(self.tablets):
            log.warning("placing %d tablets a previous leader had not written", len(wanted - set(self.tablets)))
        await self._rebalance("leader", wanted)
        log.info("leading: %d topologies, %d workers, %d tablets",
                 len(self.topologies), len(self.workers), len(self.tablets))

    async def _collect(self, wanted: set[TabletKey], stored: set[str]) -> None:
        """Delete what a lifecycle change interrupted by a failover left behind (review N13):
        tablets no topology wants (a cancelled job's, a removed or reset computation's old
        ranges, a restore that never wrote its topology), and the ranges and watermarks of
        computations no topology has."""
        names = {s.name for t in self.topologies.values() for s in t.computations.values()}
        orphans = sorted(k for k in self.tablets if k not in wanted)
        stray = sorted(c for c in stored if c not in names)
        if not orphans and not stray:
            return
        log.warning("deleting %d tablets and the ranges and watermarks of %d computations that an interrupted "
                    "lifecycle change left behind", len(orphans), len(stray))
        await self._io(self.store.collect, orphans, stray)
        for key in orphans:
            del self.tablets[key]
        for c in stray:
            self.published.pop(c, None)

    # ------------------------------------------------------------ topologies

    async def submit(self, topology_json: str) -> tuple[str, int]:
        topo = Topology.from_json(topology_json)
        check_topology_size(topo.name, topology_json)
        async with self._lock:
            old = self.topologies.get(topo.name)
            state = self.job_state(topo.name)
            if old is not None and state == DRAINED:
                raise TopologyError(f"job {topo.name!r} is drained; cancel it (`millstream cancel {topo.name}`) "
                                    "before submitting it again")
            if old is not None and state != CANCELLED:
                if old.to_json() == topo.to_json():
                    return topo.name, sum(len(self._keys(s)) for s in topo.computations.values())
                raise TopologyError(
                    f"a different topology named {topo.name!r} is already running; change it in place with "
                    "`millstream update MODULE:ATTR`, or submit it under a new name")
            assert old is None, "a cancelled job with its state kept is resumed by master.lifecycle.update"
            existing = [s for t in self.topologies.values() for s in t.computations.values()]
            validate_against(topo.computations.values(), existing)
            check_loadable(topo.computations.values(), self.code, self.workers)
            ranges = {s.name: Ranges.first(s.key_ranges, base=self.dropped.get(s.name, 0))
                      for s in topo.computations.values()}
            self.ranges.update(ranges)
            wanted = {k for s in topo.computations.values() for k in self._keys(s)}
            placed = self._plan(wanted, extra={k: s.replication or self.config.replication
                                               for s in topo.computations.values() for k in self._keys(s)})
            new = {k: v for k, v in placed.items() if self.tablets.get(k) != v}
            # A name used before starts above the range ids its state had (stored: not the first cut).
            # A stream whose injectors all finished (for jobs before this one) is open again for
            # this job: it starts with nothing, not at the end of time.
            finished = self.finished_streams(input_streams(topo))
            await self._io(self.store.apply, Change(
                topologies={topo.name: topo.to_json()}, tablets=new,
                ranges={c: r for c, r in ranges.items() if c in self.dropped},
                jobs={topo.name: None} if topo.name in self.jobs else {}, injectors_gone=finished))
            self.jobs.pop(topo.name, None)
            for n in finished:
                self.injectors.pop(n, None)
                self.injector_incarnations.pop(n, None)
                self.injector_idle.pop(n, None)
                self.settler.forget(("injector", n))
            self.topologies[topo.name] = topo
            self.tablets.update(new)
            await self._bump()
            log.info("submitted topology %s (%d tablets)", topo.name, len(wanted))
            return topo.name, len(wanted)

    def job_state(self, name: str) -> str:
        job = self.jobs.get(name)
        return job.state if job is not None else RUNNING

    def finished_streams(self, streams: list[str]) -> list[str]:
        """The markers of ``streams`` whose injectors all finished, if no running job reads them."""
        read = {i for t in self.live_topologies() for s in t.computations.values() for i in s.inputs}
        return [FINISHED + s for s in streams if FINISHED + s in self.injectors and s not in read]

    def live_topologies(self) -> list[Topology]:
        """The topologies whose computations run (all but those of cancelled jobs that keep
        their state: their tablets are planned and kept, but closed)."""
        return [t for n, t in self.topologies.items() if self.job_state(n) != CANCELLED]

    # --------------------------------------------------------------- workers

    def _live(self) -> list[str]:
        return list(self.workers)

    async def register_worker(self, address: str, worker_id: str = "", zone: str = "",
                              secret: str = "", allowed_code: Sequence[str] = ()) -> tuple[str, str]:
        """A worker joins. ``worker_id`` is the identity its state directory keeps: a worker
        back on its disk is the same worker, and its copies count again. Returns its id and
        its secret: issued on its first registration, to be shown on every later call as that
        id (a worker token alone cannot pose as another worker)."""
        if worker_id and not WORKER_ID.fullmatch(worker_id):
            raise ConfigError(f"worker id {worker_id[:40]!r} is not 12 hex digits; remove the worker.id file "
                              "of its state directory to start it as a new worker")
        if not ZONE.fullmatch(zone):
            raise ConfigError(f"zone {zone[:80]!r} is not a zone name (letters, digits, '_', '.', '-'; "
                              "at most 63)")
        allowed = check_policy(allowed_code)
        worker_id = worker_id or uuid.uuid4().hex[:12]
        async with self._lock:
            issued = None
            if worker_id in self.identities:
                self.authenticate(worker_id, secret)
            else:
                secret = secrets.token_hex(16)
                issued = _digest(secret)
            restarted = worker_id in self.workers
            self.draining.discard(worker_id)
            await self._io(self.store.put_worker, worker_id, address, zone, issued, allowed)
            if issued is not None:
                self.identities[worker_id] = issued
            self.workers[worker_id] = address
            self.zones[worker_id] = zone
            self.code[worker_id] = allowed
            self.heard.add(worker_id)
            self.last_seen[worker_id] = self.now_ms()
            self.liveness["registrations"] += 1
            if restarted:
                # The same disk, a new process: what it was primary of opens again under a new
                # token (fencing anything of the old process). As a follower it stays in the
                # in-sync sets it was in: its copy on disk holds every commit acknowledged
                # without its leaving them (its primaries drop it if it falls behind).
                changed = {}
                for key, own in self.tablets.items():
                    if own.worker == worker_id:
                        changed[key] = Ownership(worker_id, own.token + 1, own.followers, (worker_id,))
                if changed:
                    await self._io(self.store.put_tablets, changed)
                    self.tablets.update(changed)
            await self._rebalance("join")
        log.info("worker %s %s at %s%s", worker_id, "rejoined" if restarted else "joined", address,
                 f" (zone {zone})" if zone else "")
        return worker_id, secret

    def authenticate(self, worker_id: str, secret: str) -> None:
        """Refuse a call as ``worker_id`` without the secret issued to it at registration."""
        want = self.identities.get(worker_id)
        if want is not None and not hmac.compare_digest(_digest(secret), want):
            raise WorkerIdentityError(
                f"worker id {worker_id} was issued another secret: this is not that worker. A worker back "
                "on its own disk sends the worker.secret file kept beside worker.id; if that file is lost, "
                "delete worker.id too to join as a new worker")

    async def drain(self, worker_id: str) -> int:
        """A worker is stopping but still runs: move its primaries away, each to a target that
        catches up first (DESIGN.md §5). Returns how many it still holds that can move (0:
        none left, or no other worker to take them)."""
        async with self._lock:
            if worker_id not in self.workers:
                return 0
            if worker_id not in self.draining:
                log.info("worker %s at %s is draining", worker_id, self.workers[worker_id])
                self.draining.add(worker_id)
                await self._rebalance("drain")
            if not set(self.workers) - self.draining:
                return 0
            return sum(1 for o in self.tablets.values() if o.worker == worker_id)

    async def leave(self, worker_id: str) -> None:
        """A worker left cleanly (its tablets are closed): move what it still had at once."""
        async with self._lock:
            self.draining.discard(worker_id)
            if worker_id not in self.workers:
                return
            log.info("worker %s at %s left; moving its tablets", worker_id, self.workers[worker_id])
            await self._io(self.store.delete_worker, worker_id)
            self._forget_worker(worker_id)
            await self._rebalance("leave")

    def _forget_worker(self, worker_id: str) -> None:
        """Drop what the leader kept of a worker that left or expired (review N17: one entry
        per worker ever, otherwise). Its identity stays: it may come back on its disk."""
        for per_worker in (self.workers, self.problems, self.reported_seq, self.last_seen, self.routing_seen,
                           self.zones, self.code):
            per_worker.pop(worker_id, None)
        self.heard.discard(worker_id)
        self.draining.discard(worker_id)

    def heartbeat(self, worker_id: str, held: Sequence[pb.HeldTablet] = (), report_seq: int = 0,
                  problems: Sequence[pb.TabletProblem] = (), routing_version: int = 0) -> dict[str, int]:
        """Renew a worker's lease and take its tablets' progress; returns the input watermarks."""
        if worker_id not in self.workers:
            raise UnknownWorkerError(f"worker {worker_id} is not registered (its lease expired)")
        self.routing_seen[worker_id] = max(self.routing_seen.get(worker_id, 0), routing_version)
        self.problems[worker_id] = {(p.computation, p.key_range): (p.error, p.attempts, p.seconds)
                                    for p in problems}
        if worker_id not in self.heard:  # the first report since this master leads
            self.heard.add(worker_id)
            self._replan_soon = True
        self.last_seen[worker_id] = self.now_ms()
        self.reported_seq[worker_id] = max(self.reported_seq.get(worker_id, 0), report_seq)
        for h in held:
            key = (h.computation, h.key_range)
            own = self.tablets.get(key)
            if own is None or own.worker != worker_id or own.token != h.token:
                self.stale_reports += 1  # a report under a stale token changes nothing
                continue
            now = self.now_ms()
            if key in self.reports and self.reports[key].token != h.token:
                self.settler.forget(key)
            self.settler.observe(key, h.oldest_work if h.has_work else END_OF_TIME, now)
            self.reports[key] = TabletReport(h.token, h.oldest_work if h.has_work else None)
            self.report_time[key] = now
            self.rebalancer.load.observe(key, h.token, h.processed, now)
            if h.load_median:
                self.load_medians[key] = h.load_median
            counts = (h.processed, h.late, h.dead_lettered)
            last_token, last = self._last_counts.get(key, (h.token, (0, 0, 0)))
            if last_token != h.token:
                last = (0, 0, 0)
            self._last_counts[key] = (h.token, counts)
            totals = self.counters.setdefault(h.computation, {})
            for name, count, before in zip(("processed", "late", "dead_lettered"), counts, last, strict=True):
                totals[name] = totals.get(name, 0) + max(0, count - before)
            self._backlog[key] = h.backlog
            self.in_flight[key] = h.in_flight
            self.report_marks[key] = (routing_version, h.commits)
            self._seen[key] = h.watermark
            if h.slow:
                self._slow[key] = (now, [(c.key, c.seconds, c.running) for c in h.slow])
            else:
                self._slow.pop(key, None)
        # A tablet of this worker that the report leaves out is closed or reopening (after a
        # failed batch, say) and may hold committed work its last report predates: forget
        # that report, so the tablet holds its computation at the published watermark until
        # it reports again (review W1).
        reported = {(h.computation, h.key_range) for h in held}
        for key, own in self.tablets.items():
            if own.worker == worker_id and key not in reported and key in self.reports:
                del self.reports[key]
                self.report_time.pop(key, None)
                self.settler.forget(key)
        return self.input_published

    def reported(self) -> dict[str, int]:
        """The newest progress report held from each known worker (for receipts, see
        HeartbeatResponse.reported). A worker missing here is unknown: its tablets' reports
        count for nothing, so holds waiting on it can go."""
        return {w: self.reported_seq.get(w, 0) for w in self.workers}

    def report_injector(self, name: str, stream: str, watermark: int, incarnation: str = "",
                        release: bool = False, operator: bool = False, idle: bool = False) -> None:
        """An injector's current promise; a new injector holds its stream from now on.

        Several live injectors may share a name (``incarnation`` tells them apart): the
        name holds its stream at the minimum of their watermarks, and one that finishes
        releases only its own hold (review W4). ``release`` (every hold under the name) is
        an operator's action: ``operator`` says the caller holds that role (review N9). An
        ``idle`` incarnation counts only when all of the name's are idle; an idle name holds
        its stream only as :func:`master.watermarks.with_idleness` says."""
        check_injector_name(name)
        if release and not operator:
            raise RoleError(f"releasing injector {name!r} drops every hold under the name, an "
                            "operator's action; call it with the operator token (an injector "
                            "ends its own hold with finish())")
        if not isinstance(stream, str) or not STREAM_NAME.fullmatch(stream):
            raise ConfigError(f"injector {name!r}: stream {stream[:80]!r} is not a stream name (letters, "
                              "digits, '_', '.', '-'; at most 128 characters)")
        closed = closed_streams(self.topologies, self.jobs).get(stream)
        if closed is not None:
            if watermark == END_OF_TIME or release:
                return  # an injector finishing on a closed stream: it holds nothing anyway
            raise MillstreamError(f"injector {name!r}: {closed}")
        if len(incarnation) > MAX_INCARNATION_CHARS or not incarnation.isprintable():
            raise ConfigError(f"injector {name!r}: incarnation {incarnation[:80]!r} is not an id of at most "
                              f"{MAX_INCARNATION_CHARS} printable characters; let the Injector pick it")
        old = self.injectors.get(name)
        if release:
            # An operator gives up on every incarnation of the name (crashed, stale).
            if old is None or old[0] != stream or name.startswith(FINISHED):
                raise MillstreamError(
                    f"no injector {name!r} holds stream {stream!r}; `millstream status` lists the injectors")
            log.warning("injector %s on %s released by an operator at watermark %s", name, stream, old[1])
            self.injector_incarnations[name] = {incarnation: END_OF_TIME}
            self.injector_idle.pop(name, None)
            self.injectors[name] = (stream, END_OF_TIME)
            self.injector_seen[name] = self.now_ms()
            self.settler.forget(("injector", name))
            self._dirty_injectors.add(name)
            return
        incarnations = self.injector_incarnations.setdefault(name, {})
        idlers = self.injector_idle.setdefault(name, set())
        before = dict(incarnations)
        if old is not None and old[0] != stream:
            if old[1] != END_OF_TIME:
                # Else any caller could drop a live name's holds by naming another stream (N9).
                raise MillstreamError(
                    f"injector {name!r} still holds stream {old[0]!r} (at {old[1]}); finish it "
                    f"there, or have an operator release it, before using the name for {stream!r}")
            incarnations.clear()  # the name now feeds another stream: a new registration
            idlers.clear()
        incarnations[incarnation] = watermark
        if idle and watermark != END_OF_TIME:
            idlers.add(incarnation)
        else:
            idlers.discard(incarnation)
        if watermark == END_OF_TIME and len(incarnations) > 1:
            del incarnations[incarnation]  # finished: holds nothing, the others still do
        active = [wm for i, wm in incarnations.items() if i not in idlers]
        self.injectors[name] = (stream, min(active or incarnations.values()))
        self.injector_seen[name] = self.now_ms()
        self.settler.observe(("injector", name), self.injectors[name][1], self.now_ms())
        if self.injectors[name] != old or incarnations != before:
            self._dirty_injectors.add(name)  # (a keep-alive that changes nothing costs no etcd write)

    def idle_injectors(self) -> set[str]:
        """Names all of whose incarnations report themselves idle."""
        return {n for n, idlers in self.injector_idle.items()
                if idlers and n in self.injector_incarnations and idlers >= set(self.injector_incarnations[n])}

    def expire_injectors(self) -> list[str]:
        """Release the names no injector has reported for ``injector_expiry_s`` (review G4):
        a live ``Injector`` reports every 10 s, so the process that held them is gone. Records
        a later injector sends under such a name may be late; the log and the status say so."""
        limit = self.config.injector_expiry_s * 1000
        if limit <= 0:
            return []
        now = self.now_ms()
        gone = [n for n, (_, wm) in self.injectors.items()
                if wm != END_OF_TIME and not n.startswith(FINISHED)
                and now - self.injector_seen.get(n, now) > limit]
        for n in gone:
            stream, wm = self.injectors[n]
            log.warning("injector %s on %s expired: no report for %.0f s (MasterConfig.injector_expiry_s); "
                        "its hold at watermark %s is released, and records sent later under the name may "
                        "be late", n, stream, (now - self.injector_seen[n]) / 1000, wm)
            self.expired_injectors = [*self.expired_injectors[-19:], (now, n, stream, wm)]
            self.report_injector(n, stream, 0, release=True, operator=True)  # the leader's own release
        return gone

    async def advance_watermarks(self) -> None:
        """Recompute every low watermark; persist and publish those that advanced.

        Under the leader's lock: the watermarks are computed for the jobs as they are, then
        written to etcd, then applied; a cancel, update or pause during the write would
        otherwise see its computations' watermarks put back (or advanced while paused)."""
        async with self._lock:
            await self._advance_watermarks()

    async def _advance_watermarks(self) -> None:
        self.expire_injectors()
        specs = [s for t in self.live_topologies() for s in t.computations.values()]
        now = self.now_ms()
        reports = {}
        for key, rep in self.reports.items():
            if now - self.report_time.get(key, now) > self.config.report_timeout_ms:
                continue  # treated as not reported: held at the published value
            settled = self.settler.value(key, now)
            oldest = None if settled is None or settled == END_OF_TIME else settled
            reports[key] = TabletReport(rep.token, oldest)
        injectors = {}
        for name, (stream, wm) in self.injectors.items():
            settled = self.settler.value(("injector", name), now)
            injectors[name] = (stream, wm if settled is None else min(wm, settled))
        injectors = with_idleness(injectors, self.idle_injectors())
        self.computed = compute(specs, self.tablets, reports, injectors, self.published)
        new = publish(self.computed, self.published)
        frozen = {s for n in self.paused for s in self.topologies[n].computations} if self.paused else set()
        changed = {c: v for c, v in new.items() if v != self.published.get(c, MIN) and c not in frozen}
        dirty = {n: self.injectors[n] for n in self._dirty_injectors if n in self.injectors}
        # A finished injector (at the end of time) holds nothing any more. It is replaced by
        # one marker per stream, so the registry does not grow with every injection while the
        # stream still counts as fed (a stream nobody ever fed holds its readers back).
        done = [n for n, (_, wm) in self.injectors.items()
                if wm == END_OF_TIME and not n.startswith(FINISHED)]
        for n in done:
            stream = self.injectors[n][0]
            dirty[FINISHED + stream] = self.injectors[FINISHED + stream] = (stream, END_OF_TIME)
        if changed or dirty or done:
            # Taken now: a report arriving during the awaits below marks its name dirty
            # again and is written by the next tick (review W2).
            self._dirty_injectors.clear()
            written = {n: w for n, w in dirty.items() if n not in done}
            await self._io(self.store.put_progress, changed, written,
                           {n: dict(self.injector_incarnations[n]) for n in written
                            if n in self.injector_incarnations})
            if done:
                await self._io(self.store.delete_injectors, done)
                for n in done:
                    # Only if still finished: a new injector may have registered under the
                    # name meanwhile; it stays, and is written again next tick.
                    if self.injectors.get(n, ("", END_OF_TIME))[1] == END_OF_TIME:
                        self.injectors.pop(n, None)
                        self.injector_incarnations.pop(n, None)
                        self.injector_idle.pop(n, None)
                        self.injector_seen.pop(n, None)
                        self.settler.forget(("injector", n))
                    else:
                        self._dirty_injectors.add(n)
            for c, v in changed.items():
                assert v >= self.published.get(c, MIN), "published watermarks never decrease"
            self.published.update(changed)
        for c, v in inputs(specs, self.published, injectors).items():
            if c not in frozen and v > self.input_published.get(c, MIN) or c not in self.input_published:
                # A paused job's inputs stay where they were; a leader that took over during the
                # pause starts them from what was published, so a worker's first heartbeat
                # answer never leaves them at the start of time (review N20).
                self.input_published[c] = v
        wall = time.time()
        for c, v in new.items():
            metrics.WATERMARK.labels(c).set(v)
            if MIN < v < END_OF_TIME:
                metrics.WATERMARK_LAG.labels(c).set(wall - v / 1e6)
        metrics.WORKERS.set(len(self.workers))

    async def move(self, computation: str, key_range: int, worker: str) -> int:
        """Move one tablet to ``worker`` (an id or an address): at once if it holds an in-sync
        copy, else once it has caught up as a follower (DESIGN.md §5). Returns the token the
        tablet will have there."""
        async with self._lock:
            key = (computation, key_range)
            if key not in self.tablets:
                raise MillstreamError(
                    f"no tablet {computation}/{key_range}; `millstream status` lists the tablets")
            target = worker if worker in self.workers else next(
                (w for w, a in self.workers.items() if a == worker), None)
            if target is None:
                raise MillstreamError(
                    f"no live worker {worker!r}; give a worker id or address from `millstream status`")
            old = self.tablets[key]
            if old.worker == target:
                return old.token
            if not old.worker:
                raise MillstreamError(f"tablet {computation}/{key_range} has no live in-sync copy to move")
            self.pinned[key] = target
            await self._rebalance("move")
            log.info("moving tablet %s/%d to %s (token %d)%s", computation, key_range, target, old.token + 1,
                     "" if self.tablets[key].worker == target else " once it has caught up")
            return old.token + 1

    async def tick(self) -> None:
        """Expire workers whose lease ran out and move their tablets; advance watermarks."""
        await self.advance_watermarks()
        self._start_upkeep()
        self._gauges()
        if self._replan_soon:
            self._replan_soon = False
            async with self._lock:
                await self._rebalance("heard")
        now = self.now_ms()
        dead = [w for w, t in self.last_seen.items() if now - t > self.config.lease_ms]
        if not dead:
            return
        async with self._lock:
            for w in dead:
                log.warning("worker %s at %s missed its lease; moving its tablets",
                            w, self.workers.get(w))
                await self._io(self.store.delete_worker, w)
                self._forget_worker(w)
                self.liveness["lease_expiries"] += 1
                metrics.WORKER_EXPIRIES.inc()
            await self._rebalance("expiry")

    def _start_upkeep(self) -> None:
        """etcd's size check (and its hourly defragment) as a task of its own: a defragment
        takes seconds on a large database, and the leader's loop, which also keeps its etcd
        lease alive, must not wait for it (review N12: it cost leadership and fenced workers)."""
        now = self.now_ms()
        if (self.upkeep is not None and not self.upkeep.done()) or self.closed \
                or now - self._etcd_checked < self.config.etcd_check_s * 1000:
            return
        self._etcd_checked = now
        self.upkeep = asyncio.get_running_loop().create_task(self._etcd_upkeep(now), name="etcd upkeep")

    async def _etcd_upkeep(self, now: float) -> None:
        try:
            size = await self._io(self.store.db_size)
            if size > self.config.defrag_above_bytes and now - self._defragged > 3_600_000:
                log.warning("etcd holds %d MiB: defragmenting it", size >> 20)
                self._defragged = now
                await self._io(self.store.defragment)
                size = await self._io(self.store.db_size)
        except MillstreamError as e:  # etcd unreachable: the leader's own writes will say so
            log.warning("etcd upkeep failed: %s", e)
            return
        except Exception:
            log.exception("etcd upkeep failed")
            return
        self.etcd_db_bytes = size
        metrics.ETCD_DB_BYTES.set(size)

    def replication_factors(self) -> dict[TabletKey, int]:
        """Copies wanted per tablet (its computation's ``replication``, else the master's)."""
        return {k: s.replication or self.config.replication
                for t in self.topologies.values() for s in t.computations.values() for k in self._keys(s)}

    def _keys(self, spec: ComputationSpec) -> list[TabletKey]:
        """The tablets of a computation: one per key range it has now."""
        ranges = self.ranges.get(spec.name)
        return [(spec.name, r) for r in (ranges.ranges if ranges is not None else range(spec.key_ranges))]

    def rebalanced(self) -> dict[str, list[tuple[int, int, int]]]:
        """The ranges ``(id, start, end)`` of every computation the policy looks after."""
        return {s.name: [(r, kr.start, kr.end) for r, kr in self.ranges[s.name].ranges.items()]
                for t in self.live_topologies() for s in t.computations.values()
                if (self.config.rebalance if s.rebalance is None else s.rebalance) and s.name in self.ranges}

    def bounds(self, computation: str, key_range: int) -> KeyRange | None:
        ranges = self.ranges.get(computation)
        return ranges.ranges.get(key_range) if ranges is not None else None

    def _plan(self, more: Any = (), extra: dict[TabletKey, int] | None = None) -> dict[TabletKey, Ownership]:
        for key, target in list(self.pinned.items()):
            own = self.tablets.get(key)
            if own is None or own.worker == target or target not in self.workers:
                del self.pinned[key]  # done, or its target is gone
        return replan([*self.tablets, *more], self.tablets, self._live(),
                      {**self.replication_factors(), **(extra or {})}, self.zones, {**self.holding, **self.pinned},
                      self.draining & set(self.workers), set(self.workers) - self.heard)

    async def _rebalance(self, reason: str, more: Any = ()) -> None:
        """Apply :func:`~master.scheduler.replan`: failovers, moves, followers."""
        placed = self._plan(more)
        changed = {k: v for k, v in placed.items() if self.tablets.get(k) != v}
        if changed:
            await self._io(self.store.put_tablets, changed)
            moved = sum(1 for k, v in changed.items() if k in self.tablets and self.tablets[k].worker != v.worker)
            lost = [k for k, v in changed.items() if not v.worker and v.existed]
            self.tablets.update(changed)
            for key in [k for k, target in self.pinned.items() if k in changed and changed[k].worker == target]:
                del self.pinned[key]  # moved: a merge waiting for it need not wait for another replan
            if moved:
                self._count_moves(moved, reason)
                log.info("moved %d tablets (%s)", moved, reason)
            for c, r in lost:
                log.error("tablet %s/%d has no live in-sync copy: it stays unassigned until one of %s "
                          "comes back (it is never opened empty)", c, r, ", ".join(self.tablets[(c, r)].in_sync))
        await self._bump()

    async def update_in_sync(self, computation: str, key_range: int, token: int, follower: str,
                             add: bool, primary: str = "") -> tuple[str, ...]:
        """A primary adds a caught-up follower to its in-sync set, or removes one that stopped
        acknowledging. Only under the tablet's current token (the fence: a deposed primary
        can change nothing), and written to etcd before the answer."""
        async with self._lock:
            key = (computation, key_range)
            own = self.tablets.get(key)
            if own is None or own.token != token or (primary and own.worker != primary):
                raise StaleTokenError(
                    f"tablet {computation}/{key_range}: token {token} is not current "
                    f"({own.token if own else 'no such tablet'}); this primary is stale")
            if add and follower not in own.followers:
                raise MillstreamError(f"worker {follower} is not a follower of {computation}/{key_range}")
            if add == (follower in own.in_sync):
                return own.in_sync
            in_sync = (*own.in_sync, follower) if add else tuple(w for w in own.in_sync if w != follower)
            new = Ownership(own.worker, own.token, own.followers, in_sync)
            await self._io(self.store.put_tablets, {key: new})
            self.tablets[key] = new
            log.log(logging.INFO if add else logging.WARNING, "tablet %s/%d: follower %s %s the in-sync set",
                    computation, key_range, follower, "joins" if add else "leaves")
            if add:  # a move may wait for this follower to catch up: promote it now
                await self._rebalance("move" if key in self.pinned else "balance")
            else:
                await self._bump()
            return self.tablets[key].in_sync

    def _gauges(self) -> None:
        now = self.now_ms()
        if now - self._gauged_at >= 1000:  # a pass over every tablet: once a second
            self._gauged_at = now
            self.replication_counts()

    def replication_counts(self) -> tuple[int, int]:
        """Tablets under-replicated and unavailable now (also set as the leader's gauges)."""
        factors = self.replication_factors()
        health = [replication_health(o, factors.get(k, 1)) for k, o in self.tablets.items()]
        under, unavailable = health.count("under-replicated"), health.count("unavailable")
        metrics.UNDER_REPLICATED.set(under)
        metrics.UNAVAILABLE.set(unavailable)
        return under, unavailable

    def _count_moves(self, n: int, reason: str) -> None:
        self.liveness["tablet_moves"] += n
        metrics.TABLET_MOVES.labels(reason).inc(n)

    # --------------------------------------------------------------- routing

    async def _bump(self, above: int = 0) -> None:
        """A new routing version (above ``above`` too: a version a worker reported)."""
        async with self._changed:
            self.version = max(self.version + 1, above + 1, int(self.now_ms() * 1000))
            self._changed.notify_all()

    def routing(self) -> pb.Routing:
        out = pb.Routing(version=self.version, closed_streams=closed_streams(self.topologies, self.jobs))
        for name, below in sorted(self.dropped.items()):
            out.dropped.add(computation=name, below=below)
        for topo in self.live_topologies():
            for s in topo.computations.values():
                c = out.computations.add(
                    name=s.name, topology=topo.name, code=s.code, outputs=s.outputs,
                    key_ranges=s.key_ranges, exactly_once=s.exactly_once,
                    productions=s.productions, late_records=s.late_records,
                    job_state=self.job_state(topo.name), input_paused=topo.name in self.paused,
                )
                # Only the runtime writes its own options (a user's are refused at submit).
                c.params.update({k: v for k, v in s.params.items() if not k.startswith(RESERVED_PARAM_PREFIX)})
                if s.fsync is not None:
                    c.params["millstream.fsync"] = "1" if s.fsync else "0"
                if s.dedup_retention is not None:
                    c.params["millstream.dedup_retention"] = repr(float(s.dedup_retention))
                c.params["millstream.replication"] = str(s.replication or self.config.replication)
                for stream, ex in s.inputs.items():
                    c.inputs.add(stream=stream, key_extractor=ex or "")
                for r, kr in sorted(self.ranges[s.name].ranges.items()):
                    own = self.tablets.get((s.name, r), Ownership("", 0))
                    a = c.assignments.add(key_range=r, worker_id=own.worker,
                                          address=self.workers.get(own.worker, ""), token=own.token,
                                          in_sync=own.in_sync, start=kr.start, end=wire_end(kr.end),
                                          parents=kr.parents, cut=kr.cut % (1 << 64))
                    for f in own.followers:
                        a.followers.add(worker_id=f, address=self.workers.get(f, ""))
        return out

    async def watch(self, known_version: int) -> AsyncIterator[pb.Routing]:
        """Routing now (if newer than ``known_version``) and after every change, until shutdown."""
        while True:
            async with self._changed:
                await self._changed.wait_for(functools.partial(self._moved_since, known_version))
            if self.closed:
                return  # no longer leading: watchers reconnect and find the new leader
            known_version = self.version
            yield self.routing()

    async def changed(self, timeout: float) -> None:
        """Wait for the next routing change, at most ``timeout`` seconds."""
        version = self.version
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(functools.partial(self._moved_since, version)),
                                       timeout)
            except TimeoutError:
                pass

    def _moved_since(self, version: int) -> bool:
        return self.version != version or self.closed

    def shutdown(self) -> None:
        """Leadership is lost: end every routing watch (their workers look for the leader)."""
        self.closed = True
        if self.upkeep is not None:
            self.upkeep.cancel()  # its etcd call in a thread runs out; nothing waits for it

        async def wake() -> None:
            async with self._changed:
                self._changed.notify_all()

        asyncio.get_running_loop().create_task(wake())


def forget_tablet(core: MasterCore, key: TabletKey) -> None:
    """Drop what the leader kept of a tablet that no longer exists (split, merged, removed)."""
    core.tablets.pop(key, None)
    core.reports.pop(key, None)
    core.report_time.pop(key, None)
    core._backlog.pop(key, None)
    core._seen.pop(key, None)
    core._slow.pop(key, None)
    core._last_counts.pop(key, None)
    core.in_flight.pop(key, None)
    core.report_marks.pop(key, None)
    core.load_medians.pop(key, None)
    core.settler.forget(key)
    for problems in core.problems.values():
        problems.pop(key, None)


MAX_POLICY_ENTRIES = 256


def check_policy(allowed: Sequence[str]) -> tuple[str, ...]:
    """A worker's code policy as it reports it: module prefixes (or "*"), bounded."""
    if len(allowed) > MAX_POLICY_ENTRIES or not all(
            p == "*" or MODULE_PREFIX.fullmatch(p) for p in allowed):
        raise ConfigError(f"the worker's --allow-code ({', '.join(list(allowed)[:5])[:200]}) is not a list of at "
                          f"most {MAX_POLICY_ENTRIES} module prefixes; give dotted module names such as my_jobs")
    return tuple(allowed)


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()
