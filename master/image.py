"""The leader's image of the cluster: every fact it decides from, typed, in one place.

- **Durable facts** (what etcd keeps: topologies, jobs and savepoint pauses, key ranges,
  tablets with their primary, followers, in-sync set and token, workers, injector promises,
  finished streams, published watermarks) change only through :meth:`ClusterImage.apply` of a
  :class:`~master.change.Change`, once it is written to etcd (``MasterCore.commit``). A new
  leader builds its image the same way, from everything etcd holds as one change.
- **What the leader hears** (heartbeats and the tablets' progress reports, injector reports)
  lands on the entries through their intake methods (:meth:`ClusterImage.heartbeat`,
  :meth:`InjectorEntry.report`). It is not stored, except the injectors' promises: those are
  marked ``dirty`` and written by the next tick, with the watermarks they allow.

Routing and the status document are pure views of the image (master/views.py). Other modules
read the image and change it only through these methods: none assigns to its fields. The
model is Kafka KRaft's ``MetadataImage`` (changed by applying a ``MetadataDelta``) and etcd's
single applier.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from master.change import Change, InjectorPromise, WorkerInfo
from master.jobs import CANCELLED, RUNNING, Job, Pause
from master.ranges import KeyRange, Ranges
from master.rebalance import LoadMeter
from master.scheduler import Ownership, TabletKey, replication_health
from master.watermarks import Settler, TabletReport, Watermark
from runtime.errors import MillstreamError
from runtime.record import END_OF_TIME, MIN_TIME
from runtime.topology import ComputationSpec, Topology
from runtime.wire import millstream_pb2 as pb

V = TypeVar("V")


class UnknownWorkerError(MillstreamError):
    """A heartbeat from a worker whose lease has already expired."""


@dataclass(frozen=True, slots=True)
class Problem:
    """A tablet its worker is given but cannot run: why, how often it tried, since when (s)."""

    error: str
    attempts: int
    seconds: float


@dataclass
class WorkerEntry:
    """A live worker: what etcd keeps of it, and what the leader heard from it."""

    address: str
    zone: str = ""                 # failure domain ("" = none)
    code: tuple[str, ...] = ()     # module prefixes it loads code from (master/code.py)
    last_seen: float = 0.0         # the leader's clock (ms) at its last heartbeat or registration
    heard: bool = False            # it reported to this leader (a new leader trusts no one yet)
    draining: bool = False         # stopping: its primaries move first
    routing_seen: int = 0          # the newest routing version it applied
    reported_seq: int = 0          # the newest progress report the leader holds from it
    problems: dict[TabletKey, Problem] = field(default_factory=dict)

    def joined(self, now: float) -> None:
        """It registered (again): heard from now, and not stopping."""
        self.heard, self.draining, self.last_seen = True, False, now

    def drain(self) -> None:
        """It is stopping: its primaries move first, and it takes nothing new."""
        self.draining = True


@dataclass
class TabletEntry:
    """A tablet: its ownership (durable) and its latest progress report (heard)."""

    own: Ownership
    report: TabletReport | None = None   # the latest report; None: none since it was forgotten
    report_time: float = 0.0
    counted: tuple[int, tuple[int, int, int]] | None = None  # token, (processed, late, dead) reported
    backlog: int = 0                     # records queued, not yet committed
    in_flight: int = 0                   # records queued or running + unacknowledged productions
    # The routing version its worker had applied when it took the report, and the commits its
    # storage held: a savepoint's check that nothing ran (master/savepoints.py).
    mark: tuple[int, int] = (0, 0)
    seen: int = MIN_TIME                 # the low watermark it acts on
    slow: tuple[float, list[tuple[bytes, float, bool]]] | None = None  # (when, [(key, s, running)])
    load_median: int = 0                 # where its recent load divides evenly (0: not known)

    def observe(self, h: pb.HeldTablet, routing_version: int, now: float) -> tuple[int, int, int]:
        """Take a report made under the current token; returns how much its counters grew."""
        self.report = TabletReport(h.token, h.oldest_work if h.has_work else None)
        self.report_time = now
        counts = (h.processed, h.late, h.dead_lettered)
        before = self.counted[1] if self.counted is not None and self.counted[0] == h.token else (0, 0, 0)
        self.counted = (h.token, counts)
        self.backlog, self.in_flight, self.seen = h.backlog, h.in_flight, h.watermark
        self.mark = (routing_version, h.commits)
        if h.load_median:
            self.load_median = h.load_median
        self.slow = (now, [(c.key, c.seconds, c.running) for c in h.slow]) if h.slow else None
        return (max(0, counts[0] - before[0]), max(0, counts[1] - before[1]), max(0, counts[2] - before[2]))


@dataclass
class InjectorEntry:
    """An injector name: its stream, the promise of each live incarnation under the name, and
    the promise runs under it left when they retired (``floor``). The name holds its stream at
    the lowest promise of its active (not idle) incarnations; with none live, at the floor."""

    stream: str
    watermark: int
    incarnations: dict[str, int] = field(default_factory=dict)
    idle: set[str] = field(default_factory=set)   # incarnations that say they are idle (not stored)
    floor: int | None = None                      # the highest retired promise (stored)
    seen: float | None = None                     # the leader's clock at its last report
    dirty: bool = False                           # changed since it was written to etcd

    @property
    def finished(self) -> bool:
        """Every incarnation finished (or an operator released the name): it holds nothing."""
        return self.watermark == END_OF_TIME

    @property
    def all_idle(self) -> bool:
        return bool(self.idle) and self.idle >= set(self.incarnations)

    @property
    def waiting(self) -> bool:
        """No run is live, one retired: the name holds its stream at the floor until a next run
        reports (it is silent by design: never stale, never expired)."""
        return not self.incarnations and self.floor is not None

    def promise(self) -> InjectorPromise:
        return InjectorPromise(self.stream, self.watermark, dict(self.incarnations), self.floor)

    def report(self, incarnation: str, watermark: int, idle: bool, now: float, retired: bool = False) -> None:
        """One incarnation's promise (docs/time.md): a finished one (at the end of time) holds
        nothing while others live (nor once another registers), and ends the floor (the input
        is over for good); an idle one counts only while all are idle. A ``retired`` one
        (``Injector.retire``: its run is over, its promise final) leaves the live ones and
        raises the floor to its promise: the floor holds the stream while no run is live, and
        never moves back (an empty run retiring below it changes nothing)."""
        self.seen = now
        before = (self.watermark, dict(self.incarnations), self.floor)
        if watermark != END_OF_TIME:  # (a name left at the end of time before the tick deleted it)
            for done in [i for i, wm in self.incarnations.items() if wm == END_OF_TIME and i != incarnation]:
                del self.incarnations[done]
        if retired and watermark != END_OF_TIME:
            self.incarnations.pop(incarnation, None)
            self.idle.discard(incarnation)
            self.floor = watermark if self.floor is None else max(self.floor, watermark)
        else:
            self.incarnations[incarnation] = watermark
            if idle and watermark != END_OF_TIME:
                self.idle.add(incarnation)
            else:
                self.idle.discard(incarnation)
            if watermark == END_OF_TIME:
                self.floor = None
                if len(self.incarnations) > 1:
                    del self.incarnations[incarnation]
        self._settle()
        if (self.watermark, self.incarnations, self.floor) != before:
            self.dirty = True  # (a keep-alive that changes nothing costs no etcd write)

    def _settle(self) -> None:
        if self.incarnations:
            active = [wm for i, wm in self.incarnations.items() if i not in self.idle]
            self.watermark = min(active or self.incarnations.values())
        elif self.floor is not None:  # every run is over: the highest promise stands until the next run
            self.watermark = self.floor

    def expire_live(self, now: float) -> None:
        """The live incarnations went silent past the expiry: they are gone, and the floor
        stands again (the name waits for a next run)."""
        self.incarnations, self.idle = {}, set()
        self._settle()
        self.seen, self.dirty = now, True

    def release(self, now: float) -> None:
        """Every hold under the name ends (an operator's release, a drain, an expiry)."""
        self.incarnations, self.idle, self.floor, self.watermark = {"": END_OF_TIME}, set(), None, END_OF_TIME
        self.seen, self.dirty = now, True

    def reset(self, stream: str) -> None:
        """The name, finished on its stream, is taken for another stream: a new registration."""
        self.stream, self.incarnations, self.idle, self.floor = stream, {}, set(), None


class ClusterImage:
    """The cluster as the leader sees it (see the module doc)."""

    def __init__(self, replication: int = 2, rebalance: bool = False, settle_ms: float = 0.0,
                 load_window_s: float = 5.0) -> None:
        self.replication = replication  # copies of a tablet unless its computation says (--replication)
        self.rebalance = rebalance      # the policy looks after computations that do not say (--rebalance)
        # Durable: changed by apply() only.
        self.topologies: dict[str, Topology] = {}  # those of cancelled jobs too, while their state is kept
        self.jobs: dict[str, Job] = {}             # jobs not running (master/jobs.py); absent: running
        self.pauses: dict[str, Pause] = {}         # jobs whose input a savepoint pauses
        self.ranges: dict[str, Ranges] = {}        # computation -> its key ranges
        self.dropped: dict[str, int] = {}          # computation -> range ids below this were deleted
        self.tablets: dict[TabletKey, TabletEntry] = {}
        self.workers: dict[str, WorkerEntry] = {}
        self.identities: dict[str, str] = {}       # worker id -> SHA-256 of its secret (kept when it leaves)
        self.injectors: dict[str, InjectorEntry] = {}
        self.finished_streams: set[str] = set()    # every injector of these finished
        self.published: dict[str, int] = {}        # published low watermarks (never decrease)
        # Heard and derived: changed by the intake methods and the tick.
        self.inputs: dict[str, int] = {}           # each computation's input watermark (only rises)
        self.computed: dict[str, Watermark] = {}   # the last computed watermarks and their holders
        self.counters: dict[str, dict[str, int]] = {}  # computation -> totals since this leader leads
        self.pinned: dict[TabletKey, str] = {}     # operator moves waiting for their target to catch up
        self.holding: dict[TabletKey, str] = {}    # kept on a worker while a merge waits for them there
        self.settler = Settler(settle_ms)
        self.load = LoadMeter(load_window_s)       # records/s per tablet (master/rebalance.py)
        self.version = 0                           # the routing version
        self.stale_reports = 0
        # Since this master leads (docs/operations.md): on a healthy cluster only joins move tablets.
        self.liveness = {"registrations": 0, "lease_expiries": 0, "tablet_moves": 0}
        self.reshards: list[tuple[float, str]] = []  # recent splits and merges (ms, what)
        self.expired: list[tuple[float, str, str, int]] = []  # recent (ms, injector, stream, watermark)
        self.etcd_db_bytes = 0

    # ------------------------------------------------------------------ applying changes

    def apply(self, change: Change, now: float) -> None:
        """Make ``change`` (written to etcd) the image's; ``now``: the leader's clock (ms)."""
        for name, topo in change.topologies.items():
            _put(self.topologies, name, topo)
        for name, job in change.jobs.items():
            _put(self.jobs, name, job)
        for name, pause in change.pauses.items():
            _put(self.pauses, name, pause)
        self.dropped.update(change.dropped)
        for c, r in change.ranges.items():
            _put(self.ranges, c, r)
        for t in change.topologies.values():  # ranges never split or merged: the first cut
            for s in (t.computations.values() if t is not None else ()):
                self.ranges.setdefault(s.name, Ranges.first(s.key_ranges))
        for key in change.gone:
            self._forget_tablet(key)
        for key, own in change.tablets.items():
            entry = self.tablets.get(key)
            if entry is None:
                self.tablets[key] = TabletEntry(own)
            else:
                if own.worker != entry.own.worker and entry.report is not None:
                    # It predates its old owner's last commits (a leaving worker stops reporting first);
                    # under the same token (unassigned) it counted until it timed out (watermarks review 4).
                    entry.report = None
                    self.settler.forget(key)
                entry.own = own
        for c in change.watermarks_gone:
            for per_computation in (self.published, self.inputs, self.computed, self.counters):
                per_computation.pop(c, None)
        self.published.update(change.watermarks)
        for w, info in change.workers.items():
            self._put_worker(w, info, now)
        self.identities.update(change.identities)
        for name, p in change.injectors.items():
            inj = self.injectors.get(name)
            if inj is None:  # a new leader's image
                self.injectors[name] = InjectorEntry(p.stream, p.watermark, dict(p.incarnations),
                                                     floor=p.floor, seen=now)
            elif inj.promise() == p:
                inj.dirty = False  # written as it is (a report meanwhile keeps it dirty)
        for name in change.injectors_gone:
            inj = self.injectors.get(name)
            if inj is not None and inj.finished:
                del self.injectors[name]
                self.settler.forget(("injector", name))
            elif inj is not None:
                inj.dirty = True  # registered again meanwhile: it stays, written again next tick
        for stream, done in change.finished_streams.items():
            if done:
                self.finished_streams.add(stream)
            else:
                self.finished_streams.discard(stream)

    def _put_worker(self, w: str, info: WorkerInfo | None, now: float) -> None:
        if info is None:  # left or expired; its identity stays: it may come back on its disk
            self.workers.pop(w, None)
            return
        entry = self.workers.get(w)
        if entry is None:
            self.workers[w] = WorkerEntry(info.address, info.zone, info.code, last_seen=now)
        else:
            entry.address, entry.zone, entry.code = info.address, info.zone, info.code

    def _forget_tablet(self, key: TabletKey) -> None:
        """Drop everything kept of a tablet that no longer exists (split, merged, removed)."""
        self.tablets.pop(key, None)
        self.settler.forget(key)
        self.load.forget(key)
        for w in self.workers.values():
            w.problems.pop(key, None)

    # ------------------------------------------------------------------ intake

    def heartbeat(self, worker_id: str, held: Sequence[pb.HeldTablet], report_seq: int,
                  problems: Sequence[pb.TabletProblem], routing_version: int, now: float) -> bool:
        """A worker's heartbeat with its tablets' progress; returns whether it is the first this
        leader heard from it. Raises :class:`UnknownWorkerError` for a worker it does not know."""
        w = self.workers.get(worker_id)
        if w is None:
            raise UnknownWorkerError(f"worker {worker_id} is not registered (its lease expired)")
        w.routing_seen = max(w.routing_seen, routing_version)
        first, w.heard, w.last_seen = not w.heard, True, now
        if 0 < report_seq < w.reported_seq:  # an older heartbeat served late: its reports are stale
            self.stale_reports += len(held)
            return first
        w.problems = {(p.computation, p.key_range): Problem(p.error, p.attempts, p.seconds) for p in problems}
        w.reported_seq = max(w.reported_seq, report_seq)
        for h in held:
            key = (h.computation, h.key_range)
            t = self.tablets.get(key)
            if t is None or t.own.worker != worker_id or t.own.token != h.token:
                self.stale_reports += 1  # a report under a stale token changes nothing
                continue
            if t.report is not None and t.report.token != h.token:
                self.settler.forget(key)
            self.settler.observe(key, h.oldest_work if h.has_work else END_OF_TIME, now)
            grown = t.observe(h, routing_version, now)
            self.load.observe(key, h.token, h.processed, now)
            totals = self.counters.setdefault(h.computation, {})
            for name, n in zip(("processed", "late", "dead_lettered"), grown, strict=True):
                totals[name] = totals.get(name, 0) + n
        # A tablet of this worker that the report leaves out is closed or reopening (after a
        # failed batch, say) and may hold committed work its last report predates: forget
        # that report, so the tablet holds its computation at the published watermark until
        # it reports again (review W1).
        reported = {(h.computation, h.key_range) for h in held}
        for key, t in self.tablets.items():
            if t.own.worker == worker_id and key not in reported and t.report is not None:
                t.report = None
                self.settler.forget(key)
        return first

    def advanced(self, computed: dict[str, Watermark], inputs: dict[str, int], frozen: set[str]) -> None:
        """The tick's watermarks: those computed (with what holds each), and the input watermarks,
        which only rise; a paused job's (``frozen``) stay where they are, but a leader that took
        over during the pause starts them from what was published (review N20)."""
        self.computed = computed
        for c, v in inputs.items():
            if c not in self.inputs or (c not in frozen and v > self.inputs[c]):
                self.inputs[c] = v

    def bump(self, now_ms: float, above: int = 0) -> int:
        """A new routing version (above ``above`` too: a version a worker reported)."""
        self.version = max(self.version + 1, above + 1, int(now_ms * 1000))
        return self.version

    def pin(self, key: TabletKey, worker: str) -> None:
        """Move ``key`` to ``worker`` (once it has caught up there)."""
        self.pinned[key] = worker

    def unpin(self, key: TabletKey) -> None:
        """Forget a move that is no longer wanted."""
        self.pinned.pop(key, None)

    def hold(self, keys: Iterable[TabletKey], worker: str | None) -> None:
        """Keep ``keys`` on ``worker`` while a merge waits for them there (None: let go)."""
        for key in keys:
            if worker is None:
                self.holding.pop(key, None)
            else:
                self.holding[key] = worker

    def unpin_done(self) -> None:
        """Forget the moves that are done, or whose target is gone."""
        for key, target in list(self.pinned.items()):
            t = self.tablets.get(key)
            if t is None or t.own.worker == target or target not in self.workers:
                del self.pinned[key]

    def renew_pause(self, name: str, until: float) -> None:
        """A savepoint's client is still copying: its pause holds until ``until`` (not stored)."""
        self.pauses[name] = dataclasses.replace(self.pauses[name], until=until)

    def note_drain_version(self, name: str, version: int) -> None:
        """A draining job waits for every live worker to apply routing ``version`` (not stored:
        a new leader waits for its own routing)."""
        self.jobs[name] = dataclasses.replace(self.jobs[name], version=version)

    def count(self, what: str, n: int = 1) -> None:
        """One more of ``what`` in :attr:`liveness` (registrations, lease expiries, tablet moves)."""
        self.liveness[what] += n

    def note_reshard(self, now: float, what: str) -> None:
        self.reshards = [*self.reshards[-19:], (now, what)]

    def note_etcd_size(self, size: int) -> None:
        self.etcd_db_bytes = size

    def add_injector(self, name: str, stream: str, watermark: int) -> InjectorEntry:
        """A name reported for the first time (written to etcd by the next tick)."""
        inj = self.injectors[name] = InjectorEntry(stream, watermark, dirty=True)
        return inj

    def note_expired(self, now: float, name: str, stream: str, watermark: int) -> None:
        self.expired = [*self.expired[-19:], (now, name, stream, watermark)]

    # ------------------------------------------------------------------ reading

    def job(self, name: str) -> tuple[Topology | None, Job | None]:
        """The topology and lifecycle entry of job ``name``; :class:`MillstreamError` if none."""
        topo, job = self.topologies.get(name), self.jobs.get(name)
        if topo is None and job is None:
            known = ", ".join(sorted(set(self.topologies) | set(self.jobs))) or "none"
            raise MillstreamError(f"no job named {name!r} (jobs: {known}); `millstream jobs` lists them")
        return topo, job

    def job_state(self, name: str) -> str:
        job = self.jobs.get(name)
        return job.state if job is not None else RUNNING

    def live_topologies(self) -> list[Topology]:
        """The topologies whose computations run (all but those of cancelled jobs that keep
        their state: their tablets are planned and kept, but closed)."""
        return [t for n, t in self.topologies.items() if self.job_state(n) != CANCELLED]

    def live_computations(self) -> set[str]:
        """The computations whose tablets run: of every job but those cancelled with their state kept."""
        return {s.name for s in self.specs(live=True)}

    def specs(self, live: bool = False) -> list[ComputationSpec]:
        """Every computation (``live``: of running, draining or drained jobs only)."""
        topologies = self.live_topologies() if live else list(self.topologies.values())
        return [s for t in topologies for s in t.computations.values()]

    def keys(self, spec: ComputationSpec) -> list[TabletKey]:
        """The tablets of a computation: one per key range it has now."""
        ranges = self.ranges.get(spec.name)
        return [(spec.name, r) for r in (ranges.ranges if ranges is not None else range(spec.key_ranges))]

    def wanted(self) -> set[TabletKey]:
        """The tablets every topology wants."""
        return {k for s in self.specs() for k in self.keys(s)}

    def bounds(self, computation: str, key_range: int) -> KeyRange | None:
        ranges = self.ranges.get(computation)
        return ranges.ranges.get(key_range) if ranges is not None else None

    def owners(self) -> dict[TabletKey, Ownership]:
        return {k: t.own for k, t in self.tablets.items()}

    def replication_factors(self) -> dict[TabletKey, int]:
        """Copies wanted per tablet (its computation's ``replication``, else the master's)."""
        return {k: s.replication or self.replication for s in self.specs() for k in self.keys(s)}

    def health_counts(self) -> tuple[int, int]:
        """Tablets under-replicated, and unavailable (no live in-sync copy), now."""
        factors = self.replication_factors()
        health = [replication_health(t.own, factors.get(k, 1), self.workers) for k, t in self.tablets.items()]
        return health.count("under-replicated"), health.count("unavailable")

    def rebalanced(self) -> dict[str, list[tuple[int, int, int]]]:
        """The ranges ``(id, start, end)`` of every computation the policy looks after (not
        while a savepoint of its job is taken: its tablets must stay where they are, and a
        paused job's idle ranges are not cold)."""
        paused = self.paused_computations()
        return {s.name: [(r, kr.start, kr.end) for r, kr in self.ranges[s.name].ranges.items()]
                for s in self.specs(live=True)
                if (self.rebalance if s.rebalance is None else s.rebalance) and s.name in self.ranges
                and s.name not in paused}

    def eligible_workers(self) -> list[str]:
        """Live workers this leader heard from that are not stopping: they may take tablets."""
        return [w for w, e in self.workers.items() if e.heard and not e.draining]

    def reported(self) -> dict[str, int]:
        """The newest progress report held from each known worker (for receipts, see
        HeartbeatResponse.reported). A worker missing here is unknown: its tablets' reports
        count for nothing, so holds waiting on it can go."""
        return {w: e.reported_seq for w, e in self.workers.items()}

    def finished_markers(self, streams: Iterable[str]) -> list[str]:
        """Those of ``streams`` marked finished that no running job reads (a new job reading one
        opens it again: it starts with nothing, not at the end of time)."""
        read = {i for s in self.specs(live=True) for i in s.inputs}
        return [s for s in streams if s in self.finished_streams and s not in read]

    def idle_injectors(self) -> set[str]:
        """Names all of whose incarnations report themselves idle."""
        return {n for n, inj in self.injectors.items() if inj.all_idle}

    def paused_computations(self) -> set[str]:
        return {c for n in self.pauses if n in self.topologies for c in self.topologies[n].computations}


def _put(mapping: dict[str, V], key: str, value: V | None) -> None:
    if value is None:
        mapping.pop(key, None)
    else:
        mapping[key] = value
