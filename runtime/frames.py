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

Its client end, which finds whether a worker has a frames port and opens a stream on it (or
on gRPC), is runtime/framesclient.py.

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
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from typing import Any, cast

import grpc
from google.protobuf.message import DecodeError
from prometheus_client import Counter

from runtime.errors import MillstreamError
from runtime.security import Refusal, Security, acting_as
from runtime.streams import StreamError
from runtime.wire import MAX_MESSAGE_BYTES

log = logging.getLogger(__name__)

HELLO, READY, MESSAGE, ERROR, END = 1, 2, 3, 4, 5
_HEAD = struct.Struct(">IB")
HELLO_TIMEOUT_S = 10.0  # a connection that says nothing (or does not finish its TLS handshake) is closed
HELLO_MAX_BYTES = 64 << 10  # a hello: a method's name and a few headers
DRAIN_TIMEOUT_S = 20.0  # a peer that reads nothing for this long, its buffers full: the stream breaks
LINGER_S = 1.0  # after an error, how long the server reads on, so the error is not lost to a reset
HIGH_WATER = 256 << 10  # bytes waiting in a connection's buffer before a writer waits for room

SERVICE = "/millstream.v1.Worker/"

STREAMS = Counter("millstream_frames_streams", "Streams a worker's data port took, or refused (its "
                  "caller's token, a stream it does not serve, a hello that does not parse)", ["result"])

# A stream's server side: the servicer's method (``WorkerServicer.DeliverStream``), given the
# frames and a context whose ``abort`` ends the stream with a status code.
StreamMethod = Callable[[AsyncIterator[Any], Any], AsyncIterator[Any]]


def write_nowait(writer: asyncio.StreamWriter, message: Any) -> bool:
    """Write ``message`` unless the connection is closing or its buffer is above the
    high-water mark (False: the caller waits for room instead)."""
    if writer.is_closing() or writer.transport.get_write_buffer_size() > HIGH_WATER:
        return False
    writer.write(pack(MESSAGE, message.SerializeToString()))
    return True


def pack(kind: int, payload: bytes) -> bytes:
    return _HEAD.pack(len(payload), kind) + payload


class Broken(MillstreamError):
    """The connection ended within a message."""


async def read_message(reader: asyncio.StreamReader, limit: int = MAX_MESSAGE_BYTES) -> tuple[int, bytes] | None:
    """The next message, refused unread past ``limit`` bytes; None if the connection ended
    between messages, :class:`Broken` if it ended within one."""
    try:
        head = await reader.readexactly(_HEAD.size)
    except asyncio.IncompleteReadError as e:
        if e.partial:
            raise Broken("within a message's header") from None
        return None
    length, kind = _HEAD.unpack(head)
    if length > limit:
        raise StreamError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"a message of {length} B is over the {limit} B a message may hold here")
    try:
        return kind, await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        raise Broken("within a message") from None


def _error(code: grpc.StatusCode, details: str) -> bytes:
    return pack(ERROR, json.dumps({"code": code.name, "details": details}).encode())


def raised(payload: bytes) -> StreamError:
    try:
        doc = json.loads(payload)
        return StreamError(grpc.StatusCode[doc["code"]], str(doc["details"]))
    except (ValueError, KeyError, TypeError):
        return StreamError(grpc.StatusCode.INTERNAL, "the worker ended the stream with an error that does not parse")


def tune(writer: asyncio.StreamWriter) -> None:
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
        self.write_nowait = functools.partial(write_nowait, writer)

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
        tune(writer)
        refused: StreamError | None = None
        try:
            await self._stream(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, Broken, TimeoutError):
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
        first = await asyncio.wait_for(read_message(reader, HELLO_MAX_BYTES), HELLO_TIMEOUT_S)
        if first is None:
            return
        try:
            call, message = self._take(*first)
        except StreamError:
            STREAMS.labels("refused").inc()
            raise
        writer.write(pack(READY, b""))
        self.opened += 1
        STREAMS.labels("opened").inc()
        try:
            # (closed at once when this ends, its frames in flight cancelled: not at collection)
            async with contextlib.aclosing(cast(AsyncGenerator[Any, None], call(_frames(reader, message),
                                                                                  _Context(writer)))) as answers:
                async for answer in answers:
                    writer.write(pack(MESSAGE, answer.SerializeToString()))
                    if writer.transport.get_write_buffer_size() > HIGH_WATER:
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
            got = await read_message(reader)
        except (ConnectionError, Broken) as e:
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
