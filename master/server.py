"""The master daemon: a thin gRPC layer over :class:`~master.core.MasterCore`, plus leadership."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, cast

import grpc

from master import lifecycle, membership, reshard, savepoints, web
from master.config import MasterConfig
from master.core import MasterCore
from master.image import UnknownWorkerError
from master.store import EtcdConfig, EtcdStore, NotLeaderError
from master.views import StatusDocument
from runtime import health, http, metrics, serving
from runtime.client import NOT_LEADER_METADATA
from runtime.errors import EtcdUnavailableError, WorkerIdentityError
from runtime.keyspace import wire_end
from runtime.security import Security, caller_owner, caller_roles, report_problem, require_worker_token
from runtime.wire import millstream_pb2 as pb
from runtime.wire import millstream_pb2_grpc as rpc

log = logging.getLogger(__name__)
# How often the leader re-reads the masters list that status shows (S7: not per request).
MASTERS_REFRESH_MS = 2000.0


@dataclass(frozen=True)
class MasterOptions:
    etcd: EtcdConfig
    listen: str
    config: MasterConfig = MasterConfig()
    advertise: str | None = None
    http_listen: str | None = None
    security: Security = Security()
    health_listen: str | None = None  # the health service alone, in plaintext (runtime/health.py)
    require_injector_credentials: bool = False  # reports from injectors only with one (review N4)
    http_token: str | None = field(default=None, repr=False)  # the console asks for it (master/web.py)
    http_tls: bool = False  # the console over HTTPS, with the master's certificate

    def __post_init__(self) -> None:
        require_worker_token(self.require_injector_credentials, self.security)
        http.check_token(self.http_token, "--http-token")
        if self.http_tls:
            self.security.https_context()  # (refused now, with its reason, not once serving)


async def _async(fn: Any, *args: Any) -> Any:
    return fn(*args)


class MasterServicer(rpc.MasterServicer):
    def __init__(self, master: Master, require_credentials: bool = False) -> None:
        self.m = master
        self.require_credentials = require_credentials  # injectors' reports only with a credential

    async def _leader(self, context: grpc.aio.ServicerContext) -> MasterCore:
        core = self.m.core
        if core is not None and not self.m.leadership_confirmed():
            # Our etcd lease may have lapsed: another master may lead. Acknowledge nothing
            # (above all, no worker heartbeats) until etcd confirms it again.
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "no leader elected yet (leadership not confirmed with etcd)",
                                trailing_metadata=((NOT_LEADER_METADATA, ""),))
        if core is None:
            leader = self.m.leader_address or ""
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"not the leader; the leader is at {leader}" if leader else "no leader elected yet",
                trailing_metadata=((NOT_LEADER_METADATA, leader),),
            )
        assert core is not None
        return core

    async def Submit(self, request: pb.SubmitRequest, context: Any) -> pb.SubmitResponse:
        core = await self._leader(context)
        name, n = await serving.call_core(context, lambda: lifecycle.submit(core, request.topology_json))
        return pb.SubmitResponse(name=name, tablets=n)

    async def Update(self, request: pb.UpdateRequest, context: Any) -> pb.UpdateResponse:
        core = await self._leader(context)
        summary = await serving.call_core(context, lambda: lifecycle.update(
            core, request.topology_json, request.drop_state, list(request.reset_state)))
        return pb.UpdateResponse(summary_json=json.dumps(summary))

    async def Drain(self, request: pb.JobRequest, context: Any) -> pb.JobResponse:
        core = await self._leader(context)
        job = await serving.call_core(context, lambda: lifecycle.drain(core, request.topology))
        return pb.JobResponse(state=job.state)

    async def Savepoint(self, request: pb.SavepointRequest, context: Any) -> pb.SavepointResponse:
        core = await self._leader(context)
        if request.renew:
            await serving.call_core(context, lambda: savepoints.savepoint_renew(
                core, request.topology, request.savepoint_id))
            return pb.SavepointResponse(savepoint_id=request.savepoint_id)
        if request.end:
            await serving.call_core(context, lambda: savepoints.savepoint_end(
                core, request.topology, request.savepoint_id, request.verify))
            return pb.SavepointResponse(savepoint_id=request.savepoint_id)
        return await serving.call_core(context, lambda: savepoints.savepoint_begin(
            core, request.topology, request.timeout_s or 60.0))

    async def Restore(self, request: pb.RestoreRequest, context: Any) -> pb.RestoreResponse:
        core = await self._leader(context)
        if request.commit:
            await serving.call_core(context, lambda: savepoints.restore_commit(core, request.name))
            return pb.RestoreResponse(name=request.name)
        try:
            manifest = json.loads(request.manifest_json)
        except ValueError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the savepoint manifest is not JSON ({e})")
        return await serving.call_core(context, lambda: savepoints.restore_begin(
            core, manifest, request.name or str(manifest.get("job", ""))))

    async def Cancel(self, request: pb.JobRequest, context: Any) -> pb.JobResponse:
        core = await self._leader(context)
        job = await serving.call_core(context, lambda: lifecycle.cancel(core, request.topology,
                                                                        request.keep_state))
        return pb.JobResponse(state=job.state, detail="state kept" if job.kept else "state deleted")

    async def RegisterWorker(self, request: pb.RegisterWorkerRequest, context: Any) -> pb.RegisterWorkerResponse:
        core = await self._leader(context)
        wid, secret = await serving.call_core(context, lambda: membership.register(
            core, request.address, request.worker_id, request.zone, request.secret, list(request.allowed_code)))
        return pb.RegisterWorkerResponse(worker_id=wid, lease_ms=core.config.lease_ms, secret=secret)

    async def Heartbeat(self, request: pb.HeartbeatRequest, context: Any) -> pb.HeartbeatResponse:
        core = await self._leader(context)
        try:
            membership.authenticate(core.image, request.worker_id, request.secret)
        except WorkerIdentityError as e:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(e))
        try:
            watermarks = core.heartbeat(request.worker_id, list(request.tablets), request.report_seq,
                                        list(request.problems), request.routing_version)
        except UnknownWorkerError:
            return pb.HeartbeatResponse(known=False, routing_version=core.version)
        dropped = core.image.dropped  # read with the watermarks: no await between
        return pb.HeartbeatResponse(known=True, routing_version=core.version, input_watermarks=watermarks,
                                    lease_ms=core.config.lease_ms, reported=core.reported(), sends_dropped=True,
                                    dropped={c: dropped[c] for c in watermarks if c in dropped})

    async def LeaveWorker(self, request: pb.LeaveRequest, context: Any) -> pb.LeaveResponse:
        core = await self._leader(context)
        await serving.call_core(context, lambda: _async(membership.authenticate, core.image, request.worker_id,
                                                        request.secret))
        if request.drain:
            left = await serving.call_core(context, lambda: membership.drain(core, request.worker_id))
            return pb.LeaveResponse(primaries=left)
        await serving.call_core(context, lambda: membership.leave(core, request.worker_id))
        return pb.LeaveResponse()

    async def ReportInjector(self, request: pb.InjectorReport, context: Any) -> pb.InjectorResponse:
        problem = report_problem(caller_owner(), request.name, self.require_credentials,
                                 "operator" in caller_roles())
        if problem is not None:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, problem)
        core = await self._leader(context)
        await serving.call_core(context, lambda: core.report_injector_between_ticks(
            request.name, request.stream, request.watermark, request.incarnation,
            request.release, "operator" in caller_roles(), request.idle, request.retired))
        return pb.InjectorResponse(reported=core.reported())

    async def GetRouting(self, request: pb.RoutingRequest, context: Any) -> pb.Routing:
        return (await self._leader(context)).routing()

    async def WatchRouting(self, request: pb.RoutingRequest, context: Any) -> AsyncIterator[pb.Routing]:
        core = await self._leader(context)
        async for routing in core.watch(request.known_version):
            if self.m.core is not core:
                return  # leadership lost: the client reconnects to the new leader
            yield routing

    async def Status(self, request: pb.StatusRequest, context: Any) -> pb.StatusResponse:
        await self._leader(context)
        doc = await self.m._status_doc()
        if doc is None:  # lost leadership meanwhile: the client retries elsewhere
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no leader elected yet",
                                trailing_metadata=((NOT_LEADER_METADATA, ""),))
        return pb.StatusResponse(json=json.dumps(doc))

    async def UpdateInSync(self, request: pb.InSyncRequest, context: Any) -> pb.InSyncResponse:
        core = await self._leader(context)
        if not request.primary:  # (no name: no secret to check, and no primary to check it against)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "an in-sync change names the primary asking it")
        await serving.call_core(context, lambda: _async(membership.authenticate, core.image, request.primary,
                                                        request.secret))
        in_sync = await serving.call_core(context, lambda: core.update_in_sync(
            request.computation, request.key_range, request.token, request.follower, request.add,
            request.primary))
        return pb.InSyncResponse(in_sync=in_sync)

    async def MoveTablet(self, request: pb.MoveTabletRequest, context: Any) -> pb.MoveTabletResponse:
        core = await self._leader(context)
        token = await serving.call_core(
            context, lambda: core.move(request.computation, request.key_range, request.worker))
        return pb.MoveTabletResponse(token=token)

    async def Split(self, request: pb.SplitRequest, context: Any) -> pb.ReshardResponse:
        core = await self._leader(context)
        views = await serving.call_core(context, lambda: reshard.split(
            core, request.computation, request.key_range, request.at if request.has_at else None))
        return _ranges(views)

    async def Merge(self, request: pb.MergeRequest, context: Any) -> pb.ReshardResponse:
        core = await self._leader(context)
        views = await serving.call_core(context, lambda: reshard.merge(
            core, request.computation, request.left, request.right))
        return _ranges(views)


def _ranges(views: list[reshard.RangeView]) -> pb.ReshardResponse:
    return pb.ReshardResponse(ranges=[pb.RangeInfo(key_range=v.key_range, start=v.start, end=wire_end(v.end),
                                                   worker_id=v.worker, token=v.token) for v in views])


class Master:
    """One master process: campaigns for leadership, serves while leading."""

    def __init__(self, options: MasterOptions) -> None:
        self.options = options
        self.store = EtcdStore(options.etcd)
        self.identity = uuid.uuid4().hex[:12]
        self.address = ""
        self.core: MasterCore | None = None
        self.leader_address: str | None = None
        self.sure_until = 0.0  # monotonic ms until which our leadership is certain
        self._refreshed_at = float("-inf")  # monotonic ms of the last confirmed keep-alive
        self._masters_cache: list[str] = []  # addresses of all masters, as last read by the leader
        self._autoscaled_at = -1e18
        self._masters_read_at = -math.inf

    async def run(self, stop: asyncio.Event) -> None:
        await asyncio.to_thread(self.store.check)
        server = serving.make_server(self.options.security)
        rpc.add_MasterServicer_to_server(MasterServicer(self, self.options.require_injector_credentials), server)
        ready = health.Health(health.MASTER)
        ready.add_to(server)
        self.address = serving.bind(server, self.options.listen, self.options.advertise,
                                    self.options.security)
        await ready.start()
        await server.start()
        plain = None
        if self.options.health_listen:
            plain, health_address = await ready.serve_plain(self.options.health_listen)
            print(f"millstream master health service on {health_address}", flush=True)
        http = None
        if self.options.http_listen:
            tls = self.options.security.https_context() if self.options.http_tls else None
            http, http_address = await web.serve(self.options.http_listen, self._status_json,
                                                 token=self.options.http_token, ssl=tls)
            scheme = "https" if tls is not None else "http"
            print(f"millstream master web page and /metrics on {scheme}://{http_address}/", flush=True)
        await ready.set(health.MASTER, True)  # it serves: leading, or sending clients to the leader
        print(health.listening_line("master", self.address), flush=True)
        tasks = [asyncio.create_task(self._lead()), asyncio.create_task(stop.wait())]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                t.result()
        finally:
            for t in tasks:
                t.cancel()
            await ready.stop()
            await server.stop(grace=0.5)
            if plain is not None:
                await plain.stop(grace=None)
            if http is not None:
                http.close()
            await asyncio.to_thread(self.store.resign)

    async def _status_doc(self) -> StatusDocument | None:
        core = self.core
        if core is None:
            return None
        doc = core.status()
        # From the cache the leader loop refreshes: a flood of /status.json requests must
        # not queue etcd reads ahead of the lease keep-alive on the shared executor (S7).
        doc["masters"] = {"leader": self.address, "leader_id": self.identity,
                          "all": sorted({*self._masters_cache, self.address})}
        return doc

    async def _status_json(self) -> dict[str, Any] | None:
        """The status document as /status.json serves it (plain JSON objects)."""
        return cast("dict[str, Any] | None", await self._status_doc())

    def leadership_confirmed(self) -> bool:
        return time.monotonic() * 1000 < self.sure_until

    def _step_down(self, why: object) -> None:
        if self.core is not None:
            log.warning("master %s stops leading: %s", self.identity, why)
            self.core.shutdown()
        self.core = None
        self.sure_until = 0.0
        self._refreshed_at = float("-inf")
        metrics.LEADER.set(0)

    async def _lead(self) -> None:
        cfg = self.options.config
        # Shorter than the workers' trust in their lease (0.8 x lease_ms), so a failover does
        # not fence every worker; etcd grants at least 2 s.
        ttl_s = max(2, math.ceil(cfg.lease_ms / 2000))
        while True:
            try:
                t0 = time.monotonic() * 1000
                if self.core is None:
                    won = await asyncio.to_thread(
                        self.store.campaign, {"id": self.identity, "address": self.address}, ttl_s)
                    if won:
                        core = MasterCore(self.store, cfg, lambda: time.monotonic() * 1000)
                        await core.become_leader()
                        self.core = core
                        metrics.LEADER.set(1)
                        log.info("master %s leads at %s", self.identity, self.address)
                    else:
                        leader = await asyncio.to_thread(self.store.leader)
                        self.leader_address = leader["address"] if leader else None
                # A keep-alive is a gRPC stream and a thread in the etcd client: every tick
                # (50 ms) it cost a tenth of a core on an idle cluster. A quarter of the TTL
                # keeps leadership certain (sure_until stays ahead of now by >= 0.55 TTL).
                if t0 - self._refreshed_at >= ttl_s * 1000 / 4 or self.core is None:
                    if not await asyncio.to_thread(self.store.keep_alive):
                        raise NotLeaderError("lease expired")
                    self._refreshed_at = t0
                    # Confirmed: etcd cannot expire our lease before t0 + ttl; keep a margin.
                    self.sure_until = t0 + ttl_s * 1000 * 0.8
                if self.core is not None:
                    await self.core.tick()
                    await lifecycle.advance(self.core)
                    if t0 - self._autoscaled_at >= 1000:
                        self._autoscaled_at = t0
                        reshard.autoscale(self.core)
                    if t0 - self._masters_read_at >= MASTERS_REFRESH_MS:
                        masters = await asyncio.to_thread(self.store.masters)
                        self._masters_cache = sorted(m["address"] for m in masters)
                        self._masters_read_at = t0
            except NotLeaderError as e:
                self._step_down(e)
            except EtcdUnavailableError as e:
                log.error("%s", e)
                self._step_down(e)
            except Exception as e:
                # Any other failure (etcd refusing a write: too large, out of space; a bug)
                # costs leadership, never the process: step down, and campaign again after a
                # pause, reading everything afresh from etcd (review S5, B41).
                log.exception("leader tick failed; stepping down")
                self._step_down(e)
                await asyncio.sleep(1.0)
            await asyncio.sleep(cfg.tick_ms / 1000)


def main(options: MasterOptions) -> None:
    serving.run(Master(options).run)
