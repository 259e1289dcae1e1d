"""TLS on every gRPC port and a shared token on every call (both optional).

Parsed once at the entry point into a frozen :class:`Security`, then passed
to every server and channel. Servers present ``cert``/``key``; clients verify
servers with ``ca``; with a ``token``, servers refuse any call that does not
carry it (``authorization: Bearer <token>``) with UNAUTHENTICATED.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from runtime.errors import ConfigError
from runtime.wire import CHANNEL_OPTIONS

_HEADER = "authorization"


@dataclass(frozen=True)
class Security:
    """Transport security settings. The default is plaintext and no token (loopback use)."""

    cert: str | None = None   # server certificate chain (PEM), for daemons
    key: str | None = None    # its private key (PEM)
    ca: str | None = None     # CA bundle clients verify servers with (PEM)
    token: str | None = None  # shared secret every call must carry

    def __post_init__(self) -> None:
        for what, path in (("--tls-cert", self.cert), ("--tls-key", self.key), ("--tls-ca", self.ca)):
            if path is not None and not os.path.isfile(path):
                raise ConfigError(f"{what} {path!r} is not a readable file")
        if (self.cert is None) != (self.key is None):
            raise ConfigError("--tls-cert and --tls-key go together: pass both or neither")
        if self.token is not None and not self.token.strip():
            raise ConfigError("the token is empty; pass a non-empty --token (or unset MILLSTREAM_TOKEN)")

    @property
    def tls(self) -> bool:
        return self.ca is not None or self.cert is not None

    def _read(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    # --------------------------------------------------------------- servers

    def server_credentials(self) -> grpc.ServerCredentials | None:
        if self.cert is None or self.key is None:
            return None
        return grpc.ssl_server_credentials([(self._read(self.key), self._read(self.cert))])

    def server_interceptors(self) -> list[grpc.aio.ServerInterceptor]:
        return [_TokenCheck(self.token)] if self.token else []

    # --------------------------------------------------------------- clients

    def _client_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(self._read(self.ca) if self.ca else None)

    def channel(self, address: str) -> grpc.Channel:
        """A blocking channel to ``address`` carrying the token, over TLS if configured."""
        if self.tls:
            ch = grpc.secure_channel(address, self._client_credentials(), options=CHANNEL_OPTIONS)
        else:
            ch = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        return grpc.intercept_channel(ch, _SyncToken(self.token)) if self.token else ch

    def aio_channel(self, address: str) -> grpc.aio.Channel:
        """An asyncio channel to ``address`` carrying the token, over TLS if configured."""
        interceptors = [_AioUnaryToken(self.token), _AioStreamToken(self.token)] if self.token else None
        if self.tls:
            return grpc.aio.secure_channel(address, self._client_credentials(), options=CHANNEL_OPTIONS,
                                           interceptors=interceptors)
        return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS, interceptors=interceptors)


def _with_token(details: Any, token: str) -> Any:
    metadata = list(details.metadata or []) + [(_HEADER, f"Bearer {token}")]
    return details._replace(metadata=metadata) if hasattr(details, "_replace") else _Details(details, metadata)


class _Details:
    """Client call details with extra metadata (grpc's own type is a namedtuple-like)."""

    def __init__(self, base: Any, metadata: list[tuple[str, str]]) -> None:
        self.method = base.method
        self.timeout = base.timeout
        self.metadata = metadata
        self.credentials = base.credentials
        self.wait_for_ready = getattr(base, "wait_for_ready", None)
        self.compression = getattr(base, "compression", None)


class _SyncToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    def __init__(self, token: str | None) -> None:
        self.token = token or ""

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(_with_token(details, self.token), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(_with_token(details, self.token), request)


class _AioUnaryToken(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, token: str) -> None:
        self.token = token

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_token(details, self.token), request)


class _AioStreamToken(grpc.aio.UnaryStreamClientInterceptor):
    def __init__(self, token: str) -> None:
        self.token = token

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_token(details, self.token), request)


class _TokenCheck(grpc.aio.ServerInterceptor):
    def __init__(self, token: str | None) -> None:
        self.expected = f"Bearer {token}"

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]], details: Any) -> Any:
        handler = await continuation(details)
        if handler is None or dict(details.invocation_metadata or ()).get(_HEADER) == self.expected:
            return handler
        message = ("missing or wrong token: this cluster requires its shared token; pass --token "
                   "(or set MILLSTREAM_TOKEN, or Security(token=...) in code)")

        async def deny(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

        async def deny_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
            yield  # pragma: no cover - makes this an async generator

        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                deny_stream, handler.request_deserializer, handler.response_serializer)
        return grpc.unary_unary_rpc_method_handler(deny, handler.request_deserializer, handler.response_serializer)
