"""The worker daemon: a thin gRPC layer over :class:`~worker.core.WorkerCore` (its session
with the master is worker/session.py)."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import os
import shutil
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, cast

import grpc

from runtime import delivery, health, http, metrics, serving, streams
from runtime.client import AsyncMasterClient
from runtime.columns import Columns, MalformedColumns, of_request
from runtime.durable import sync_dir
from runtime.errors import ConfigError
from runtime.faults import Faults
from runtime.frames import FramesServer
from runtime.imports import CodePolicy
from runtime.security import REQUIRED, Owner, Security, caller_owner, caller_roles, require_worker_token
from runtime.wire import millstream_pb2 as pb
from runtime.wire import millstream_pb2_grpc as rpc
from worker.chunks import checkpoint_chunks
from worker.core import WorkerCore, WorkerLimits
from worker.dedup import delivery_problem, outside_problem
from worker.deliverstream import serve_frames
from worker.owners import owned
from worker.peers import Peers, ReplicaLinks
from worker.replica import write_at
from worker.session import MasterSession, drain
from worker.statedir import claim_state_dir

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerOptions:
    masters: tuple[str, ...]
    listen: str
    state_dir: str
    metrics_listen: str | None = None
    limits: WorkerLimits = WorkerLimits()
    advertise: str | None = None
    security: Security = Security()
    code_policy: CodePolicy = CodePolicy()
    zone: str = ""
    health_listen: str | None = None  # the health service alone, in plaintext (runtime/health.py)
    require_injector_credentials: bool = False  # refuse records from callers without one (review N4)
    metrics_token: str | None = field(default=None, repr=False)  # /metrics asks for it (runtime/http.py)
    metrics_tls: bool = False  # /metrics over HTTPS, with the worker's certificate
    # The port of the data plane's transport (runtime/frames.py) on the listen host: 0, one the
    # OS chooses; None, none (deliveries and replication to this worker stay on gRPC).
    data_port: int | None = 0

    def __post_init__(self) -> None:
        require_worker_token(self.require_injector_credentials, self.security)
        http.check_token(self.metrics_token, "--metrics-token")
        if self.metrics_tls:
            self.security.https_context("--metrics-tls")  # (refused now, with its reason, not once serving)


def _caller() -> tuple[bool, Owner | None]:
    """Whether the caller holds the worker role, and what its injector credential proved."""
    worker = "worker" in caller_roles()
    return worker, None if worker else caller_owner()


class WorkerServicer(rpc.WorkerServicer):
    frames_port = 0  # where its streams are also served (runtime/frames.py; set by serve()); 0: nowhere

    def __init__(self, core: WorkerCore, stream_credit: int = streams.STREAM_CREDIT_BYTES,
                 require_credentials: bool = False) -> None:
        self.core = core
        self.stream_credit = stream_credit  # each delivery stream's grant, in bytes of frames
        # Refuse records from callers outside the worker role that showed no injector credential.
        self.require_credentials = require_credentials

    async def Deliver(self, request: pb.DeliverRequest, context: Any) -> pb.DeliverResponse:
        worker, owner = _caller()
        try:
            admitted = await self._admit([request], worker, owner)
        except streams.StreamError as e:
            await context.abort(e.code(), e.details())
            raise
        metrics.DELIVER_CALLS.labels("unary").inc()
        outside = delivery.from_outside(request, worker)
        metrics.DELIVERIES_PER_CALL.labels("injector" if outside else "worker").observe(1)
        return await self._deliver(*admitted[0], worker)

    async def DeliverMany(self, request: pb.DeliverManyRequest, context: Any) -> pb.DeliverManyResponse:
        """Every delivery is checked before any is handed over (one refused refuses the call,
        so none of it is committed), then all go to their tablets at once: their batches run
        side by side on the tablets' threads (worker/runner.py)."""
        worker, owner = _caller()
        try:
            return await self._deliver_many(request, worker, owner)
        except streams.StreamError as e:
            await context.abort(e.code(), e.details())
            raise

    async def DeliverStream(self, request_iterator: AsyncIterator[pb.DeliverFrame],
                            context: Any) -> AsyncIterator[pb.DeliverAnswerFrame]:
        """Deliveries on one long-lived stream (runtime/streams.py): each frame is handled as
        a DeliverMany call by the same caller would be, side by side with the others, and
        answered when done (with ``answer_each``, each delivery as soon as it is done, so a
        slow tablet holds back only its own); a refused frame is answered with its status code."""
        worker, owner = _caller()  # the stream's credentials, checked once, hold for every frame

        async def handle(frame: pb.DeliverFrame, size: int,
                         part: Callable[[pb.DeliverAnswerFrame], None]) -> pb.DeliverAnswerFrame:
            try:
                admitted = await self._admit_many(frame.deliveries, worker, owner, "frame")
            except streams.StreamError as e:
                return streams.refused(frame.id, size, e.code(), e.details())
            pending = {asyncio.ensure_future(self._deliver(*a, worker)): i for i, a in enumerate(admitted)}
            if not pending:
                return pb.DeliverAnswerFrame(id=frame.id, answers=pb.DeliverManyResponse())
            try:
                while True:  # with answer_each, each delivery's answer as soon as it is done
                    done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED
                                                 if frame.answer_each else asyncio.ALL_COMPLETED)
                    ready = sorted((pending.pop(t), t.result()) for t in done)
                    answer = pb.DeliverAnswerFrame(id=frame.id, answers=pb.DeliverManyResponse(
                        answers=[a for _, a in ready]), indexes=[i for i, _ in ready] if frame.answer_each else ())
                    if not pending:
                        return answer  # (its credit: the rest of the frame's, serve_frames')
                    answer.more = True
                    if frame.credit_each:  # these deliveries' bytes of the grant go back now
                        deliveries = frame.deliveries.deliveries
                        answer.credit = sum(deliveries[i].ByteSize() for i, _ in ready)
                    part(answer)
            finally:
                for t in pending:
                    t.cancel()

        async for answer in serve_frames(request_iterator, context, handle, self.stream_credit):
            yield answer

    async def _deliver_many(self, request: pb.DeliverManyRequest, worker: bool, owner: Owner | None,
                            ) -> pb.DeliverManyResponse:
        admitted = await self._admit_many(request, worker, owner, "unary")
        answers = await asyncio.gather(*(self._deliver(*a, worker) for a in admitted))
        return pb.DeliverManyResponse(answers=answers)

    async def _admit_many(self, request: pb.DeliverManyRequest, worker: bool, owner: Owner | None,
                          carrier: str) -> list[tuple[pb.DeliverRequest, Columns, Any]]:
        """:meth:`_admit` of a call's or a frame's deliveries, counted in the metrics."""
        admitted = await self._admit(request.deliveries, worker, owner)
        metrics.DELIVER_CALLS.labels(carrier).inc()
        if admitted:
            outside = delivery.from_outside(admitted[0][0], worker)
            metrics.DELIVERIES_PER_CALL.labels("injector" if outside else "worker").observe(len(admitted))
        return admitted

    async def _admit(self, requests: Any, worker: bool,
                     owner: Owner | None = None) -> list[tuple[pb.DeliverRequest, Columns, Any]]:
        """Each request with its records (as columns: rows from older senders are turned into
        columns) and producer orders, once all are valid; raises
        :class:`~runtime.streams.StreamError` with what is wrong otherwise (the call is
        aborted with it, a stream's frame refused). ``worker``: whether the caller holds the
        worker role. A producer token fences older owners of a producing tablet: only a
        worker may name one, never an injector's credentials (review S3); nor send a
        tablet's records (N4). ``owner``: the name the caller's injector credential proved;
        its producers are kept apart from everyone else's (worker/owners.py, N4)."""
        if not worker and owner is None and self.require_credentials and requests:
            raise streams.StreamError(grpc.StatusCode.PERMISSION_DENIED, REQUIRED)
        out = []
        injected = False
        for request in requests:
            orders = {o.producer: (o.after, o.token if worker else 0) for o in request.orders} or None
            try:
                records = of_request(request)
            except MalformedColumns as e:
                raise streams.StreamError(grpc.StatusCode.INVALID_ARGUMENT, f"delivery to {request.computation}/"
                                          f"{request.key_range} refused: {e}") from None
            problem = delivery_problem(records.ids or [], orders)
            if problem is not None:
                raise streams.StreamError(grpc.StatusCode.INVALID_ARGUMENT, f"delivery to {request.computation}/"
                                          f"{request.key_range} refused: {problem}")
            problem = None if worker else outside_problem(orders)
            if problem is not None:
                raise streams.StreamError(grpc.StatusCode.PERMISSION_DENIED, f"delivery to {request.computation}/"
                                          f"{request.key_range} refused: {problem}")
            if delivery.from_outside(request, worker):
                injected = True
                closed = self.core.routing.closed_to_input(request.computation)
                if closed:
                    raise streams.StreamError(grpc.StatusCode.FAILED_PRECONDITION, closed)
            if owner is not None:
                records, orders = owned(owner, records, orders)
            out.append((request, records, orders))
        delay = self.core.faults.injector_delay_s() if injected else 0
        if delay:
            await asyncio.sleep(delay)  # the fault hook's network round trip (tests, benchmarks)
        return out

    async def _deliver(self, request: pb.DeliverRequest, records: Columns, orders: Any,
                       worker: bool) -> pb.DeliverResponse:
        if delivery.from_outside(request, worker):
            route = self.core.routing.computations.get(request.computation)
            if route is not None and route.input_paused:  # a savepoint is being taken: retry soon
                return pb.DeliverResponse(status=cast(Any, delivery.Status.BUSY),
                                          routing_version=self.core.routing.version)
        status, duplicates = await self.core.deliver_counted(request.computation, request.key_range,
                                                             request.token, records, orders,
                                                             delivery.from_outside(request, worker))
        wid, seq = self.core.receipt()
        return pb.DeliverResponse(status=cast(Any, status),  # an int of DeliverResponse.Status
                                  worker_id=wid, report_seq=seq, routing_version=self.core.routing.version,
                                  duplicates=duplicates)

    async def ReadState(self, request: pb.ReadStateRequest, context: Any) -> pb.ReadStateResponse:
        found, states = await serving.call_core(context, lambda: self.core.read_state(
            request.computation, request.key_range, request.token, request.key, request.state))
        return pb.ReadStateResponse(found=found is not None, value=found or b"", token=request.token, states=states)

    async def Checkpoint(self, request: pb.CheckpointRequest, context: Any) -> AsyncIterator[pb.SnapshotChunk]:
        path, index = await serving.call_core(context, lambda: self.core.checkpoint(
            request.computation, request.key_range, request.token))
        try:
            base = pb.SnapshotChunk(computation=request.computation, key_range=request.key_range,
                                    token=request.token, index=index)
            async for chunk in checkpoint_chunks(path, base):
                yield chunk
            base.done = True
            yield base
        finally:
            await asyncio.to_thread(shutil.rmtree, path, True)

    async def LoadTablet(self, request_iterator: AsyncIterator[pb.SnapshotChunk],
                         context: Any) -> pb.ReplicateResponse:
        incoming = os.path.join(self.core.state_dir, ".incoming", uuid.uuid4().hex)
        target = ""
        try:
            async for chunk in request_iterator:
                if not target:
                    target = await serving.call_core(context, functools.partial(
                        self.core.loadable, chunk.computation, chunk.key_range, chunk.token))
                if chunk.done:
                    wrong = await asyncio.to_thread(_differs, incoming, chunk.files)
                    if wrong:
                        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"tablet {chunk.computation}/"
                                            f"{chunk.key_range}: {wrong}; nothing was installed")
                    await asyncio.to_thread(_install, incoming, target)
                    return pb.ReplicateResponse(status=pb.ReplicateResponse.OK)
                if not _plain_name(chunk.file):
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad file name {chunk.file[:80]!r}")
                await asyncio.to_thread(os.makedirs, incoming, exist_ok=True)
                await asyncio.to_thread(write_at, os.path.join(incoming, chunk.file), chunk.offset, chunk.data)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the tablet's files ended without a last chunk")
        finally:
            await asyncio.to_thread(shutil.rmtree, incoming, True)
        raise AssertionError("unreachable")

    async def Ping(self, request: pb.PingRequest, context: Any) -> pb.PingResponse:
        return pb.PingResponse(worker_id=self.core.worker_id, frames_port=self.frames_port)

    async def Replicate(self, request: pb.ReplicateRequest, context: Any) -> pb.ReplicateResponse:
        metrics.REPLICAS_PER_CALL.observe(1)
        metrics.REPLICATE_CALLS.labels("unary").inc()
        return await self.core.replicas.replicate(request)

    async def ReplicateMany(self, request: pb.ReplicateManyRequest, context: Any) -> pb.ReplicateManyResponse:
        """Several tablets' commits from one primary worker, applied together
        (worker/replica.py); one that raises fails the call, and the sender sends each alone."""
        metrics.REPLICAS_PER_CALL.observe(len(request.requests))
        metrics.REPLICATE_CALLS.labels("unary").inc()
        answers = await self.core.replicas.replicate_many(request.requests)
        return pb.ReplicateManyResponse(answers=answers)

    async def ReplicateStream(self, request_iterator: AsyncIterator[pb.ReplicateFrame],
                              context: Any) -> AsyncIterator[pb.ReplicateAnswerFrame]:
        """Replication on one long-lived stream (runtime/streams.py): each frame is handled as
        a ReplicateMany call would be, side by side with the others, and answered when done."""

        async def handle(frame: pb.ReplicateFrame, size: int, part: Any) -> pb.ReplicateAnswerFrame:
            metrics.REPLICAS_PER_CALL.observe(len(frame.requests.requests))
            metrics.REPLICATE_CALLS.labels("frame").inc()
            answers = await self.core.replicas.replicate_many(frame.requests.requests)
            return pb.ReplicateAnswerFrame(id=frame.id, answers=pb.ReplicateManyResponse(answers=answers))

        async for answer in serve_frames(request_iterator, context, handle, self.stream_credit,
                                         pb.ReplicateAnswerFrame):
            yield answer

    async def InstallSnapshot(self, request: pb.SnapshotChunk, context: Any) -> pb.ReplicateResponse:
        return await self.core.replicas.install(request)


def _differs(incoming: str, files: Any) -> str:
    """What is wrong with the files loaded into ``incoming`` against the list the last chunk
    carries (a savepoint's manifest): "" if they match, or if there is no list (an older client)."""
    if not files:
        return ""
    for f in files:  # (checked first: a name reaching outside ``incoming`` must not be looked at)
        if not _plain_name(f.name):
            return f"its manifest names {f.name[:80]!r}, which is not the name of a file of a tablet"
    arrived = set(os.listdir(incoming)) if os.path.isdir(incoming) else set()
    extra = sorted(arrived - {f.name for f in files})
    if extra:
        return f"its file {extra[0][:80]!r} is not in the savepoint's manifest"
    for f in files:
        path = os.path.join(incoming, f.name)
        try:
            size = os.path.getsize(path)
        except OSError:
            return f"its file {f.name!r} did not arrive"
        if size != f.size:
            return f"its file {f.name!r} has {size} bytes, the savepoint's manifest says {f.size}"
        h = hashlib.sha256()
        with open(path, "rb") as data:
            while block := data.read(4 << 20):
                h.update(block)
        if h.hexdigest() != f.sha256:
            return f"its file {f.name!r} differs from the savepoint's manifest (SHA-256)"
    return ""


def _plain_name(name: str) -> bool:
    """A file name of a tablet's copy as a client may send it: no directory, not hidden."""
    return bool(name) and "/" not in name and "\0" not in name and not name.startswith(".")


def _install(incoming: str, target: str) -> None:
    """Make the loaded files (each synced as written) the tablet's storage, renamed into place."""
    os.makedirs(incoming, exist_ok=True)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if os.path.exists(target):
        shutil.rmtree(target)  # an earlier, interrupted load of the same restore
    os.rename(incoming, target)
    sync_dir(os.path.dirname(target))


async def _reconcile_loop(core: WorkerCore) -> None:
    while True:
        await asyncio.sleep(0.2)
        try:
            await core.reconcile()
        except Exception:  # never the end of the loop: every later pass may open what is assigned
            log.exception("reconcile failed; trying again")


async def serve(options: WorkerOptions, stop: asyncio.Event) -> None:
    identity, lock = claim_state_dir(options.state_dir)
    server = serving.make_server(options.security)
    address = serving.bind(server, options.listen, options.advertise, options.security)
    peers = Peers(options.security)
    masters = AsyncMasterClient(options.masters, security=options.security)
    links = ReplicaLinks(peers, masters)
    core = WorkerCore(options.state_dir, address, peers.deliver, options.limits,
                      code_policy=options.code_policy, channel=links, faults=Faults.from_env(),
                      await_watermarks=True)
    links.secret = lambda: core.secret
    servicer = WorkerServicer(core, require_credentials=options.require_injector_credentials)
    rpc.add_WorkerServicer_to_server(servicer, server)
    ready = health.Health(health.WORKER)
    ready.add_to(server)
    await ready.start()
    frames = FramesServer({"DeliverStream": (pb.DeliverFrame, servicer.DeliverStream),
                           "ReplicateStream": (pb.ReplicateFrame, servicer.ReplicateStream)}, options.security,
                          lambda: core.worker_id)
    if options.data_port is not None:  # the data plane's own transport, before anyone can ask for it
        try:
            servicer.frames_port = await frames.start(serving.host_of(options.listen), options.data_port)
        except OSError as e:
            raise ConfigError(f"--data-port {options.data_port}: cannot listen on it ({e.strerror or e}); is the "
                              "port taken? pass another, 0 (the OS chooses), or off") from None
    await server.start()
    plain = None
    if options.health_listen:
        plain, health_address = await ready.serve_plain(options.health_listen)
        print(f"millstream worker health service on {health_address}", flush=True)
    print(health.listening_line("worker", address), flush=True)
    scrapes = None
    if options.metrics_listen:
        tls = options.security.https_context("--metrics-tls") if options.metrics_tls else None
        scrapes, metrics_address = await metrics.serve(options.metrics_listen, token=options.metrics_token, ssl=tls)
        print(f"millstream worker metrics on {metrics_address}", flush=True)
    session = MasterSession(core, masters, identity, options.zone, options.state_dir, ready)
    tasks = [asyncio.create_task(session.run()), asyncio.create_task(_reconcile_loop(core))]
    try:
        await stop.wait()
        await drain(core, masters, options.limits.drain_timeout_s)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await core.close_all()  # commits in flight finish; storage locks are released
        if core.worker_id:
            try:  # tell the leader, so our tablets move now rather than after the lease
                await masters.stub().LeaveWorker(pb.LeaveRequest(worker_id=core.worker_id, secret=core.secret), timeout=2)
            except grpc.RpcError as e:
                log.info("could not tell the master we leave (%s); the lease will expire", e.code().name)
        await ready.stop()
        await asyncio.gather(frames.stop(grace_s=0.5), server.stop(grace=0.5))
        if plain is not None:
            await plain.stop(grace=None)
        if scrapes is not None:
            scrapes.close()
        await peers.close()
        await masters.close()
        lock.close()


# How long a thread may hold the GIL while another waits for it: CPython's default, 5 ms.
# Session 8 chose 0.5 ms (a tablet's thread won the GIL back sooner after its fsync); since
# the loop waits for one turn's short calls together, several tablet threads run side by
# side, and forcing the GIL between them every 0.5 ms measured worse under load (W1 three
# stages and one stage at 10,000 rec/s; neutral at one stage 1,000: docs/performance-history.md,
# "Session 12").
SWITCH_INTERVAL_S = 0.005


def main(options: WorkerOptions) -> None:
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    serving.run(lambda stop: serve(options, stop))
