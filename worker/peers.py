"""A worker's gRPC links to the other workers: deliveries (runtime/links.py: a turn's
deliveries to one worker in one frame of a long-lived ``DeliverStream``), replication to
followers (a turn's commits for one follower worker in one frame of a long-lived
``ReplicateStream``) and snapshots (:class:`Peers`), and the replication channel that adds
the in-sync set kept by the leader (:class:`ReplicaLinks`)."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine
from typing import Any, cast

import grpc

from runtime import delivery
from runtime.client import AsyncMasterClient
from runtime.columns import Columns
from runtime.errors import StaleTokenError
from runtime.links import Channels, DeliveryLinks, FrameStream, Unsent, call_back, settle
from runtime.security import Security
from runtime.wire import millstream_pb2 as pb
from runtime.wire import millstream_pb2_grpc as rpc

log = logging.getLogger(__name__)

REPLICATE_TIMEOUT_S = 10.0  # a replication frame (or call) not answered by then fails: unreachable
# A request, its size, and what takes its answer.
_Replicating = tuple[pb.ReplicateRequest, int, Callable[[pb.ReplicateResponse | None], None]]


def replication_stream(stub: rpc.WorkerStub, open: Callable[[], Any] | None = None
                       ) -> FrameStream[pb.ReplicateManyRequest, pb.ReplicateManyResponse]:
    """A ``ReplicateStream`` to the follower worker of ``stub`` (``open``: how it opens, where
    not on gRPC: :meth:`~runtime.links.Channels.streams`)."""
    return FrameStream(open or stub.ReplicateStream, lambda i, r: pb.ReplicateFrame(id=i, requests=r),
                       lambda a: a.answers, "replication", REPLICATE_TIMEOUT_S)


class Peers:
    """gRPC links to the other workers, for deliveries and replication.

    Deliveries: :class:`~runtime.links.DeliveryLinks`. Commits replicated to one follower
    worker in one turn of the loop (of several tablets) leave together in one frame of the
    ``ReplicateStream`` to it (or, to a worker that has no such stream yet, an older
    version, in one ``ReplicateMany`` call)."""

    def __init__(self, security: Security) -> None:
        self.security = security
        self.channels = Channels(security)
        self.links = DeliveryLinks(self.channels)
        self._replication: dict[str, FrameStream[pb.ReplicateManyRequest, pb.ReplicateManyResponse]] = {}
        self._unary: set[str] = set()  # workers without ReplicateStream (older versions)
        self._replicas: dict[str, list[_Replicating]] = {}
        self._calls: set[asyncio.Task[None]] = set()
        self._closing = False

    async def deliver(self, address: str, computation: str, key_range: int, token: int,
                      cols: Columns, orders: delivery.Orders | None
                      ) -> tuple[int, delivery.Receipt | None]:
        req = pb.DeliverRequest(computation=computation, key_range=key_range, token=token,
                                columns=cols.to_proto(), orders=delivery.to_orders(orders),
                                sender_kind=pb.SENDER_WORKER)
        out = await self.links.post(address, req)
        return out.status, out.receipt

    def _stub(self, address: str) -> rpc.WorkerStub:
        return self.channels.stub(address)

    async def replicate(self, address: str, req: pb.ReplicateRequest) -> pb.ReplicateResponse | None:
        """None: not reachable (or the call failed)."""
        fut: asyncio.Future[pb.ReplicateResponse | None] = asyncio.get_running_loop().create_future()
        self.post(address, req, functools.partial(settle, fut))
        return await fut

    def post(self, address: str, req: pb.ReplicateRequest,
             answered: Callable[[pb.ReplicateResponse | None], None]) -> None:
        """Send ``req`` in this turn's frame to ``address``; ``answered`` takes its answer (None:
        not reachable, or the call failed) as it is read."""
        bundle = self._replicas.setdefault(address, [])
        if not bundle:
            asyncio.get_running_loop().call_soon(self._send_replicas, address)
        bundle.append((req, req.ByteSize(), answered))

    def _send_replicas(self, address: str) -> None:
        """Send the Replicate requests this turn gave ``address``: on its stream at once where
        that needs no wait (their answers are taken as they are read), else from a task."""
        waiting = self._replicas.pop(address, [])
        if self._closing:  # (nothing new starts: close() has cancelled what it will wait for)
            for _, _, then in waiting:
                call_back(then, None)
            return
        for part in delivery.bundles([b[1] for b in waiting]):
            bundle = waiting[part.start:part.stop]
            if address not in self._unary and self._replication_stream(address).post(
                    pb.ReplicateManyRequest(requests=[b[0] for b in bundle]),
                    functools.partial(self._answered, address, bundle)):
                continue
            self._spawn(self._replicate(address, bundle))

    def _spawn(self, call: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(call)
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)

    async def _replicate(self, address: str, bundle: list[_Replicating]) -> None:
        answers: pb.ReplicateManyResponse | grpc.RpcError
        requests = pb.ReplicateManyRequest(requests=[b[0] for b in bundle])
        try:
            if address in self._unary:
                answers = await self._replicate_unary(address, bundle)
            else:
                try:
                    answers = await self._replication_stream(address).send(requests)
                except Unsent:  # its stream broke before it went: a new one, at once (once)
                    answers = await self._replication_stream(address).send(requests)
        except grpc.RpcError as e:
            answers = e
        self._answered(address, bundle, answers)

    def _answered(self, address: str, bundle: list[_Replicating],
                  answers: pb.ReplicateManyResponse | grpc.RpcError) -> None:
        """Hand each request of ``bundle`` its answer, or what became of the frame."""
        got: list[pb.ReplicateResponse | None]
        if isinstance(answers, grpc.RpcError) and self._closing:
            got = [None] * len(bundle)  # (nothing is sent again: the streams are closing)
        elif isinstance(answers, grpc.RpcError):
            code = answers.code()
            if code == grpc.StatusCode.UNIMPLEMENTED and address not in self._unary:
                log.info("worker %s has no replication stream (an older version): replicating to it in calls",
                         address)
                self._unary.add(address)
                self._spawn(self._replicate(address, bundle))
                return
            log.debug("replication to %s failed: %s", address, code)
            if len(bundle) > 1 and code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                # One tablet's copy failing there fails the frame: the others must not wait
                # for it (nor leave their in-sync sets), so each goes alone.
                for b in bundle:
                    self._spawn(self._replicate(address, [b]))
                return
            got = [None] * len(bundle)
        else:
            got = list(answers.answers)
            if len(got) != len(bundle):  # not ours to trust: as unreachable
                log.warning("worker %s answered %d of %d replication requests", address, len(got), len(bundle))
                got = [None] * len(bundle)
        for (_, _, then), answer in zip(bundle, got, strict=True):
            call_back(then, answer)  # (one that fails leaves the others their answers)

    async def _replicate_unary(self, address: str, bundle: list[_Replicating]) -> pb.ReplicateManyResponse:
        stub = self._stub(address)
        if len(bundle) == 1:
            return pb.ReplicateManyResponse(answers=[await stub.Replicate(bundle[0][0], timeout=REPLICATE_TIMEOUT_S)])
        return await stub.ReplicateMany(pb.ReplicateManyRequest(requests=[b[0] for b in bundle]),
                                        timeout=REPLICATE_TIMEOUT_S)

    def _replication_stream(self, address: str) -> FrameStream[pb.ReplicateManyRequest, pb.ReplicateManyResponse]:
        """The replication stream to ``address``: a new one if there is none or it broke."""
        stream = self._replication.get(address)
        if stream is None or stream.broken is not None:
            stream = self._replication[address] = replication_stream(
                self._stub(address), self.channels.streams(address, "ReplicateStream", pb.ReplicateAnswerFrame))
        return stream

    async def snapshot(self, address: str, chunk: pb.SnapshotChunk) -> pb.ReplicateResponse | None:
        try:
            return cast(pb.ReplicateResponse, await self._stub(address).InstallSnapshot(chunk, timeout=60))
        except grpc.RpcError as e:
            log.info("snapshot to %s failed: %s (%s)", address, e.code().name, e.details())
            return None

    async def close(self) -> None:
        self._closing = True
        for t in list(self._calls):
            t.cancel()
        await asyncio.gather(*self._calls, return_exceptions=True)
        await self.links.close()
        for stream in self._replication.values():
            await stream.close()
        await self.channels.close()


class ReplicaLinks:
    """The :class:`~worker.replication.ReplicaChannel` of a worker: followers through
    :class:`Peers`, the in-sync set through the leader."""

    def __init__(self, peers: Peers, masters: AsyncMasterClient) -> None:
        self.peers = peers
        self.masters = masters
        self.secret: Callable[[], str] = lambda: ""  # this worker's, shown with in-sync changes
        self.replicate = peers.replicate
        self.post = peers.post
        self.snapshot = peers.snapshot

    async def update_in_sync(self, req: pb.InSyncRequest) -> tuple[str, ...]:
        req.secret = self.secret()
        try:
            resp = await self.masters.stub().UpdateInSync(req, timeout=self.masters.timeout)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.ABORTED:
                raise StaleTokenError(e.details() or "stale token") from None
            self.masters.follow(e)
            raise
        return tuple(resp.in_sync)
