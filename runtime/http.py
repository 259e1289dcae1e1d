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
import contextlib
import hmac
import logging
import socket
import ssl as ssl_module
from collections.abc import Awaitable, Callable

from runtime.errors import ConfigError

log = logging.getLogger(__name__)

Route = Callable[[str], Awaitable[tuple[int, str, bytes]]]  # path -> (status, content type, body)

# Bounds on what one client may make us hold (S7, slowloris): a request line or header
# line longer than MAX_LINE_BYTES, more than MAX_HEADER_LINES headers, or a request head
# not complete within HEAD_TIMEOUT_S is refused (a TLS handshake: closed after as long); at
# most MAX_CONNECTIONS are served at once, handshakes in progress included.
MAX_LINE_BYTES = 8192
MAX_HEADER_LINES = 100
HEAD_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 64
REFUSAL_READ_S = 1.0  # how long a connection over the limit may take to send its request, to be refused

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


class Server:
    """A running :func:`serve`: its own accept loop, so that every connection is counted from
    its accept, TLS handshakes included (``asyncio.start_server`` runs nothing of ours until a
    handshake is done: clients that never say hello were not counted)."""

    def __init__(self, listener: socket.socket, serving: set[asyncio.Task[None]],
                 accepted: dict[socket.socket, None]) -> None:
        self.sockets = [listener]
        self._serving = serving
        self._accepted = accepted

    def close(self) -> None:
        if self.sockets[0].fileno() >= 0:
            asyncio.get_running_loop().remove_reader(self.sockets[0].fileno())
        for t in self._serving:
            t.cancel()
        for sock in self._accepted:  # (a task cancelled before it ran would never close its socket)
            sock.close()
        self.sockets[0].close()

    async def wait_closed(self) -> None:
        await asyncio.gather(*self._serving, return_exceptions=True)


async def serve(listen: str, route: Route, *, token: str | None = None, ssl: ssl_module.SSLContext | None = None,
                unauthorized: bytes = b"send Authorization: Bearer TOKEN\n") -> tuple[Server, str]:
    """Serve ``route`` on ``HOST:PORT`` (HTTPS with ``ssl``; every route asking for ``token``
    if given, ``unauthorized`` the body of a refusal); returns the server and its bound address.

    At most MAX_CONNECTIONS at once, counted from their accept: over it, a plaintext client
    is answered 503 and a TLS one closed at once (no handshake is spent on it). TLS starts on
    the accepted socket before anything is read from it (a handler's ``start_tls`` lost a
    ClientHello that came early under uvloop), and a handshake not done in HEAD_TIMEOUT_S is
    closed."""
    loop = asyncio.get_running_loop()
    serving: set[asyncio.Task[None]] = set()
    accepted: dict[socket.socket, None] = {}  # accepted, not yet a transport's: closed by the server's close

    async def one(sock: socket.socket, refuse: bool) -> None:
        reader = asyncio.StreamReader(limit=MAX_LINE_BYTES)
        protocol = asyncio.StreamReaderProtocol(reader)
        try:
            transport, _ = await loop.connect_accepted_socket(
                lambda: protocol, sock, ssl=ssl, ssl_handshake_timeout=HEAD_TIMEOUT_S if ssl is not None else None)
        except (OSError, TimeoutError) as e:  # a handshake that failed or never ended
            log.debug("http client's TLS handshake failed: %r", e)
            return
        finally:
            accepted.pop(sock, None)  # (its transport's now, or closed)
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        try:
            if refuse:  # (its request read first, briefly: closed with it unread, the socket resets, 503 lost)
                with contextlib.suppress(TimeoutError, OSError, ValueError):
                    async with asyncio.timeout(REFUSAL_READ_S):
                        await _read_head(reader)
                await _reply(writer, 503, "text/plain", b"too many connections\n")
            else:
                await _handle(reader, writer, route, token, unauthorized)
        finally:
            writer.close()  # (also when the server closes: its connections are cancelled)

    def accept() -> None:  # (a callback, as asyncio's own servers accept: a cancelled await could lose a socket)
        for _ in range(128):
            try:
                sock, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # out of descriptors: accept again in a second
                log.warning("the HTTP server on %s cannot accept a connection (%s); trying again in 1 s", listen, e)
                loop.remove_reader(listener.fileno())
                loop.call_later(1.0, lambda: listener.fileno() >= 0 and loop.add_reader(listener.fileno(), accept))
                return
            sock.setblocking(False)
            if len(serving) >= MAX_CONNECTIONS and ssl is not None:
                sock.close()
                continue
            accepted[sock] = None
            task = asyncio.create_task(one(sock, refuse=len(serving) >= MAX_CONNECTIONS))
            serving.add(task)
            task.add_done_callback(serving.discard)

    host, _, port = listen.rpartition(":")
    infos = await loop.getaddrinfo(host or None, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    listener = socket.socket(family, kind, proto)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(128)
        listener.setblocking(False)
    except OSError:
        listener.close()
        raise
    loop.add_reader(listener.fileno(), accept)
    return Server(listener, serving, accepted), f"{host}:{listener.getsockname()[1]}"


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, route: Route, token: str | None,
                  unauthorized: bytes) -> None:
    try:
        async with asyncio.timeout(HEAD_TIMEOUT_S):
            head = await _read_head(reader)
    except ValueError:  # a line longer than the stream limit (MAX_LINE_BYTES)
        head = None
    except (TimeoutError, OSError) as e:  # (ConnectionError, ssl.SSLError: OSErrors)
        log.debug("http client went away: %s", e)
        return
    if head is None:
        await _reply(writer, 431, "text/plain", (f"request head too large: at most {MAX_HEADER_LINES} header lines "
                                                 f"of {MAX_LINE_BYTES} bytes\n").encode())
    elif token is not None and not authorized(head[1], token):
        await _reply(writer, 401, "text/plain", unauthorized)
    else:
        parts = head[0].decode("latin-1").split()
        await _reply(writer, *await route(parts[1].split("?")[0] if len(parts) > 1 else "/"))


async def _reply(writer: asyncio.StreamWriter, code: int, ctype: str, body: bytes) -> None:
    ask = 'WWW-Authenticate: Basic realm="millstream", charset="UTF-8"\r\n' if code == 401 else ""
    head = (f"HTTP/1.1 {code} {_REASONS[code]}\r\n{ask}"
            f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    try:
        writer.write(head.encode() + body)
        await writer.drain()
    except OSError as e:  # (ConnectionError, ssl.SSLError: OSErrors)
        log.debug("http client went away: %s", e)
