"""Savepoints and restores, as the leader carries them out (docs/lifecycle.md).

A savepoint pauses a job (its input and its timers; the pause is stored in etcd, so a new
leader keeps it) and waits until the job is at rest: then every tablet's state, copied by
the client in any order while the pause holds, is one consistent cut. The client renews the
pause while it copies and ends it (verifying that nothing ran) when done; a pause nobody
renews ends by itself after :data:`~master.jobs.PAUSE_LIMIT_S`.

A restore creates the job of a savepoint with its tablets closed, placed on this cluster's
workers under tokens above their saved ones and every earlier restore's (:func:`restore_token`);
the client loads each tablet's files into its primary, then commits, which opens them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from typing import Any

from master.change import Change
from master.code import check_loadable
from master.core import MasterCore
from master.jobs import CANCELLED, DRAINED, PAUSE_LIMIT_S, RESTORING, RUNNING, Job, Pause, input_streams
from master.ranges import KeyRange, Ranges
from master.scheduler import Ownership, TabletKey
from runtime.errors import MillstreamError
from runtime.keyspace import HASH_SPACE, wire_end
from runtime.record import MIN_TIME
from runtime.topology import Topology, validate_against
from runtime.wire import millstream_pb2 as pb

log = logging.getLogger(__name__)

RESTORE_TOKEN_GAP = 1 << 20  # a restored tablet's token: the saved one + this, at least
RESTORE_TIME_SHIFT = 20      # ... and at least the restore's wall-clock ms, this many bits up


def restore_token(saved: int, wall_ms: float) -> int:
    """The token a restored tablet opens under: above the saved one by
    :data:`RESTORE_TOKEN_GAP` (the old job's tablet may have moved since the savepoint, and a
    restored sink's claim on its output files must outrank the old job's), and at least the
    restore's wall-clock time in ms, :data:`RESTORE_TIME_SHIFT` bits up: a restore of the same
    savepoint a millisecond or more later then outranks an earlier restore's tablets too, unless
    their tokens changed (a move, a failover, an update, a split) 2^20 times per millisecond between the two (a second restore onto the same output directory used to get
    the first one's tokens, below what the first one's moved tablets had claimed, and every
    sink tablet with output failed its claim for ever). This assumes the masters' clocks
    agree (as NTP keeps them, to far less than the time between two restores); a clock past
    the year 2109 is not believed (the token would near 2^63), and neither is one before 2020."""
    if not 1_577_836_800_000 <= wall_ms < 1 << 42:
        log.warning("restore: this master's clock reads %.0f ms since 1970, which it does not believe; the restored "
                    "tablets' tokens come from their saved ones alone", wall_ms)
        return saved + RESTORE_TOKEN_GAP
    return max(saved + RESTORE_TOKEN_GAP, int(wall_ms) << RESTORE_TIME_SHIFT)


def _placed(core: MasterCore, key: TabletKey, saved: int | None = None) -> pb.TabletPlace:
    own, kr = core.image.tablets[key].own, core.image.bounds(*key)
    assert kr is not None
    w = core.image.workers.get(own.worker)
    return pb.TabletPlace(computation=key[0], key_range=key[1], start=kr.start, end=wire_end(kr.end),
                          address=w.address if w is not None else "", token=own.token,
                          saved_key_range=key[1] if saved is None else saved)


def _upstream_first(topo: Topology) -> list[str]:
    """The job's computations, each after every computation of the job that feeds it."""
    producers = {o: s.name for s in topo.computations.values() for o in s.all_outputs}
    order: list[str] = []

    def visit(name: str) -> None:
        if name in order:
            return
        for stream in topo.computations[name].inputs:
            if stream in producers and producers[stream] != name:
                visit(producers[stream])
        order.append(name)

    for name in topo.computations:
        visit(name)
    return order


async def savepoint_begin(core: MasterCore, name: str, timeout_s: float) -> pb.SavepointResponse:
    """Pause the job (its input, its timers; stored in etcd) and wait until it is at rest
    (docs/lifecycle.md): then every tablet's state, taken in any order while the pause
    holds, is one consistent cut of the job."""
    image = core.image
    async with core.lock:
        topo, job = image.job(name)
        if topo is None or (job is not None and job.state not in (DRAINED,)):
            raise MillstreamError(f"job {name!r} is {image.job_state(name)}; only a running or drained job "
                                  "has a savepoint taken")
        if name in image.pauses:
            raise MillstreamError(f"a savepoint of job {name!r} is being taken; wait for it to finish")
        pause = Pause(uuid.uuid4().hex[:16], core.now_ms() + (timeout_s + PAUSE_LIMIT_S) * 1000)
        await core.commit(Change(pauses={name: pause}))
        await core.bump()
    try:
        keys = [k for c in _upstream_first(topo) for k in image.keys(topo.computations[c])]
        deadline = time.monotonic() + timeout_s
        first: dict[str, int] | None = None
        while True:
            # Two rounds of reports, each taken after the routing bumped before it, with nothing
            # queued, in flight or running, and the same batches committed in both: nothing ran
            # in the job between them, and with its input and timers paused nothing can start.
            cut, busy = await _round(core, keys, deadline)
            if cut is not None and cut == first:
                break
            first = cut
            if cut is None:
                await asyncio.sleep(0.02)  # not at rest yet: look again at the next reports
            if time.monotonic() > deadline:
                raise MillstreamError(
                    f"savepoint of job {name!r}: it did not come to rest within {timeout_s:.0f} s "
                    f"({', '.join(busy[:5]) or 'its tablets kept committing'}); nothing was saved, "
                    "try again (or with a longer --timeout-s)")
        async with core.lock:
            now = image.pauses.get(name)
            if now is None or now.id != pause.id:
                raise MillstreamError(f"savepoint of job {name!r}: its pause ended while it came to rest "
                                      "(cancelled?); nothing was saved")
            await core.commit(Change(pauses={name: dataclasses.replace(
                now, cut=cut, until=core.now_ms() + PAUSE_LIMIT_S * 1000)}))
    except BaseException:
        await savepoint_end(core, name, pause.id)
        raise
    log.info("job %s: paused and at rest: taking savepoint %s of %d tablets", name, pause.id, len(keys))
    return pb.SavepointResponse(topology_json=topo.to_json(), tablets=[_placed(core, k) for k in keys],
                                watermarks={c: image.published.get(c, MIN_TIME) for c in topo.computations},
                                savepoint_id=pause.id)


async def _round(core: MasterCore, keys: list[TabletKey],
                 deadline: float) -> tuple[dict[str, int] | None, list[str]]:
    """Bump the routing, wait for a report of every tablet taken after its worker applied it
    (or the deadline); returns what each committed so far if all are at rest (else None),
    and the tablets that are not."""
    image = core.image
    # Above every version a worker reported, once every worker holding one of the tablets has
    # reported to this leader: a report under an earlier leader's routing is no proof of when
    # it was taken (leaders' versions come from their own clocks).
    while any(not _heard(core, image.tablets[k].own.worker) for k in keys if k in image.tablets):
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.02)
    await core.bump(above=max((w.routing_seen for w in image.workers.values()), default=0))
    version = core.version
    while True:
        busy = _busy(core, keys, version)
        if not [b for b in busy if b.endswith("(no report yet)")] or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.02)  # waiting for the workers' next reports (every 50 ms)
    if busy:
        return None, busy
    return {f"{c}/{r}": image.tablets[(c, r)].mark[1] for c, r in keys}, []


def _heard(core: MasterCore, worker: str) -> bool:
    w = core.image.workers.get(worker)
    return w is not None and w.heard


def _busy(core: MasterCore, keys: list[TabletKey], version: int) -> list[str]:
    """The tablets not known to be at rest: no live primary, no report taken under routing
    ``version`` or later, or records or productions in flight, or a batch running."""
    out = []
    for key in keys:
        t = core.image.tablets.get(key)
        if t is None or not t.own.worker or t.own.worker not in core.image.workers:
            out.append(f"{key[0]}/{key[1]} (no live primary)")
        elif t.report is None or t.report.token != t.own.token or t.mark[0] < version:
            out.append(f"{key[0]}/{key[1]} (no report yet)")
        elif t.in_flight:
            out.append(f"{key[0]}/{key[1]} ({t.in_flight} in flight)")
    return out


def _lost(name: str, savepoint_id: str, why: str) -> MillstreamError:
    return MillstreamError(
        f"savepoint {savepoint_id or '(no id)'} of job {name!r}: {why}. The tablets copied are not one "
        "consistent cut of the job, so no manifest is written; take the savepoint again")


async def savepoint_renew(core: MasterCore, name: str, savepoint_id: str) -> None:
    """The client is still copying: keep the pause another :data:`PAUSE_LIMIT_S`."""
    pause = core.image.pauses.get(name)
    if pause is None or pause.id != savepoint_id or pause.cut is None:
        raise _lost(name, savepoint_id, "its pause is no longer in force (not renewed in time, or ended)")
    core.image.renew_pause(name, core.now_ms() + PAUSE_LIMIT_S * 1000)


async def savepoint_end(core: MasterCore, name: str, savepoint_id: str = "", verify: bool = False,
                        timeout_s: float = 30.0) -> None:
    """Resume the job a savepoint paused. With ``verify``, first check that the pause held
    throughout and that every tablet still reports what it reported at the agreed point (nothing
    ran while the tablets were copied); raise otherwise (the pause ends either way)."""
    pause = core.image.pauses.get(name)
    try:
        if verify:
            if pause is None or pause.id != savepoint_id or pause.cut is None:
                raise _lost(name, savepoint_id, "its pause ended before the copy did (not renewed in time?)")
            keys = [(c, int(r)) for c, _, r in (k.rpartition("/") for k in pause.cut)]
            cut, busy = await _round(core, keys, time.monotonic() + timeout_s)
            if cut != pause.cut:
                moved = busy or [f"{k}: {pause.cut.get(k)} commits then, {v} now" for k, v in (cut or {}).items()
                                 if pause.cut.get(k) != v]
                raise _lost(name, savepoint_id, "its tablets did not stay at rest while they were copied "
                                                f"({', '.join(moved[:5])})")
    finally:
        async with core.lock:
            pause = core.image.pauses.get(name)
            if pause is not None and (not savepoint_id or pause.id == savepoint_id):
                await core.commit(Change(pauses={name: None}))
                await core.bump()
                core.replan_soon("move")  # a move the pause held back goes ahead (at the next tick)
                log.info("job %s: savepoint %s ended, input and timers resumed", name, pause.id)


async def end_unrenewed(core: MasterCore) -> None:
    """End the savepoint pauses nobody renewed (their clients died); every leader tick."""
    for name, pause in list(core.image.pauses.items()):
        if core.now_ms() > pause.until:
            log.warning("job %s: the savepoint that paused its input was not renewed for %.0f s (its "
                        "client died?); resuming", name, PAUSE_LIMIT_S)
            await savepoint_end(core, name, pause.id)


async def restore_begin(core: MasterCore, manifest: dict[str, Any], name: str) -> pb.RestoreResponse:
    """Create the job of a savepoint with its tablets closed, placed on this cluster's workers
    under tokens above the saved ones (:func:`restore_token`); the caller loads each tablet's files into its
    primary, then calls :func:`restore_commit`."""
    topo = Topology.from_json(str(manifest["topology"]))
    if name != topo.name:
        renamed = Topology(name)
        renamed.computations = topo.computations
        topo = renamed
    image = core.image
    async with core.lock:
        if name in image.topologies or image.jobs.get(name, Job(CANCELLED, 0)).state != CANCELLED:
            raise MillstreamError(f"a job named {name!r} exists in this cluster; restore with --as NEW_NAME, "
                                  f"or cancel it first (`millstream cancel {name}`)")
        validate_against(topo.computations.values(), image.specs())
        check_loadable(topo.computations.values(), {w: e.code for w, e in image.workers.items()},
                       {w: e.address for w, e in image.workers.items()})
        if not image.workers:
            raise MillstreamError("no worker is running in this cluster; start workers, then restore")
        saved: dict[str, list[dict[str, Any]]] = {}
        for t in manifest["tablets"]:
            saved.setdefault(str(t["computation"]), []).append(t)
        # As a submit does: a stream whose injectors all finished (for the old job, say) is open
        # again for this one; else its input reads as finished, every saved window fires at
        # once, and what is sent again counts late.
        change = Change(topologies={name: topo},
                        jobs={name: Job(RESTORING, time.time(), streams=tuple(input_streams(topo)))},
                        finished_streams=dict.fromkeys(image.finished_markers(input_streams(topo)), False))
        ids: dict[TabletKey, int] = {}  # new tablet -> its id in the savepoint
        for c in topo.computations:
            entries = sorted(saved.get(c, []), key=lambda t: int(t["start"]))
            if not entries:
                raise MillstreamError(f"the savepoint has no tablets of computation {c!r}; it is damaged")
            base = image.dropped.get(c, 0)
            keep = min(int(t["key_range"]) for t in entries) >= base
            ranges = {}
            at = 0  # (the ranges must tile the hash space: a damaged or foreign manifest stops here)
            for i, t in enumerate(entries):
                start, end, token = int(t["start"]), int(t["end"]), int(t["token"])
                if start != at or not start < end <= HASH_SPACE or token < 1 or token.bit_length() > 63:
                    raise MillstreamError(f"the savepoint's tablet {c}/{t['key_range']} has range [{start}, {end}) "
                                          f"and token {token}: its ranges do not tile the key space in order, or "
                                          "its token is out of range; the savepoint is damaged")
                at = end
                rid = int(t["key_range"]) if keep else base + i
                ranges[rid] = KeyRange(start, end)
                ids[(c, rid)] = int(t["key_range"])
            if at != HASH_SPACE:
                raise MillstreamError(f"the savepoint's tablets of {c!r} end at {at}, not at the end of the key "
                                      "space; the savepoint is damaged")
            change.ranges[c] = Ranges(ranges, max(ranges) + 1)
        tokens = {(str(t["computation"]), int(t["key_range"])): int(t["token"]) for t in manifest["tablets"]}
        wall_ms = time.time() * 1000
        fresh = {k: topo.computations[k[0]].replication or image.replication for k in ids}
        placed = core.plan(fresh, extra=fresh)
        for key in fresh:
            own = placed[key]
            # Tokens never go back, and the restored tablets' claims on sink output must outrank
            # the old job's and every earlier restore's (restore_token). Only the primary holds
            # the state yet.
            token = restore_token(tokens[(key[0], ids[key])], wall_ms)
            change.tablets[key] = Ownership(own.worker, token, own.followers, (own.worker,))
        change.watermarks = {c: int(v) for c, v in dict(manifest.get("watermarks", {})).items()
                             if c in topo.computations}
        await core.commit(change)
        await core.rebalance("restore")
        return pb.RestoreResponse(name=name, tablets=[_placed(core, k, ids[k]) for k in fresh])


async def restore_commit(core: MasterCore, name: str) -> None:
    """Every tablet of a restored job is loaded: open them."""
    async with core.lock:
        job = core.image.jobs.get(name)
        if job is None or job.state != RESTORING:
            raise MillstreamError(f"job {name!r} is not being restored ({core.image.job_state(name)})")
        await core.commit(Change(jobs={name: None}))
        await core.bump()
    log.info("job %s restored from a savepoint: %s", name, RUNNING)
