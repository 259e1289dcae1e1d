"""The one HTTP server in millstream: a few read-only GET routes, for the master's console
(master/web.py) and a worker's Prometheus ``/metrics`` (runtime/metrics.py).

Plain asyncio streams: GET routes need no web framework. Off loopback, serve it over TLS
(``ssl``: the process's certificate) and with a token: every route then asks for
``Authorization: Bearer TOKEN`` (what Prometheus' ``authorization`` sends) or HTTP Basic with
the token as the password, any user name (what a browser sends once asked: it shows a login
box). Anything else gets ``401`` with ``WWW-Authenticate: Basic``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import logging
import ssl as ssl_module
from collections.abc import Awaitable, Callable

from runtime.errors import ConfigError

log = logging.getLogger(__name__)

Route = Callable[[str], Awaitable[tuple[int, str, bytes]]]  # path -> (status, content type, body)

# Bounds on what one client may make us hold (S7, slowloris): a request line or header
# line longer than MAX_LINE_BYTES, more than MAX_HEADER_LINES headers, or a request head
# not complete within HEAD_TIMEOUT_S is refused (a TLS handshake: closed after as long); at
# most MAX_CONNECTIONS are served at once (handshakes in progress are not counted).
MAX_LINE_BYTES = 8192
MAX_HEADER_LINES = 100
HEAD_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 64

_REASONS = {200: "OK", 401: "Unauthorized", 404: "Not Found", 431: "Request Header Fields Too Large",
            503: "Service Unavailable"}


def check_token(token: str | None, flag: str) -> None:
    """Refuse, before serving, a token given by ``flag`` that is empty or has spaces around it
    (a client could never send it: a token file is stripped, as every secret file is)."""
    if token is not None and (not token.strip() or token != token.strip()):
        raise ConfigError(f"the token of {flag} is empty or has spaces around it; pass {flag}-file FILE (or "
                          f"MILLSTREAM_{flag[2:].upper().replace('-', '_')}_FILE) with the token in it")


def authorized(header: bytes | None, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``token``: ``Bearer TOKEN``, or ``Basic``
    with it as the password (any user name). Compared in constant time."""
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


async def _read_head(reader: asyncio.StreamReader) -> tuple[bytes, bytes | None] | None:
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


async def serve(listen: str, route: Route, *, token: str | None = None, ssl: ssl_module.SSLContext | None = None,
                unauthorized: bytes = b"send Authorization: Bearer TOKEN\n") -> tuple[asyncio.AbstractServer, str]:
    """Serve ``route`` on ``HOST:PORT`` (HTTPS with ``ssl``; every route asking for ``token``
    if given, ``unauthorized`` the body of a refusal); returns the server and its bound address."""
    active = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal active
        active += 1
        try:
            if active > MAX_CONNECTIONS:
                code, ctype, body = 503, "text/plain", b"too many connections\n"
            else:
                try:
                    async with asyncio.timeout(HEAD_TIMEOUT_S):
                        head = await _read_head(reader)
                except ValueError:  # a line longer than the stream limit (MAX_LINE_BYTES)
                    head = None
                if head is None:
                    code, ctype, body = 431, "text/plain", (
                        f"request head too large: at most {MAX_HEADER_LINES} header lines of "
                        f"{MAX_LINE_BYTES} bytes\n").encode()
                elif token is not None and not authorized(head[1], token):
                    code, ctype, body = 401, "text/plain", unauthorized
                else:
                    parts = head[0].decode("latin-1").split()
                    code, ctype, body = await route(parts[1].split("?")[0] if len(parts) > 1 else "/")
            ask = 'WWW-Authenticate: Basic realm="millstream", charset="UTF-8"\r\n' if code == 401 else ""
            reply = (f"HTTP/1.1 {code} {_REASONS[code]}\r\n{ask}"
                     f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n")
            writer.write(reply.encode() + body)
            await writer.drain()
        except (TimeoutError, OSError) as e:  # (ConnectionError, ssl.SSLError: OSErrors)
            log.debug("http client went away: %s", e)
        finally:
            active -= 1
            writer.close()

    host, _, port = listen.rpartition(":")
    # TLS by the server, not the handler (``start_tls``: uvloop had read a ClientHello that came
    # early as plaintext, lost to the handshake). A handshake is not a connection yet: one that
    # never ends is closed after HEAD_TIMEOUT_S, uncounted meanwhile (asyncio runs the handler
    # only once it is done).
    server = await asyncio.start_server(handle, host, int(port), limit=MAX_LINE_BYTES, ssl=ssl,
                                        ssl_handshake_timeout=HEAD_TIMEOUT_S if ssl is not None else None)
    return server, f"{host}:{server.sockets[0].getsockname()[1]}"
