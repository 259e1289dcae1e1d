"""The one HTTP server's connection limit (runtime/http.py), on the loops it runs on: every
connection counts from its accept, a TLS handshake that never ends included; over the limit a
plaintext client gets 503 and a TLS one is closed at once; a connection that ends makes room."""

from __future__ import annotations

import asyncio
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
LOOPS: dict[str, Callable[[Coroutine[Any, Any, None]], None]] = {"asyncio": asyncio.run, "uvloop": uvloop.run}


async def _ok(path: str) -> tuple[int, str, bytes]:
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
