"""The master's HTTP side: the console (master/console.py), ``/status.json``, ``/history.json``
(master/history.py) and Prometheus ``/metrics``.

Plain asyncio streams: four read-only GET routes need no web framework. The console's history
is sampled by a task of this server, not by the master's core.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from master.console import PAGE
from master.history import History, sample

log = logging.getLogger(__name__)
StatusFn = Callable[[], Awaitable[dict[str, Any] | None]]

# Bounds on what one client may make us hold (S7, slowloris): a request line or header
# line longer than MAX_LINE_BYTES, more than MAX_HEADER_LINES headers, or a request head
# not complete within HEAD_TIMEOUT_S is refused; at most MAX_CONNECTIONS are served at once.
MAX_LINE_BYTES = 8192
MAX_HEADER_LINES = 100
HEAD_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 64

class Console:
    """The running HTTP server and its history sampler; :meth:`close` stops both."""

    def __init__(self, server: asyncio.AbstractServer, sampler: asyncio.Task[None], history: History) -> None:
        self.server = server
        self.sampler = sampler
        self.history = history

    def close(self) -> None:
        self.sampler.cancel()
        self.server.close()

    async def wait_closed(self) -> None:
        await self.server.wait_closed()


async def serve(listen: str, status: StatusFn, history: History | None = None) -> tuple[Console, str]:
    """Start the HTTP server on ``HOST:PORT`` and the history sampler; returns them and the
    bound address."""
    history = history if history is not None else History()

    active = 0

    async def read_head(reader: asyncio.StreamReader) -> bytes | None:
        """The request line, or None if the head breaks a bound."""
        async with asyncio.timeout(HEAD_TIMEOUT_S):
            request = await reader.readline()
            for _ in range(MAX_HEADER_LINES + 1):
                if await reader.readline() in (b"\r\n", b"\n", b""):
                    return request  # headers: not needed
        return None

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal active
        active += 1
        try:
            if active > MAX_CONNECTIONS:
                code, ctype, body = 503, "text/plain", b"too many connections\n"
            else:
                try:
                    request = await read_head(reader)
                except ValueError:  # a line longer than the stream limit (MAX_LINE_BYTES)
                    request = None
                if request is None:
                    code, ctype, body = 431, "text/plain", (
                        f"request head too large: at most {MAX_HEADER_LINES} header lines of "
                        f"{MAX_LINE_BYTES} bytes\n").encode()
                else:
                    code, ctype, body = await route(request)
            reason = {200: "OK", 404: "Not Found", 431: "Request Header Fields Too Large",
                      503: "Service Unavailable"}[code]
            head = (f"HTTP/1.1 {code} {reason}\r\n"
                    f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n")
            writer.write(head.encode() + body)
            await writer.drain()
        except (TimeoutError, ConnectionError) as e:
            log.debug("http client went away: %s", e)
        finally:
            active -= 1
            writer.close()

    async def route(request: bytes) -> tuple[int, str, bytes]:
        parts = request.decode("latin-1").split()
        path = parts[1].split("?")[0] if len(parts) > 1 else "/"
        if path == "/":
            return 200, "text/html; charset=utf-8", PAGE.encode()
        if path == "/status.json":
            doc = await status()
            doc = doc if doc is not None else {"error": "this master is not the leader"}
            return 200, "application/json", json.dumps(doc).encode()
        if path == "/history.json":
            return 200, "application/json", json.dumps(history.document()).encode()
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest()
        return 404, "text/plain", b"not found\n"

    host, _, port = listen.rpartition(":")
    server = await asyncio.start_server(handle, host, int(port), limit=MAX_LINE_BYTES)
    bound = server.sockets[0].getsockname()[1]
    sampler = asyncio.create_task(sample(status, history), name="console history")
    return Console(server, sampler, history), f"{host}:{bound}"
