"""The master's HTTP side: the console (master/console.py), ``/status.json``, ``/history.json``
(master/history.py) and Prometheus ``/metrics``.

Plain asyncio streams: four read-only GET routes need no web framework. The console's history
is sampled by a task of this server, not by the master's core.

Off loopback, serve it over TLS (``ssl``: the master's certificate, ``--http-tls``) and with a
token (``--http-token``): every route then asks for ``Authorization: Bearer TOKEN`` (what
Prometheus' ``authorization`` sends) or HTTP Basic with the token as the password, any user
name (what a browser sends once asked: it shows a login box).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import json
import logging
import ssl as ssl_module
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from master.console import PAGE
from master.history import History, sample

log = logging.getLogger(__name__)
StatusFn = Callable[[], Awaitable[dict[str, Any] | None]]

# Bounds on what one client may make us hold (S7, slowloris): a request line or header
# line longer than MAX_LINE_BYTES, more than MAX_HEADER_LINES headers, or a request head
# not complete within HEAD_TIMEOUT_S is refused (a TLS handshake: closed after as long); at
# most MAX_CONNECTIONS are served at once (handshakes in progress are not counted).
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


UNAUTHORIZED = (b"this console asks for its token (the master's --http-token): send Authorization: Bearer "
                b"TOKEN, or log in with any user name and the token as the password\n")


def authorized(header: bytes | None, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``token``: ``Bearer TOKEN``, or ``Basic``
    with it as the password (any user name)."""
    if header is None:
        return False
    scheme, _, credentials = header.strip().partition(b" ")
    if scheme.lower() == b"bearer":
        given = credentials.strip()
    elif scheme.lower() == b"basic":
        try:
            given = base64.b64decode(credentials.strip(), validate=True).partition(b":")[2]
        except (binascii.Error, ValueError):
            return False
    else:
        return False
    return hmac.compare_digest(given, token.encode())


async def serve(listen: str, status: StatusFn, history: History | None = None, *, token: str | None = None,
                ssl: ssl_module.SSLContext | None = None) -> tuple[Console, str]:
    """Start the HTTP server on ``HOST:PORT`` (HTTPS with ``ssl``; every route asking for
    ``token`` if given: module doc) and the history sampler; returns them and the bound
    address."""
    history = history if history is not None else History()

    active = 0

    async def read_head(reader: asyncio.StreamReader) -> tuple[bytes, bytes | None] | None:
        """The request line and its ``Authorization`` header, or None if the head breaks a bound."""
        request = await reader.readline()
        auth = None
        for _ in range(MAX_HEADER_LINES + 1):
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                return request, auth
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"authorization":
                auth = value
        return None

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal active
        active += 1
        try:
            if active > MAX_CONNECTIONS:
                code, ctype, body = 503, "text/plain", b"too many connections\n"
            else:
                try:
                    async with asyncio.timeout(HEAD_TIMEOUT_S):
                        head = await read_head(reader)
                except ValueError:  # a line longer than the stream limit (MAX_LINE_BYTES)
                    head = None
                if head is None:
                    code, ctype, body = 431, "text/plain", (
                        f"request head too large: at most {MAX_HEADER_LINES} header lines of "
                        f"{MAX_LINE_BYTES} bytes\n").encode()
                elif token is not None and not authorized(head[1], token):
                    code, ctype, body = 401, "text/plain", UNAUTHORIZED
                else:
                    code, ctype, body = await route(head[0])
            reason = {200: "OK", 401: "Unauthorized", 404: "Not Found", 431: "Request Header Fields Too Large",
                      503: "Service Unavailable"}[code]
            ask = 'WWW-Authenticate: Basic realm="millstream", charset="UTF-8"\r\n' if code == 401 else ""
            reply = (f"HTTP/1.1 {code} {reason}\r\n{ask}"
                     f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n")
            writer.write(reply.encode() + body)
            await writer.drain()
        except (TimeoutError, OSError) as e:  # (ConnectionError, ssl.SSLError: OSErrors)
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
    # TLS by the server, not the handler (``start_tls``: uvloop had read a ClientHello that came
    # early as plaintext, lost to the handshake). A handshake is not a connection yet: one that
    # never ends is closed after HEAD_TIMEOUT_S, uncounted meanwhile (asyncio runs the handler
    # only once it is done).
    server = await asyncio.start_server(handle, host, int(port), limit=MAX_LINE_BYTES, ssl=ssl,
                                        ssl_handshake_timeout=HEAD_TIMEOUT_S if ssl is not None else None)
    bound = server.sockets[0].getsockname()[1]
    sampler = asyncio.create_task(sample(status, history), name="console history")
    return Console(server, sampler, history), f"{host}:{bound}"
