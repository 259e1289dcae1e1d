"""The data plane's transport: a worker's delivery and replication streams as length-prefixed
messages on a TCP connection of their own (TLS when configured), beside the gRPC server, which
keeps the control plane (issue 29, item 2; docs/architecture.md, "The data plane's transport").

Why: a message on a ``grpc.aio`` stream crosses gRPC's own threads and its poller before the
event loop sees it. Traced on an idle machine (docs/performance-history.md), each of W1's four
one-way trips (injector to worker, primary to follower and back, worker to injector) took
0.4-0.7 ms, half of a round; the same frames on a connection of their own take a tenth of that.

The streams above are unchanged (runtime/streams.py: frames within a credit, answers by id,
runtime/links.py's :class:`~runtime.links.FrameStream` and worker/deliverstream.py's
``serve_frames``); only what carries their messages is. A connection carries one stream:

    [4-byte length][1-byte kind][payload]

- ``HELLO`` (client first): the method (``DeliverStream``, ``ReplicateStream``) and the
  headers a gRPC call would carry (the token, an injector's credential), checked as the gRPC
  server's interceptor checks them (runtime/security.py);
- ``READY``: the server took the stream;
- ``MESSAGE``: a frame, or an answer (the protobuf message, encoded);
- ``ERROR``: the server refused or ended the stream (a status code's name and its details),
  raised at the client as the gRPC call would raise it;
- ``END``: the client has no more frames (a gRPC stream's half close).

Which transport a stream takes is the client's to find: a worker's ``Ping`` names its frames
port (0: it has none, an older worker or one started without); :class:`Opener` asks once per
address and keeps the answer until a connection to that port fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import grpc

from runtime.errors import MillstreamError
from runtime.security import Refusal, Security, acting_as
from runtime.streams import StreamError
from runtime.wire import millstream_pb2 as pb

log = logging.getLogger(__name__)

HELLO, READY, MESSAGE, ERROR, END = 1, 2, 3, 4, 5
_HEAD = struct.Struct(">IB")
MAX_MESSAGE_BYTES = 64 << 20  # as gRPC's limit on a message (runtime/wire CHANNEL_OPTIONS)
HELLO_TIMEOUT_S = 10.0  # a connection that says nothing is closed after this long
CONNECT_TIMEOUT_S = 5.0  # a worker's frames port that does not take a connection: unreachable
_HIGH_WATER = 256 << 10  # bytes waiting in a connection's buffer before a writer waits for room

SERVICE = "/millstream.v1.Worker/"

# A stream's server side: the servicer's method (``WorkerServicer.DeliverStream``), given the
# frames and a context whose ``abort`` ends the stream with a status code.
StreamMethod = Callable[[AsyncIterator[Any], Any], AsyncIterator[Any]]


def _pack(kind: int, payload: bytes) -> bytes:
    return _HEAD.pack(len(payload), kind) + payload


async def _read(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """The next message; :class:`asyncio.IncompleteReadError` at the connection's end."""
    length, kind = _HEAD.unpack(await reader.readexactly(_HEAD.size))
    if length > MAX_MESSAGE_BYTES:
        raise StreamError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"a message of {length} B is over the {MAX_MESSAGE_BYTES} B a message may hold")
    return kind, await reader.readexactly(length)


def _error(code: grpc.StatusCode, details: str) -> bytes:
    return _pack(ERROR, json.dumps({"code": code.name, "details": details}).encode())


def _raised(payload: bytes) -> StreamError:
    try:
        doc = json.loads(payload)
        return StreamError(grpc.StatusCode[doc["code"]], str(doc["details"]))
    except (ValueError, KeyError, TypeError):
        return StreamError(grpc.StatusCode.INTERNAL, "the worker ended the stream with an error that does not parse")


_UNREACHABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)


class _Abort(MillstreamError):
    """A stream method's ``context.abort``: the stream ends with this status code."""
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


class _Context:
    """What a stream method is given as its context: ``abort`` ends the stream."""

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise _Abort(code, details)


class FramesServer:
    """A worker's frames port: serves ``methods`` (name -> (message type, stream method)),
    each connection one stream, its caller checked as by the gRPC server."""

    def __init__(self, methods: Mapping[str, tuple[type[Any], StreamMethod]], security: Security) -> None:
        self.methods = dict(methods)
        self.security = security
        self._check = security.token_check()
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self.opened = 0  # streams taken (their caller checked)

    async def start(self, host: str, port: int = 0) -> int:
        """Listen on ``host:port`` (0: a port the OS chooses); returns the port."""
        self._server = await asyncio.start_server(self._serve, host or None, port,
                                                  ssl=self.security.server_ssl_context())
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            await self._stream(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass  # the client went away, or never spoke: nothing of its stream is left here
        except StreamError as e:
            if not writer.is_closing():
                writer.write(_error(e.code(), e.details() or ""))
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("a frames stream failed")
        finally:
            self._connections.discard(task)
            writer.close()

    async def _stream(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        kind, payload = await asyncio.wait_for(_read(reader), HELLO_TIMEOUT_S)
        if kind != HELLO:
            raise StreamError(grpc.StatusCode.INVALID_ARGUMENT, "a stream starts with its hello")
        try:
            hello = json.loads(payload)
            method, headers = str(hello["method"]), {str(k): str(v) for k, v in hello["headers"]}
        except (ValueError, KeyError, TypeError):
            raise StreamError(grpc.StatusCode.INVALID_ARGUMENT, "a hello that does not parse") from None
        served = self.methods.get(method)
        if served is None:
            raise StreamError(grpc.StatusCode.UNIMPLEMENTED, f"no stream {method!r} here")
        message, call = served
        if self._check is not None:
            verdict = self._check.check(SERVICE + method, headers)
            if isinstance(verdict, Refusal):
                raise StreamError(verdict.code, verdict.message)
            acting_as(*verdict)
        writer.write(_pack(READY, b""))
        self.opened += 1
        try:
            async for answer in call(_frames(reader, message), _Context()):
                writer.write(_pack(MESSAGE, answer.SerializeToString()))
                if writer.transport.get_write_buffer_size() > _HIGH_WATER:
                    await writer.drain()
        except _Abort as e:
            if writer.is_closing():
                return
            writer.write(_error(e.code, e.details))
        with contextlib.suppress(ConnectionError):
            await writer.drain()


async def _frames(reader: asyncio.StreamReader, message: type[Any]) -> AsyncIterator[Any]:
    """The client's frames, until its ``END``; a connection that breaks first raises as a
    gRPC stream whose sender went away does."""
    while True:
        try:
            kind, payload = await _read(reader)
        except (ConnectionError, asyncio.IncompleteReadError) as e:
            raise StreamError(grpc.StatusCode.UNAVAILABLE, f"the sender's connection broke ({e!r})") from None
        if kind == END:
            return
        if kind != MESSAGE:
            raise StreamError(grpc.StatusCode.INVALID_ARGUMENT, f"a message of unknown kind {kind}")
        frame = message()
        frame.ParseFromString(payload)
        yield frame


class Opener:
    """The streams of one process to workers: on a worker's frames port where it has one,
    else on gRPC (``grpc_call``)."""

    def __init__(self, security: Security, ping: Callable[[str], Awaitable[pb.PingResponse]]) -> None:
        self.security = security
        self._ping = ping
        self._ports: dict[str, asyncio.Future[int]] = {}
        self._ssl = security.client_ssl_context()

    def stream(self, address: str, method: str, answer: type[Any],
               grpc_call: Callable[[], Any]) -> FramesCall:
        """A stream of ``method`` to the worker at ``address``, opened on first use."""
        return FramesCall(self, address, method, answer, grpc_call)

    async def port(self, address: str) -> int:
        """The frames port of ``address`` (0: none), asked once; a failed ask is asked again."""
        fut = self._ports.get(address)
        if fut is None:
            fut = self._ports[address] = asyncio.get_running_loop().create_task(self._ask(address))
        try:
            return await asyncio.shield(fut)
        except BaseException:
            if self._ports.get(address) is fut and fut.done():
                del self._ports[address]
            raise

    async def _ask(self, address: str) -> int:
        try:
            return int((await self._ping(address)).frames_port)
        except grpc.RpcError as e:
            if e.code() in _UNREACHABLE:
                raise  # as a stream to it would fail now
            # Refused or failed there (an older worker, a role its Ping refuses): its gRPC
            # streams answer for themselves.
            log.debug("worker %s did not say where its frames port is (%s): its streams go over gRPC",
                      address, e.code().name)
            return 0

    def forget(self, address: str) -> None:
        """A connection to ``address``'s frames port failed: ask again next time (it may have
        restarted on another port)."""
        self._ports.pop(address, None)

    async def connect(self, address: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        host = address.rpartition(":")[0].strip("[]")
        return await asyncio.open_connection(host, port, ssl=self._ssl,
                                             server_hostname=host if self._ssl is not None else None)


class FramesCall:
    """One stream to a worker, with the calls :class:`~runtime.links.FrameStream` makes of a
    gRPC stream (``write``, ``read``, ``cancel``): on the worker's frames port, or, where it
    has none, on the gRPC stream itself. Connects at its first call."""

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
        try:
            port = await self._opener.port(self._address)
        except grpc.RpcError as e:
            raise StreamError(e.code(), e.details() or "the worker did not answer") from None
        if self._cancelled:
            raise StreamError(grpc.StatusCode.CANCELLED, "the stream was cancelled")
        if port == 0:
            self._grpc = self._grpc_call()
            return
        try:
            reader, writer = await asyncio.wait_for(self._opener.connect(self._address, port), CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError) as e:
            self._opener.forget(self._address)
            raise StreamError(grpc.StatusCode.UNAVAILABLE, f"cannot connect to {self._address}'s frames port "
                                                           f"{port} ({e!r})") from None
        if self._cancelled:
            writer.close()
            raise StreamError(grpc.StatusCode.CANCELLED, "the stream was cancelled")
        self._reader, self._writer = reader, writer
        # Frames follow the hello at once, as on a gRPC stream: a refusal comes back to the
        # reader (then the frames sent meanwhile fail with it), and a worker that does not
        # answer holds them only as long as their answers' timeout.
        headers = self._opener.security.headers()
        writer.write(_pack(HELLO, json.dumps({"method": self._method, "headers": headers}).encode()))

    async def _next(self) -> tuple[int, bytes]:
        assert self._reader is not None
        try:
            return await _read(self._reader)
        except asyncio.IncompleteReadError as e:
            if not e.partial and self._reader.at_eof():
                return END, b""  # the worker closed the stream between messages
            raise StreamError(grpc.StatusCode.UNAVAILABLE, f"the connection to {self._address} broke "
                                                           "within a message") from None
        except ConnectionError as e:
            raise StreamError(grpc.StatusCode.UNAVAILABLE, f"the connection to {self._address} broke ({e!r})") from None

    async def write(self, message: Any) -> None:
        await self._open()
        if self._grpc is not None:
            await self._grpc.write(message)
            return
        writer = self._writer
        assert writer is not None
        if writer.is_closing():
            raise StreamError(grpc.StatusCode.UNAVAILABLE, f"the connection to {self._address} is closed")
        writer.write(_pack(MESSAGE, message.SerializeToString()))
        if writer.transport.get_write_buffer_size() > _HIGH_WATER:
            try:
                await writer.drain()
            except ConnectionError as e:
                raise StreamError(grpc.StatusCode.UNAVAILABLE, f"the connection to {self._address} broke ({e!r})"
                                  ) from None

    async def read(self) -> Any:
        await self._open()
        if self._grpc is not None:
            return await self._grpc.read()
        kind, payload = await self._next()
        if not self._taken:  # the server's answer to the hello comes first
            if kind == END:
                raise StreamError(grpc.StatusCode.UNAVAILABLE, f"{self._address} closed the stream before taking it")
            if kind == READY:
                self._taken = True
                kind, payload = await self._next()
        if kind == MESSAGE:
            answer = self._answer()
            answer.ParseFromString(payload)
            return answer
        if kind == ERROR:
            raise _raised(payload)
        if kind == END:
            return grpc.aio.EOF
        raise StreamError(grpc.StatusCode.INTERNAL, f"a message of unknown kind {kind} from {self._address}")

    async def done_writing(self) -> None:
        await self._open()
        if self._grpc is not None:
            await self._grpc.done_writing()
        elif self._writer is not None and not self._writer.is_closing():
            self._writer.write(_pack(END, b""))

    def cancel(self) -> bool:
        self._cancelled = True
        if self._grpc is not None:
            return bool(self._grpc.cancel())
        if self._writer is not None:
            self._writer.close()
        if self._opening is not None and not self._opening.done():
            self._opening.cancel()
        return True
