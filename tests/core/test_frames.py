"""The data plane's transport (runtime/frames.py): delivery and replication streams on a
worker's frames port, through the real servicer, token check and TLS, on an in-process core
(real RocksDB); and the gRPC stream where a worker has no frames port."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from runtime import Record
from runtime.delivery import request
from runtime.frames import FramesServer
from runtime.links import Channels, delivery_stream
from runtime.record import producer_prefix, sequence_id
from runtime.security import Security
from runtime.wire import millstream_pb2 as pb
from runtime.wire import millstream_pb2_grpc as rpc
from tests.certs import make_certs
from tests.core.corekit import make_core
from tests.core.jobs import Collector
from tests.core.test_worker_core import BASE, routing
from worker.core import WorkerCore
from worker.peers import replication_stream
from worker.sender import OK
from worker.server import WorkerServicer

TOKENS = {"worker": "w-secret", "injector": "i-secret", "operator": "o-secret"}


@dataclass
class Served:
    address: str
    servicer: WorkerServicer
    frames: FramesServer
    server_security: Security
    ca: str | None

    def client(self, role: str | None) -> Security:
        return Security(token=TOKENS[role] if role else None, ca=self.ca)

    async def restart_frames(self) -> None:
        """The frames port closes and opens again on another port (a worker restarted)."""
        await self.frames.stop()
        self.frames = _frames_server(self.servicer, self.server_security)
        self.servicer.frames_port = await self.frames.start("127.0.0.1")


def _frames_server(servicer: WorkerServicer, security: Security) -> FramesServer:
    return FramesServer({"DeliverStream": (pb.DeliverFrame, servicer.DeliverStream),
                         "ReplicateStream": (pb.ReplicateFrame, servicer.ReplicateStream)}, security)


@asynccontextmanager
async def _served(core: WorkerCore, tmp: str, tls: bool = False, frames: bool = True) -> AsyncIterator[Served]:
    """The core behind a gRPC server and a frames port, as ``worker/server.py`` serves it."""
    ca = cert = key = None
    if tls:
        ca, cert, key = make_certs(tmp)
    security = Security(cert=cert, key=key, ca=ca, role_tokens=TOKENS)
    server = grpc.aio.server(interceptors=security.server_interceptors())
    servicer = WorkerServicer(core)
    rpc.add_WorkerServicer_to_server(servicer, server)
    creds = security.server_credentials()
    port = server.add_secure_port("127.0.0.1:0", creds) if creds else server.add_insecure_port("127.0.0.1:0")
    frames_server = _frames_server(servicer, security)
    if frames:
        servicer.frames_port = await frames_server.start("127.0.0.1")
    await server.start()
    served = Served(f"127.0.0.1:{port}", servicer, frames_server, security, ca)
    try:
        yield served
    finally:
        await served.frames.stop()
        await server.stop(None)


def _records(producer: str, seqs: range) -> tuple[list[Record], bytes]:
    me = producer_prefix(producer)
    return [Record(b"k%d" % i, b"r%d" % i, BASE + i, sequence_id(me, i)) for i in seqs], me


async def _deliver(channels: Channels, address: str, records: list[Record], me: bytes) -> Any:
    stream = delivery_stream(channels.stub(address), channels.streams(address, "DeliverStream", pb.DeliverAnswerFrame))
    try:
        frame = await stream.send(pb.DeliverManyRequest(deliveries=[
            request("collect", 0, 1, records, {me: (0, 0)}, sender="injector/src")]))
        return frame.answers.answers[0]
    finally:
        await stream.close()


def _collected() -> list[bytes]:
    return sorted(v for n, _, v in Collector.seen if n == "out")


async def _core(tmp: str) -> WorkerCore:
    Collector.seen = []
    return await make_core(tmp, routing(("collect", "tests.core.jobs:Collector", ["in"], [], {"name": "out"})))


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_deliveries_go_on_the_frames_port_and_commit(tmp_path: object, tls: bool) -> None:
    """An injector's delivery stream finds the worker's frames port through its Ping and
    goes there (over TLS when the cluster has it): the records commit, once each, also when
    the same records come again on a second stream."""

    async def main() -> None:
        core = await _core(str(tmp_path))
        async with _served(core, str(tmp_path), tls=tls) as served:
            channels = Channels(served.client("injector"))
            records, me = _records("injector/src", range(1, 4))
            assert (await _deliver(channels, served.address, records, me)).status == OK
            again = await _deliver(channels, served.address, records, me)
            assert (again.status, again.duplicates) == (OK, 3)
            assert served.frames.opened == 2  # both streams went on the frames port
            await channels.close()
        await core.close_all()

    asyncio.run(main())
    assert _collected() == [b"r1", b"r2", b"r3"]


def test_the_frames_port_checks_the_token_and_the_role_as_grpc_does(tmp_path: object) -> None:
    """No token, or another role's token on a replication stream, is refused on the frames
    port with the gRPC server's codes and reasons, before any frame is read; the worker's
    token is answered."""

    async def main() -> None:
        core = await _core(str(tmp_path))
        req = pb.ReplicateRequest(computation="collect", key_range=0, token=1, follower="nobody")
        async with _served(core, str(tmp_path)) as served:
            refusals = {}
            for role in (None, "injector", "operator", "worker"):
                channels = Channels(served.client(role))
                stream = replication_stream(channels.stub(served.address), channels.streams(
                    served.address, "ReplicateStream", pb.ReplicateAnswerFrame))
                try:
                    answers = await stream.send(pb.ReplicateManyRequest(requests=[req]))
                    refusals[role] = [a.status for a in answers.answers]
                except grpc.RpcError as e:
                    refusals[role] = [e.code(), e.details()]
                finally:
                    await stream.close()
                    await channels.close()
            assert refusals[None][0] == grpc.StatusCode.UNAUTHENTICATED
            assert "missing or wrong token" in refusals[None][1]
            for role in ("injector", "operator"):
                assert refusals[role][0] == grpc.StatusCode.PERMISSION_DENIED
                assert "may not call ReplicateStream" in refusals[role][1]
            assert refusals["worker"] == [pb.ReplicateResponse.WRONG_WORKER]
        await core.close_all()

    asyncio.run(main())


def test_a_worker_without_a_frames_port_is_reached_on_grpc(tmp_path: object) -> None:
    """A worker started with ``--data-port off`` (or an older one) answers Ping with port 0:
    its streams go over gRPC, and its records commit all the same."""

    async def main() -> None:
        core = await _core(str(tmp_path))
        async with _served(core, str(tmp_path), frames=False) as served:
            channels = Channels(served.client("injector"))
            records, me = _records("injector/src", range(1, 3))
            assert (await _deliver(channels, served.address, records, me)).status == OK
            assert served.frames.opened == 0
            await channels.close()
        await core.close_all()

    asyncio.run(main())
    assert _collected() == [b"r1", b"r2"]


def test_a_frames_port_that_moved_is_asked_for_again(tmp_path: object) -> None:
    """A worker whose frames port closed and opened elsewhere (restarted on the same gRPC
    address): the next stream finds the old port closed, asks the worker again, and goes to
    the new one; the records commit once each."""

    async def main() -> None:
        core = await _core(str(tmp_path))
        async with _served(core, str(tmp_path)) as served:
            channels = Channels(served.client("injector"))
            records, me = _records("injector/src", range(1, 3))
            assert (await _deliver(channels, served.address, records, me)).status == OK
            await served.restart_frames()
            later, _ = _records("injector/src", range(3, 5))
            assert (await _deliver(channels, served.address, later, me)).status == OK
            assert served.frames.opened == 1  # on the new port, not on gRPC
            await channels.close()
        await core.close_all()

    asyncio.run(main())
    assert _collected() == [b"r1", b"r2", b"r3", b"r4"]


def test_a_frames_port_that_takes_no_connection_sends_the_streams_over_grpc(tmp_path: object) -> None:
    """A worker whose frames port cannot be reached (a firewall, a NAT that maps only its gRPC
    port): what its Ping just said takes no connection, so its streams go over gRPC (with a
    warning) and the records commit; the port is not tried again for a while."""

    async def main() -> None:
        core = await _core(str(tmp_path))
        async with _served(core, str(tmp_path)) as served:
            await served.frames.stop()  # nothing listens on the port the worker names
            channels = Channels(served.client("injector"))
            records, me = _records("injector/src", range(1, 3))
            assert (await _deliver(channels, served.address, records, me)).status == OK
            assert channels.opener is not None
            assert (await channels.opener.port(served.address))[0] == 0  # on gRPC for now
            await channels.close()
        await core.close_all()

    asyncio.run(main())
    assert _collected() == [b"r1", b"r2"]


def test_a_hello_meant_for_another_worker_is_refused(tmp_path: object) -> None:
    """A port reused by another worker of the same host: a stream meant for worker A that
    reaches worker B's frames port is refused (FAILED_PRECONDITION), and the client forgets
    what A said, so its next stream asks A again."""

    async def main() -> None:
        core = await _core(str(tmp_path))
        async with _served(core, str(tmp_path)) as served:
            served.frames.worker_id = lambda: "worker-b"
            channels = Channels(served.client("injector"))
            assert channels.opener is not None

            async def ping(address: str) -> pb.PingResponse:
                return pb.PingResponse(worker_id="worker-a", frames_port=served.servicer.frames_port)

            channels.opener._ping = ping
            records, me = _records("injector/src", range(1, 3))
            with pytest.raises(grpc.RpcError) as refused:
                await _deliver(channels, served.address, records, me)
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "this is worker worker-b, not worker-a" in (refused.value.details() or "")
            assert served.address not in channels.opener._ports  # asked again next time
            await channels.close()
        await core.close_all()

    asyncio.run(main())


def test_a_frames_port_refuses_what_is_not_a_stream_with_a_reason(tmp_path: object) -> None:
    """Bytes that are not a hello, a stream this port does not serve, and a hello longer than a
    hello may be each get an error naming what was wrong (its gRPC status code), and the
    connection is closed; nothing of them is parsed as a frame."""
    import json
    import struct

    served_frames: list[Any] = []

    async def method(frames: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        async for f in frames:
            served_frames.append(f)
            yield pb.DeliverAnswerFrame(id=f.id)

    async def exchange(port: int, data: bytes) -> tuple[str, str]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(data)
        length, kind = struct.unpack(">IB", await reader.readexactly(5))
        doc = json.loads(await reader.readexactly(length))
        assert kind == 4  # ERROR
        assert await reader.read() == b""  # closed after it
        writer.close()
        return doc["code"], doc["details"]

    def message(kind: int, payload: bytes) -> bytes:
        return struct.pack(">IB", len(payload), kind) + payload

    async def main() -> None:
        server = FramesServer({"DeliverStream": (pb.DeliverFrame, method)}, Security())
        port = await server.start("127.0.0.1")
        try:
            code, why = await exchange(port, message(3, b"\x08\x01"))
            assert (code, why) == ("INVALID_ARGUMENT", "a stream starts with its hello")
            hello = json.dumps({"method": "ReplicateStream", "headers": []}).encode()
            code, why = await exchange(port, message(1, hello))
            assert code == "UNIMPLEMENTED" and "ReplicateStream" in why
            # A caller not checked yet gets no more read than a hello may take (64 KiB), not
            # the 64 MiB of a frame.
            code, why = await exchange(port, struct.pack(">IB", (64 << 10) + 1, 1))
            assert code == "RESOURCE_EXHAUSTED" and "65536 B a message may hold" in why
            assert server.opened == 0
        finally:
            await server.stop()

    asyncio.run(main())
    assert served_frames == []
