"""A worker's state directory (one per worker: machines share nothing): claimed under a file
lock that must really hold, the worker identity and its secret kept in it, and what an
interrupted process left half-done swept away on start."""

from __future__ import annotations

import fcntl
import logging
import os
import re
import secrets
import shutil
import subprocess
import sys
import uuid
from typing import IO

from runtime.durable import sync_dir
from runtime.errors import ConfigError
from worker import seen

log = logging.getLogger(__name__)


def claim_state_dir(state_dir: str) -> tuple[str, IO[str]]:
    """Lock the state directory for this process and read (or create) the worker identity it
    keeps: a worker back on its disk is the same worker to the leader, and its copies count."""
    os.makedirs(state_dir, exist_ok=True)
    lock = open(os.path.join(state_dir, "worker.lock"), "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.close()
        raise ConfigError(f"state directory {state_dir!r} is in use by another worker; give every worker "
                          "its own --state-dir (workers share no disk)") from None
    if not locks_work(lock.name):
        lock.close()
        raise ConfigError(
            f"state directory {state_dir!r} is on a filesystem whose file locks do not hold (another "
            "process could take the lock this worker holds: an NFS mount with 'nolock', a FUSE or SMB "
            "share?). Two processes could then write one tablet's RocksDB; give the worker a local disk "
            "(review E7)")
    path = os.path.join(state_dir, "worker.id")
    try:
        with open(path) as f:
            worker_id = f.read().strip()
    except FileNotFoundError:
        seen.start(state_dir)  # a new worker: it knows every tablet it will ever hold (worker/seen.py)
        worker_id = uuid.uuid4().hex[:12]
        with open(path + ".tmp", "w") as f:
            f.write(worker_id + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".tmp", path)
        sync_dir(state_dir)
    if not re.fullmatch(r"[0-9a-f]{12}", worker_id):
        lock.close()
        raise ConfigError(f"{path} holds {worker_id[:40]!r}, not a worker id (12 hex digits); delete it to "
                          "start this worker under a new identity")
    sweep_leftovers(state_dir)
    return worker_id, lock


_BUILDING = re.compile(r"\d+\.building")


def sweep_leftovers(state_dir: str) -> None:
    """Delete what a previous process left half-done (called with the state directory locked:
    no other process can be using any of it): checkpoints taken for a snapshot or a savepoint
    (hard links that keep old SST files on disk), snapshots and restore loads being received,
    and split or merge builds. Each is redone from scratch when it is needed again."""
    gone = []
    for name in (".checkpoints", ".incoming"):
        top = os.path.join(state_dir, name)
        if os.path.isdir(top) and os.listdir(top):
            gone += [os.path.join(name, n) for n in os.listdir(top)]
            shutil.rmtree(top, ignore_errors=True)
    for comp in os.listdir(state_dir):
        top = os.path.join(state_dir, comp)
        if comp.startswith(".") or not os.path.isdir(top):
            continue
        for name in os.listdir(top):
            if _BUILDING.fullmatch(name):
                gone.append(os.path.join(comp, name))
                shutil.rmtree(os.path.join(top, name), ignore_errors=True)
    if gone:
        log.info("state directory %s: deleted %d leftovers of an interrupted snapshot, savepoint, restore "
                 "or split: %s", state_dir, len(gone), ", ".join(sorted(gone)[:10]))


def locks_work(path: str) -> bool:
    """Whether another process is refused the lock this process holds on ``path`` (RocksDB and
    the worker rely on such locks; some network filesystems ignore them)."""
    probe = ("import fcntl, sys\n"
             "f = open(sys.argv[1], 'a')\n"
             "try:\n    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\nexcept OSError:\n    sys.exit(3)\n")
    done = subprocess.run([sys.executable, "-c", probe, path], timeout=30, check=False)
    return done.returncode == 3


def new_secret() -> str:
    """A worker's secret, made by the worker before its id first registers (the leader keeps
    its SHA-256; master/membership.py)."""
    return secrets.token_hex(16)


def read_secret(state_dir: str) -> str:
    """The secret of this worker id (kept beside worker.id; "" before the worker first made
    one)."""
    try:
        with open(os.path.join(state_dir, "worker.secret")) as f:
            return f.read().strip()
    except FileNotFoundError:
        return ""


def keep_secret(state_dir: str, secret: str) -> None:
    """Store the worker's secret (readable by this user only), durably, before it is used."""
    path = os.path.join(state_dir, "worker.secret")
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
    sync_dir(state_dir)  # the rename too: a worker registered under a secret it lost is locked out
