"""The data plane's client end (runtime/frames.py is its wire format and its server end): which
transport a process's stream to a worker takes, and the stream itself.

Which transport a stream takes is the client's to find (:class:`Opener`): a worker's ``Ping``
names its frames port (0: it has none: started with ``--data-port off``, or older). The answer
is kept until a connection to that port fails or is refused before it is taken (the worker
restarted, perhaps on another port: asked again), and a "none" for :data:`FALLBACK_S`. A
port that a fresh answer names and that takes no connection (a firewall, a NAT that maps only
the gRPC port) sends that worker's streams over gRPC for :data:`FALLBACK_S`, with a warning:
gRPC's own errors then say whether the worker is reachable at all.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from runtime.frames import (
    DRAIN_TIMEOUT_S,
    END,
    ERROR,
    HELLO,
    HIGH_WATER,
    MESSAGE,
    READY,
    Broken,
    pack,
    raised,
    read_message,
    tune,
    write_nowait,
)
from runtime.security import Security
from runtime.serving import host_of
from runtime.streams import StreamError
from runtime.wire import millstream_pb2 as pb

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5.0  # a frames port that does not take a connection: unreachable
FALLBACK_S = 60.0  # how long a worker's streams stay on gRPC before its frames port is asked for again

_UNREACHABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)


class Opener:
    """Which transport the streams of one process to each worker take (the module's doc):
    ``ping(address)`` asks a worker for its frames port."""

    def __init__(self, security: Security, ping: Callable[[str], Awaitable[pb.PingResponse]],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.security = security
        self._ping = ping
        self._clock = clock
        # address -> the answer (port, worker id), asked or being asked; and until when a
        # "none" holds (an address on gRPC for now)
        self._ports: dict[str, asyncio.Future[tuple[int, str]]] = {}
        self._grpc_until: dict[str, float] = {}
        self._ssl = security.client_ssl_context()

    def stream(self, address: str, method: str, answer: type[Any], grpc_call: Callable[[], Any]) -> FramesCall:
        """A stream of ``method`` to the worker at ``address``, opened on first use."""
        return FramesCall(self, address, method, answer, grpc_call)

    async def port(self, address: str) -> tuple[int, str, bool]:
        """(``address``'s frames port, 0 for none; its worker id; whether it was asked just now)."""
        if self._clock() < self._grpc_until.get(address, 0.0):
            return 0, "", False
        fut = self._ports.get(address)
        fresh = fut is None
        if fut is None:
            fut = self._ports[address] = asyncio.get_running_loop().create_task(self._ask(address))
        try:
            port, worker = await asyncio.shield(fut)
        except BaseException:
            if self._ports.get(address) is fut and fut.done():
                del self._ports[address]
            raise
        if port == 0:
            self.on_grpc(address)
        return port, worker, fresh

    async def _ask(self, address: str) -> tuple[int, str]:
        try:
            answer = await self._ping(address)
        except grpc.RpcError as e:
            if e.code() in _UNREACHABLE:
                raise  # as a stream to it would fail now
            # Refused or failed there (an older worker, a bug): its gRPC streams answer for themselves.
            log.debug("worker %s did not say where its frames port is (%s): its streams go over gRPC",
                      address, e.code().name)
            return 0, ""
        return int(answer.frames_port), str(answer.worker_id)

    def forget(self, address: str) -> None:
        """What ``address`` said is not to be trusted any more: ask it again next time."""
        self._ports.pop(address, None)

    def on_grpc(self, address: str, why: str = "") -> None:
        """``address``'s streams go over gRPC for :data:`FALLBACK_S` (then it is asked again)."""
        if why and self._clock() >= self._grpc_until.get(address, 0.0):
            log.warning("worker %s: %s; its deliveries and replication go over gRPC for %.0f s (slower: "
                        "let its --data-port through, or start it with --data-port off)", address, why, FALLBACK_S)
        self._grpc_until[address] = self._clock() + FALLBACK_S
        self._ports.pop(address, None)

    async def connect(self, address: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        host = host_of(address)
        reader, writer = await asyncio.wait_for(asyncio.open_connection(
            host, port, ssl=self._ssl, server_hostname=host if self._ssl is not None else None), CONNECT_TIMEOUT_S)
        tune(writer)
        return reader, writer


class FramesCall:
    """One stream to a worker, with the calls :class:`~runtime.links.FrameStream` makes of a
    gRPC stream (``write``, ``read``, ``cancel``): on the worker's frames port, or, where it
    has none (or it cannot be reached), on the gRPC stream itself. Connects at its first call."""

    def __init__(self, opener: Opener, address: str, method: str, answer: type[Any],
                 grpc_call: Callable[[], Any]) -> None:
        self._opener = opener
        self._address = address
        self._method = method
        self._answer = answer
        self._grpc_call = grpc_call
        self._grpc: Any = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._opening: asyncio.Task[None] | None = None
        self._cancelled = False
        self._taken = False  # the server answered the hello

    async def _open(self) -> None:
        if self._opening is None:
            self._opening = asyncio.get_running_loop().create_task(self._connect())
        try:
            await asyncio.shield(self._opening)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # our caller's
            raise StreamError(grpc.StatusCode.CANCELLED, "the stream was cancelled") from None

    async def _connect(self) -> None:
        opener, address = self._opener, self._address
        try:
            port, worker, fresh = await opener.port(address)
            while port:
                try:
                    reader, writer = await opener.connect(address, port)
                    break
                except (OSError, TimeoutError) as e:
                    opener.forget(address)
                    if fresh:  # the port it named just now takes no connection
                        opener.on_grpc(address, f"its frames port {port} takes no connection ({e!r})")
                        port = 0
                    else:  # it may have restarted elsewhere: ask again
                        port, worker, fresh = await opener.port(address)
        except grpc.RpcError as e:
            raise StreamError(e.code(), e.details() or "the worker did not answer") from None
        if self._cancelled:
            raise StreamError(grpc.StatusCode.CANCELLED, "the stream was cancelled")
        if not port:
            self._grpc = self._grpc_call()
            return
        self._reader, self._writer = reader, writer
        hello = {"method": self._method, "worker": worker, "headers": self._opener.security.headers()}
        writer.write(pack(HELLO, json.dumps(hello).encode()))

    def _broke(self, why: str) -> StreamError:
        return StreamError(grpc.StatusCode.UNAVAILABLE, f"the connection to {self._address} broke ({why})")

    async def _next(self) -> tuple[int, bytes]:
        assert self._reader is not None
        try:
            got = await read_message(self._reader)
        except (ConnectionError, Broken) as e:
            raise self._broke(str(e) or type(e).__name__) from None
        return (END, b"") if got is None else got  # (closed between messages: the stream's end)

    async def write(self, message: Any) -> None:
        await self._open()
        if self._grpc is not None:
            await self._grpc.write(message)
            return
        writer = self._writer
        assert writer is not None
        if writer.is_closing():
            raise self._broke("closed")
        writer.write(pack(MESSAGE, message.SerializeToString()))
        if writer.transport.get_write_buffer_size() > HIGH_WATER:
            try:
                await asyncio.wait_for(writer.drain(), DRAIN_TIMEOUT_S)
            except ConnectionError as e:
                raise self._broke(repr(e)) from None
            except TimeoutError:
                raise self._broke(f"the worker read nothing for {DRAIN_TIMEOUT_S:.0f} s") from None

    def write_nowait(self, message: Any) -> bool:
        """:meth:`write`, where it needs no wait: the connection on the frames port open, its
        buffer below the high-water mark. False: not written (:meth:`write` it)."""
        return self._writer is not None and write_nowait(self._writer, message)

    async def read(self) -> Any:
        await self._open()
        if self._grpc is not None:
            return await self._grpc.read()
        kind, payload = await self._next()
        if not self._taken:  # the server's answer to the hello comes first
            if kind != READY:  # refused, or closed: what the worker said may be stale
                self._opener.forget(self._address)
                if kind == END:
                    raise self._broke("closed before it took the stream")
            else:
                self._taken = True
                kind, payload = await self._next()
        if kind == MESSAGE:
            try:
                return self._answer.FromString(payload)
            except DecodeError:
                return None  # (as grpc.aio's read of an answer it cannot parse: FrameStream says so)
        if kind == ERROR:
            raise raised(payload)
        if kind == END:
            return grpc.aio.EOF
        raise StreamError(grpc.StatusCode.INTERNAL, f"a message of unknown kind {kind} from {self._address}")

    async def done_writing(self) -> None:
        await self._open()
        if self._grpc is not None:
            await self._grpc.done_writing()
        elif self._writer is not None and not self._writer.is_closing():
            self._writer.write(pack(END, b""))

    def cancel(self) -> bool:
        self._cancelled = True
        if self._grpc is not None:
            return bool(self._grpc.cancel())
        if self._writer is not None:
            self._writer.transport.abort()  # (buffered frames dropped: close() would wait to send them)
        if self._opening is not None and not self._opening.done():
            self._opening.cancel()
        return True
