"""The data plane's transport: a worker's delivery and replication streams as length-prefixed
messages on a TCP connection of their own (TLS when configured), beside the gRPC server, which
keeps the control plane (issue 29, item 2; docs/architecture.md, "The data plane's transport").

Why: a message on a ``grpc.aio`` stream crosses gRPC's own threads and its poller before the
event loop sees it; traced on W1, each one-way trip took 0.4-0.7 ms, half of a round
(docs/performance-history.md).

The streams above are unchanged (runtime/streams.py: frames within a credit, answers by id;
runtime/links.py's :class:`~runtime.links.FrameStream`, worker/deliverstream.py's
``serve_frames``); only what carries their messages is. A connection carries one stream:

    [4-byte length][1-byte kind][payload]

- ``HELLO`` (client first): the method (``DeliverStream``, ``ReplicateStream``), the worker
  the client means (its id from ``Ping``) and the headers a gRPC call would carry (the token,
  an injector's credential), checked as the gRPC server's interceptor checks them
  (runtime/security.py) before any frame is read;
- ``READY``: the server took the stream. The client does not wait for it: its frames follow
  the hello at once, as on a gRPC stream, and a refusal reaches its reader;
- ``MESSAGE``: a frame, or an answer (the protobuf message, encoded);
- ``ERROR``: the server refused or ended the stream (a status code's name and its details),
  raised at the client as the gRPC call would raise it;
- ``END``: the client has no more frames (a gRPC stream's half close).

Which transport a stream takes is the client's to find (:class:`Opener`): a worker's ``Ping``
names its frames port (0: it has none: started with ``--data-port off``, or older). The answer
is kept until a connection to that port fails or is refused before it is taken (the worker
restarted, perhaps on another port: asked again), and a "none" for :data:`FALLBACK_S`. A
port that a fresh answer names and that takes no connection (a firewall, a NAT that maps only
the gRPC port) sends that worker's streams over gRPC for :data:`FALLBACK_S`, with a warning:
gRPC's own errors then say whether the worker is reachable at all.

A dead peer is found as with gRPC's keepalive: TCP keepalive and a user timeout (a host that
vanished), a bound on each wait for room to write, and each frame's answer timeout (streams.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import socket
import struct
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, cast

import grpc
from google.protobuf.message import DecodeError
from prometheus_client import Counter

from runtime.errors import MillstreamError
from runtime.security import Refusal, Security, acting_as
from runtime.serving import host_of
from runtime.streams import StreamError
from runtime.wire import MAX_MESSAGE_BYTES
from runtime.wire import millstream_pb2 as pb

log = logging.getLogger(__name__)

HELLO, READY, MESSAGE, ERROR, END = 1, 2, 3, 4, 5
_HEAD = struct.Struct(">IB")
HELLO_TIMEOUT_S = 10.0  # a connection that says nothing (or does not finish its TLS handshake) is closed
HELLO_MAX_BYTES = 64 << 10  # a hello: a method's name and a few headers
CONNECT_TIMEOUT_S = 5.0  # a frames port that does not take a connection: unreachable
DRAIN_TIMEOUT_S = 20.0  # a peer that reads nothing for this long, its buffers full: the stream breaks
FALLBACK_S = 60.0  # how long a worker's streams stay on gRPC before its frames port is asked for again
LINGER_S = 1.0  # after an error, how long the server reads on, so the error is not lost to a reset
_HIGH_WATER = 256 << 10  # bytes waiting in a connection's buffer before a writer waits for room

SERVICE = "/millstream.v1.Worker/"

STREAMS = Counter("millstream_frames_streams", "Streams a worker's data port took, or refused (its "
                  "caller's token, a stream it does not serve, a hello that does not parse)", ["result"])

# A stream's server side: the servicer's method (``WorkerServicer.DeliverStream``), given the
# frames and a context whose ``abort`` ends the stream with a status code.
StreamMethod = Callable[[AsyncIterator[Any], Any], AsyncIterator[Any]]


def _write_nowait(writer: asyncio.StreamWriter, message: Any) -> bool:
    """Write ``message`` unless the connection is closing or its buffer is above the
    high-water mark (False: the caller waits for room instead)."""
    if writer.is_closing() or writer.transport.get_write_buffer_size() > _HIGH_WATER:
        return False
    writer.write(_pack(MESSAGE, message.SerializeToString()))
    return True


def _pack(kind: int, payload: bytes) -> bytes:
    return _HEAD.pack(len(payload), kind) + payload


class _Broken(MillstreamError):
    """The connection ended within a message."""


async def _read(reader: asyncio.StreamReader, limit: int = MAX_MESSAGE_BYTES) -> tuple[int, bytes] | None:
    """The next message, refused unread past ``limit`` bytes; None if the connection ended
    between messages, :class:`_Broken` if it ended within one."""
    try:
        head = await reader.readexactly(_HEAD.size)
    except asyncio.IncompleteReadError as e:
        if e.partial:
            raise _Broken("within a message's header") from None
        return None
    length, kind = _HEAD.unpack(head)
    if length > limit:
        raise StreamError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"a message of {length} B is over the {limit} B a message may hold here")
    try:
        return kind, await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        raise _Broken("within a message") from None


def _error(code: grpc.StatusCode, details: str) -> bytes:
    return _pack(ERROR, json.dumps({"code": code.name, "details": details}).encode())


def _raised(payload: bytes) -> StreamError:
    try:
        doc = json.loads(payload)
        return StreamError(grpc.StatusCode[doc["code"]], str(doc["details"]))
    except (ValueError, KeyError, TypeError):
        return StreamError(grpc.StatusCode.INTERNAL, "the worker ended the stream with an error that does not parse")


def _tune(writer: asyncio.StreamWriter) -> None:
    """Keepalive on a connection, as gRPC's: a peer whose host vanished is found within ~30 s."""
    sock = writer.get_extra_info("socket")
    if sock is None:
        return
    for level, option, value in ((socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
                                 (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPIDLE", None), 10),
                                 (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPINTVL", None), 5),
                                 (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPCNT", None), 3),
                                 (socket.IPPROTO_TCP, getattr(socket, "TCP_USER_TIMEOUT", None), 30_000)):
        if option is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(level, option, value)


class _Abort(MillstreamError):
    """A stream method's ``context.abort``: the stream ends with this status code."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


class _Context:
    """What a stream method is given as its context: ``abort`` ends the stream;
    ``write_nowait`` writes an answer at once where the connection's buffer has room (False:
    yield it)."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.write_nowait = functools.partial(_write_nowait, writer)

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise _Abort(code, details)


class FramesServer:
    """A worker's frames port: serves ``methods`` (name -> (message type, stream method)),
    each connection one stream, its caller checked as by the gRPC server. ``worker_id``: the
    worker's id now ("" before it has one): a hello meant for another worker is refused."""

    def __init__(self, methods: Mapping[str, tuple[type[Any], StreamMethod]], security: Security,
                 worker_id: Callable[[], str] = lambda: "") -> None:
        self.methods = dict(methods)
        self.security = security
        self.worker_id = worker_id
        self._check = security.token_check()
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self.opened = 0  # streams taken (their caller checked)

    async def start(self, host: str, port: int = 0) -> int:
        """Listen on ``host:port`` (0: a port the OS chooses; a wildcard host: every interface);
        returns the port."""
        tls = self.security.server_ssl_context()
        self._server = await asyncio.start_server(
            self._serve, host if host not in ("", "0.0.0.0", "::") else None, port, ssl=tls,
            ssl_handshake_timeout=HELLO_TIMEOUT_S if tls is not None else None)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self, grace_s: float = 0.5) -> None:
        """Take no more streams; those open get ``grace_s`` to end, then are cancelled."""
        if self._server is not None:
            self._server.close()
        if self._connections:
            await asyncio.wait(set(self._connections), timeout=grace_s)
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        _tune(writer)
        refused: StreamError | None = None
        try:
            await self._stream(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, _Broken, TimeoutError):
            pass  # the client went away, or never spoke: nothing of its stream is left here
        except StreamError as e:
            refused = e
        except asyncio.CancelledError:
            writer.transport.abort()
            raise
        except Exception as e:  # a bug here, or a hello that breaks the parser: the stream fails
            log.debug("a frames stream failed", exc_info=True)
            refused = StreamError(grpc.StatusCode.UNKNOWN, f"{type(e).__name__}: {e}")
        finally:
            self._connections.discard(task)
        try:
            if refused is not None and not writer.is_closing():
                writer.write(_error(refused.code(), refused.details()))
                await self._linger(reader, writer)
        except (ConnectionError, TimeoutError, OSError):
            pass
        finally:
            if refused is not None:
                writer.transport.abort()
            else:
                writer.close()

    @staticmethod
    async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """After an error: let it reach the client before the connection closes. Frames the
        client sent after its hello are read and dropped meanwhile (never parsed), or closing
        with them unread would reset the connection, and the error could be lost with it."""
        await asyncio.wait_for(writer.drain(), LINGER_S)
        if writer.can_write_eof():
            writer.write_eof()
        deadline = time.monotonic() + LINGER_S
        while (left := deadline - time.monotonic()) > 0:
            if not await asyncio.wait_for(reader.read(1 << 16), left):
                return

    async def _stream(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # A caller not checked yet gets no more than a hello's bytes read (gRPC's check, too,
        # refuses before it reads a message: runtime/security.py).
        first = await asyncio.wait_for(_read(reader, HELLO_MAX_BYTES), HELLO_TIMEOUT_S)
        if first is None:
            return
        try:
            call, message = self._take(*first)
        except StreamError:
            STREAMS.labels("refused").inc()
            raise
        writer.write(_pack(READY, b""))
        self.opened += 1
        STREAMS.labels("opened").inc()
        try:
            # (closed at once when this ends, its frames in flight cancelled: not at collection)
            async with contextlib.aclosing(cast(AsyncGenerator[Any, None], call(_frames(reader, message),
                                                                                  _Context(writer)))) as answers:
                async for answer in answers:
                    writer.write(_pack(MESSAGE, answer.SerializeToString()))
                    if writer.transport.get_write_buffer_size() > _HIGH_WATER:
                        await asyncio.wait_for(writer.drain(), DRAIN_TIMEOUT_S)
        except _Abort as e:
            raise StreamError(e.code, e.details) from None
        await writer.drain()

    def _take(self, kind: int, payload: bytes) -> tuple[StreamMethod, type[Any]]:
        """The stream a hello asks for, its caller checked (the caller's roles set for it)."""
        if kind != HELLO:
            raise StreamError(grpc.StatusCode.INVALID_ARGUMENT, "a stream starts with its hello")
        try:
            hello = json.loads(payload)
            method, worker = str(hello["method"]), str(hello.get("worker", ""))
            headers = {str(k): str(v) for k, v in hello["headers"]}
        except (ValueError, KeyError, TypeError, RecursionError):
            raise StreamError(grpc.StatusCode.INVALID_ARGUMENT, "a hello that does not parse") from None
        served = self.methods.get(method)
        if served is None:
            raise StreamError(grpc.StatusCode.UNIMPLEMENTED, f"no stream {method!r} here")
        if self._check is not None:
            verdict = self._check.check(SERVICE + method, headers)
            if isinstance(verdict, Refusal):
                raise StreamError(verdict.code, verdict.message)
            acting_as(*verdict)
        me = self.worker_id()
        if worker and me and worker != me:  # its port taken over by another worker of this host
            raise StreamError(grpc.StatusCode.FAILED_PRECONDITION, f"this is worker {me}, not {worker}")
        message, call = served
        return call, message


async def _frames(reader: asyncio.StreamReader, message: type[Any]) -> AsyncIterator[Any]:
    """The client's frames, until its ``END``; a connection that breaks first raises as a
    gRPC stream whose sender went away does."""
    while True:
        try:
            got = await _read(reader)
        except (ConnectionError, _Broken) as e:
            raise StreamError(grpc.StatusCode.UNAVAILABLE, f"the sender's connection broke ({e})") from None
        if got is None:
            raise StreamError(grpc.StatusCode.UNAVAILABLE, "the sender closed its connection without ending its stream")
        kind, payload = got
        if kind == END:
            return
        if kind != MESSAGE:
            raise StreamError(grpc.StatusCode.INVALID_ARGUMENT, f"a message of unknown kind {kind}")
        try:
            yield message.FromString(payload)
        except DecodeError:
            raise StreamError(grpc.StatusCode.INVALID_ARGUMENT, "a frame that does not parse") from None


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
        _tune(writer)
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
        writer.write(_pack(HELLO, json.dumps(hello).encode()))

    def _broke(self, why: str) -> StreamError:
        return StreamError(grpc.StatusCode.UNAVAILABLE, f"the connection to {self._address} broke ({why})")

    async def _next(self) -> tuple[int, bytes]:
        assert self._reader is not None
        try:
            got = await _read(self._reader)
        except (ConnectionError, _Broken) as e:
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
        writer.write(_pack(MESSAGE, message.SerializeToString()))
        if writer.transport.get_write_buffer_size() > _HIGH_WATER:
            try:
                await asyncio.wait_for(writer.drain(), DRAIN_TIMEOUT_S)
            except ConnectionError as e:
                raise self._broke(repr(e)) from None
            except TimeoutError:
                raise self._broke(f"the worker read nothing for {DRAIN_TIMEOUT_S:.0f} s") from None

    def write_nowait(self, message: Any) -> bool:
        """:meth:`write`, where it needs no wait: the connection on the frames port open, its
        buffer below the high-water mark. False: not written (:meth:`write` it)."""
        return self._writer is not None and _write_nowait(self._writer, message)

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
            self._writer.transport.abort()  # (buffered frames dropped: close() would wait to send them)
        if self._opening is not None and not self._opening.done():
            self._opening.cancel()
        return True
