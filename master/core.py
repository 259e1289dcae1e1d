"""The leader: its image of the cluster, the one way it changes a durable fact, the routing it
streams and its tick.

Knows nothing of gRPC. Everything the leader decides from is on its
:class:`~master.image.ClusterImage`; every decision is a :class:`~master.change.Change`,
written to etcd and then applied to the image by :meth:`MasterCore.commit` (one path for
every command: master/lifecycle.py, master/savepoints.py, master/reshard.py and
master/membership.py go through it). After a failover the next leader builds its image
from etcd with :meth:`MasterCore.become_leader`, through the same apply.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Sequence

from master import injectors, progress
from master.change import Change
from master.config import MasterConfig
from master.image import ClusterImage, UnknownWorkerError
from master.jobs import PAUSE_LIMIT_S
from master.rebalance import Rebalancer
from master.scheduler import Ownership, TabletKey, replan
from master.store import EtcdStore, NotLeaderError, as_change
from master.views import StatusDocument, routing_of, status_of
from runtime import metrics
from runtime.errors import MillstreamError, StaleTokenError
from runtime.record import END_OF_TIME
from runtime.wire import millstream_pb2 as pb

log = logging.getLogger(__name__)

__all__ = ["MasterConfig", "MasterCore", "UnknownWorkerError"]


class MasterCore:
    """Leader-side logic. Every durable change is written to etcd before it is visible."""

    def __init__(self, store: EtcdStore, config: MasterConfig, now_ms: Callable[[], float]) -> None:
        self.store = store
        self.config = config
        self.now_ms = now_ms
        self.image = ClusterImage(config.replication, config.rebalance, config.settle_ms, config.policy.window_s)
        self.rebalancer = Rebalancer(config.policy, self.image.load)
        self.autoscaling: asyncio.Task[None] | None = None  # a policy decision being carried out
        self.upkeep: asyncio.Task[None] | None = None  # etcd's size check and defragment, off the tick
        self.closed = False
        self.term = store.term  # the election this core leads for: its writes are refused after it
        self._etcd_checked = -1e18
        self._defragged = -1e18
        self._gauged_at = -1e18
        self._replan_soon = ""  # why to re-plan at the next tick (a worker became eligible for copies, ...)
        self._changed = asyncio.Condition()
        self._lock = asyncio.Lock()
        self._expiring: set[str] = set()  # workers whose expiry is being written (tick)
        # Injector names whose report must reach etcd before it is answered, and the write's
        # own lock (report_injector_between_ticks).
        self._unwritten: set[str] = set()
        self._registering = asyncio.Lock()

    @property
    def lock(self) -> asyncio.Lock:
        """Held by every command: one change of the cluster at a time."""
        return self._lock

    @property
    def version(self) -> int:
        return self.image.version

    async def commit(self, change: Change) -> None:
        """Write ``change`` to etcd, then apply the same change to the image: the one way the
        leader changes a durable fact (a deposed leader's write is refused by etcd; one made by
        a core whose leadership ended, after this master was elected again, by this check)."""
        if self.closed:
            raise NotLeaderError("this master's leadership ended; the change was not written")
        await asyncio.to_thread(self.store.apply, change, self.term)
        self.image.apply(change, self.now_ms())

    async def become_leader(self) -> None:
        """Build the image from etcd; every known worker gets a fresh lease period."""
        snap = await asyncio.to_thread(self.store.load)
        now = self.now_ms()
        self.image.apply(as_change(snap, now + PAUSE_LIMIT_S * 1000), now)
        wanted = self.image.wanted()
        await self._collect(wanted)
        # Tablets a new topology wants that are not written yet (a change interrupted after
        # its topology was, see EtcdStore.apply; or one written before that order): new
        # tablets, placed now.
        if wanted - set(self.image.tablets):
            log.warning("placing %d tablets a previous leader had not written", len(wanted - set(self.image.tablets)))
        await self.rebalance("leader", wanted)
        log.info("leading: %d topologies, %d workers, %d tablets",
                 len(self.image.topologies), len(self.image.workers), len(self.image.tablets))

    async def _collect(self, wanted: set[TabletKey]) -> None:
        """Delete what a lifecycle change interrupted by a failover left behind (review N13):
        tablets no topology wants (a cancelled job's, a removed or reset computation's old
        ranges, a restore that never wrote its topology), and the ranges and watermarks of
        computations no topology has."""
        names = {s.name for s in self.image.specs()}
        orphans = sorted(k for k in self.image.tablets if k not in wanted)
        stray = sorted(c for c in set(self.image.ranges) | set(self.image.published) if c not in names)
        if orphans or stray:
            log.warning("deleting %d tablets and the ranges and watermarks of %d computations that an "
                        "interrupted lifecycle change left behind", len(orphans), len(stray))
            await self.commit(Change(gone=orphans, ranges=dict.fromkeys(stray), watermarks_gone=stray))

    # --------------------------------------------------------------- intake

    def heartbeat(self, worker_id: str, held: Sequence[pb.HeldTablet] = (), report_seq: int = 0,
                  problems: Sequence[pb.TabletProblem] = (), routing_version: int = 0) -> dict[str, int]:
        """Renew a worker's lease and take its tablets' progress; returns the input watermarks."""
        if worker_id in self._expiring:
            raise UnknownWorkerError(f"worker {worker_id} is not registered (its lease expired)")
        if self.image.heartbeat(worker_id, held, report_seq, problems, routing_version, self.now_ms()):
            self._replan_soon = "heard"  # the first report since this master leads
        return self.image.inputs

    def reported(self) -> dict[str, int]:
        """The newest report held from each known worker (HeartbeatResponse.reported)."""
        return self.image.reported()

    def report_injector(self, name: str, stream: str, watermark: int, incarnation: str = "",
                        release: bool = False, operator: bool = False, idle: bool = False,
                        retired: bool = False) -> None:
        """An injector's current promise (master/injectors.py)."""
        injectors.report(self.image, name, stream, watermark, self.now_ms(), incarnation, release, operator, idle,
                         retired)

    async def report_injector_between_ticks(self, name: str, stream: str, watermark: int, incarnation: str = "",
                                            release: bool = False, operator: bool = False, idle: bool = False,
                                            retired: bool = False) -> None:
        """:meth:`report_injector` under the leader's lock, as an injector's call is served: a
        tick takes the injectors' holds, writes the watermarks they allow to etcd and then
        publishes them; a name registering (at the start of time) during that write was
        answered before, and left out of, what the tick published (review of watermarks, 1).

        A report that changes who holds what is written to etcd before it is answered, not at
        the next tick: a registration (a new name, run or stream), for a new leader must hold
        the stream for it too (it was lost with a failover before that tick); an operator's
        release, which a failover would otherwise undo; and a run's last report (retired, or
        finished), after which it reports nothing. Keep-alives and promises wait for the tick.
        The write is made outside the leader's lock (the tick and its lease renewal do not
        wait for it), for every name waiting then in one transaction (a burst of new runs is
        one write, not one each); a name whose write failed stays waiting, so its retry is
        written even though the image already has it."""
        async with self._lock:
            inj = self.image.injectors.get(name)
            registers = inj is None or inj.stream != stream or incarnation not in inj.incarnations
            self.report_injector(name, stream, watermark, incarnation, release, operator, idle, retired)
            if registers or release or retired or watermark == END_OF_TIME:
                self._unwritten.add(name)
            if name not in self._unwritten:
                return
        async with self._registering:
            if name not in self._unwritten:
                return  # written with another name's, while this call waited
            names, self._unwritten = self._unwritten, set()
            promises = {n: e.promise() for n in sorted(names) if (e := self.image.injectors.get(n)) is not None}
            try:
                await self.commit(Change(injectors=promises))
            except BaseException:
                self._unwritten |= names
                raise

    def routing(self) -> pb.Routing:
        return routing_of(self.image)

    def status(self) -> StatusDocument:
        return status_of(self.image, self.config, self.now_ms())

    # --------------------------------------------------------------- placement

    def plan(self, more: Iterable[TabletKey] = (), extra: dict[TabletKey, int] | None = None
             ) -> dict[TabletKey, Ownership]:
        """Where every tablet (and ``more``, with ``extra`` replication factors) goes now
        (:func:`~master.scheduler.replan`)."""
        image = self.image
        image.unpin_done()
        workers = image.workers
        paused = image.paused_computations()
        return replan([*image.tablets, *more], image.owners(), list(workers),
                      {**image.replication_factors(), **(extra or {})}, {w: e.zone for w, e in workers.items()},
                      {**image.holding, **image.pinned}, {w for w, e in workers.items() if e.draining},
                      {w for w, e in workers.items() if not e.heard},
                      [k for k in image.tablets if k[0] in paused])

    async def rebalance(self, reason: str, more: Iterable[TabletKey] = ()) -> None:
        """Apply the plan: failovers, moves, followers; then a new routing version."""
        owners = self.image.owners()
        changed = {k: v for k, v in self.plan(more).items() if owners.get(k) != v}
        if changed:
            await self.commit(Change(tablets=changed))
            self.image.unpin_done()  # a merge waiting for a move need not wait for another replan
            moved = sum(1 for k, v in changed.items() if k in owners and owners[k].worker != v.worker)
            if moved:
                self.count_moves(moved, reason)
                log.info("moved %d tablets (%s)", moved, reason)
            for c, r in [k for k, v in changed.items() if not v.worker and v.existed]:
                log.error("tablet %s/%d has no live in-sync copy: it stays unassigned until one of %s "
                          "comes back (it is never opened empty)", c, r, ", ".join(changed[(c, r)].in_sync))
        await self.bump()

    def replan_soon(self, reason: str) -> None:
        """Re-plan at the next tick, under the lock: where a change must not fail for a plan."""
        self._replan_soon = reason

    def count_moves(self, n: int, reason: str) -> None:
        self.image.count("tablet_moves", n)
        metrics.TABLET_MOVES.labels(reason).inc(n)

    async def update_in_sync(self, computation: str, key_range: int, token: int, follower: str,
                             add: bool, primary: str = "") -> tuple[str, ...]:
        """A primary adds a caught-up follower to its in-sync set, or removes one that stopped
        acknowledging. Only under the tablet's current token (the fence: a deposed primary
        can change nothing), and written to etcd before the answer."""
        async with self._lock:
            key = (computation, key_range)
            t = self.image.tablets.get(key)
            own = t.own if t is not None else None
            if own is None or own.token != token or (primary and own.worker != primary):
                raise StaleTokenError(
                    f"tablet {computation}/{key_range}: token {token} is not current "
                    f"({own.token if own else 'no such tablet'}); this primary is stale")
            if add and follower not in own.followers:
                raise MillstreamError(f"worker {follower} is not a follower of {computation}/{key_range}")
            if not add and follower in own.in_sync and computation not in self.image.live_computations():
                # Its job was cancelled with its state kept: the tablet is closing, and nothing
                # can catch a dropped follower up until the job resumes. Its last batch fails
                # instead, and the kept state stays on every in-sync copy (a host lost meanwhile
                # leaves another).
                raise StaleTokenError(
                    f"tablet {computation}/{key_range}: its job is cancelled (its state kept); follower "
                    f"{follower} stays in the in-sync set and this primary closes without committing")
            if add == (follower in own.in_sync):
                return own.in_sync
            in_sync = (*own.in_sync, follower) if add else tuple(w for w in own.in_sync if w != follower)
            await self.commit(Change(tablets={key: Ownership(own.worker, own.token, own.followers, in_sync)}))
            log.log(logging.INFO if add else logging.WARNING, "tablet %s/%d: follower %s %s the in-sync set",
                    computation, key_range, follower, "joins" if add else "leaves")
            if add:  # a move may wait for this follower to catch up: promote it now
                await self.rebalance("move" if key in self.image.pinned else "balance")
            else:
                await self.bump()
            return self.image.tablets[key].own.in_sync

    async def move(self, computation: str, key_range: int, worker: str) -> int:
        """Move one tablet to ``worker`` (an id or an address): at once if it holds an in-sync
        copy, else once it has caught up as a follower (DESIGN.md §5). Returns the token the
        tablet will have there."""
        async with self._lock:
            key = (computation, key_range)
            t = self.image.tablets.get(key)
            if t is None:
                raise MillstreamError(
                    f"no tablet {computation}/{key_range}; `millstream status` lists the tablets")
            workers = self.image.workers
            target = worker if worker in workers else next(
                (w for w, e in workers.items() if e.address == worker), None)
            if target is None:
                raise MillstreamError(
                    f"no live worker {worker!r}; give a worker id or address from `millstream status`")
            old = t.own
            if old.worker == target:
                return old.token
            if not old.worker:
                raise MillstreamError(f"tablet {computation}/{key_range} has no live in-sync copy to move")
            self.image.pin(key, target)
            await self.rebalance("move")
            when = ("" if self.image.tablets[key].own.worker == target else
                    " once the savepoint being taken of its job ends" if computation in self.image.paused_computations()
                    else " once it has caught up")
            log.info("moving tablet %s/%d to %s (token %d)%s", computation, key_range, target, old.token + 1, when)
            return old.token + 1

    # --------------------------------------------------------------- the tick

    async def tick(self) -> None:
        """Advance watermarks; expire workers whose lease ran out and move their tablets."""
        await progress.advance(self)
        self._start_upkeep()
        now = self.now_ms()
        if now - self._gauged_at >= 1000:  # a pass over every tablet: once a second
            self._gauged_at = now
            under, unavailable = self.image.health_counts()
            metrics.UNDER_REPLICATED.set(under)
            metrics.UNAVAILABLE.set(unavailable)
        if self._replan_soon:
            reason, self._replan_soon = self._replan_soon, ""
            async with self._lock:
                await self.rebalance(reason)
        if not self._expired(now):
            return
        async with self._lock:
            # Looked at again under the lock: a worker heard while this waited for it keeps its
            # lease (it was answered as known), and one that left meanwhile is gone already.
            dead = self._expired(self.now_ms())
            if not dead:
                return
            for w in dead:
                log.warning("worker %s at %s missed its lease; moving its tablets", w, self.image.workers[w].address)
                self.image.count("lease_expiries")
                metrics.WORKER_EXPIRIES.inc()
            self._expiring = set(dead)  # a heartbeat meanwhile is answered unknown: it registers again
            try:
                await self.commit(Change(workers=dict.fromkeys(dead)))
            finally:
                self._expiring = set()
            await self.rebalance("expiry")

    def _expired(self, now: float) -> list[str]:
        return [w for w, e in self.image.workers.items() if now - e.last_seen > self.config.lease_ms]

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
            size = await asyncio.to_thread(self.store.db_size)
            if size > self.config.defrag_above_bytes and now - self._defragged > 3_600_000:
                log.warning("etcd holds %d MiB: defragmenting it", size >> 20)
                self._defragged = now
                await asyncio.to_thread(self.store.defragment)
                size = await asyncio.to_thread(self.store.db_size)
        except MillstreamError as e:  # etcd unreachable: the leader's own writes will say so
            log.warning("etcd upkeep failed: %s", e)
            return
        except Exception:
            log.exception("etcd upkeep failed")
            return
        self.image.note_etcd_size(size)
        metrics.ETCD_DB_BYTES.set(size)

    # --------------------------------------------------------------- routing

    async def bump(self, above: int = 0) -> None:
        """A new routing version (above ``above`` too: a version a worker reported)."""
        async with self._changed:
            self.image.bump(self.now_ms(), above)
            self._changed.notify_all()

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
        """Wait for the next routing change, at most ``timeout`` seconds (raises once this core's
        leadership ended: a split or merge waiting for its ranges would otherwise spin)."""
        if self.closed:
            raise NotLeaderError("this master's leadership ended")
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
        for task in (self.upkeep, self.autoscaling):  # (an etcd call in a thread runs out; nothing waits for it)
            if task is not None:
                task.cancel()  # a split or merge under way: its waits would spin on a closed core

        async def wake() -> None:
            async with self._changed:
                self._changed.notify_all()

        asyncio.get_running_loop().create_task(wake())
