"""The master's console behind a token and over TLS (master/web.py): every route asks for the
token, as Bearer (Prometheus) or as a Basic login's password (a browser), and refuses anything
else with 401 and a login prompt; ``--http-tls`` serves it over HTTPS with the master's
certificate."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import uvloop

from master import web
from master.server import MasterOptions
from master.store import EtcdConfig
from runtime import http
from runtime.errors import ConfigError
from runtime.security import Security
from tests.certs import make_certs
from tests.unit.test_master_hardening import _http

TOKEN = "console-s3cret"


async def _get(path: str, headers: dict[str, str], *, token: str | None = TOKEN,
               server_ssl: ssl.SSLContext | None = None, client_ssl: ssl.SSLContext | None = None) -> bytes:
    raw = (f"GET {path} HTTP/1.1\r\nHost: x\r\n".encode()
           + "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode() + b"\r\n")
    return await _http(raw, client_ssl, token=token, ssl=server_ssl)


async def _until_reply(ask: Callable[[], Awaitable[bytes]], good: Callable[[bytes], bool], what: str) -> None:
    deadline = asyncio.get_running_loop().time() + 10
    while not good(reply := await ask()):
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}: {reply[:80]!r}"
        await asyncio.sleep(0.01)  # poll interval of this deadline-bounded wait


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.mark.parametrize("path", ["/", "/status.json", "/history.json", "/metrics"])
def test_every_route_asks_for_the_token_with_a_login_prompt(path: str) -> None:
    reply = asyncio.run(_get(path, {}))
    assert reply.startswith(b"HTTP/1.1 401 Unauthorized\r\n")
    assert b'WWW-Authenticate: Basic realm="millstream"' in reply
    assert reply.endswith(web.UNAUTHORIZED)


@pytest.mark.parametrize("auth", [f"Bearer {TOKEN}", f"bearer {TOKEN}", _basic("anyone", TOKEN), _basic("", TOKEN)])
def test_the_token_as_bearer_or_as_a_logins_password_is_let_in(auth: str) -> None:
    reply = asyncio.run(_get("/status.json", {"Authorization": auth}))
    assert reply.startswith(b"HTTP/1.1 200 OK")
    assert json.loads(reply.split(b"\r\n\r\n", 1)[1]) == {"ok": True}


@pytest.mark.parametrize("auth", ["Bearer wrong", f"Bearer {TOKEN}x", _basic(TOKEN, "wrong"), "Basic !!notbase64",
                                  f"Token {TOKEN}", TOKEN, ""])
def test_anything_else_is_refused(auth: str) -> None:
    assert asyncio.run(_get("/metrics", {"Authorization": auth})).startswith(b"HTTP/1.1 401 ")


def test_without_a_token_the_console_is_open_as_before() -> None:
    assert asyncio.run(_get("/status.json", {}, token=None)).startswith(b"HTTP/1.1 200 OK")


def test_over_tls_with_the_masters_certificate(tmp_path: Any) -> None:
    ca, cert, key = make_certs(str(tmp_path))
    server_ssl = Security(cert=cert, key=key).https_context()
    client_ssl = ssl.create_default_context(cafile=ca)
    reply = asyncio.run(_get("/status.json", {"Authorization": f"Bearer {TOKEN}"}, server_ssl=server_ssl,
                             client_ssl=client_ssl))
    assert reply.startswith(b"HTTP/1.1 200 OK")
    try:  # a plaintext client gets nothing (the handshake fails, the server hangs up)
        plain = asyncio.run(_get("/status.json", {"Authorization": f"Bearer {TOKEN}"}, server_ssl=server_ssl))
    except ConnectionError:
        plain = b""
    assert plain == b""
    with pytest.raises(ssl.SSLCertVerificationError):  # a client that does not trust the CA
        asyncio.run(_get("/status.json", {}, server_ssl=server_ssl, client_ssl=ssl.create_default_context()))


def test_a_tls_client_that_never_finishes_its_handshake_is_closed_after_the_heads_deadline(
        tmp_path: Any, monkeypatch: Any) -> None:
    ca, cert, key = make_certs(str(tmp_path))
    monkeypatch.setattr(http, "HEAD_TIMEOUT_S", 0.5)

    async def status() -> dict[str, Any]:
        return {"ok": True}

    async def run() -> None:
        server, address = await web.serve("127.0.0.1:0", status, token=TOKEN,
                                          ssl=Security(cert=cert, key=key).https_context())
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", int(address.rpartition(":")[2]))
            assert await asyncio.wait_for(reader.read(), 10) == b""  # no ClientHello, ever: closed by the server
            writer.close()
        finally:
            server.close()
            await server.wait_closed()
    asyncio.run(run())


def test_flags_that_cannot_work_are_refused_before_the_master_serves(tmp_path: Any, monkeypatch: Any) -> None:
    from cli.main import build_parser

    ca, cert, key = make_certs(str(tmp_path))
    with pytest.raises(ConfigError, match="do not load as a certificate and its key"):
        Security(cert=ca, key=key).https_context()  # (the CA's certificate with the server's key)
    for value, on in (("True", True), ("1", True), ("yes", True), ("", False), ("0", False)):
        monkeypatch.setenv("MILLSTREAM_HTTP_TLS", value)
        assert build_parser().parse_args(["master"]).http_tls is on, value
    etcd = EtcdConfig.parse("http://127.0.0.1:2379")
    with pytest.raises(ConfigError, match="--http-tls .* pass --tls-cert and --tls-key"):
        MasterOptions(etcd, "127.0.0.1:0", http_tls=True)
    with pytest.raises(ConfigError, match="token of --http-token is empty or has spaces around it"):
        MasterOptions(etcd, "127.0.0.1:0", http_token="  ")


def test_a_client_hello_that_arrives_before_the_handler_runs_is_not_lost(tmp_path: Any) -> None:
    """A client whose ClientHello is in the socket before the server's loop even accepts it
    (the loop busy meanwhile) is served, on uvloop, the master's loop. With the handshake made
    by the handler (``start_tls``), uvloop read the hello as plaintext before the handler ran,
    and the handshake failed (a CI run's e2e console test); the server's own TLS takes it."""
    import socket
    import threading
    import time

    ca, cert, key = make_certs(str(tmp_path))
    got: list[bytes] = []

    async def status() -> dict[str, Any]:
        return {"ok": True}

    def client(port: int) -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                ssl.create_default_context(cafile=ca).wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(f"GET /status.json HTTP/1.1\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode())
            got.append(b"".join(iter(lambda: tls.recv(65536), b"")))

    async def run() -> None:
        server, address = await web.serve("127.0.0.1:0", status, token=TOKEN,
                                          ssl=Security(cert=cert, key=key).https_context())
        try:
            thread = threading.Thread(target=client, args=(int(address.rpartition(":")[2]),))
            thread.start()
            time.sleep(0.3)  # the server's loop held: the ClientHello waits in the socket (not a wait for a condition)
            await asyncio.to_thread(thread.join, 15)
        finally:
            server.close()
            await server.wait_closed()
    uvloop.run(run())  # (the master's loop: runtime/serving.py)
    assert got and got[0].startswith(b"HTTP/1.1 200 OK"), got
