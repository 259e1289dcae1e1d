"""The headers every gRPC call of a process carries (its token, its injector credential:
runtime/security.py says which), added by interceptors on each of its channels, blocking
(:class:`SyncToken`) or asyncio (:func:`aio_token_interceptors`), for every shape of call."""

from __future__ import annotations

from typing import Any

import grpc


def aio_token_interceptors(headers: list[tuple[str, str]]) -> list[Any]:
    """An asyncio channel's interceptors: one per shape of call."""
    return [_AioUnaryToken(headers), _AioStreamToken(headers), _AioStreamUnaryToken(headers),
            _AioStreamStreamToken(headers)]


def _with_token(details: Any, headers: list[tuple[str, str]]) -> Any:
    metadata = list(details.metadata or []) + headers
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


class SyncToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """The token on every call of a channel, whatever its shape (a shape left out goes
    without it: ``LoadTablet``, stream-unary, was refused on a cluster with tokens)."""

    def __init__(self, headers: list[tuple[str, str]]) -> None:
        self.headers = headers

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(_with_token(details, self.headers), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(_with_token(details, self.headers), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(_with_token(details, self.headers), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(_with_token(details, self.headers), requests)


class _Headers:
    """What an asyncio interceptor adds (grpc.aio files one under one shape of call only, so
    each shape has its own class)."""

    def __init__(self, headers: list[tuple[str, str]]) -> None:
        self.headers = headers


class _AioUnaryToken(_Headers, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_token(details, self.headers), request)


class _AioStreamToken(_Headers, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_token(details, self.headers), request)


class _AioStreamUnaryToken(_Headers, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(_with_token(details, self.headers), requests)


class _AioStreamStreamToken(_Headers, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(_with_token(details, self.headers), requests)
