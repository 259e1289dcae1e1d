"""CPU per delivery round trip, unary ``DeliverMany`` against one ``DeliverStream`` frame, as
each sender makes them: blocking gRPC, a worker's ``grpc.aio`` (runtime/links.py), and an
injector's blocking caller handing the frame to its delivery loop's stream (a thread of its
own, injectors/tablets.py). The receiver is a server in a child process that answers at once
(the real frame loop, ``worker/deliverstream.py``, without tablets), so the figures are the
transport's alone, each end's CPU apart::

    python -m bench.deliver_rtt [ROUND_TRIPS]      # 3,000 by default, a few seconds

Beside the gRPC stream it measures the same stream on the data plane's own transport
(runtime/frames.py, a worker's ``--data-port``: length-prefixed messages on a connection of
their own), without and with TLS (the gRPC stream is measured with TLS too); both ends are the
runtime's own (``FrameStream``, ``serve_frames``), so the difference is the transport's. TLS needs ``openssl``
(a throwaway CA and certificate for 127.0.0.1); without it those lines are skipped.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import uvloop

from runtime import delivery, serving
from runtime.frames import FramesServer
from runtime.framesclient import Opener
from runtime.links import delivery_stream
from runtime.record import Record
from runtime.security import Security
from runtime.streams import STREAM_CREDIT_BYTES
from runtime.wire import millstream_pb2 as pb
from runtime.wire import millstream_pb2_grpc as rpc
from worker.deliverstream import serve_frames


def _answers(req: pb.DeliverManyRequest) -> pb.DeliverManyResponse:
    return pb.DeliverManyResponse(answers=[pb.DeliverResponse(status=pb.DeliverResponse.OK, worker_id="w",
                                                              report_seq=1) for _ in req.deliveries])


class _Echo(rpc.WorkerServicer):
    async def DeliverMany(self, request: pb.DeliverManyRequest, context: Any) -> pb.DeliverManyResponse:
        return _answers(request)

    async def DeliverStream(self, requests: Any, context: Any) -> AsyncIterator[pb.DeliverAnswerFrame]:
        async def handle(frame: pb.DeliverFrame, size: int, part: Any) -> pb.DeliverAnswerFrame:
            return pb.DeliverAnswerFrame(id=frame.id, credit=size, answers=_answers(frame.deliveries))

        async for answer in serve_frames(requests, context, handle, STREAM_CREDIT_BYTES):
            yield answer


async def _serve(certs: str | None) -> None:
    """gRPC and frames servers (runtime/frames.py), plain and (with ``certs``) TLS; prints
    their ports as JSON."""
    server = serving.make_server()
    echo = _Echo()
    rpc.add_WorkerServicer_to_server(echo, server)
    ports: dict[str, int] = {"grpc": server.add_insecure_port("127.0.0.1:0")}
    frames = {"DeliverStream": (pb.DeliverFrame, echo.DeliverStream)}
    ports["frames"] = await FramesServer(frames, Security()).start("127.0.0.1")
    if certs is not None:
        key, cert = (_read(os.path.join(certs, n)) for n in ("srv.key", "srv.pem"))
        ports["grpc_tls"] = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([(key, cert)]))
        tls = Security(cert=os.path.join(certs, "srv.pem"), key=os.path.join(certs, "srv.key"))
        ports["frames_tls"] = await FramesServer(frames, tls).start("127.0.0.1")
    await server.start()
    print(json.dumps(ports), flush=True)
    await server.wait_for_termination()


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _certs(d: str) -> str | None:
    """A throwaway CA (``ca.pem``) and a certificate for 127.0.0.1 it signed (``srv.pem``,
    ``srv.key``) in ``d``; None without ``openssl``."""
    if shutil.which("openssl") is None:
        return None
    with open(os.path.join(d, "ext.cnf"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\n")
    for args in (["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
                  "-days", "1", "-subj", "/CN=deliver_rtt CA"],
                 ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", "srv.key", "-out", "srv.csr", "-subj",
                  "/CN=127.0.0.1"],
                 ["x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                  "-out", "srv.pem", "-days", "1", "-extfile", "ext.cnf"]):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)
    return d


def _cpu_s(pid: int | None = None) -> float:
    if pid is None:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return ru.ru_utime + ru.ru_stime
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _sample(server: int) -> tuple[float, float, float]:
    """(this process's CPU, the receiver's CPU, wall clock), in seconds."""
    return _cpu_s(), _cpu_s(server), time.perf_counter()


def _line(name: str, n: int, before: tuple[float, float, float], after: tuple[float, float, float]) -> None:
    sender, receiver, wall = (1e6 * (b - a) / n for a, b in zip(before, after, strict=True))
    print(f"{name:16s} {wall:5.0f} us wall, CPU {sender:4.0f} us sender + {receiver:4.0f} us receiver "
          f"= {sender + receiver:4.0f} us")


def main(n: int) -> None:
    tmp = tempfile.mkdtemp(prefix="deliver-rtt-")
    child = None
    try:
        certs = _certs(tmp)
        child = subprocess.Popen([sys.executable, "-m", "bench.deliver_rtt", "--serve", *([certs] if certs else [])],
                                 stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None
        ports = json.loads(child.stdout.readline())
        address = f"127.0.0.1:{ports['grpc']}"
        # One round of W1: two tablets' deliveries of 50 small records to one worker.
        records = [Record(b"k%d" % i, b"v" * 20, 1, bytes(16)) for i in range(50)]
        req = pb.DeliverManyRequest(deliveries=[delivery.request("c", r, 1, records) for r in range(2)])
        print(f"load average {os.getloadavg()}; {n} sequential round trips of one DeliverMany "
              f"({req.ByteSize()} B) each")
        channel = Security().channel(address)
        stub = rpc.WorkerStub(channel)
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()

        async def open_stream() -> Any:
            ch = Security().aio_channel(address)
            return ch, delivery_stream(rpc.WorkerStub(ch))

        ch, stream = asyncio.run_coroutine_threadsafe(open_stream(), loop).result(30)
        def handed() -> None:
            """As an injector's round: handed to the loop, the caller woken by an event."""
            done = threading.Event()
            loop.call_soon_threadsafe(lambda: loop.create_task(stream.send(req)).add_done_callback(
                lambda _: done.set()))
            done.wait(30)

        for name, once in (("blocking unary", lambda: stub.DeliverMany(req, timeout=30)),
                           ("injector's loop", handed)):
            for _ in range(200):
                once()
            before = _sample(child.pid)
            for _ in range(n):
                once()
            _line(name, n, before, _sample(child.pid))
        asyncio.run_coroutine_threadsafe(stream.close(), loop).result(30)
        asyncio.run_coroutine_threadsafe(ch.close(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        channel.close()
        uvloop.run(_aio(address, req, n, child.pid))
        uvloop.run(_aio_frames(ports, certs, req, n, child.pid))
        if certs is None:
            print("TLS lines skipped: no openssl to make a certificate with")
    finally:
        if child is not None:
            child.kill()
            child.wait()
        shutil.rmtree(tmp, ignore_errors=True)


async def _aio(address: str, req: pb.DeliverManyRequest, n: int, server: int) -> None:
    channel = Security().aio_channel(address)
    stub = rpc.WorkerStub(channel)
    stream = delivery_stream(stub)
    for name, once in (("asyncio unary", lambda: stub.DeliverMany(req, timeout=30)),
                       ("asyncio stream", lambda: stream.send(req))):
        await _times(once, 200)
        before = _sample(server)
        await _times(once, n)
        _line(name, n, before, _sample(server))
    await stream.close()
    await channel.close()


async def _aio_frames(ports: dict[str, int], certs: str | None, req: pb.DeliverManyRequest, n: int,
                      server: int) -> None:
    """The gRPC stream over TLS, then the same stream on the data plane's transport
    (runtime/frames.py: a worker's ``--data-port``), plain and TLS."""
    ca = os.path.join(certs, "ca.pem") if certs is not None else None
    if ca is not None:
        channel = Security(ca=ca).aio_channel(f"127.0.0.1:{ports['grpc_tls']}")
        stream = delivery_stream(rpc.WorkerStub(channel))
        await _times(lambda: stream.send(req), 200)
        before = _sample(server)
        await _times(lambda: stream.send(req), n)
        _line("stream, TLS", n, before, _sample(server))
        await stream.close()
        await channel.close()
    for name, port, security in (("frames", ports["frames"], Security()),
                                 ("frames, TLS", ports.get("frames_tls"), Security(ca=ca))):
        if port is None or (name.endswith("TLS") and ca is None):
            continue
        channel = security.aio_channel(f"127.0.0.1:{ports['grpc']}")
        stub = rpc.WorkerStub(channel)

        async def ping(address: str, port: int = port) -> pb.PingResponse:
            return pb.PingResponse(frames_port=port)  # (this echo server's Ping knows no frames port)

        opener = Opener(security, ping)
        stream = delivery_stream(stub, functools.partial(opener.stream, "127.0.0.1:1", "DeliverStream",
                                                         pb.DeliverAnswerFrame, stub.DeliverStream))
        once = functools.partial(stream.send, req)
        try:
            await _times(once, 200)
            before = _sample(server)
            await _times(once, n)
            _line(name, n, before, _sample(server))
        finally:
            await stream.close()
            await channel.close()


async def _times(once: Callable[[], Awaitable[Any]], n: int) -> None:
    for _ in range(n):
        await once()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        uvloop.run(_serve(sys.argv[2] if len(sys.argv) > 2 else None))
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 3000)
