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
import errno
import gzip
import hmac
import logging
import socket
import ssl as ssl_module
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from runtime.errors import ConfigError

log = logging.getLogger(__name__)

# Bounds on what one client may make us hold (S7, slowloris): a request line or header
# line longer than MAX_LINE_BYTES, more than MAX_HEADER_LINES headers, or a request head
# not complete within HEAD_TIMEOUT_S is refused; a TLS handshake is closed after as long, a
# route that takes over ROUTE_TIMEOUT_S is answered 503, a reply not taken within
# REPLY_TIMEOUT_S is dropped, and a connection whose close is not
# done within CLOSE_TIMEOUT_S (a TLS client that never answers the close) is cut. At most
# MAX_CONNECTIONS are served at once, counted from their accept to their close, TLS
# handshakes included; past them, as many again are refused (503, their request read for
# at most REFUSAL_READ_S first) and any more closed at once.
MAX_LINE_BYTES = 8192
MAX_HEADER_LINES = 100
HEAD_TIMEOUT_S = 10.0
REPLY_TIMEOUT_S = 30.0
ROUTE_TIMEOUT_S = 30.0  # a route that takes longer is answered 503 (its slot is given back)
CLOSE_TIMEOUT_S = 2.0
MAX_CONNECTIONS = 64
REFUSAL_READ_S = 1.0
GZIP_ABOVE_BYTES = 1024  # a larger body is sent gzip'ed to a client that accepts it

_REASONS = {200: "OK", 401: "Unauthorized", 404: "Not Found", 431: "Request Header Fields Too Large",
            500: "Internal Server Error", 503: "Service Unavailable"}
_KEPT = (b"authorization", b"accept", b"accept-encoding")  # the request headers a route or the server reads


@dataclass(frozen=True)
class Request:
    """What a route is given: the path (no query) and the few headers kept (``_KEPT``, by
    lower-case name)."""
    path: str
    headers: dict[str, str]


Route = Callable[[Request], Awaitable[tuple[int, str, bytes]]]  # -> (status, content type, body)


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


async def _read_head(reader: asyncio.StreamReader) -> tuple[bytes, dict[bytes, bytes]] | None:
    """The request line and the headers kept (``_KEPT``), or None if the head breaks a bound."""
    request = await reader.readline()
    headers: dict[bytes, bytes] = {}
    for _ in range(MAX_HEADER_LINES + 1):
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            return request, headers
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name in _KEPT:
            headers[name] = value.strip()
    return None


class Server:
    """A running :func:`serve`: its own accept, so that every connection is counted from its
    accept to its close, TLS handshakes and closes included (``asyncio.start_server`` runs
    nothing of ours until a handshake is done: clients that never said hello went uncounted)."""

    def __init__(self, listeners: list[socket.socket], serving: set[asyncio.Task[None]],
                 refusing: set[asyncio.Task[None]], accepted: dict[socket.socket, None]) -> None:
        self.sockets = listeners
        self._serving = serving
        self._refusing = refusing
        self._accepted = accepted
        self._on_close: list[Callable[[], object]] = []

    def on_close(self, fn: Callable[[], object]) -> None:
        """Call ``fn`` when the server closes (what its routes hold: a thread pool)."""
        self._on_close.append(fn)

    def close(self) -> None:
        loop = asyncio.get_running_loop()
        for listener in self.sockets:
            if listener.fileno() >= 0:
                loop.remove_reader(listener.fileno())
                listener.close()
        for t in (*self._serving, *self._refusing):  # (each aborts its connection)
            t.cancel()
        for sock in self._accepted:  # (a task cancelled before it ran would never close its socket)
            sock.close()
        for fn in self._on_close:
            fn()
        self._on_close.clear()

    async def wait_closed(self) -> None:
        await asyncio.gather(*self._serving, *self._refusing, return_exceptions=True)


async def serve(listen: str, route: Route, *, token: str | None = None, ssl: ssl_module.SSLContext | None = None,
                unauthorized: bytes = b"send Authorization: Bearer TOKEN\n") -> tuple[Server, str]:
    """Serve ``route`` on ``HOST:PORT`` (every address HOST names; HTTPS with ``ssl``; every
    route asking for ``token`` if given, ``unauthorized`` the body of a refusal); returns the
    server and its bound address.

    TLS starts on the accepted socket before anything is read from it (a handler's
    ``start_tls`` lost a ClientHello that came early under uvloop). The bounds are the
    module's (above)."""
    loop = asyncio.get_running_loop()
    serving: set[asyncio.Task[None]] = set()
    refusing: set[asyncio.Task[None]] = set()
    accepted: dict[socket.socket, None] = {}  # accepted, not yet a transport's: closed by the server's close

    async def one(sock: socket.socket, refuse: bool) -> None:
        reader = asyncio.StreamReader(limit=MAX_LINE_BYTES)
        protocol = asyncio.StreamReaderProtocol(reader)
        try:
            transport, _ = await loop.connect_accepted_socket(
                lambda: protocol, sock, ssl=ssl, ssl_handshake_timeout=HEAD_TIMEOUT_S if ssl is not None else None,
                ssl_shutdown_timeout=CLOSE_TIMEOUT_S if ssl is not None else None)
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
                reply: tuple[int, str, bytes] | None = (503, "text/plain", b"too many connections\n")
                accepts = b""
            else:
                reply, accepts = await _answer(reader, route, token, unauthorized)
            if reply is not None:
                async with asyncio.timeout(REPLY_TIMEOUT_S):  # a client that does not take its reply
                    await _reply(writer, *reply, gzip_ok=_gzip_accepted(accepts))
            writer.close()
            async with asyncio.timeout(CLOSE_TIMEOUT_S):  # (a TLS close waits for the client's answer)
                await writer.wait_closed()
        except (TimeoutError, OSError) as e:  # (ConnectionError, ssl.SSLError: OSErrors)
            log.debug("http client went away: %r", e)
        finally:
            transport.abort()  # (nothing, if it closed; else now: its slot is given back with it)

    def accept(listener: socket.socket) -> None:  # (a callback, as asyncio's own servers accept)
        for _ in range(128):
            try:
                sock, _ = listener.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as e:
                if e.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    log.debug("accept on %s failed: %r", listener.getsockname(), e)
                    continue
                log.warning("the HTTP server on %s cannot accept a connection (%s); trying again in 1 s",
                            listener.getsockname(), e)
                loop.remove_reader(listener.fileno())
                loop.call_later(1.0, lambda: listener.fileno() >= 0 and loop.add_reader(listener.fileno(), accept,
                                                                                         listener))
                return
            sock.setblocking(False)
            full = len(serving) >= MAX_CONNECTIONS
            tasks = refusing if full else serving
            if full and (ssl is not None or len(refusing) >= MAX_CONNECTIONS):
                sock.close()  # (no handshake spent on it; refusals bounded too)
                continue
            accepted[sock] = None
            task = asyncio.create_task(one(sock, refuse=full))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    host, _, port = listen.rpartition(":")
    listeners = _listen(host, int(port), await loop.getaddrinfo(host or None, int(port), type=socket.SOCK_STREAM,
                                                                 flags=socket.AI_PASSIVE))
    for listener in listeners:
        loop.add_reader(listener.fileno(), accept, listener)
    return Server(listeners, serving, refusing, accepted), f"{host}:{listeners[0].getsockname()[1]}"


def _listen(host: str, port: int, infos: list[tuple]) -> list[socket.socket]:  # type: ignore[type-arg]
    """A listening socket on every address ``host`` names that this machine has (one it does
    not, an IPv6 one on a host without IPv6, is skipped with a warning; none at all raises).
    When the OS picks the port, the others take the first one's. An IPv6 socket beside an
    IPv4 one is for IPv6 only; alone (``:::PORT``), it takes IPv4 too, as Linux's default."""
    listeners: list[socket.socket] = []
    addresses = list(dict.fromkeys((i[0], i[1], i[2], i[4]) for i in infos))
    both = len({family for family, *_ in addresses}) > 1
    failed: OSError | None = None
    try:
        for family, kind, proto, address in addresses:
            if port == 0 and listeners:
                address = (address[0], listeners[0].getsockname()[1], *address[2:])
            try:
                listener = socket.socket(family, kind, proto)
            except OSError as e:  # (EAFNOSUPPORT: IPv6 off in this kernel)
                log.warning("not serving HTTP on %s: %s", address[0], e)
                failed = e
                continue
            try:
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6 and both:
                    listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                listener.bind(address)
            except OSError as e:
                listener.close()
                if e.errno != errno.EADDRNOTAVAIL:  # (in use, not allowed: the operator must know)
                    raise
                log.warning("not serving HTTP on %s: this machine has no such address (%s)", address[0], e)
                failed = e
                continue
            listeners.append(listener)
            listener.listen(128)
            listener.setblocking(False)
        if not listeners:
            raise failed or OSError(errno.EADDRNOTAVAIL, f"{host!r} names no address to serve HTTP on")
    except OSError:
        for listener in listeners:
            listener.close()
        raise
    return listeners


async def _answer(reader: asyncio.StreamReader, route: Route, token: str | None,
                  unauthorized: bytes) -> tuple[tuple[int, str, bytes] | None, bytes]:
    """The reply to the request ``reader`` brings (None: none came, or the client went
    away), and the encodings the client accepts."""
    try:
        async with asyncio.timeout(HEAD_TIMEOUT_S):
            head = await _read_head(reader)
    except ValueError:  # a line longer than the stream limit (MAX_LINE_BYTES)
        head = None
    if head is None:
        return (431, "text/plain", (f"request head too large: at most {MAX_HEADER_LINES} header lines of "
                                    f"{MAX_LINE_BYTES} bytes\n").encode()), b""
    line, headers = head
    parts = line.decode("latin-1").split()
    if len(parts) < 2:  # connected and closed, or not HTTP (a probe, a port scan): no route runs
        return None, b""
    if token is not None and not authorized(headers.get(b"authorization"), token):
        return (401, "text/plain", unauthorized), b""
    request = Request(parts[1].split("?")[0], {k.decode(): v.decode("latin-1") for k, v in headers.items()})
    try:
        async with asyncio.timeout(ROUTE_TIMEOUT_S):
            return await route(request), headers.get(b"accept-encoding", b"")
    except TimeoutError:
        log.warning("the HTTP route for %s took over %.0f s: answered 503", request.path, ROUTE_TIMEOUT_S)
        return (503, "text/plain", b"the server took too long to answer; try again\n"), b""
    except Exception:
        log.exception("the HTTP route for %s failed", request.path)
        return (500, "text/plain", b"internal error: see the server's log\n"), b""


def _gzip_accepted(accept_encoding: bytes) -> bool:
    """Whether an ``Accept-Encoding`` takes gzip (``gzip;q=0`` refuses it)."""
    for part in accept_encoding.lower().split(b","):
        coding, _, params = part.partition(b";")
        if coding.strip() == b"gzip":
            q = params.strip()
            return not (q.startswith(b"q=") and q[2:].strip() in (b"0", b"0.0", b"0.00", b"0.000"))
    return False


async def _reply(writer: asyncio.StreamWriter, code: int, ctype: str, body: bytes, *, gzip_ok: bool) -> None:
    extra = 'WWW-Authenticate: Basic realm="millstream", charset="UTF-8"\r\n' if code == 401 else ""
    if gzip_ok and len(body) > GZIP_ABOVE_BYTES:
        body = gzip.compress(body, compresslevel=1)  # (on the loop: ~0.2 ms for a worker's 100 KB of metrics)
        extra += "Content-Encoding: gzip\r\nVary: Accept-Encoding\r\n"
    head = (f"HTTP/1.1 {code} {_REASONS[code]}\r\n{extra}"
            f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    writer.write(head.encode() + body)
    await writer.drain()
