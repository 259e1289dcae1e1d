"""The one HTTP server's bounds (runtime/http.py), on the loops it runs on: every connection
counts from its accept to its close, a TLS handshake that never ends included; over the limit
a plaintext client gets 503 (as many as the limit; more are closed at once) and a TLS one is
closed at once; a connection that ends makes room; a reply not taken and a TLS close not
answered are cut. And what it does with what a client sends: nothing for an empty request,
500 for a route that raises."""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from runtime import http
from runtime.security import Security
from tests.certs import make_certs

LIMIT = 3


@pytest.fixture(autouse=True)
def _long_heads(monkeypatch: Any) -> None:
    """Connections held without a request stay held through every wait here (whose deadlines
    are 10 s): the head's own deadline does not end them meanwhile."""
    monkeypatch.setattr(http, "HEAD_TIMEOUT_S", 60.0)
LOOPS: dict[str, Callable[[Coroutine[Any, Any, None]], None]] = {"asyncio": asyncio.run, "uvloop": uvloop.run}


async def _ok(request: http.Request) -> tuple[int, str, bytes]:
    return 200, "text/plain", b"ok\n"


async def _get(port: int, client_ssl: ssl.SSLContext | None) -> bytes:
    """What one GET is answered, or b"" if the connection is closed without a reply."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_ssl,
                                                       server_hostname="localhost" if client_ssl else None)
        writer.write(b"GET / HTTP/1.1\r\n\r\n")
        reply = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        return reply
    except (ConnectionError, ssl.SSLError):
        return b""


async def _held(port: int) -> list[socket.socket]:
    """LIMIT connections that never send a byte (no request head; under TLS, no ClientHello)."""
    return [await asyncio.to_thread(socket.create_connection, ("127.0.0.1", port), 10) for _ in range(LIMIT)]


async def _until(ask: Callable[[], Coroutine[Any, Any, bytes]], good: Callable[[bytes], bool], what: str) -> bytes:
    deadline = asyncio.get_running_loop().time() + 10
    while not good(reply := await ask()):
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}: {reply[:80]!r}"
        await asyncio.sleep(0.01)  # poll interval of this deadline-bounded wait
    return reply


@pytest.mark.parametrize("loop", LOOPS)
def test_plaintext_connections_past_the_limit_get_503_until_one_ends(loop: str, monkeypatch: Any) -> None:
    monkeypatch.setattr(http, "MAX_CONNECTIONS", LIMIT)

    async def run() -> None:
        server, address = await http.serve("127.0.0.1:0", _ok)
        port = int(address.rpartition(":")[2])
        try:
            held = await _held(port)
            await _until(lambda: _get(port, None), lambda r: r.startswith(b"HTTP/1.1 503 "), "the limit to be full")
            for s in held:
                s.close()
            await _until(lambda: _get(port, None), lambda r: r.startswith(b"HTTP/1.1 200 OK"), "room again")
        finally:
            server.close()
            await server.wait_closed()
    LOOPS[loop](run())


@pytest.mark.parametrize("loop", LOOPS)
def test_tls_handshakes_that_never_end_count_against_the_limit(loop: str, monkeypatch: Any, tmp_path: Any) -> None:
    """asyncio's own TLS server ran nothing of ours before a handshake was done: any number
    of clients that never said hello were held, uncounted (a review finding)."""
    monkeypatch.setattr(http, "MAX_CONNECTIONS", LIMIT)
    ca, cert, key = make_certs(str(tmp_path))
    client_ssl = ssl.create_default_context(cafile=ca)

    async def run() -> None:
        server, address = await http.serve("127.0.0.1:0", _ok, ssl=Security(cert=cert, key=key).https_context())
        port = int(address.rpartition(":")[2])
        try:
            assert (await _get(port, client_ssl)).startswith(b"HTTP/1.1 200 OK")
            held = await _held(port)
            await _until(lambda: _get(port, client_ssl), lambda r: r == b"", "a TLS client past the limit closed")
            for s in held:
                s.close()
            await _until(lambda: _get(port, client_ssl), lambda r: r.startswith(b"HTTP/1.1 200 OK"), "room again")
        finally:
            server.close()
            await server.wait_closed()
    LOOPS[loop](run())


def test_a_server_closed_lets_go_of_its_port_and_of_the_connections_it_held() -> None:
    async def run() -> None:
        server, address = await http.serve("127.0.0.1:0", _ok)
        port = int(address.rpartition(":")[2])
        held = await _held(port)
        server.close()
        await asyncio.wait_for(server.wait_closed(), 10)
        for s in held:  # closed by the server (reset: it was never accepted, its listener closed)
            try:
                assert await asyncio.to_thread(s.recv, 1) == b""
            except ConnectionResetError:
                pass
            s.close()
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection("127.0.0.1", port)
    asyncio.run(run())


def _fds() -> int:
    """The sockets this process holds open (uvloop keeps a /dev/null descriptor of its own)."""
    held = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            held += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:  # (closed meanwhile)
            pass
    return held


@pytest.mark.parametrize("loop", LOOPS)
def test_a_tls_client_that_never_answers_the_close_is_cut_after_the_close_deadline(
        loop: str, monkeypatch: Any, tmp_path: Any) -> None:
    """Each took its reply and then said nothing: the server's side of each is closed within
    CLOSE_TIMEOUT_S (TLS's own default waited 30 s, its descriptor held and no longer counted)."""
    monkeypatch.setattr(http, "CLOSE_TIMEOUT_S", 0.3)
    ca, cert, key = make_certs(str(tmp_path))
    clients: list[ssl.SSLSocket] = []

    def silent(port: int) -> bytes:
        tls = ssl.create_default_context(cafile=ca).wrap_socket(
            socket.create_connection(("127.0.0.1", port), 10), server_hostname="localhost")
        clients.append(tls)  # (kept open, never unwrapped: the server's close is never answered)
        tls.sendall(b"GET / HTTP/1.1\r\n\r\n")
        return b"".join(iter(lambda: tls.recv(65536), b""))

    async def run() -> None:
        server, address = await http.serve("127.0.0.1:0", _ok, ssl=Security(cert=cert, key=key).https_context())
        port = int(address.rpartition(":")[2])
        try:
            before = _fds()
            for _ in range(5):
                assert (await asyncio.to_thread(silent, port)).startswith(b"HTTP/1.1 200 OK")
            deadline = asyncio.get_running_loop().time() + 10
            while _fds() > before + len(clients):  # the clients' own are still open
                assert asyncio.get_running_loop().time() < deadline, "the server held its side of silent clients"
                await asyncio.sleep(0.01)  # poll interval of this deadline-bounded wait
        finally:
            for c in clients:
                c.close()
            server.close()
            await server.wait_closed()
    LOOPS[loop](run())


@pytest.mark.parametrize("loop", LOOPS)
def test_a_client_that_does_not_take_its_reply_gives_its_slot_back_after_the_reply_deadline(
        loop: str, monkeypatch: Any) -> None:
    monkeypatch.setattr(http, "MAX_CONNECTIONS", 1)
    monkeypatch.setattr(http, "REPLY_TIMEOUT_S", 0.5)
    big = b"x" * (32 << 20)  # more than both sockets' buffers hold

    async def large(request: http.Request) -> tuple[int, str, bytes]:
        return 200, "text/plain", big

    async def run() -> None:
        server, address = await http.serve("127.0.0.1:0", large)
        port = int(address.rpartition(":")[2])
        try:
            stuck = socket.create_connection(("127.0.0.1", port), 10)
            stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            stuck.sendall(b"GET / HTTP/1.1\r\n\r\n")  # and never reads
            reply = await _until(lambda: _get(port, None), lambda r: r.startswith(b"HTTP/1.1 200 OK"),
                                 "the stuck client's slot back")
            assert len(reply) > len(big)
            stuck.close()
        finally:
            server.close()
            await server.wait_closed()
    LOOPS[loop](run())


@pytest.mark.parametrize("loop", LOOPS)
def test_refusals_are_bounded_too_and_more_are_closed_at_once(loop: str, monkeypatch: Any) -> None:
    monkeypatch.setattr(http, "MAX_CONNECTIONS", 1)
    monkeypatch.setattr(http, "REFUSAL_READ_S", 30.0)

    async def run() -> None:
        server, address = await http.serve("127.0.0.1:0", _ok)
        port = int(address.rpartition(":")[2])
        held: list[socket.socket] = []
        try:
            for _ in range(2):  # one served, one refused: both wait for a request
                held.append(await asyncio.to_thread(socket.create_connection, ("127.0.0.1", port), 10))
            more = await asyncio.to_thread(socket.create_connection, ("127.0.0.1", port), 10)
            try:
                assert await asyncio.to_thread(more.recv, 1) == b""  # past both bounds: closed at once
            except ConnectionResetError:
                pass
            more.close()
            held[1].sendall(b"GET / HTTP/1.1\r\n\r\n")
            assert (await asyncio.to_thread(held[1].recv, 65536)).startswith(b"HTTP/1.1 503 ")
        finally:
            for s in held:
                s.close()
            server.close()
            await server.wait_closed()
    LOOPS[loop](run())


@pytest.mark.parametrize("loop", LOOPS)
def test_an_empty_request_runs_no_route_and_a_route_that_raises_is_a_500(loop: str, caplog: Any) -> None:
    asked: list[str] = []

    async def fails(request: http.Request) -> tuple[int, str, bytes]:
        asked.append(request.path)
        raise RuntimeError("a bug in a route")

    async def run() -> None:
        server, address = await http.serve("127.0.0.1:0", fails)
        port = int(address.rpartition(":")[2])
        try:
            for _ in range(3):  # a probe: connects and closes
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
            assert (await _get(port, None)).startswith(b"HTTP/1.1 500 Internal Server Error")
            assert asked == ["/"]  # the GET's alone
            assert [r.message for r in caplog.records if r.levelname == "ERROR"] == [
                "the HTTP route for / failed"]  # logged once, with its traceback
        finally:
            server.close()
            await server.wait_closed()
    LOOPS[loop](run())


def test_a_host_that_names_two_addresses_is_served_on_both() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")

    async def run() -> None:
        server, address = await http.serve(":0", _ok)  # (every interface: IPv4 and IPv6)
        port = int(address.rpartition(":")[2])
        try:
            for host in ("127.0.0.1", "::1"):
                reader, writer = await asyncio.open_connection(host, port)
                writer.write(b"GET / HTTP/1.1\r\n\r\n")
                assert (await asyncio.wait_for(reader.read(), 10)).startswith(b"HTTP/1.1 200 OK"), host
                writer.close()
        finally:
            server.close()
            await server.wait_closed()
        server, address = await http.serve(":::0", _ok)  # (IPv6's every interface alone: IPv4 too, as Linux's default)
        port = int(address.rpartition(":")[2])
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.1\r\n\r\n")
            assert (await asyncio.wait_for(reader.read(), 10)).startswith(b"HTTP/1.1 200 OK")
            writer.close()
        finally:
            server.close()
            await server.wait_closed()
    asyncio.run(run())


def test_an_address_this_machine_lacks_is_skipped_and_none_at_all_is_an_error() -> None:
    mine = (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 0))
    absent = (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("192.0.2.1", 0))  # (TEST-NET-1: on no machine)
    listeners = http._listen("somehost", 0, [absent, mine])
    try:
        assert [ls.getsockname()[0] for ls in listeners] == ["127.0.0.1"]
    finally:
        for ls in listeners:
            ls.close()
    with pytest.raises(OSError):
        http._listen("somehost", 0, [absent])


def test_a_route_that_takes_too_long_is_answered_503_and_gives_its_slot_back(monkeypatch: Any) -> None:
    monkeypatch.setattr(http, "ROUTE_TIMEOUT_S", 0.3)
    monkeypatch.setattr(http, "MAX_CONNECTIONS", 1)
    hung = asyncio.Event()

    async def hangs(request: http.Request) -> tuple[int, str, bytes]:
        if request.path == "/hang":
            await hung.wait()  # (never set)
        return 200, "text/plain", b"ok\n"

    async def run() -> None:
        server, address = await http.serve("127.0.0.1:0", hangs)
        port = int(address.rpartition(":")[2])
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /hang HTTP/1.1\r\n\r\n")
            assert (await asyncio.wait_for(reader.read(), 10)).startswith(b"HTTP/1.1 503 ")
            writer.close()
            assert (await _get(port, None)).startswith(b"HTTP/1.1 200 OK")
        finally:
            server.close()
            await server.wait_closed()
    asyncio.run(run())
