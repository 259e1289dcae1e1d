"""Workers joining, proving who they are, draining and leaving, as the leader handles them.

A worker's identity is the id its state directory keeps (``worker.id``): a worker back on its
disk is the same worker, and its copies count again. The secret it shows on its first
registration becomes that id's (only the SHA-256 is stored; a worker that shows none is issued
one), and it shows it on every later call as that id: a worker token alone cannot pose as
another worker. The worker makes its secret before it first registers, so a registration
whose answer was lost (the leader killed after writing it) is repeated with the same secret. Each change goes through
the leader's ``commit`` (master/core.py); a lease expiry is the leader's tick.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
import uuid
from collections.abc import Sequence

from master.change import Change, WorkerInfo
from master.image import ClusterImage
from master.leader import Leader
from master.scheduler import Ownership
from runtime.errors import ConfigError, WorkerIdentityError

log = logging.getLogger(__name__)

WORKER_ID = re.compile(r"^[0-9a-f]{12}$")
SECRET = re.compile(r"^[0-9a-f]{32,128}$")
ZONE = re.compile(r"^[A-Za-z0-9_.\-]{0,63}$")
MODULE_PREFIX = re.compile(r"[A-Za-z_]\w{0,127}(\.[A-Za-z_]\w{0,127}){0,15}")
MAX_POLICY_ENTRIES = 256


def check_policy(allowed: Sequence[str]) -> tuple[str, ...]:
    """A worker's code policy as it reports it: module prefixes (or "*"), bounded."""
    if len(allowed) > MAX_POLICY_ENTRIES or not all(p == "*" or MODULE_PREFIX.fullmatch(p) for p in allowed):
        raise ConfigError(f"the worker's --allow-code ({', '.join(list(allowed)[:5])[:200]}) is not a list of at "
                          f"most {MAX_POLICY_ENTRIES} module prefixes; give dotted module names such as my_jobs")
    return tuple(allowed)


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def authenticate(image: ClusterImage, worker_id: str, secret: str) -> None:
    """Refuse a call as ``worker_id`` without the secret issued to it at registration."""
    want = image.identities.get(worker_id)
    if want is not None and not hmac.compare_digest(_digest(secret), want):
        raise WorkerIdentityError(
            f"worker id {worker_id} was issued another secret: this is not that worker. A worker back "
            "on its own disk sends the worker.secret file kept beside worker.id; if that file is lost, "
            "delete worker.id too to join as a new worker")


async def register(core: Leader, address: str, worker_id: str = "", zone: str = "", secret: str = "",
                   allowed_code: Sequence[str] = ()) -> tuple[str, str]:
    """A worker joins; returns its id and its secret (the one it showed on its first
    registration, or one issued then if it showed none)."""
    if worker_id and not WORKER_ID.fullmatch(worker_id):
        raise ConfigError(f"worker id {worker_id[:40]!r} is not 12 hex digits; remove the worker.id file "
                          "of its state directory to start it as a new worker")
    if not ZONE.fullmatch(zone):
        raise ConfigError(f"zone {zone[:80]!r} is not a zone name (letters, digits, '_', '.', '-'; at most 63)")
    allowed = check_policy(allowed_code)
    worker_id = worker_id or uuid.uuid4().hex[:12]
    async with core.lock:
        image = core.image
        change = Change(workers={worker_id: WorkerInfo(address, zone, allowed)})
        if worker_id in image.identities:
            authenticate(image, worker_id, secret)
        else:
            if secret and not SECRET.fullmatch(secret):
                raise ConfigError("the secret this worker shows for its new id is not 32 to 128 hex digits; "
                                  "delete the worker.secret file of its state directory and it makes one")
            secret = secret or secrets.token_hex(16)
            change.identities[worker_id] = _digest(secret)
        restarted = worker_id in image.workers
        if restarted:
            # The same disk, a new process: what it was primary of opens again under a new
            # token (fencing anything of the old process). As a follower it stays in the
            # in-sync sets it was in: its copy on disk holds every commit acknowledged
            # without its leaving them (its primaries drop it if it falls behind).
            change.tablets = {key: Ownership(worker_id, t.own.token + 1, t.own.followers, (worker_id,))
                              for key, t in image.tablets.items() if t.own.worker == worker_id}
        await core.commit(change)
        image.workers[worker_id].joined(core.now_ms())
        image.count("registrations")
        await core.rebalance("join")
    log.info("worker %s %s at %s%s", worker_id, "rejoined" if restarted else "joined", address,
             f" (zone {zone})" if zone else "")
    return worker_id, secret


async def drain(core: Leader, worker_id: str) -> int:
    """A worker is stopping but still runs: move its primaries away, each to a target that
    catches up first (DESIGN.md §5). Returns how many it still holds that can move (0:
    none left, or no other worker to take them)."""
    async with core.lock:
        image = core.image
        w = image.workers.get(worker_id)
        if w is None:
            return 0
        if not w.draining:
            log.info("worker %s at %s is draining", worker_id, w.address)
            w.drain()
            await core.rebalance("drain")
        if all(e.draining for e in image.workers.values()):
            return 0
        return sum(1 for t in image.tablets.values() if t.own.worker == worker_id)


async def leave(core: Leader, worker_id: str) -> None:
    """A worker left cleanly (its tablets are closed): move what it still had at once."""
    async with core.lock:
        w = core.image.workers.get(worker_id)
        if w is None:
            return
        log.info("worker %s at %s left; moving its tablets", worker_id, w.address)
        await core.commit(Change(workers={worker_id: None}))
        await core.rebalance("leave")
