"""A worker's gRPC links to the other workers: deliveries (several tablets' in one frame of
a long-lived stream, :class:`DeliveryStream`), replication to followers and snapshots
(:class:`Peers`), and the replication channel that adds the in-sync set kept by the leader
(:class:`ReplicaLinks`)."""

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
from runtime.streams import FRAME_TIMEOUT_S, SenderWindow, StreamError, refusal
from runtime.wire import millstream_pb2 as pb
from runtime.wire import millstream_pb2_grpc as rpc

log = logging.getLogger(__name__)


class DeliveryStream:
    """One long-lived ``DeliverStream`` to a worker (runtime/streams.py): frames go within the
    credit the worker grants, answers come back in any order, matched by id. Once broken, it
    fails every frame in flight with the stream's error and takes no more (the caller opens
    a new one)."""

    def __init__(self, stub: rpc.WorkerStub) -> None:
        self.window = SenderWindow()
        self.broken: grpc.RpcError | None = None
        self._call = stub.DeliverStream()
        # Each frame's answer, or the stream's error (a result, never raised into a future
        # whose sender may have stopped waiting).
        self._waiting: dict[int, asyncio.Future[pb.DeliverAnswerFrame | grpc.RpcError]] = {}
        self._credit = asyncio.Event()  # set when credit comes back (or the stream breaks)
        self._writing = asyncio.Lock()
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def send(self, deliveries: pb.DeliverManyRequest) -> pb.DeliverManyResponse:
        """The answers to ``deliveries`` as one frame; raises :class:`grpc.RpcError` where a
        ``DeliverMany`` call would: refused, the stream broken, no answer in time."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + FRAME_TIMEOUT_S
        frame, size = self.window.frame(deliveries)
        while self.broken is None and not self.window.fits(size):
            self._credit.clear()
            try:
                await asyncio.wait_for(self._credit.wait(), deadline - loop.time())
            except TimeoutError:
                raise StreamError(grpc.StatusCode.DEADLINE_EXCEEDED, "no credit on the delivery stream "
                                  f"within {FRAME_TIMEOUT_S:.0f} s") from None
        if self.broken is not None:
            raise self.broken
        self.window.sent(frame.id, size)
        answer = self._waiting[frame.id] = loop.create_future()
        try:
            async with self._writing:
                await self._call.write(frame)
        except (grpc.RpcError, asyncio.InvalidStateError) as e:
            self._break(e if isinstance(e, grpc.RpcError) else StreamError(grpc.StatusCode.UNAVAILABLE, str(e)))
        try:
            done = await asyncio.wait_for(asyncio.shield(answer), deadline - loop.time())
        except TimeoutError:
            self._waiting.pop(frame.id, None)
            raise StreamError(grpc.StatusCode.DEADLINE_EXCEEDED, f"no answer within {FRAME_TIMEOUT_S:.0f} s"
                              ) from None
        if isinstance(done, grpc.RpcError):
            raise done
        refused = refusal(done)
        if refused is not None:
            raise refused
        return done.answers

    async def _read(self) -> None:
        error: grpc.RpcError
        try:
            while True:
                answer = await self._call.read()
                if answer is grpc.aio.EOF:
                    error = StreamError(grpc.StatusCode.UNAVAILABLE, "the worker ended the delivery stream")
                    break
                self.window.answered(answer)
                self._credit.set()
                waiter = self._waiting.pop(answer.id, None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(answer)
        except grpc.RpcError as e:
            error = e
        except ValueError as e:  # an answer to no frame of ours: this stream cannot be trusted
            error = StreamError(grpc.StatusCode.INTERNAL, str(e))
        self._break(error)

    def _break(self, error: grpc.RpcError) -> None:
        if self.broken is None:
            self.broken = error
        self._call.cancel()
        self._credit.set()
        waiting, self._waiting = self._waiting, {}
        for waiter in waiting.values():
            if not waiter.done():
                waiter.set_result(self.broken)

    async def close(self) -> None:
        self._break(StreamError(grpc.StatusCode.CANCELLED, "the delivery stream was closed"))
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)


class Peers:
    """gRPC channels to the other workers, for deliveries.

    The deliveries a turn of the event loop makes to one worker (a commit's productions to
    several of its tablets) leave together in one frame (up to ``delivery.BUNDLE_BYTES``) of
    the :class:`DeliveryStream` to that worker: one frame instead of a call per tablet, and
    the receiver runs their batches side by side. Commits replicated to one follower worker
    in one turn (of several tablets) leave together in one ``ReplicateMany``."""

    def __init__(self, security: Security) -> None:
        self.security = security
        self._stubs: dict[str, rpc.WorkerStub] = {}
        self._streams: dict[str, DeliveryStream] = {}
        self._channels: list[grpc.aio.Channel] = []
        self._warned: set[tuple[str, grpc.StatusCode]] = set()
        self._bundles: dict[str, list[tuple[pb.DeliverRequest, int, asyncio.Future[delivery.Outcome]]]] = {}
        self._replicas: dict[str, list[tuple[pb.ReplicateRequest, int, asyncio.Future[pb.ReplicateResponse | None]]]] = {}
        self._calls: set[asyncio.Task[None]] = set()

    async def deliver(self, address: str, computation: str, key_range: int, token: int,
                      cols: Columns, orders: delivery.Orders | None
                      ) -> tuple[int, delivery.Receipt | None]:
        req = pb.DeliverRequest(computation=computation, key_range=key_range, token=token,
                                columns=cols.to_proto(), orders=delivery.to_orders(orders),
                                sender_kind=pb.SENDER_WORKER)
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
        try:
            resp = await self._stream(address).send(pb.DeliverManyRequest(deliveries=[b[0] for b in bundle]))
            outs = [delivery.answered(a) for a in resp.answers]
        except grpc.RpcError as e:
            out = self._failed(address, e)
            if out.refused is not None and len(bundle) > 1:
                # One delivery the receiver refuses for good refuses the frame: the others go
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

    def _stream(self, address: str) -> DeliveryStream:
        """The stream to ``address``: a new one if there is none or it broke."""
        stream = self._streams.get(address)
        if stream is None or stream.broken is not None:
            stream = self._streams[address] = DeliveryStream(self._stub(address))
        return stream

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
        for stream in self._streams.values():
            await stream.close()
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
