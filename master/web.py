"""The master's HTTP side: the console (master/console.py), ``/status.json``, ``/history.json``
(master/history.py) and Prometheus ``/metrics``, served by runtime/http.py (its TLS, its
token and its bounds are there). The console's history is sampled by a task of this server,
not by the master's core.
"""

from __future__ import annotations

import asyncio
import json
import ssl as ssl_module
from collections.abc import Awaitable, Callable
from typing import Any

from master.console import PAGE
from master.history import History, sample
from runtime import http, metrics

StatusFn = Callable[[], Awaitable[dict[str, Any] | None]]


class Console:
    """The running HTTP server and its history sampler; :meth:`close` stops both."""

    def __init__(self, server: http.Server, sampler: asyncio.Task[None], history: History) -> None:
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


async def serve(listen: str, status: StatusFn, history: History | None = None, *, token: str | None = None,
                ssl: ssl_module.SSLContext | None = None) -> tuple[Console, str]:
    """Start the HTTP server on ``HOST:PORT`` (HTTPS with ``ssl``; every route asking for
    ``token`` if given: runtime/http.py) and the history sampler; returns them and the bound
    address."""
    history = history if history is not None else History()

    async def route(request: http.Request) -> tuple[int, str, bytes]:
        path = request.path
        if path == "/":
            return 200, "text/html; charset=utf-8", PAGE.encode()
        if path == "/status.json":
            doc = await status()
            doc = doc if doc is not None else {"error": "this master is not the leader"}
            return 200, "application/json", json.dumps(doc).encode()
        if path == "/history.json":
            return 200, "application/json", json.dumps(history.document()).encode()
        if path == "/metrics":  # (on the loop: the shared executor is etcd's, S7)
            return 200, *metrics.exposition(request.headers.get("accept", ""))
        return 404, "text/plain", b"not found\n"

    server, address = await http.serve(listen, route, token=token, ssl=ssl, unauthorized=UNAUTHORIZED)
    sampler = asyncio.create_task(sample(status, history), name="console history")
    return Console(server, sampler, history), address
