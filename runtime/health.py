"""Readiness as the standard gRPC health service (``grpc.health.v1.Health``), not printed lines.

Every daemon serves it on its gRPC port, without a token (a probe has none; it tells whether
a process serves, nothing more). Kubernetes' gRPC probes speak it natively; they speak no TLS,
so a daemon given ``--health-listen HOST:PORT`` also serves it alone on a plaintext port
(deploy/kubernetes). The services:

- ``""`` (:data:`SERVER`): SERVING while the process serves gRPC: liveness.
- :data:`MASTER`: SERVING while the master serves: leading, or standing by and sending clients
  to the leader.
- :data:`WORKER`: SERVING while the worker holds a lease from the leader (registered);
  NOT_SERVING before and while it registers again: readiness.

A daemon still prints the address it listens on (:func:`listening_line`): with port 0 the OS
picks the port, and only the process knows it. That line says where, never whether it is
ready: :func:`wait_serving` asks the health service.
"""

from __future__ import annotations

import re
import time

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from runtime import serving
from runtime.errors import MillstreamError
from runtime.security import Security

SERVER = ""
MASTER = "millstream.v1.Master"
WORKER = "millstream.v1.Worker"
_LISTENING = re.compile(r"^millstream (\w+) listening on (\S+)$")


def listening_line(kind: str, address: str) -> str:
    """What a daemon prints once its gRPC port is bound: where it listens."""
    return f"millstream {kind} listening on {address}"


def listened(line: str) -> str | None:
    """The address a :func:`listening_line` names (None: not such a line)."""
    m = _LISTENING.match(line.strip())
    return m.group(2) if m else None


class Health:
    """A daemon's health service: SERVING or NOT_SERVING per service name."""

    def __init__(self, *services: str) -> None:
        self.servicer = health.aio.HealthServicer()  # "" is SERVING from the start
        self._initial = services

    def add_to(self, server: grpc.aio.Server) -> None:
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)

    async def start(self) -> None:
        """Every named service NOT_SERVING until :meth:`set` says otherwise."""
        for service in self._initial:
            await self.set(service, False)

    async def set(self, service: str, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        await self.servicer.set(service, status)

    async def stop(self) -> None:
        """Shutting down: every service NOT_SERVING, for good."""
        await self.servicer.enter_graceful_shutdown()

    async def serve_plain(self, listen: str) -> tuple[grpc.aio.Server, str]:
        """The health service alone on a plaintext port (for probes that speak no TLS);
        returns the server and the address it is bound to."""
        server = grpc.aio.server()
        self.add_to(server)
        address = serving.bind(server, listen)
        await server.start()
        return server, address


def is_serving(address: str, security: Security = Security(), service: str = SERVER, timeout: float = 1.0) -> bool:
    """Whether ``service`` at ``address`` answers SERVING (False when it does not answer)."""
    with security.channel(address) as ch:
        try:
            answer = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service),
                                                          timeout=timeout)
        except grpc.RpcError:
            return False
    return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)


def wait_serving(address: str, timeout: float, security: Security = Security(), service: str = SERVER) -> None:
    """Wait until ``service`` at ``address`` is SERVING; :class:`MillstreamError` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not is_serving(address, security, service):
        if time.monotonic() > deadline:
            raise MillstreamError(f"{address} did not report {service or 'the server'} as serving within "
                                  f"{timeout:.0f} s (gRPC health service)")
        time.sleep(0.02)  # poll interval of this deadline-bounded wait
