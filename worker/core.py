"""The worker's core: the tablets it hosts, fencing, routing, its lease. No gRPC here."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from runtime import metrics
from runtime.columns import Columns
from runtime.delivery import Orders, Receipt
from runtime.errors import NotOwnerError, StaleTokenError
from runtime.faults import Faults
from runtime.flows.stage import readable_spec, state_names
from runtime.imports import CodePolicy
from runtime.keyspace import from_wire_end
from runtime.record import MIN_TIME, Record
from runtime.routing import KeyExtractor, RoutingTable
from runtime.state import read_as_json
from runtime.wire import millstream_pb2 as pb
from worker.openings import OpenFailures
from worker.replica import Replicas
from worker.replication import ReplicaChannel, Replicator
from worker.reshard import Origin, Parent
from worker.seen import SeenTablets
from worker.sender import Sender
from worker.storage import Shipment
from worker.tablet import BUSY, NOT_OWNER, Tablet

log = logging.getLogger(__name__)
WATERMARK_MIN = MIN_TIME
RemoteDeliver = Callable[[str, str, int, int, Columns, Orders | None], Awaitable[tuple[int, Receipt | None]]]


@dataclass(frozen=True)
class WorkerLimits:
    """Bounds of the record path (backpressure and retries)."""

    max_queued_records: int = 20_000
    max_queued_bytes: int = 256 << 20  # also BUSY past this much queued input (S8)
    max_worker_queued_bytes: int = 1 << 30  # ... or past this much in all the worker's tablets together
    max_worker_waiting_bytes: int = 256 << 20  # deliveries waiting for room, all senders: BUSY at once past it
    max_unacked: int = 100_000
    max_batch_records: int = 2_000
    # ... for a flow's stage, whose operators work per batch (one state write per key and
    # window): W2 on a flow 1.17x at 8,000. A classic computation's per-key state gains
    # nothing from larger batches, and its watermark lags: W2's classic one 2.2x slower.
    flow_batch_records: int = 8_000
    batch_budget_ms: int = 100  # a batch stops taking records and timers once user code used this
    max_attempts: int = 3
    lease_safety: float = 0.8  # fraction of the lease a worker trusts before self-fencing
    progress_ms: int = 50      # heartbeat (and watermark report) interval
    weak_ack_ms: int = 20      # how long a batch waits for weak productions' acks before checkpointing
    slow_call_s: float = 1.0   # a call of user code longer than this is logged and counted
    reconcile_wait_s: float = 2.0  # how long one reconcile waits for tablets to open or close
    producer_expiry_s: float = 7 * 86400  # a producer silent this long loses its dedup mark
    replica_timeout_ms: int = 1000  # an in-sync follower silent this long leaves the in-sync set
    drain_timeout_s: float = 8.0    # a stopping worker waits this long for its primaries to move


OPENING_WAIT_S = 0.5  # a delivery waits this long for its tablet to finish opening, then BUSY


class WorkerCore:
    """Hosts tablets for one worker identity and fences them by lease and token."""

    def __init__(self, state_dir: str, address: str, remote_deliver: RemoteDeliver,
                 limits: WorkerLimits = WorkerLimits(),
                 now_ms: Callable[[], float] = lambda: time.monotonic() * 1000,
                 wall_us: Callable[[], int] = lambda: time.time_ns() // 1000,
                 code_policy: CodePolicy = CodePolicy(("*",)),
                 channel: ReplicaChannel | None = None, faults: Faults = Faults(None),
                 await_watermarks: bool = False) -> None:
        self.wall_us = wall_us
        self.code_policy = code_policy  # which modules user code may come from
        self._extractor_errors: set[str] = set()  # the wall clock of WALL_TIME timers and ctx.now()
        self.state_dir = state_dir
        self.address = address
        self.limits = limits
        self.now_ms = now_ms
        self.worker_id = ""
        self.secret = ""  # what the leader issued this worker id (shown on calls as this worker)
        self.lease_deadline = 0.0
        self._fenced = False
        self.routing = RoutingTable(pb.Routing())
        self.tablets: dict[tuple[str, int], Tablet] = {}
        self._added: dict[tuple[str, int], tuple[int, set[str]]] = {}  # (worker/replication.py Replicator.added)
        self.watermarks: dict[str, int] = {}
        # Until the leader's first answer sets them, every input watermark here reads as MIN:
        # nothing would be late, a fired window would open again, expired state would read
        # as live (review N20). A worker of a cluster (``await_watermarks``) runs no batch
        # before then; its tablets open and queue deliveries meanwhile.
        self.watermarks_known = not await_watermarks
        self.waiting_bytes = 0  # deliveries waiting for room in full tablets (max_worker_waiting_bytes)
        self._dropped_seen: dict[str, int] = {}  # the routing's "dropped" ids as last applied
        # Progress reports are numbered from this process's start time (µs), so a restarted
        # worker's first report is newer than any receipt its previous process handed out: a
        # sender holding one is released by it, not after as many reports as the old process
        # had sent (minutes of a held watermark; the chaos suite found it).
        self.report_seq = max(1, wall_us())
        self._extractors: dict[str, KeyExtractor] = {}
        self._remote = remote_deliver
        self._routing_cond = asyncio.Condition()
        self._reconcile_lock = asyncio.Lock()
        # Tablets still opening, and tablets still closing (a batch in flight, perhaps one whose
        # user code never returns): reconcile waits for them only so long, then goes on.
        self._opening: dict[tuple[str, int], tuple[Tablet, asyncio.Task[None]]] = {}
        self._closing: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._batch_limits: dict[tuple[str, int], int] = {}  # smaller batches after a failure
        self._batch_failures: dict[tuple[str, int], int] = {}  # failed batches in a row
        self._failures = OpenFailures(now_ms)  # tablets that failed to open, and when to try again
        self._opened_at: dict[tuple[str, int], float] = {}  # when an opening began
        self._wanted: dict[tuple[str, int], int] = {}       # as of the last reconcile
        self._refused_logged: tuple[str, int, int] | None = None
        self.sender = Sender(lambda: self.routing, self.deliver_to)
        self.channel = channel  # None: no replication (a worker of the in-process test kit)
        self.faults = faults
        self.seen = SeenTablets(state_dir)  # the tablets this worker was ever given a role in
        self.replicas = Replicas(state_dir, self.path_of, self._primary_token, lambda: self.worker_id,
                                 lambda key: self.seen.remember([key]), routed_token=self._followed_token)
        self._closing_tablets: dict[tuple[str, int], Tablet] = {}
        self._swept = 0  # the routing version replaced ranges' leftover copies were last looked for in

    def path_of(self, key: tuple[str, int]) -> str:
        """Where this worker keeps its copy of a tablet (as primary or follower)."""
        return os.path.join(self.state_dir, key[0], str(key[1]))

    def _primary_token(self, key: tuple[str, int]) -> int | None:
        """The token of a tablet open, opening or still closing here as primary (its storage
        is in use: no snapshot may replace it)."""
        tablet = self.tablets.get(key) or self._closing_tablets.get(key)
        if tablet is None and key in self._opening:
            tablet = self._opening[key][0]
        return tablet.token if tablet is not None else None

    def _followed_token(self, key: tuple[str, int]) -> int:
        """The routing's token of a tablet this worker follows (0: the routing does not say it
        follows it): the newest primary a peer may claim to be (review N14)."""
        a = self.routing.assignments.get(key)
        if a is None or not self.worker_id or not any(f.worker_id == self.worker_id for f in a.followers):
            return 0
        return a.token

    def _replicator(self, tablet: Tablet) -> Replicator:
        assert self.channel is not None
        key = (tablet.computation, tablet.key_range)  # what it asked the leader to add: kept under a token
        if self._added.get(key, (None,))[0] != tablet.token:
            self._added[key] = (tablet.token, set())
        rep = Replicator(tablet, self.channel, os.path.join(self.state_dir, ".checkpoints"),
                         self.limits.replica_timeout_ms / 1000, self.faults.blocked, added=self._added[key][1])
        if (assignment := self.routing.assignments.get((tablet.computation, tablet.key_range))) is not None:
            rep.configure(assignment)
        return rep

    def queued_bytes(self) -> int:
        """Input queued in all this worker's tablets, not yet committed (bounded by
        ``limits.max_worker_queued_bytes``: a worker given many tablets does not hold many
        times one tablet's bound in memory, review S8)."""
        return sum(t.inbox.bytes for t in self.tablets.values())

    # ----------------------------------------------------------------- lease

    def lease_valid(self) -> bool:
        """Whether a batch may commit (the fault hook may play a zombie that skips this)."""
        return self.lease_held() or self.faults.ignore_lease()

    def lease_held(self) -> bool:
        return self.now_ms() < self.lease_deadline

    def renewed(self, sent_at_ms: float, lease_ms: int) -> None:
        """A heartbeat sent at ``sent_at_ms`` was acknowledged: trust the lease until then + a margin."""
        self.lease_deadline = max(self.lease_deadline, sent_at_ms + lease_ms * self.limits.lease_safety)
        self._fenced = False

    def lost_lease(self) -> None:
        self.lease_deadline = 0.0

    # --------------------------------------------------------------- routing

    async def apply_routing(self, routing: pb.Routing) -> None:
        table = RoutingTable(routing)
        for d in routing.dropped:
            # A computation deleted (and perhaps submitted again under its name): its old
            # watermark means nothing for the new one.
            if self._dropped_seen.get(d.computation) != d.below:
                self._dropped_seen[d.computation] = d.below
                self.watermarks.pop(d.computation, None)
        # On the loop, but bounded: imports are refused outside the code policy before
        # anything runs, and an allowed module is imported once.
        errors = set(table.load_extractors(self._extractors, self.code_policy))
        for error in errors - self._extractor_errors:  # once per distinct error, not per update
            log.error("%s; records routed through it go to that reader's dead letters", error)
        self._extractor_errors = errors
        await self._first_sight(table)
        async with self._routing_cond:
            self.routing = table
            self.sender.routing_applied()  # in this same step: nothing is sent with it before
            self._routing_cond.notify_all()
        for key, a in table.assignments.items():
            self.replicas.raise_fence(key, a.token)  # a deposed primary is refused from now on
            if (a.token == 1 and self.worker_id and self.worker_id in a.in_sync and self.channel is not None
                    and any(f.worker_id == self.worker_id for f in a.followers)):
                await self.replicas.create_empty(key, a.token)
            if (tablet := self.tablets.get(key)) is not None and tablet.token == a.token:
                tablet.follow(a)
        for tablet in self.tablets.values():
            tablet.wake()  # a savepoint's pause may have ended: the timers it held fire now
        await self.reconcile()

    async def _first_sight(self, table: RoutingTable) -> None:
        """Record the tablets ``table`` gives this worker a role in (worker/seen.py), before
        any copy of them is made here. One never held here, of whose in-sync set this worker
        is (primary or follower), gets the empty copy its creation would have given it: no
        commit of it can have been acknowledged (review 3 N19: a new tablet's primary died
        before its follower applied the routing, and the follower, promoted, had no copy)."""
        if not self.worker_id:
            return
        held = table.copies_of(self.worker_id)
        first = self.seen.first_seen(held)
        await self.seen.remember(held)
        for key in sorted(first):
            a = table.assignments[key]
            if (a.token > 1 and not a.parents and table.computations[key[0]].job_state != "restoring"
                    and self.worker_id in (a.worker_id, *a.in_sync) and not os.path.exists(self.path_of(key))):
                log.warning("tablet %s/%d: this worker is in its in-sync set (token %d) but never held a copy: "
                            "nothing of it was acknowledged; starting from its empty copy", key[0], key[1], a.token)
                await self.replicas.create_empty(key, a.token)

    async def routing_changed(self, version: int, timeout: float) -> None:
        async with self._routing_cond:
            try:
                await asyncio.wait_for(
                    self._routing_cond.wait_for(lambda: self.routing.version != version), timeout)
            except TimeoutError:
                pass

    async def reconcile(self) -> None:
        """Open the tablets assigned here, close the others (and any that failed).

        Bounded in time: it waits at most ``reconcile_wait_s`` for openings and closings
        (user code's ``setup`` or a batch in flight may take long, or never end) and picks
        up the rest on a later call.
        """
        async with self._reconcile_lock:
            valid = self.lease_held()
            wanted = self._assigned() if valid else {}
            self._wanted = wanted
            self._failures.keep(wanted)
            if not valid and self.worker_id and not self._fenced:
                self._fenced = True
                metrics.LEASE_LOST.inc()
                log.warning("lease not renewed in time: self-fencing, closing %d tablets",
                            len(self.tablets) + len(self._opening))
            for key, tablet in list(self.tablets.items()):
                if tablet.closing or wanted.get(key) != tablet.token:
                    del self.tablets[key]
                    if tablet.failed:
                        metrics.TABLET_FAILURES.labels(key[0]).inc()
                        self._batch_limits[key] = max(1, tablet.batch_limit // 2)
                        self._batch_failures[key] = tablet.failures
                    else:
                        self._batch_failures.pop(key, None)
                    self._closing_tablets[key] = tablet  # in use until closed (_primary_token)
                    self._closing[key] = asyncio.create_task(self._close(key, tablet), name=f"close {key}")
            for key, (tablet, task) in list(self._opening.items()):
                if wanted.get(key) != tablet.token:
                    del self._opening[key]
                    self._closing[key] = asyncio.create_task(self._abandon(tablet, task))
            deferred = self._start_openings(wanted)
            await self._drop_copies(wanted)
            started = time.monotonic()
            pending = [t for _, t in self._opening.values()] + list(self._closing.values())
            if pending:
                await asyncio.wait(pending, timeout=self.limits.reconcile_wait_s)
            if deferred and self.lease_held():
                # What waited for a copy being closed (a move here, a split's old range) opens
                # now rather than on the next pass, 200 ms later.
                self._start_openings(self._assigned())
                pending = [t for _, t in self._opening.values()]
                left = self.limits.reconcile_wait_s - (time.monotonic() - started)
                if pending and left > 0:
                    await asyncio.wait(pending, timeout=left)
            self._collect()
            await self._forget_parents()
            await self._delete_dropped()
            await self._forget_gone()

    def _assigned(self) -> dict[tuple[str, int], int]:
        """The tablets this worker is primary of and should run (a job being restored from a
        savepoint keeps its tablets closed until their state is loaded)."""
        return {k: t for k, t in self.routing.tablets_of(self.worker_id).items()
                if self.routing.computations[k[0]].job_state != "restoring"}

    def _start_openings(self, wanted: dict[tuple[str, int], int]) -> bool:
        """Start opening what is assigned here and not open; true if some had to wait for a
        copy still being closed."""
        deferred = False
        for key, token in wanted.items():
            if key in self.tablets or key in self._opening:
                continue
            if not self._failures.may_try(key, token):
                continue  # failed lately under this token: tried again once its backoff is over
            if any(self._in_use(p) for p in [key, *self._parents(key)]):
                deferred = True  # the previous copy (or a range it is built from) still holds the storage
                continue
            try:
                route = self.routing.computations[key[0]]
                tablet = Tablet(self, route, key[1], token, self.path_of(key), now_us=self.wall_us,
                                batch_limit=self._batch_limits.get(key),
                                failures=self._batch_failures.get(key, 0),
                                replicator=self._replicator if self.channel is not None else None,
                                origin=self._origin(key))
            except Exception as e:
                # One tablet that cannot even be built (a route option that does not parse)
                # must not stop the others opening, nor the reconcile loop (review N7).
                self._failures.failed(key, token, e)
                continue
            self._opening[key] = (tablet, asyncio.create_task(self._open(key, tablet), name=f"open {key}"))
            self._opened_at[key] = time.monotonic()
        return deferred

    def _parents(self, key: tuple[str, int]) -> list[tuple[str, int]]:
        a = self.routing.assignments.get(key)
        return [(key[0], p) for p in a.parents] if a is not None else []

    def _in_use(self, key: tuple[str, int]) -> bool:
        closing = self._closing.get(key)
        return key in self.tablets or key in self._opening or (closing is not None and not closing.done())

    def _origin(self, key: tuple[str, int]) -> Origin | None:
        """How to build a range a split or merge made here (its storage is not here yet)."""
        a = self.routing.assignments.get(key)
        if a is None or not a.parents:
            return None
        end = from_wire_end(a.end)
        if len(a.parents) == 1:
            parents = [Parent(self.path_of((key[0], a.parents[0])), a.start, end)]
        else:
            parents = [Parent(self.path_of((key[0], a.parents[0])), a.start, a.cut),
                       Parent(self.path_of((key[0], a.parents[1])), a.cut, end)]
        return Origin(parents, a.start, end, first=len(a.parents) == 1 and end == a.cut)

    async def _forget_parents(self) -> None:
        """Delete the storage of ranges a split or merge replaced, once every range built from
        them that this worker holds a copy of (as primary or follower) is here. A range held
        only elsewhere does not keep it: a follower that follows one half of a split (the
        other half moved away) would otherwise keep the whole parent for ever."""
        if not self.worker_id or not self.routing.version:
            return
        held = self.routing.copies_of(self.worker_id)
        children: dict[tuple[str, int], list[tuple[str, int]]] = {}
        for key, a in self.routing.assignments.items():
            for p in a.parents:
                kids = children.setdefault((key[0], p), [])
                if key in held:
                    kids.append(key)
        # A range assigned here whose parents' storage is missing cannot be built: delete nothing
        # while that lasts (the leader never splits a range its primary has not opened, so
        # this is a defence, and status shows the tablet that cannot open).
        unbuildable = any(not os.path.isdir(self.path_of(k)) and not all(os.path.isdir(self.path_of(p))
                                                                       for p in self._parents(k))
                          for k in self._wanted if self._parents(k))
        for parent, kids in children.items():
            path = self.path_of(parent)
            if (parent in self.routing.assignments or self._in_use(parent) or parent in self.replicas.copies
                    or not os.path.isdir(path) or not all(os.path.isdir(self.path_of(k)) for k in kids)
                    or unbuildable):
                continue
            log.info("tablet %s/%d: every range built from it is built; deleting its storage", *parent)
            await asyncio.to_thread(shutil.rmtree, path, True)
        if unbuildable or self._swept == self.routing.version:
            return
        # A range replaced again before its copy reached here leaves its parent unneeded.
        self._swept = self.routing.version
        for computation in self.routing.computations:
            try:
                names = os.listdir(os.path.join(self.state_dir, computation))
            except OSError:
                continue
            for name in names:
                old = (computation, int(name)) if name.isdigit() else None
                if (old is None or old in children or not self.routing.replaced(*old) or self._in_use(old)
                        or old in self.replicas.copies or old in self._closing_tablets):
                    continue
                log.info("tablet %s/%d: replaced, and no range is built from it; deleting its storage", *old)
                await asyncio.to_thread(shutil.rmtree, self.path_of(old), True)

    async def _forget_gone(self) -> None:
        """Forget what this worker kept per range about ranges it no longer has: smaller batches
        after a failure (for a tablet no longer assigned here), opening times, and followers'
        fences of ranges gone for good. Else every range ever held stays in memory."""
        mine = self.routing.tablets_of(self.worker_id) if self.worker_id else {}
        for kept in (self._batch_limits, self._batch_failures, self._added):
            for key in [k for k in kept if k not in mine]:
                del kept[key]
        for key in [k for k in self._opened_at if k not in self._opening]:
            del self._opened_at[key]
        self.replicas.forget(self._gone)
        await self.seen.forget(self._gone)

    def _gone(self, key: tuple[str, int]) -> bool:
        """Whether range ``key`` is gone for good (no later routing brings it back: range ids
        only grow): split or merged away, or its state deleted by the leader."""
        if key in self.routing.assignments:
            return False
        if self.routing.replaced(*key):
            return True
        return any(d.computation == key[0] and key[1] < d.below for d in self.routing.proto.dropped)

    async def _delete_dropped(self) -> None:
        """Delete this worker's copies of ranges whose state the leader deleted (a cancelled
        job, a computation removed or reset by an update): every ``<computation>/<id>`` below
        the routing's ``dropped`` id that nothing here uses any more."""
        for d in self.routing.proto.dropped:
            top = os.path.join(self.state_dir, d.computation)
            try:
                names = os.listdir(top)
            except OSError:
                continue
            for name in names:
                if not name.isdigit() or int(name) >= d.below:
                    continue
                key = (d.computation, int(name))
                if key in self.routing.assignments or self._in_use(key) or key in self._closing_tablets:
                    continue
                if key in self.replicas.copies:
                    await self.replicas.close(key, delete=True)
                log.info("tablet %s/%d: its state was deleted by the leader (job cancelled or computation "
                         "removed); deleting this copy", *key)
                await asyncio.to_thread(shutil.rmtree, os.path.join(top, name), True)
            if not any(n for n in os.listdir(top) if not n.startswith(".")):
                await asyncio.to_thread(shutil.rmtree, top, True)

    async def checkpoint(self, computation: str, key_range: int, token: int) -> tuple[str, int]:
        """A RocksDB checkpoint of an open tablet, taken between two of its batches (for a
        savepoint); returns its directory (the caller deletes it) and commit index."""
        tablet = self.tablets.get((computation, key_range))
        if tablet is None or tablet.token != token or tablet.closing or tablet.thread is None:
            raise NotOwnerError(f"tablet {computation}/{key_range} is not open on this worker under token {token}; "
                           "it moved: take the savepoint again")
        path = os.path.join(self.state_dir, ".checkpoints", f"savepoint-{computation}-{key_range}-{uuid.uuid4().hex[:12]}")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        index = await tablet.thread.run(tablet.store.checkpoint, path)
        return path, index

    async def loadable(self, computation: str, key_range: int, token: int, wait_s: float = 10.0) -> str:
        """Where a restore may load a tablet's files: only a tablet of a job being restored,
        assigned here as primary under ``token`` (a running tablet is never overwritten). The
        routing that says so may be on its way: it is waited for, ``wait_s`` at most."""
        deadline = time.monotonic() + wait_s
        while True:
            route = self.routing.computations.get(computation)
            a = self.routing.assignments.get((computation, key_range))
            if (route is not None and route.job_state == "restoring" and a is not None
                    and a.worker_id == self.worker_id and a.token == token):
                return self.path_of((computation, key_range))
            left = deadline - time.monotonic()
            if left <= 0:
                raise NotOwnerError(f"tablet {computation}/{key_range} under token {token} is not being restored on "
                               "this worker")
            await self.routing_changed(self.routing.version, left)

    async def read_state(self, computation: str, key_range: int, token: int, key: bytes,
                         state: str = "") -> tuple[bytes | None, list[str]]:
        """One key's committed state, from the tablet open here (`millstream state get`):
        ``ctx.state``, or with ``state`` the typed state of that name as JSON; and with
        ``ctx.state``, the names ``state`` takes (a flow's stage has only those)."""
        tablet = self.tablets.get((computation, key_range))
        if tablet is None or (token and tablet.token != token) or tablet.closing:
            raise NotOwnerError(f"tablet {computation}/{key_range} is not open on this worker under token {token}; "
                           "it is moving or reopening: try again")
        if state:
            spec = readable_spec(tablet.proc.comp, state)
            return await asyncio.to_thread(read_as_json, spec, key, tablet.store.get_cell, tablet.store.scan,
                                           self.watermark(computation), self.wall_us()), []
        return await asyncio.to_thread(lambda: (tablet.store.get_state(key), state_names(tablet.proc.comp)))

    def _collect(self) -> None:
        """Adopt the tablets that opened; forget finished closings; log what stays stuck."""
        for key, task in list(self._closing.items()):
            if task.done():
                del self._closing[key]
        for key, (tablet, task) in list(self._opening.items()):
            if not task.done():
                continue
            del self._opening[key]
            error = task.exception() if not task.cancelled() else StaleTokenError("opening cancelled")
            if error is None:
                self.tablets[key] = tablet
                self._failures.opened(key)
                a = self.routing.assignments.get(key)
                if a is not None and a.token == tablet.token:
                    tablet.follow(a)  # a routing applied while it opened passed it by (its followers)
                metrics.TABLET_OPENS.labels(key[0]).inc()
                log.info("tablet %s/%d open under token %d", key[0], key[1], tablet.token)
                continue
            if isinstance(error, StaleTokenError):
                metrics.STALE.labels("open").inc()
            self._failures.failed(key, tablet.token, error)

    async def _open(self, key: tuple[str, int], tablet: Tablet) -> None:
        """A follower copy promoted here is closed first: the tablet opens the same files (and a
        range built here from others closes their follower copies, if it has any, first)."""
        await self.replicas.close(key)
        for parent in self._parents(key):
            await self.replicas.close(parent)
        await tablet.start()

    async def _close(self, key: tuple[str, int], tablet: Tablet) -> None:
        self._closing_tablets[key] = tablet
        try:
            await tablet.close()
            self.replicas.demoted(key)  # its next primary may continue its files as a copy here
        finally:
            if self._closing_tablets.get(key) is tablet:
                del self._closing_tablets[key]

    async def _drop_copies(self, wanted: dict[tuple[str, int], int]) -> None:
        """Close follower copies no longer assigned here; delete the files of those the leader
        no longer counts on (not a follower, not in the in-sync set) as of a routing at least
        as new as the copy."""
        if not self.routing.version:
            return
        copies = self.routing.copies_of(self.worker_id) if self.worker_id else set()
        for key, copy in list(self.replicas.copies.items()):
            a = self.routing.assignments.get(key)
            if a is None and key[0] in self.routing.computations:
                # Split or merged away. While this worker is to hold a copy of a range built
                # from it, its files stay (closed) until that copy is here (_forget_parents):
                # until then they may be the only other copy of that state.
                heir = any(key[1] in c.parents and (c.worker_id == self.worker_id or any(
                    f.worker_id == self.worker_id for f in c.followers)) for c in self.routing.assignments.values())
                await self.replicas.close(key, delete=not heir)
                continue
            if a is None or key in wanted or key in copies or a.token < copy.token:
                continue
            await self.replicas.close(key, delete=True)

    async def _abandon(self, tablet: Tablet, opening: asyncio.Task[None]) -> None:
        """A tablet no longer wanted while it opens: close it once the opening ends."""
        await asyncio.gather(opening, return_exceptions=True)
        await self._close((tablet.computation, tablet.key_range), tablet)

    async def close_all(self, timeout: float = 10.0) -> None:
        """Close every tablet; one whose batch does not finish within ``timeout`` is left to
        the process's exit (its storage is never written half-way: RocksDB's WAL)."""
        async with self._reconcile_lock:
            for key, tablet in self.tablets.items():
                self._closing[key] = asyncio.create_task(self._close(key, tablet))
            for key, (tablet, task) in self._opening.items():
                self._closing[key] = asyncio.create_task(self._abandon(tablet, task))
            self.tablets.clear()
            self._opening.clear()
            pending = list(self._closing.values())
            if pending:
                _, stuck = await asyncio.wait(pending, timeout=timeout)
                if stuck:
                    log.warning("%d tablets did not finish their batch within %.0f s "
                                "(user code still running); leaving them", len(stuck), timeout)
            self._collect()
        await self.replicas.close_all()
        await self.sender.close()

    def open_failures(self) -> dict[str, str]:
        """Tablets that failed to open, by ``computation/range``: the last error."""
        return self._failures.errors()

    def quiet(self) -> bool:
        """Nothing to do now: no tablet opening or closing, nothing waiting to be sent, and
        every tablet :meth:`~worker.tablet.Tablet.quiet` (``TestRun.run_until_idle``)."""
        if self.sender.pending() or self._opening or any(not t.done() for t in self._closing.values()):
            return False
        return all(t.quiet() for t in self.tablets.values())

    def clock_moved(self) -> None:
        """The wall clock jumped (a test's virtual clock): every tablet looks at its
        wall-clock timers again."""
        for t in self.tablets.values():
            t.wake()

    def problems(self) -> list[pb.TabletProblem]:
        """Tablets assigned here that do not run: failing to open, or waiting on user code."""
        now = time.monotonic()
        out = []
        for key in self._wanted:
            failed = self._failures.problem(key, now)
            if failed is not None:
                out.append(failed)
                continue
            since = self._opened_at.get(key)
            if key in self._opening and since is not None and now - since > 5:
                out.append(pb.TabletProblem(
                    computation=key[0], key_range=key[1], attempts=1, seconds=now - since,
                    error="still opening: user code's setup() or the storage open has not returned"))
            closing = self._closing.get(key)
            if closing is not None and not closing.done() and key not in self.tablets:
                out.append(pb.TabletProblem(
                    computation=key[0], key_range=key[1], attempts=1, seconds=0.0,
                    error="the previous copy's batch has not finished (user code still running)"))
        return out

    def stuck(self) -> list[str]:
        """Tablets that were let go of but whose batch in flight has not finished."""
        return [f"{c}/{r}" for (c, r), task in self._closing.items() if not task.done()]

    # -------------------------------------------------------------- delivery

    def send(self, shipments: list[Shipment], owner: Tablet) -> None:
        self.sender.send(shipments, owner)

    def watermark(self, computation: str) -> int:
        """``computation``'s input watermark (master/watermarks.py, inputs): what its timers
        fire on, what its records are late against, ``ctx.low_watermark``."""
        return self.watermarks.get(computation, WATERMARK_MIN)

    def set_watermarks(self, inputs: dict[str, int], dropped: dict[str, int] | None = None) -> None:
        """Adopt the leader's input watermarks (never moving one backwards here). ``dropped``:
        the answer's Routing.dropped ids of those computations; one that differs from what this
        worker's routing says speaks of another incarnation (an answer built before a computation
        was deleted and submitted again under its name). An answer with none is a leader that
        has not computed them yet (a new one, before its first tick): they are not known from
        it, and no batch may run on the start of time."""
        if not inputs and not self.watermarks_known:
            return
        advanced = set()
        seen = self._dropped_seen
        for comp, wm in inputs.items():
            if dropped is not None and dropped.get(comp, 0) != seen.get(comp, 0):
                continue
            if wm > self.watermarks.get(comp, WATERMARK_MIN):
                self.watermarks[comp] = wm
                advanced.add(comp)
        if not self.watermarks_known:
            self.watermarks_known = True
            for tablet in self.tablets.values():
                tablet.wake()  # it may run batches now
        elif advanced:
            for (comp, _), tablet in self.tablets.items():
                if comp in advanced:
                    tablet.watermark_advanced()

    def next_report(self) -> tuple[int, list[pb.HeldTablet]]:
        """A progress snapshot and its sequence number (every commit acknowledged before
        this call is reflected in it)."""
        seq = self.report_seq
        self.report_seq += 1
        return seq, [t.progress() for t in self.tablets.values() if t.open and not t.closing]

    def receipt(self) -> Receipt:
        """For an acknowledgement: the first report that will reflect what was just committed."""
        return self.worker_id, self.report_seq

    def release(self, reported: dict[str, int]) -> None:
        """The leader holds these reports: let go of timestamps waiting on them."""
        for tablet in self.tablets.values():
            tablet.release(reported)

    async def deliver(self, computation: str, key_range: int, token: int, records: Columns | list[Record],
                      orders: Orders | None = None) -> int:
        """Fence by token, then hand the batch to the tablet (DESIGN.md §4 step 1)."""
        return (await self.deliver_counted(computation, key_range, token, records, orders))[0]

    async def deliver_counted(self, computation: str, key_range: int, token: int, records: Columns | list[Record],
                              orders: Orders | None = None, injected: bool = False) -> tuple[int, int]:
        """:meth:`deliver`, with how many of the records were dropped as duplicates (with OK;
        the answer to a Deliver carries it, so an injector can tell a re-used name). Records
        come as columns (a list of records is taken too: tests, runtime.testing). An
        ``injected`` delivery goes in only if its computation is still open to input when it
        does (a drain may have closed it while it waited: the leader releases the injectors
        once this worker reports the closing routing, and takes its tablets' reports as all
        that came in)."""
        if not isinstance(records, Columns):
            records = Columns.of_records(records, next(iter(orders)) if orders and len(orders) == 1 else None)
        if self.faults.path is not None and self.faults.busy():
            return BUSY, 0  # the test hook's backpressure (runtime/faults.py)
        key = (computation, key_range)
        tablet = self.tablets.get(key)
        if tablet is None and key in self._opening and self._opening[key][0].token == token:
            # Opening here under this token (moved, split, merged): wait a little, not back off.
            await asyncio.wait({self._opening[key][1]}, timeout=OPENING_WAIT_S)
            self._collect()
            tablet = self.tablets.get(key)
        if tablet is not None and tablet.token == token and not tablet.closing:
            if injected:
                return await tablet.deliver(records, orders, lambda: not self.routing.closed_to_input(computation))
            return await tablet.deliver(records, orders)
        assigned = self.routing.destination(computation, key_range)
        mine = assigned.address == self.address and self.lease_valid()
        if ((mine and assigned.token == token) or token > assigned.token) and not self.routing.replaced(
                computation, key_range):
            return BUSY, 0  # assigned here, still opening; or routing news not yet arrived
        metrics.STALE.labels("deliver").inc()
        if self._refused_logged != (computation, key_range, token):
            self._refused_logged = (computation, key_range, token)
            log.warning("refused a delivery to %s/%d under token %d: not the owner here "
                        "(routing says %s, token %d)", computation, key_range, token,
                        assigned.address or "unassigned", assigned.token)
        return NOT_OWNER, 0

    async def deliver_to(self, address: str, computation: str, key_range: int, token: int,
                         records: Columns, orders: Orders | None) -> tuple[int, Receipt | None]:
        if address == self.address:
            status = await self.deliver(computation, key_range, token, records, orders)
            return status, self.receipt()
        return await self._remote(address, computation, key_range, token, records, orders)
