"""The worker's session with the leader master: it registers (with the worker's own secret),
heartbeats and learns its lease and input watermarks from the answers, applies the routing
the leader streams, and, before the worker leaves, drains its primaries to other workers."""

from __future__ import annotations

import asyncio
import logging

import grpc

from runtime import health, metrics
from runtime.client import AsyncMasterClient
from runtime.wire import millstream_pb2 as pb
from worker.core import WorkerCore
from worker.statedir import keep_secret, new_secret, read_secret

log = logging.getLogger(__name__)


class MasterSession:
    """Registers with the leader, heartbeats, and applies the routing it streams."""

    def __init__(self, core: WorkerCore, masters: AsyncMasterClient, identity: str = "", zone: str = "",
                 state_dir: str | None = None, ready: health.Health | None = None) -> None:
        self.core = core
        self.ready = ready  # its WORKER service is SERVING while the worker holds a lease
        self.masters = masters
        self.identity = identity
        self.state_dir = state_dir  # where the secret is kept (None: in memory only)
        # Made and kept (durably) before the first registration, and shown on it: the leader
        # adopts it, so a registration whose answer was lost (the leader killed after writing
        # it) can be repeated.
        core.secret = read_secret(state_dir) if state_dir else ""
        if not core.secret:
            core.secret = new_secret()
            if state_dir:
                keep_secret(state_dir, core.secret)
        self.zone = zone
        self.lease_ms = 3000
        self._behind = 0
        self._watcher: asyncio.Task[None] = asyncio.Future()  # type: ignore[assignment]

    async def run(self) -> None:
        while True:
            sent_at = self.core.now_ms()
            try:
                resp = await self.masters.stub().RegisterWorker(
                    pb.RegisterWorkerRequest(address=self.core.address, worker_id=self.identity,
                                             zone=self.zone, secret=self.core.secret,
                                             allowed_code=self.core.code_policy.allowed),
                    timeout=self.masters.timeout)
            except grpc.RpcError as e:
                if e.code() in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.INVALID_ARGUMENT):
                    log.error("the leader refuses this worker's registration: %s", e.details())
                log.info("cannot register with master %s: %s", self.masters.leader, e.details())
                self.masters.follow(e)
                await asyncio.sleep(0.2)
                continue
            if resp.secret != self.core.secret:
                if self.state_dir:
                    keep_secret(self.state_dir, resp.secret)
                self.core.secret = resp.secret
            self.core.worker_id = resp.worker_id
            self.lease_ms = resp.lease_ms
            self.core.renewed(sent_at, self.lease_ms)
            log.info("registered as worker %s (lease %d ms)", resp.worker_id, resp.lease_ms)
            if self.ready is not None:
                await self.ready.set(health.WORKER, True)
            self._watcher = asyncio.create_task(self._watch())
            try:
                await self._heartbeat()
            finally:
                self._watcher.cancel()
                await asyncio.gather(self._watcher, return_exceptions=True)
                if self.ready is not None:
                    await self.ready.set(health.WORKER, False)
            self.core.lost_lease()
            await self.core.reconcile()  # closes every tablet: self-fencing

    async def _heartbeat(self) -> None:
        """Returns when the lease is lost for good (the master forgot us)."""
        interval = min(self.lease_ms / 4, self.core.limits.progress_ms) / 1000
        while True:
            sent_at = self.core.now_ms()
            version = self.core.routing.version  # applied before the report is taken (a drain waits on it)
            seq, held = self.core.next_report()
            try:
                resp = await self.masters.stub().Heartbeat(
                    pb.HeartbeatRequest(worker_id=self.core.worker_id, tablets=held, report_seq=seq,
                                        problems=self.core.problems(), secret=self.core.secret,
                                        routing_version=version),
                    timeout=self.lease_ms / 2000)
            except grpc.RpcError as e:
                # No reconcile here: nothing may hold up the next heartbeat. Commits check the
                # lease themselves, and the reconcile loop closes the tablets (self-fencing).
                self.masters.follow(e)
                log.info("heartbeat failed (%s)", e.code().name)
            else:
                if not resp.known:
                    metrics.REREGISTERED.inc()
                    log.warning("the master no longer knows worker %s; re-registering",
                                self.core.worker_id)
                    return
                if resp.lease_ms and resp.lease_ms < self.lease_ms:
                    # A new leader with a shorter lease (masters configured differently) would
                    # move our tablets sooner than we stop trusting our lease (review E7).
                    log.warning("the leader's lease is %d ms, shorter than the %d ms we registered "
                                "with; trusting the shorter one", resp.lease_ms, self.lease_ms)
                    self.lease_ms = resp.lease_ms
                self.core.renewed(sent_at, self.lease_ms)
                self.core.release(dict(resp.reported))
                newest = resp.reported.get(self.core.worker_id, 0)
                if newest > seq:  # the leader holds a newer report of ours (our clock stepped back
                    # since an earlier run's): it takes ours as stale until we number past it
                    log.warning("the leader holds report %d of this worker, past ours (%d); numbering on from it",
                                newest, seq)
                    self.core.report_seq = max(self.core.report_seq, newest + 1)
                self.core.set_watermarks(dict(resp.input_watermarks), dict(resp.dropped) if resp.sends_dropped else None)
                # A routing stream can outlive its master's leadership (a deposed leader that
                # did not die): if the leader's version stays ahead of ours, watch anew.
                behind = resp.routing_version > self.core.routing.version
                self._behind = self._behind + 1 if behind else 0
                if self._behind >= 10:
                    log.warning("routing version %d behind the leader's %d; re-watching",
                                self.core.routing.version, resp.routing_version)
                    self._behind = 0
                    self._watcher.cancel()
                    self._watcher = asyncio.create_task(self._watch())
            if self.ready is not None:  # ready while the lease holds (it lapses when no leader answers)
                await self.ready.set(health.WORKER, self.core.lease_held())
            await asyncio.sleep(interval)

    async def _watch(self) -> None:
        known = 0
        while True:
            try:
                async for routing in self.masters.watch(known):
                    known = routing.version
                    await self.core.apply_routing(routing)
            except grpc.RpcError as e:
                self.masters.follow(e)
            except Exception:
                # A bug applying one routing must not end the watch for good (review N7):
                # log it, and watch anew from the leader's current routing.
                log.exception("applying the routing failed; watching it anew")
            known = 0
            await asyncio.sleep(0.1)


async def drain(core: WorkerCore, masters: AsyncMasterClient, timeout_s: float) -> None:
    """Before closing: have the leader move our primaries to workers that catch up first,
    while we still serve them (a short pause per key range, nothing to wait out). Bounded:
    after ``timeout_s`` we leave anyway (the rest goes to in-sync followers, if any)."""
    if not core.worker_id or not core.lease_valid():
        return
    deadline = asyncio.get_running_loop().time() + timeout_s
    left = -1
    while asyncio.get_running_loop().time() < deadline:
        try:
            resp = await masters.stub().LeaveWorker(pb.LeaveRequest(worker_id=core.worker_id, drain=True, secret=core.secret),
                                                    timeout=2)
        except grpc.RpcError as e:
            masters.follow(e)
            log.info("drain: the leader did not answer (%s)", e.code().name)
        else:
            if resp.primaries != left:
                left = resp.primaries
                log.info("draining: %d primaries left to move", left)
            if left == 0:
                return
        await asyncio.sleep(0.2)
    log.warning("drain did not finish within %.0f s (%d primaries left); leaving anyway", timeout_s, left)
