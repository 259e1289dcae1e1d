"""A worker's gRPC links to the other workers: deliveries (several tablets' in one call),
replication to followers and snapshots (:class:`Peers`), and the replication channel that
adds the in-sync set kept by the leader (:class:`ReplicaLinks`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import cast

import grpc

from runtime import delivery
from runtime.client import AsyncMasterClient
from runtime.columns import Columns
from runtime.errors import StaleTokenError
from runtime.security import Security
from runtime.wire import millstream_pb2 as pb
from runtime.wire import millstream_pb2_grpc as rpc

log = logging.getLogger(__name__)


class Peers:
    """gRPC channels to the other workers, for deliveries.

    The deliveries a turn of the event loop makes to one worker (a commit's productions to
    several of its tablets) leave together in one ``DeliverMany`` (up to
    ``delivery.BUNDLE_BYTES``): one call instead of one per tablet, and the receiver runs
    their batches side by side. Commits replicated to one follower worker in one turn (of
    several tablets) leave together the same way, in one ``ReplicateMany``."""

    def __init__(self, security: Security) -> None:
        self.security = security
        self._stubs: dict[str, rpc.WorkerStub] = {}
        self._channels: list[grpc.aio.Channel] = []
        self._warned: set[tuple[str, grpc.StatusCode]] = set()
        self._bundles: dict[str, list[tuple[pb.DeliverRequest, int, asyncio.Future[delivery.Outcome]]]] = {}
        self._replicas: dict[str, list[tuple[pb.ReplicateRequest, int, asyncio.Future[pb.ReplicateResponse | None]]]] = {}
        self._calls: set[asyncio.Task[None]] = set()

    async def deliver(self, address: str, computation: str, key_range: int, token: int,
                      cols: Columns, orders: delivery.Orders | None
                      ) -> tuple[int, delivery.Receipt | None]:
        req = pb.DeliverRequest(computation=computation, key_range=key_range, token=token,
                                columns=cols.to_proto(), orders=delivery.to_orders(orders))
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[delivery.Outcome] = loop.create_future()
        bundle = self._bundles.setdefault(address, [])
        if not bundle:
            loop.call_soon(self._send, address)
        bundle.append((req, req.ByteSize(), fut))
        out = await fut
        return out.status, out.receipt

    def _send(self, address: str) -> None:
        """Send what this turn gave ``address``."""
        waiting = [b for b in self._bundles.pop(address, []) if not b[2].done()]
        for part in delivery.bundles([b[1] for b in waiting]):
            task = asyncio.get_running_loop().create_task(self._call(address, waiting[part.start:part.stop]))
            self._calls.add(task)
            task.add_done_callback(self._calls.discard)

    async def _call(self, address: str, bundle: list[tuple[pb.DeliverRequest, int, asyncio.Future[delivery.Outcome]]]
                    ) -> None:
        stub = self._stub(address)
        try:
            if len(bundle) == 1:
                outs = [delivery.answered(await stub.Deliver(bundle[0][0], timeout=30))]
            else:
                resp = await stub.DeliverMany(pb.DeliverManyRequest(deliveries=[b[0] for b in bundle]), timeout=30)
                outs = [delivery.answered(a) for a in resp.answers]
        except grpc.RpcError as e:
            out = self._failed(address, e)
            if out.refused is not None and len(bundle) > 1:
                # One delivery the receiver refuses for good refuses the call: the others go
                # alone, so only that one waits (it is retried, as any failed delivery).
                for b in bundle:
                    await self._call(address, [b])
                return
            outs = [out] * len(bundle)
        for (_, _, fut), out in zip(bundle, outs, strict=True):
            if not fut.done():
                fut.set_result(out)

    def _failed(self, address: str, e: grpc.RpcError) -> delivery.Outcome:
        code = e.code()
        # Unavailable / deadline: a worker restarting or busy, retried quietly. Anything
        # else (too large, unauthenticated, ...) will not heal by itself: say so, once.
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            log.debug("delivery to %s failed: %s", address, code)
        elif (address, code) not in self._warned:
            self._warned.add((address, code))
            log.warning("delivery to %s failed: %s (%s); retrying", address, code.name, e.details())
        return delivery.failed(e)

    def _stub(self, address: str) -> rpc.WorkerStub:
        stub = self._stubs.get(address)
        if stub is None:
            ch = self.security.aio_channel(address)
            self._channels.append(ch)
            stub = self._stubs[address] = rpc.WorkerStub(ch)
        return stub

    async def replicate(self, address: str, req: pb.ReplicateRequest) -> pb.ReplicateResponse | None:
        """None: not reachable (or the call failed)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[pb.ReplicateResponse | None] = loop.create_future()
        bundle = self._replicas.setdefault(address, [])
        if not bundle:
            loop.call_soon(self._send_replicas, address)
        bundle.append((req, req.ByteSize(), fut))
        return await fut

    def _send_replicas(self, address: str) -> None:
        """Send the Replicate calls this turn gave ``address``."""
        waiting = [b for b in self._replicas.pop(address, []) if not b[2].done()]
        for part in delivery.bundles([b[1] for b in waiting]):
            task = asyncio.get_running_loop().create_task(self._replicate(address, waiting[part.start:part.stop]))
            self._calls.add(task)
            task.add_done_callback(self._calls.discard)

    async def _replicate(self, address: str, bundle: list[tuple[pb.ReplicateRequest, int,
                                                                 asyncio.Future[pb.ReplicateResponse | None]]]
                         ) -> None:
        stub = self._stub(address)
        answers: list[pb.ReplicateResponse | None]
        try:
            if len(bundle) == 1:
                answers = [await stub.Replicate(bundle[0][0], timeout=10)]
            else:
                resp = await stub.ReplicateMany(pb.ReplicateManyRequest(requests=[b[0] for b in bundle]), timeout=10)
                answers = list(resp.answers)
        except grpc.RpcError as e:
            log.debug("replication to %s failed: %s", address, e.code())
            if len(bundle) > 1 and e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                # One tablet's copy failing there fails the call: the others must not wait
                # for it (nor leave their in-sync sets), so each goes alone.
                for b in bundle:
                    await self._replicate(address, [b])
                return
            answers = [None] * len(bundle)
        for (_, _, fut), answer in zip(bundle, answers, strict=True):
            if not fut.done():
                fut.set_result(answer)

    async def snapshot(self, address: str, chunk: pb.SnapshotChunk) -> pb.ReplicateResponse | None:
        try:
            return cast(pb.ReplicateResponse, await self._stub(address).InstallSnapshot(chunk, timeout=60))
        except grpc.RpcError as e:
            log.info("snapshot to %s failed: %s (%s)", address, e.code().name, e.details())
            return None

    async def close(self) -> None:
        for ch in self._channels:
            await ch.close()


class ReplicaLinks:
    """The :class:`~worker.replication.ReplicaChannel` of a worker: followers through
    :class:`Peers`, the in-sync set through the leader."""

    def __init__(self, peers: Peers, masters: AsyncMasterClient) -> None:
        self.peers = peers
        self.masters = masters
        self.secret: Callable[[], str] = lambda: ""  # this worker's, shown with in-sync changes
        self.replicate = peers.replicate
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
