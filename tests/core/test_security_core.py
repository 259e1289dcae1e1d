"""What a caller's role lets it do to a worker's dedup data, through the real gRPC token check
and the worker's servicer, on an in-process core (real RocksDB)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest

from runtime import Record
from runtime.delivery import request
from runtime.record import producer_prefix, sequence_id
from runtime.security import Security
from runtime.wire import millstream_pb2 as pb
from runtime.wire import millstream_pb2_grpc as rpc
from tests.core.corekit import make_core
from tests.core.jobs import Collector
from tests.core.test_worker_core import BASE, routing
from worker.core import WorkerCore
from worker.sender import OK
from worker.server import WorkerServicer

TOKENS = {"worker": "w-secret", "injector": "i-secret", "operator": "o-secret"}
LAST_SEQ = (1 << 64) - 1


@asynccontextmanager
async def _served(core: WorkerCore) -> AsyncIterator[Callable[[str], rpc.WorkerStub]]:
    """The core behind a real server that checks role tokens; yields a stub maker per role."""
    server = grpc.aio.server(interceptors=Security(role_tokens=TOKENS).server_interceptors())
    rpc.add_WorkerServicer_to_server(WorkerServicer(core), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channels: list[grpc.aio.Channel] = []

    def stub(role: str) -> rpc.WorkerStub:
        channels.append(Security(token=TOKENS[role]).aio_channel(f"127.0.0.1:{port}"))
        return rpc.WorkerStub(channels[-1])

    try:
        yield stub
    finally:
        for ch in channels:
            await ch.close()
        await server.stop(None)


def _outputs() -> list[bytes]:
    return [v for n, _, v in Collector.seen if n == "out"]


def test_n4_an_injector_cannot_black_hole_a_tablets_output_at_its_readers(tmp_path: object) -> None:
    """Review N4: one record ``P||2**64-1`` of producer tablet P, sent with the injector's
    token, used to set P's mark at its reader to the last sequence, so every real record of P
    then read as a duplicate. It is refused (PERMISSION_DENIED), and P's records commit."""

    async def main() -> None:
        core = await make_core(str(tmp_path), routing(
            ("echo", "tests.core.jobs:Echo", ["in"], ["out"], {}),
            ("collect", "tests.core.jobs:Collector", ["out"], [], {"name": "out"})))
        echo = core.tablets[("echo", 0)].prefix  # the producer the collector hears from
        forged = request("collect", 0, 1, [Record(b"k", b"forged", BASE, sequence_id(echo, LAST_SEQ))],
                         {echo: (0, 0)}, sender="injector/mallory")
        async with _served(core) as stub:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub("injector").Deliver(forged)
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "only the worker role sends its records" in (refused.value.details() or "")
            # The operator's token is no worker's either.
            with pytest.raises(grpc.aio.AioRpcError, match="producer inside the cluster"):
                await stub("operator").Deliver(forged)
            # The real producer's records, through its input: each reaches the collector.
            me = producer_prefix("injector/src")
            real = [Record(b"k%d" % i, b"real %d" % i, BASE + i, sequence_id(me, i)) for i in (1, 2, 3)]
            answer = await stub("injector").Deliver(request("echo", 0, 1, real, {me: (0, 0)}, "injector/src"))
            assert answer.status == OK
            deadline = asyncio.get_running_loop().time() + 10
            while len(_outputs()) < 3 and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.01)  # poll interval of this deadline-bounded wait
        assert sorted(_outputs()) == [b"real 1", b"real 2", b"real 3"]
        assert core.tablets[("collect", 0)].store.marks()[echo].seq == 3
        await core.close_all()

    asyncio.run(main())


def test_n4_a_tablets_mark_set_under_no_token_gives_way_to_its_owner(tmp_path: object) -> None:
    """A tablet producer's mark written under token 0 (by an injector, before the role check
    existed) is not a mark any owner set: the first delivery under a real token starts it
    again instead of reading every record as a duplicate."""
    from runtime.record import worker_producer

    p = worker_producer(producer_prefix("tablet\x00up/0"))

    def from_p(seq: int) -> Record:
        return Record(b"k", b"r%d" % seq, BASE + seq, sequence_id(p, seq))

    async def main() -> None:
        core = await make_core(str(tmp_path), routing(
            ("collect", "tests.core.jobs:Collector", ["in"], [], {"name": "out"})))
        assert await core.deliver("collect", 0, 1, [from_p(LAST_SEQ)], {p: (0, 0)}) == OK  # the old hole
        Collector.seen = []
        assert await core.deliver("collect", 0, 1, [from_p(1), from_p(2)], {p: (0, 3)}) == OK
        mark = core.tablets[("collect", 0)].store.marks()[p]
        assert (mark.seq, mark.token) == (2, 3)
        await core.close_all()

    asyncio.run(main())
    assert _outputs() == [b"r1", b"r2"]


def test_n4_holds_on_a_delivery_stream_for_every_frame_of_an_injectors_stream(tmp_path: object) -> None:
    """The roles of a ``DeliverStream`` are the stream's token's, checked once when it opens
    and applied to each frame as to a call: an injector's frame naming a tablet producer is
    refused (PERMISSION_DENIED) and the stream goes on; the same frame from a worker is taken."""
    from runtime.delivery import Status, answered
    from runtime.links import delivery_stream
    from runtime.record import worker_producer
    from runtime.streams import StreamError

    async def main() -> None:
        core = await make_core(str(tmp_path), routing(
            ("echo", "tests.core.jobs:Echo", ["in"], ["out"], {}),
            ("collect", "tests.core.jobs:Collector", ["out"], [], {"name": "out"})))
        echo = core.tablets[("echo", 0)].prefix
        forged = request("collect", 0, 1, [Record(b"k", b"forged", BASE, sequence_id(echo, LAST_SEQ))],
                         {echo: (0, 0)}, sender="injector/mallory")
        me = producer_prefix("injector/src")
        real = request("echo", 0, 1, [Record(b"k", b"real", BASE, sequence_id(me, 1))], {me: (0, 0)},
                       "injector/src")
        async with _served(core) as stub:
            injector = delivery_stream(stub("injector"))
            with pytest.raises(StreamError, match="only the worker role sends its records") as refused:
                await injector.send(pb.DeliverManyRequest(deliveries=[forged]))
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
            both = await injector.send(pb.DeliverManyRequest(deliveries=[real]))  # the same stream goes on
            assert [answered(a).status for a in both.answers] == [Status.OK]
            assert injector.broken is None
            await injector.close()
            worker = delivery_stream(stub("worker"))
            up = worker_producer(producer_prefix("tablet\x00up/0"))  # another producer's tablet
            own = request("collect", 0, 1, [Record(b"k", b"own", BASE, sequence_id(up, 1))], {up: (0, 1)},
                          sender="up")
            taken = await worker.send(pb.DeliverManyRequest(deliveries=[own]))
            assert [answered(a).status for a in taken.answers] == [Status.OK]
            await worker.close()
            deadline = asyncio.get_running_loop().time() + 10
            while len(_outputs()) < 2 and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.01)  # poll interval of this deadline-bounded wait
        assert sorted(_outputs()) == [b"own", b"real"]
        await core.close_all()

    asyncio.run(main())


def test_replication_streams_and_bundles_are_the_worker_roles_only(tmp_path: object) -> None:
    """``ReplicateStream`` (issue 29) and ``ReplicateMany`` carry commits to followers: another
    role's token is refused (``ReplicateMany`` was missing from the role table, so any token
    could call it); a worker's stream is answered, frame by frame."""
    from runtime.links import FrameStream
    from worker.peers import replication_stream

    async def main() -> None:
        core = await make_core(str(tmp_path), routing(("echo", "tests.core.jobs:Echo", ["in"], ["out"], {})))
        req = pb.ReplicateRequest(computation="echo", key_range=0, token=1, follower="nobody")
        async with _served(core) as stub:
            for role in ("injector", "operator"):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub(role).ReplicateMany(pb.ReplicateManyRequest(requests=[req]))
                assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
                stream: FrameStream[Any, Any] = replication_stream(stub(role))
                with pytest.raises(grpc.RpcError) as broken:
                    await stream.send(pb.ReplicateManyRequest(requests=[req]))
                assert broken.value.code() == grpc.StatusCode.PERMISSION_DENIED
                await stream.close()
            worker = replication_stream(stub("worker"))
            answers = await worker.send(pb.ReplicateManyRequest(requests=[req, req]))
            assert [a.status for a in answers.answers] == [pb.ReplicateResponse.WRONG_WORKER] * 2
            await worker.close()
        await core.close_all()

    asyncio.run(main())
