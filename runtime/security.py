"""TLS on every gRPC port, tokens on every call, and what each role may call.

Parsed once at the entry point into a frozen :class:`Security`, then passed
to every server and channel. Servers present ``cert``/``key``; clients verify
servers with ``ca``; with ``client_ca``, servers also require client certificates
signed by it (mutual TLS). Every call carries this process's ``token``
(``authorization: Bearer <token>``).

Servers accept tokens by **role** (:data:`ROLES`): a worker's token may register,
heartbeat and deliver; an injector's may report injectors and deliver; an operator's may
submit, move and read status. With only ``token`` set, that one token holds every role
(a single shared secret, as before); with ``role_tokens``, each role has its own, so an
injector (or a Spark job holding its token) cannot pose as a worker or an operator. A call
with no or an unknown token is UNAUTHENTICATED; a known token outside its role is
PERMISSION_DENIED. The role of the caller is visible to servicers (:func:`caller_roles`),
so a worker takes resend floors only from other workers.

**Injector credentials** (review N4). One injector token serves every loader, so a token alone
does not say which producer a caller is. An operator issues each injector (or a family of
them: ``NAME`` covers ``NAME`` and ``NAME/...``) a credential, ``NAME:<hex>``, an HMAC of
the name under the cluster's worker token (:func:`injector_credential`; ``millstream
credential NAME``). A process presents it with its token (``injector_credential``); a server
that knows the worker token checks it and gives the name to its servicers
(:func:`caller_owner`, with the credential's MAC as a key). Workers keep the producers of a
caller with a credential apart from everyone else's under digests keyed with it
(worker/owners.py), so no other token holder can even name them, let alone move their marks.
"""

from __future__ import annotations

import contextvars
import hashlib
import hmac
import os
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc

from runtime.callheaders import SyncToken, aio_token_interceptors
from runtime.errors import ConfigError
from runtime.wire import CHANNEL_OPTIONS

_HEADER = "authorization"
CREDENTIAL_HEADER = "x-millstream-injector-credential"
_CREDENTIAL_DOMAIN = b"millstream injector credential\x00"

ROLES = ("worker", "injector", "operator")
# Which roles may call each method (methods not listed: every role).
METHOD_ROLES: Mapping[str, frozenset[str]] = {
    "/millstream.v1.Master/Submit": frozenset({"operator"}),
    "/millstream.v1.Master/MoveTablet": frozenset({"operator"}),
    "/millstream.v1.Master/Split": frozenset({"operator"}),
    "/millstream.v1.Master/Merge": frozenset({"operator"}),
    "/millstream.v1.Master/Update": frozenset({"operator"}),
    "/millstream.v1.Master/Drain": frozenset({"operator"}),
    "/millstream.v1.Master/Cancel": frozenset({"operator"}),
    "/millstream.v1.Master/Savepoint": frozenset({"operator"}),
    "/millstream.v1.Master/Restore": frozenset({"operator"}),
    "/millstream.v1.Master/RegisterWorker": frozenset({"worker"}),
    "/millstream.v1.Master/Heartbeat": frozenset({"worker"}),
    "/millstream.v1.Master/LeaveWorker": frozenset({"worker"}),
    "/millstream.v1.Master/ReportInjector": frozenset({"injector", "operator"}),
    "/millstream.v1.Master/UpdateInSync": frozenset({"worker"}),
    "/millstream.v1.Worker/Deliver": frozenset({"worker", "injector", "operator"}),
    "/millstream.v1.Worker/DeliverMany": frozenset({"worker", "injector", "operator"}),
    "/millstream.v1.Worker/DeliverStream": frozenset({"worker", "injector", "operator"}),
    "/millstream.v1.Worker/Replicate": frozenset({"worker"}),
    "/millstream.v1.Worker/ReplicateMany": frozenset({"worker"}),
    "/millstream.v1.Worker/ReplicateStream": frozenset({"worker"}),
    "/millstream.v1.Worker/InstallSnapshot": frozenset({"worker"}),
    "/millstream.v1.Worker/ReadState": frozenset({"operator"}),
    "/millstream.v1.Worker/Checkpoint": frozenset({"operator"}),
    "/millstream.v1.Worker/LoadTablet": frozenset({"operator"}),
}
# Methods any caller may call without a token: the standard gRPC health service (runtime/health.py),
# which Kubernetes probes call with none. It tells whether a process serves, nothing more.
OPEN_METHODS = frozenset({"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"})
_ALL = frozenset(ROLES)
_caller: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar("millstream_caller_roles", default=_ALL)




@dataclass(frozen=True)
class Owner:
    """What a caller's injector credential proved: the name it is for, and its MAC, which only
    the credential's holder and the operator who issued it know (workers key the digests of
    the owner's producers with it: worker/owners.py)."""

    name: str
    key: bytes = field(repr=False)


_owner: contextvars.ContextVar[Owner | None] = contextvars.ContextVar("millstream_caller_owner", default=None)


def caller_roles() -> frozenset[str]:
    """The roles of the caller of the RPC being served (every role when tokens are off)."""
    return _caller.get()


def caller_owner() -> Owner | None:
    """What the caller's injector credential proved (None: it showed none, or this server
    cannot check one: it has no worker token)."""
    return _owner.get()


def injector_credential(worker_token: str, name: str) -> str:
    """The credential of injectors named ``name`` or ``name/...``: ``name:<hex>``, an HMAC-SHA256
    of the name under the cluster's worker token (which injectors never hold)."""
    check_owner_name(name)
    mac = hmac.new(worker_token.encode(), _CREDENTIAL_DOMAIN + name.encode(), hashlib.sha256).hexdigest()
    return f"{name}:{mac}"


def check_owner_name(name: str) -> None:
    if not name or len(name) > 200 or not name.isprintable() or name != name.strip():
        raise ConfigError(f"injector credential name {name!r}: give a printable name of 1-200 characters "
                          "without surrounding spaces (the injector's name, or the part before its '/')")


def credential_owner(credential: str) -> str:
    """The name a credential (``name:<hex>``) is for; ConfigError if it is not one."""
    name, sep, mac = credential.strip().rpartition(":")
    if not sep or len(mac) != 64 or any(c not in "0123456789abcdef" for c in mac):
        raise ConfigError("an injector credential looks like NAME:<64 hex digits>, as `millstream credential "
                          f"NAME` prints it; got {credential[:40]!r}")
    check_owner_name(name)
    return name


def covers(owner: str, injector_name: str) -> bool:
    """Whether a credential for ``owner`` covers an injector named ``injector_name``."""
    return injector_name == owner or injector_name.startswith(owner + "/")


REQUIRED = ("this cluster takes records and watermark reports from injectors only with a credential "
            "(--require-injector-credentials): give the injector the one `millstream credential NAME` "
            "prints for its name, as Security(injector_credential=...) (`millstream inject-files`: "
            "--injector-credential-file or MILLSTREAM_INJECTOR_CREDENTIAL)")


def require_worker_token(required: bool, security: Security) -> None:
    """``--require-injector-credentials`` needs the worker token the credentials are made with."""
    if required and security.role_tokens.get("worker") is None:
        raise ConfigError("--require-injector-credentials needs --worker-token: credentials are checked "
                          "with it (with one --token for every role, an injector could make its own)")


def report_problem(owner: Owner | None, name: str, required: bool, operator: bool) -> str | None:
    """Why a master refuses an injector's report under ``name`` (None: it does not): a caller
    with a credential reports only under names it covers; without one, only where credentials
    are not required (an operator's release is an operator's, whatever it shows)."""
    if owner is not None and not covers(owner.name, name):
        return (f"this caller's injector credential is for {owner.name!r}, which does not cover the injector "
                f"{name!r}: report under {owner.name!r} or {owner.name + '/...'!r}")
    if owner is None and required and not operator:
        return REQUIRED
    return None


@dataclass(frozen=True)
class Security:
    """Transport security settings. The default is plaintext and no token (loopback use)."""

    cert: str | None = None   # server certificate chain (PEM), for daemons
    key: str | None = None    # its private key (PEM)
    ca: str | None = None     # CA bundle clients verify servers with (PEM)
    token: str | None = field(default=None, repr=False)  # what this process presents on every call
    # role -> token servers accept for it; empty: ``token`` (if any) holds every role
    role_tokens: Mapping[str, str] = field(default_factory=dict, repr=False)
    client_ca: str | None = None  # servers require client certificates signed by this CA
    # ``NAME:<hex>`` (injector_credential): what this process's injectors present as theirs
    injector_credential: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.injector_credential is not None:
            credential_owner(self.injector_credential)
        for what, path in (("--tls-cert", self.cert), ("--tls-key", self.key), ("--tls-ca", self.ca)):
            if path is not None and not os.path.isfile(path):
                raise ConfigError(f"{what} {path!r} is not a readable file")
        if (self.cert is None) != (self.key is None):
            raise ConfigError("--tls-cert and --tls-key go together: pass both or neither")
        if self.token is not None and not self.token.strip():
            raise ConfigError("the token is empty; pass a non-empty --token (or unset MILLSTREAM_TOKEN)")
        for role, tok in self.role_tokens.items():
            if role not in ROLES:
                raise ConfigError(f"unknown role {role!r}; roles are {', '.join(ROLES)}")
            if not tok.strip():
                raise ConfigError(f"the {role} token is empty; pass a non-empty --{role}-token")
        named: list[tuple[str, str | None]] = [("the token", self.token)]
        for what, text in named + [(f"the {r} token", t) for r, t in self.role_tokens.items()]:
            if text is not None and text.strip() and not (text.isascii() and text.isprintable() and " " not in text):
                raise ConfigError(f"{what} has a character a gRPC header cannot carry (a space, a line break or "
                                  "a non-ASCII letter); use printable ASCII without spaces (e.g. from "
                                  "`openssl rand -hex 32`)")
        if self.client_ca is not None:
            if not os.path.isfile(self.client_ca):
                raise ConfigError(f"--tls-client-ca {self.client_ca!r} is not a readable file")
            if self.cert is None:
                raise ConfigError("--tls-client-ca needs --tls-cert and --tls-key (mutual TLS is TLS first)")

    def accepted(self) -> dict[str, frozenset[str]]:
        """Token -> the roles it holds, on servers."""
        if self.role_tokens:
            out: dict[str, set[str]] = {}
            for role, tok in self.role_tokens.items():
                out.setdefault(tok, set()).add(role)
            return {t: frozenset(r) for t, r in out.items()}
        return {self.token: _ALL} if self.token else {}

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
        if self.client_ca is not None:
            return grpc.ssl_server_credentials([(self._read(self.key), self._read(self.cert))],
                                               root_certificates=self._read(self.client_ca),
                                               require_client_auth=True)
        return grpc.ssl_server_credentials([(self._read(self.key), self._read(self.cert))])

    def https_context(self, flag: str = "--http-tls") -> ssl.SSLContext:
        """A TLS context for an HTTP server (the master's console, a worker's /metrics: ``flag``
        asked for it) with this server's certificate; no client certificate is asked for (its
        token is: runtime/http.py)."""
        if self.cert is None or self.key is None:
            raise ConfigError(f"{flag} serves HTTPS with this process's certificate: pass --tls-cert and "
                              "--tls-key too")
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            ctx.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"--tls-cert {self.cert!r} and --tls-key {self.key!r} do not load as a certificate "
                              f"and its key ({e}); pass the PEM files of one pair") from None
        return ctx

    def server_interceptors(self) -> list[grpc.aio.ServerInterceptor]:
        check = self.token_check()
        return [check] if check is not None else []

    def token_check(self) -> _TokenCheck | None:
        """What a server checks each call's token and credential with (None: no token set)."""
        accepted = self.accepted()
        # Injector credentials are made with the worker token: a server that knows it checks them.
        key = self.role_tokens.get("worker") or (None if self.role_tokens else self.token)
        return _TokenCheck(accepted, key) if accepted else None

    def server_ssl_context(self) -> ssl.SSLContext | None:
        """TLS for a server beside the gRPC one (runtime/frames.py), as its credentials are:
        this process's certificate, and client certificates required under ``client_ca``."""
        if self.cert is None or self.key is None:
            return None
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.cert, self.key)
        if self.client_ca is not None:
            ctx.load_verify_locations(self.client_ca)
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    def client_ssl_context(self) -> ssl.SSLContext | None:
        """TLS for a client of such a server, as a gRPC channel's: the server verified
        against ``ca`` (or the system's roots), this process's certificate presented if it has one."""
        if not self.tls:
            return None
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca)
        if self.cert is not None and self.key is not None:
            ctx.load_cert_chain(self.cert, self.key)
        return ctx

    # --------------------------------------------------------------- clients

    def _client_credentials(self) -> grpc.ChannelCredentials:
        # With a certificate of its own (daemons under mutual TLS), a process presents it.
        if self.cert is not None and self.key is not None:
            return grpc.ssl_channel_credentials(self._read(self.ca) if self.ca else None,
                                                private_key=self._read(self.key),
                                                certificate_chain=self._read(self.cert))
        return grpc.ssl_channel_credentials(self._read(self.ca) if self.ca else None)

    def channel(self, address: str) -> grpc.Channel:
        """A blocking channel to ``address`` carrying the token, over TLS if configured."""
        if self.tls:
            ch = grpc.secure_channel(address, self._client_credentials(), options=CHANNEL_OPTIONS)
        else:
            ch = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        headers = self.headers()
        return grpc.intercept_channel(ch, SyncToken(headers)) if headers else ch

    def headers(self) -> list[tuple[str, str]]:
        """What every call of this process carries: its token, and its injector credential."""
        out = [(_HEADER, f"Bearer {self.token}")] if self.token else []
        if self.injector_credential:
            out.append((CREDENTIAL_HEADER, self.injector_credential.strip()))
        return out

    def aio_channel(self, address: str) -> grpc.aio.Channel:
        """An asyncio channel to ``address`` carrying the token, over TLS if configured."""
        headers = self.headers()
        interceptors: Any = aio_token_interceptors(headers) if headers else None
        if self.tls:
            return grpc.aio.secure_channel(address, self._client_credentials(), options=CHANNEL_OPTIONS,
                                           interceptors=interceptors)
        return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS, interceptors=interceptors)


class _TokenCheck(grpc.aio.ServerInterceptor):
    def __init__(self, accepted: dict[str, frozenset[str]], credential_key: str | None = None) -> None:
        self.accepted = {f"Bearer {t}".encode(): roles for t, roles in accepted.items()}
        self.credential_key = credential_key

    def _owner(self, presented: str | None) -> tuple[Owner | None, str | None]:
        """(what a presented credential proves, or None; the refusal if it proves nothing)."""
        if presented is None or self.credential_key is None:
            return None, None
        try:
            name = credential_owner(presented)
        except ConfigError as e:
            return None, str(e)
        expected = injector_credential(self.credential_key, name)
        if hmac.compare_digest(presented.strip().encode(), expected.encode()):
            return Owner(name, bytes.fromhex(expected.rpartition(":")[2])), None
        return None, (f"the injector credential for {name!r} is not this cluster's: issue one with `millstream "
                      f"credential {name}` (it is made with the cluster's worker token)")

    def _roles(self, presented: str | None) -> frozenset[str] | None:
        if presented is None:
            return None
        given = presented.encode()
        for expected, roles in self.accepted.items():
            if hmac.compare_digest(given, expected):  # constant time: no token by timing
                return roles
        return None

    def check(self, method: str, metadata: Mapping[str, str]) -> tuple[frozenset[str], Owner | None] | Refusal:
        """What a call of ``method`` with these headers may do: the roles it holds there and
        the owner its injector credential proves, or why it is refused."""
        roles = self._roles(metadata.get(_HEADER))
        allowed = METHOD_ROLES.get(method, _ALL)
        owner, refused = self._owner(metadata.get(CREDENTIAL_HEADER))
        if roles is None:
            return Refusal(grpc.StatusCode.UNAUTHENTICATED,
                           "missing or wrong token: this cluster requires a token; pass --token "
                           "(or set MILLSTREAM_TOKEN, or Security(token=...) in code)")
        if refused is not None:
            return Refusal(grpc.StatusCode.UNAUTHENTICATED, refused)
        if roles & allowed:
            return roles & allowed, owner
        return Refusal(grpc.StatusCode.PERMISSION_DENIED,
                       f"this token's role ({', '.join(sorted(roles))}) may not call "
                       f"{method.rsplit('/', 1)[-1]}; that needs the {' or '.join(sorted(allowed))} token")

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]], details: Any) -> Any:
        handler = await continuation(details)
        if handler is None or details.method in OPEN_METHODS:
            return handler
        verdict = self.check(details.method, dict(details.invocation_metadata or ()))
        if isinstance(verdict, Refusal):
            return _deny(handler, verdict.code, verdict.message)
        return _with_roles(handler, *verdict)


@dataclass(frozen=True)
class Refusal:
    """A call refused before it runs: its status code and why."""

    code: grpc.StatusCode
    message: str


def acting_as(roles: frozenset[str], owner: Owner | None) -> None:
    """Set :func:`caller_roles` and :func:`caller_owner` for the task that runs a call
    (a transport other than gRPC's, which :class:`_TokenCheck` serves)."""
    _caller.set(roles)
    _owner.set(owner)


def _with_roles(handler: Any, roles: frozenset[str], owner: Owner | None = None) -> Any:
    """The same handler, with ``caller_roles()`` and ``caller_owner()`` set while it runs."""
    if handler.unary_unary is not None:
        inner = handler.unary_unary

        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            acting_as(roles, owner)
            return await inner(request, context)

        return grpc.unary_unary_rpc_method_handler(unary, handler.request_deserializer,
                                                   handler.response_serializer)
    if handler.unary_stream is not None:
        inner_stream = handler.unary_stream

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
            acting_as(roles, owner)
            async for item in inner_stream(request, context):
                yield item

        return grpc.unary_stream_rpc_method_handler(stream, handler.request_deserializer,
                                                    handler.response_serializer)
    if handler.stream_stream is not None:  # a delivery stream: its roles hold for every frame
        inner_bidi = handler.stream_stream

        async def bidi(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            acting_as(roles, owner)
            async for item in inner_bidi(requests, context):
                yield item

        return grpc.stream_stream_rpc_method_handler(bidi, handler.request_deserializer,
                                                     handler.response_serializer)
    return handler  # stream-unary (LoadTablet): it does not look at the caller's roles


def _unread(data: bytes) -> None:
    """A refused call's request deserializer: its bytes are never parsed (up to the 64 MiB a
    message may hold, from a caller that has not shown it may call)."""
    return None


def _deny(handler: Any, code: grpc.StatusCode, message: str) -> Any:
    """A handler of the same shape that refuses the call with ``code`` without parsing or
    reading what the caller sends (a stream's messages are never asked for)."""
    async def deny(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(code, message)

    async def deny_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(code, message)
        yield  # pragma: no cover - makes this an async generator

    serialize = handler.response_serializer
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(deny_stream, _unread, serialize)
    if handler.stream_stream is not None:
        return grpc.stream_stream_rpc_method_handler(deny_stream, _unread, serialize)
    if handler.stream_unary is not None:  # LoadTablet: refused before its first chunk is read
        return grpc.stream_unary_rpc_method_handler(deny, _unread, serialize)
    return grpc.unary_unary_rpc_method_handler(deny, _unread, serialize)
