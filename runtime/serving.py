"""Shared plumbing of the daemons: event loop, gRPC servers, error mapping, shutdown."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import sys
import threading
import traceback
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from runtime import collector, errors
from runtime.security import Security
from runtime.wire import SERVER_OPTIONS

log = logging.getLogger(__name__)
T = TypeVar("T")

# One table from the error hierarchy to gRPC status codes (first match wins).
STATUS_OF: list[tuple[type[BaseException], grpc.StatusCode]] = [
    (errors.TopologyError, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.ConfigError, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.NotOwnerError, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.WorkerIdentityError, grpc.StatusCode.PERMISSION_DENIED),
    (errors.RoleError, grpc.StatusCode.PERMISSION_DENIED),
    (errors.StaleTokenError, grpc.StatusCode.ABORTED),  # a deposed owner: it must stop
    (errors.EtcdUnavailableError, grpc.StatusCode.UNAVAILABLE),
    (errors.MasterUnavailableError, grpc.StatusCode.UNAVAILABLE),
    (errors.MillstreamError, grpc.StatusCode.FAILED_PRECONDITION),
]


async def call_core(context: grpc.aio.ServicerContext, fn: Callable[[], Awaitable[T]]) -> T:
    """Run a core call; map a :class:`MillstreamError` to its gRPC status."""
    try:
        return await fn()
    except errors.MillstreamError as e:
        for kind, code in STATUS_OF:
            if isinstance(e, kind):
                await context.abort(code, str(e))
        raise  # unreachable: MillstreamError is in the table


# Clients ping every keepalive_time_ms (10 s) while a call is open. A delivery stream is
# open for good, idle between rounds: the server's default (a ping at most every 5 minutes
# without data) would answer those pings with GOAWAY "too_many_pings" and break the stream,
# failing the first delivery after a quiet spell.
KEEPALIVE_OPTIONS = [("grpc.http2.min_ping_interval_without_data_ms", 5_000)]


def make_server(security: Security = Security()) -> grpc.aio.Server:
    return grpc.aio.server(options=[*SERVER_OPTIONS, *KEEPALIVE_OPTIONS],
                           interceptors=security.server_interceptors())


def bind(server: grpc.aio.Server, listen: str, advertise: str | None = None,
         security: Security = Security()) -> str:
    """Bind ``HOST:PORT`` (port 0 = chosen by the OS); returns the address others should dial.

    That is ``advertise`` if given, else the listen host with the bound port; a wildcard
    host (0.0.0.0, ::) is replaced by this machine's name.
    """
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit():
        raise errors.ConfigError(f"listen address {listen!r} is not HOST:PORT, e.g. 127.0.0.1:0")
    try:
        creds = security.server_credentials()
        bound = server.add_secure_port(listen, creds) if creds else server.add_insecure_port(listen)
    except RuntimeError as e:
        raise errors.ConfigError(f"cannot listen on {listen!r} ({e}); is the port taken?") from None
    if bound == 0:
        raise errors.ConfigError(f"cannot listen on {listen!r}; is the port already in use?")
    if advertise:
        a_host, _, a_port = advertise.rpartition(":")
        if not a_host or not a_port.isdigit():
            raise errors.ConfigError(f"advertise address {advertise!r} is not HOST:PORT")
        return f"{a_host}:{bound if a_port == '0' else a_port}"
    if host in ("0.0.0.0", "::", "[::]"):
        host = socket.getfqdn()
    return f"{host}:{bound}"


def host_of(address: str) -> str:
    """The host of a ``HOST:PORT`` address (the brackets of an IPv6 one taken off)."""
    return address.rpartition(":")[0].strip("[]")


def dump_tasks() -> None:
    """Log what the process is waiting on: every asyncio task's stack and every thread's
    (``kill -USR1 <pid>`` on a daemon; docs/operations.md, "A process that seems stuck")."""
    lines = [f"SIGUSR1: {len(asyncio.all_tasks())} asyncio tasks, {threading.active_count()} threads"]
    for task in asyncio.all_tasks():
        lines.append(f"task {task.get_name()}: {task!r:.300}")
        for frame in task.get_stack(limit=12):
            lines.append(f"    {frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
    frames = sys._current_frames()
    for thread in threading.enumerate():
        top = frames.get(thread.ident or -1)
        lines.append(f"thread {thread.name}")
        lines += ["    " + line.strip() for line in traceback.format_stack(top, limit=12)] if top else []
    log.warning("%s", "\n".join(lines))


def new_loop() -> asyncio.AbstractEventLoop:
    """A new event loop for a thread of its own (an injector's deliveries): uvloop's, as the
    daemons run on, whose sockets and callbacks cost a fraction of asyncio's own."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run(main: Callable[[asyncio.Event], Awaitable[Any]]) -> Any:
    """Run a daemon on uvloop until SIGINT/SIGTERM sets its stop event (the garbage
    collector's pauses observed first: runtime/collector.py)."""
    collector.settle()
    try:
        import uvloop
        runner: Any = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency
        runner = asyncio.run

    async def wrapper() -> Any:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        loop.add_signal_handler(signal.SIGUSR1, dump_tasks)
        return await main(stop)

    return runner(wrapper())
