"""A worker's ``/metrics`` on the one HTTP server (runtime/http.py, runtime/metrics.py): open by
default as prometheus_client's server was, behind a token and over TLS when asked, and flags
that cannot work refused before the worker serves."""

from __future__ import annotations

import asyncio
import base64
import gzip
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from runtime import metrics
from runtime.errors import ConfigError
from runtime.security import Security
from tests.certs import make_certs
from worker.server import WorkerOptions

TOKEN = "scrape-s3cret"


async def _get(path: str, headers: dict[str, str], *, token: str | None,
               server_ssl: ssl.SSLContext | None = None, client_ssl: ssl.SSLContext | None = None) -> bytes:
    server, address = await metrics.serve("127.0.0.1:0", token=token, ssl=server_ssl)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", int(address.rpartition(":")[2]), ssl=client_ssl,
                                                       server_hostname="localhost" if client_ssl else None)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n".encode()
                     + "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode() + b"\r\n")
        reply = await asyncio.wait_for(reader.read(), 30)
        writer.close()
        return reply
    finally:
        server.close()
        await server.wait_closed()


def test_without_a_token_metrics_are_served_on_any_path_as_before() -> None:
    for path in ("/metrics", "/"):
        reply = asyncio.run(_get(path, {}, token=None))
        assert reply.startswith(b"HTTP/1.1 200 OK\r\n") and b"# TYPE millstream_records_processed_total counter" in reply
    assert asyncio.run(_get("/favicon.ico", {}, token=None)).startswith(b"HTTP/1.1 404")


@pytest.mark.parametrize("auth", [None, "Bearer wrong", f"Basic {base64.b64encode(b'u:wrong').decode()}", TOKEN])
def test_with_a_token_anything_but_it_is_refused_with_a_login_prompt(auth: str | None) -> None:
    reply = asyncio.run(_get("/metrics", {"Authorization": auth} if auth else {}, token=TOKEN))
    assert reply.startswith(b"HTTP/1.1 401 Unauthorized\r\n") and b"WWW-Authenticate: Basic" in reply
    assert b"--metrics-token" in reply and b"millstream_" not in reply


@pytest.mark.parametrize("auth", [f"Bearer {TOKEN}", f"Basic {base64.b64encode(f'prometheus:{TOKEN}'.encode()).decode()}"])
def test_the_token_as_bearer_or_as_a_logins_password_is_let_in(auth: str) -> None:
    reply = asyncio.run(_get("/metrics", {"Authorization": auth}, token=TOKEN))
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n") and b"millstream_records_processed" in reply


def test_prometheus_gets_openmetrics_gzipped_as_it_asks_and_others_the_text_format() -> None:
    """What prometheus_client's own server answered: the format the ``Accept`` asks for
    (Prometheus asks for OpenMetrics first), gzip'ed for a client that accepts it."""
    prometheus = {"Accept": "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
                  "Accept-Encoding": "gzip"}
    reply = asyncio.run(_get("/metrics", prometheus, token=None))
    head, _, body = reply.partition(b"\r\n\r\n")
    assert b"Content-Type: application/openmetrics-text" in head and b"Content-Encoding: gzip" in head
    text = gzip.decompress(body)
    assert b"# TYPE millstream_records_processed counter" in text and text.endswith(b"# EOF\n")
    head, _, body = asyncio.run(_get("/metrics", {}, token=None)).partition(b"\r\n\r\n")
    assert b"Content-Type: text/plain; version=0.0.4" in head and b"Content-Encoding" not in head
    assert b"# TYPE millstream_records_processed_total counter" in body


@pytest.mark.parametrize("accept, encoding, content_type, gzipped", [
    ("text/plain;version=x", "", b"text/plain; version=0.0.4", False),  # (prometheus_client's chooser raises on it)
    ("", "gzip;q=0", b"text/plain; version=0.0.4", False),
    ("", "identity, GZIP", b"text/plain; version=0.0.4", True),
])
def test_an_accept_it_cannot_read_gets_the_text_format_and_gzip_only_when_taken(
        accept: str, encoding: str, content_type: bytes, gzipped: bool) -> None:
    headers = {k: v for k, v in (("Accept", accept), ("Accept-Encoding", encoding)) if v}
    head, _, body = asyncio.run(_get("/metrics", headers, token=None)).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and b"Content-Type: " + content_type in head, head
    assert (b"Content-Encoding: gzip" in head) is gzipped
    assert b"millstream_records_processed" in (gzip.decompress(body) if gzipped else body)


def test_scrapes_at_once_share_one_exposition_made_off_the_loop(monkeypatch: Any) -> None:
    made: list[str] = []
    real = metrics.encoder_for

    def slow(accept: str) -> tuple[Callable[[Any], bytes], str]:
        encoder, content_type = real(accept)

        def counted(registry: Any) -> bytes:
            made.append(threading.current_thread().name)
            time.sleep(0.3)  # a slow exposition (a large registry), long enough for the others to ask meanwhile
            return encoder(registry)
        return counted, content_type

    monkeypatch.setattr(metrics, "encoder_for", slow)

    async def run() -> list[bytes]:
        server, address = await metrics.serve("127.0.0.1:0")
        port = int(address.rpartition(":")[2])
        try:
            async def one() -> bytes:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"GET /metrics HTTP/1.1\r\n\r\n")
                reply = await asyncio.wait_for(reader.read(), 30)
                writer.close()
                return reply
            return await asyncio.gather(*(one() for _ in range(8)))
        finally:
            server.close()
            await server.wait_closed()
    replies = asyncio.run(run())
    assert all(r.startswith(b"HTTP/1.1 200 OK") for r in replies)
    assert made and all(name.startswith("metrics") for name in made), made  # its own thread, not the loop's pool
    assert len(made) < len(replies), made  # (eight at once: fewer expositions made)


def test_over_tls_with_the_workers_certificate(tmp_path: Any) -> None:
    ca, cert, key = make_certs(str(tmp_path))
    server_ssl = Security(cert=cert, key=key).https_context("--metrics-tls")
    reply = asyncio.run(_get("/metrics", {"Authorization": f"Bearer {TOKEN}"}, token=TOKEN, server_ssl=server_ssl,
                             client_ssl=ssl.create_default_context(cafile=ca)))
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n") and b"millstream_" in reply
    with pytest.raises((ssl.SSLError, ConnectionError)):  # a client that does not trust it
        asyncio.run(_get("/metrics", {}, token=TOKEN, server_ssl=server_ssl, client_ssl=ssl.create_default_context()))


def test_flags_that_cannot_work_are_refused_before_the_worker_serves(tmp_path: Any, monkeypatch: Any) -> None:
    from cli.main import build_parser

    for value, on in (("True", True), ("1", True), ("", False), ("0", False)):
        monkeypatch.setenv("MILLSTREAM_METRICS_TLS", value)
        assert build_parser().parse_args(["worker"]).metrics_tls is on, value
    with pytest.raises(ConfigError, match="--metrics-tls .* pass --tls-cert and --tls-key"):
        WorkerOptions(("127.0.0.1:1",), "127.0.0.1:0", str(tmp_path), metrics_tls=True)
    with pytest.raises(ConfigError, match="token of --metrics-token is empty or has spaces around it.*"
                                          "MILLSTREAM_METRICS_TOKEN_FILE"):
        WorkerOptions(("127.0.0.1:1",), "127.0.0.1:0", str(tmp_path), metrics_token=" t ")
    token_file = tmp_path / "metrics.token"
    token_file.write_text(TOKEN + "\n")
    monkeypatch.setenv("MILLSTREAM_METRICS_TOKEN_FILE", str(token_file))
    from cli.flags import read_secrets
    args = build_parser().parse_args(["worker"])
    read_secrets(args)
    assert args.metrics_token == TOKEN
