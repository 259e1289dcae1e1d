"""Replication on a long-lived stream (``Worker.ReplicateStream``, issue 29): a primary
worker's Replicate requests to one follower worker in one turn travel in one frame of one
stream (worker/peers.py), answered out of order within the stream's credit; a follower of an
older version, without the stream, is replicated to in calls."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc

from runtime.security import Security
from runtime.wire import millstream_pb2 as pb
from runtime.wire import millstream_pb2_grpc as rpc
from worker.deliverstream import serve_frames
from worker.peers import Peers

R = pb.ReplicateResponse


def _req(comp: str, index: int) -> pb.ReplicateRequest:
    return pb.ReplicateRequest(computation=comp, key_range=0, token=1,
                               entries=[pb.ReplicaEntry(index=index, ops=b"x" * 100)])


class _Follower(rpc.WorkerServicer):
    """Answers each request OK at its last index; ``hold`` keeps a computation's waiting."""

    def __init__(self, stream: bool = True) -> None:
        self.stream = stream
        self.streams = 0
        self.frames: list[list[str]] = []
        self.unary: list[list[str]] = []
        self.hold: dict[str, asyncio.Event] = {}

    async def _one(self, r: pb.ReplicateRequest) -> pb.ReplicateResponse:
        if r.computation in self.hold:
            await self.hold[r.computation].wait()
        return R(status=R.OK, index=r.entries[-1].index)

    async def ReplicateStream(self, requests: Any, context: Any) -> AsyncIterator[pb.ReplicateAnswerFrame]:
        if not self.stream:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")
        self.streams += 1

        async def handle(frame: pb.ReplicateFrame, size: int, part: Any) -> pb.ReplicateAnswerFrame:
            self.frames.append([r.computation for r in frame.requests.requests])
            answers = await asyncio.gather(*(self._one(r) for r in frame.requests.requests))
            return pb.ReplicateAnswerFrame(id=frame.id, answers=pb.ReplicateManyResponse(answers=answers), credit=size)

        async for answer in serve_frames(requests, context, handle, 1 << 20, pb.ReplicateAnswerFrame):
            yield answer

    async def Replicate(self, request: pb.ReplicateRequest, context: Any) -> pb.ReplicateResponse:
        self.unary.append([request.computation])
        return await self._one(request)

    async def ReplicateMany(self, request: pb.ReplicateManyRequest, context: Any) -> pb.ReplicateManyResponse:
        self.unary.append([r.computation for r in request.requests])
        return pb.ReplicateManyResponse(answers=await asyncio.gather(*(self._one(r) for r in request.requests)))


@asynccontextmanager
async def _server(servicer: rpc.WorkerServicer) -> AsyncIterator[str]:
    server = grpc.aio.server()
    rpc.add_WorkerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


def test_a_turns_commits_to_one_follower_go_in_one_frame_and_are_answered_out_of_order() -> None:
    async def main() -> None:
        follower = _Follower()
        follower.hold["slow"] = asyncio.Event()
        async with _server(follower) as address:
            peers = Peers(Security())
            try:
                # One turn: three tablets' commits, one frame.
                first = await asyncio.gather(*(peers.replicate(address, _req(c, 1)) for c in ("a", "b", "c")))
                assert [a.index for a in first if a is not None] == [1, 1, 1]
                assert follower.frames == [["a", "b", "c"]]
                slow = asyncio.ensure_future(peers.replicate(address, _req("slow", 2)))
                deadline = asyncio.get_running_loop().time() + 10
                while len(follower.frames) < 2:  # its own turn: its own frame
                    assert asyncio.get_running_loop().time() < deadline, "the slow frame never arrived"
                    await asyncio.sleep(0.005)  # poll interval of this deadline-bounded wait
                fast = await peers.replicate(address, _req("fast", 2))
                assert fast is not None and fast.index == 2 and not slow.done(), "answered while the other waits"
                follower.hold["slow"].set()
                assert (await slow) is not None
                assert len(follower.frames) == 3 and follower.unary == []
            finally:
                await peers.close()

    asyncio.run(main())


def test_a_frame_whose_stream_broke_before_it_went_goes_on_a_new_stream_at_once() -> None:
    """A replication frame that never went out (its stream broke while it waited for credit or
    for another frame's write: ``Unsent``) goes on a new stream at once, as a delivery does,
    instead of counting the follower as unreachable for that commit."""
    from runtime.links import Unsent
    from runtime.streams import StreamError

    class _BrokeBeforeSending:
        broken: grpc.RpcError | None = None

        def post(self, payload: Any, then: Any) -> bool:
            return False  # (not at once: send)

        async def send(self, payload: Any) -> Any:
            self.broken = StreamError(grpc.StatusCode.UNAVAILABLE, "the stream broke")
            raise Unsent(grpc.StatusCode.UNAVAILABLE, "the stream broke before the frame went out")

        async def close(self) -> None:
            pass

    async def main() -> None:
        follower = _Follower()
        async with _server(follower) as address:
            peers = Peers(Security())
            peers._replication[address] = _BrokeBeforeSending()  # type: ignore[assignment]
            try:
                answer = await asyncio.wait_for(peers.replicate(address, _req("c", 3)), 5)
                assert answer is not None and (answer.status, answer.index) == (R.OK, 3)
                assert follower.frames == [["c"]] and follower.streams == 1
            finally:
                await peers.close()

    asyncio.run(main())


def test_a_follower_without_the_stream_is_replicated_to_in_calls() -> None:
    async def main() -> None:
        follower = _Follower(stream=False)
        async with _server(follower) as address:
            peers = Peers(Security())
            try:
                answers = await asyncio.gather(*(peers.replicate(address, _req(c, 5)) for c in ("a", "b")))
                assert [a.index for a in answers if a is not None] == [5, 5]
                assert (await peers.replicate(address, _req("c", 6))) is not None
                assert follower.unary == [["a", "b"], ["c"]] and follower.frames == []
            finally:
                await peers.close()

    asyncio.run(main())


def test_a_follower_gone_is_unreachable_and_the_stream_reconnects() -> None:
    async def main() -> None:
        peers = Peers(Security())
        try:
            follower = _Follower()
            async with _server(follower) as address:
                assert (await peers.replicate(address, _req("a", 1))) is not None
            assert (await peers.replicate(address, _req("a", 2))) is None  # nobody there
            again = _Follower()
            server = grpc.aio.server()
            rpc.add_WorkerServicer_to_server(again, server)
            server.add_insecure_port(address)
            await server.start()
            try:
                # Its channel backs off after the failed attempt: retried, as the replicator does.
                deadline = asyncio.get_running_loop().time() + 20
                while (await peers.replicate(address, _req("a", 2))) is None:
                    assert asyncio.get_running_loop().time() < deadline, "never reconnected"
                    await asyncio.sleep(0.05)  # the retry's back-off
                assert again.frames == [["a"]] and again.streams == 1
            finally:
                await server.stop(None)
        finally:
            await peers.close()

    asyncio.run(main())


def test_one_request_whose_taker_fails_leaves_the_frames_others_their_answers() -> None:
    """Review of the callbacks: an exception in one tablet's taking of its answer stopped the
    frame's other answers from being handed out (their links waited for ever)."""
    async def main() -> None:
        peers = Peers(Security())
        got: list[Any] = []

        def fails(answer: Any) -> None:
            raise RuntimeError("a bug in one taker")

        bundle = [(_req("a", 1), 1, fails), (_req("b", 2), 1, got.append)]
        peers._answered("w:1", bundle, pb.ReplicateManyResponse(answers=[R(status=R.OK, index=1),
                                                                          R(status=R.OK, index=2)]))
        assert [a.index for a in got] == [2]
        await peers.close()

    asyncio.run(main())
