"""The lifecycle of jobs, as the leader carries it out: update, drain, cancel (docs/lifecycle.md).

A job is a submitted topology. It is *running* until an operator drains or cancels it:

- **update** replaces its topology in place. Computations added get new tablets; removed ones
  lose their tablets and state (only when the operator confirms it, ``drop_state``); changed
  ones keep their tablets and state and reopen under the next token, so their primaries load
  the new code and options; ``reset`` ones start over with empty state under new range ids.
- **drain** closes the job's input streams: injectors are refused from then on, and once every
  live worker has the routing that says so, every hold on those streams is released, their
  watermarks go to the end of time, every event-time timer fires and every window is emitted.
  When all of its computations' watermarks are at the end of time the job is *drained*; its
  tablets stay open (their state can still be read) until it is cancelled.
- **cancel** stops it at once. Its tablets close; their state is deleted (every worker deletes
  its copies, told by the routing's ``dropped`` list) unless ``keep_state``: then everything
  stays where it is, and submitting the job again resumes it from that state.

Range ids only grow, also across a cancel: a computation name used again starts above the ids
its earlier incarnation had (``dropped``), so no old copy on a worker's disk is ever taken for
a new tablet's storage.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from master.code import check_loadable
from master.core import FINISHED, MasterCore, forget_tablet
from master.jobs import (
    CANCELLED,
    DRAINED,
    DRAINING,
    PAUSE_LIMIT_S,
    RESTORING,
    RUNNING,
    Diff,
    Job,
    Pause,
    diff,
    input_streams,
)
from master.ranges import KeyRange, Ranges
from master.scheduler import Ownership, TabletKey
from master.store import Change
from master.watermarks import END_OF_TIME, MIN
from runtime.client import check_topology_size
from runtime.errors import MillstreamError
from runtime.keyspace import wire_end
from runtime.topology import ComputationSpec, Topology, validate_against
from runtime.wire import millstream_pb2 as pb

log = logging.getLogger(__name__)

# ------------------------------------------------------------------ submit and update


async def submit(core: MasterCore, topology_json: str) -> tuple[str, int]:
    """Submit a job; a job cancelled with its state kept resumes (as an update would)."""
    name = Topology.from_json(topology_json).name
    job = core.jobs.get(name)
    if job is not None and job.state == CANCELLED and job.kept:
        await update(core, topology_json)
        return name, sum(len(core._keys(s)) for s in core.topologies[name].computations.values())
    return await core.submit(topology_json)


async def update(core: MasterCore, topology_json: str, drop_state: bool = False,
                 reset: Sequence[str] = ()) -> dict[str, Any]:
    """Replace a job's topology in place; returns what changed (:meth:`Diff.summary`)."""
    new = Topology.from_json(topology_json)
    check_topology_size(new.name, topology_json)
    async with core._lock:
        old = core.topologies.get(new.name)
        if old is None:
            raise MillstreamError(f"no job named {new.name!r} to update; `millstream jobs` lists the jobs, "
                                  "`millstream submit` starts a new one")
        job = core.jobs.get(new.name)
        if job is not None and job.state in (DRAINING, DRAINED, RESTORING):
            raise MillstreamError(f"job {new.name!r} is {job.state}; it takes no update. Cancel it "
                                  f"(`millstream cancel {new.name}`) and submit the new topology")
        resume = job is not None and job.state == CANCELLED
        d = diff(old, new, drop_state, reset)
        others = [s for n, t in core.topologies.items() if n != new.name for s in t.computations.values()]
        validate_against(new.computations.values(), others)
        # What opens anew (added, changed, or all of a resumed job) must load on every worker.
        check_loadable([s for s in new.computations.values() if resume or old.computations.get(s.name) != s],
                       core.code, core.workers)
        await _replace(core, old, new, d, resume)
        version = core.version
    log.info("job %s %s: %s", new.name, "resumed" if resume else "updated",
             {k: v for k, v in d.summary().items() if v and k != "same"})
    await _seen_by_workers(core, version, core.config.lease_ms / 1000)
    return {**d.summary(), "resumed": resume}


async def _seen_by_workers(core: MasterCore, version: int, timeout: float) -> None:
    """Wait (at most ``timeout``) until every live worker has applied routing ``version``:
    a running injector learns a new reader of its stream from the workers' answers, so
    once this returns, whatever it sends reaches the new readers (a worker that does not
    answer in time is left to its lease)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while any(core.routing_seen.get(w, 0) < version for w in core.workers):
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            log.info("routing %d not confirmed by every worker within %.1f s", version, timeout)
            return
        await asyncio.sleep(min(0.02, left))  # heartbeats confirm it every progress interval


async def _replace(core: MasterCore, old: Topology, new: Topology, d: Diff, resume: bool) -> None:
    change = Change(topologies={new.name: new.to_json()})
    if resume:
        change.jobs[new.name] = None
    ranges: dict[str, Ranges | None] = {}
    for c in (*d.removed, *d.reset):
        change.gone += core._keys(old.computations[c])
        change.dropped[c] = core.ranges[c].next_id
        ranges[c] = None
    for c in d.removed:
        change.watermarks_gone.append(c)
    for c in (*d.added, *d.reset):
        ranges[c] = Ranges.first(new.computations[c].key_ranges, base=change.dropped.get(c, core.dropped.get(c, 0)))
    change.ranges = dict(ranges)
    fresh = {(c, i): new.computations[c] for c in (*d.added, *d.reset) for i in ranges[c].ranges}  # type: ignore[union-attr]
    placed = core._plan(fresh, extra={k: s.replication or core.config.replication for k, s in fresh.items()})
    change.tablets = {k: v for k, v in placed.items() if k in fresh}
    # What stays reopens under the next token (new code and options; resumed: closed until now).
    reopen = [c for c in (d.same if resume else ()) if c not in d.reset] + list(d.changed)
    for c in reopen:
        for key in core._keys(old.computations[c]):
            own = core.tablets.get(key)
            if own is not None:
                change.tablets[key] = _next_token(own)
    await core._io(core.store.apply, change)
    core.topologies[new.name] = new
    if resume:
        core.jobs.pop(new.name, None)
    for key in change.gone:
        forget_tablet(core, key)
    for c, r in ranges.items():
        if r is None:
            core.ranges.pop(c, None)
        else:
            core.ranges[c] = r
    core.dropped.update(change.dropped)
    for c in d.removed:
        core.published.pop(c, None)
        core.input_published.pop(c, None)
        core.computed.pop(c, None)
    core.tablets.update(change.tablets)
    await core._rebalance("update")


def _next_token(own: Ownership) -> Ownership:
    """The same owners under the next token: the primary reopens; only it is surely in sync."""
    if not own.worker:
        return own
    return Ownership(own.worker, own.token + 1, own.followers, (own.worker,))


# ------------------------------------------------------------------ drain and cancel


def _job(core: MasterCore, name: str) -> tuple[Topology | None, Job | None]:
    topo, job = core.topologies.get(name), core.jobs.get(name)
    if topo is None and job is None:
        known = ", ".join(sorted(set(core.topologies) | set(core.jobs))) or "none"
        raise MillstreamError(f"no job named {name!r} (jobs: {known}); `millstream jobs` lists them")
    return topo, job


async def drain(core: MasterCore, name: str) -> Job:
    """Close a job's input streams and let everything in it finish (see the module doc)."""
    async with core._lock:
        topo, job = _job(core, name)
        if job is not None and job.state in (DRAINING, DRAINED):
            return job
        if job is not None or topo is None:
            raise MillstreamError(f"job {name!r} is {core.job_state(name)}; only a running job drains")
        streams = input_streams(topo)
        for other, t in core.topologies.items():
            shared = sorted(set(streams) & {i for s in t.computations.values() for i in s.inputs})
            if other != name and shared and core.job_state(other) != CANCELLED:
                raise MillstreamError(
                    f"job {name!r} cannot drain alone: job {other!r} also reads {', '.join(shared)}, and a drain "
                    "closes those streams to every injector; drain or cancel that job first")
        job = Job(DRAINING, time.time(), streams=tuple(streams))
        await core._io(core.store.apply, Change(jobs={name: job.to_doc()}))
        core.jobs[name] = job
        await core._bump()
        job.version = core.version
    log.info("job %s draining: streams %s take no more input", name, ", ".join(streams) or "(none)")
    return job


async def cancel(core: MasterCore, name: str, keep_state: bool = False) -> Job:
    """Stop a job at once; delete its state unless ``keep_state``."""
    async with core._lock:
        topo, job = _job(core, name)
        if topo is None or (job is not None and job.state == CANCELLED and (keep_state or not job.kept)):
            assert job is not None
            if keep_state and not job.kept:
                raise MillstreamError(f"job {name!r} was cancelled without --keep-state; its state is deleted")
            return job
        streams = tuple(input_streams(topo))
        if keep_state:
            new = Job(CANCELLED, time.time(), kept=True, streams=streams)
            await core._io(core.store.apply, Change(jobs={name: new.to_doc()}))
            core.jobs[name] = new
            await core._bump()
            log.info("job %s cancelled; its state is kept (submit it again to resume)", name)
            return new
        new = Job(CANCELLED, time.time(), streams=streams, computations=tuple(topo.computations))
        change = Change(topologies={name: None}, jobs={name: new.to_doc()},
                        pauses={name: None} if name in core.paused else {})
        for spec in topo.computations.values():
            change.gone += core._keys(spec)
            change.dropped[spec.name] = core.ranges[spec.name].next_id
            change.ranges[spec.name] = None
            change.watermarks_gone.append(spec.name)
        await core._io(core.store.apply, change)
        core.paused.pop(name, None)
        _forget_computations(core, topo.computations.values(), change.gone)
        core.dropped.update(change.dropped)
        del core.topologies[name]
        core.jobs[name] = new
        await core._rebalance("cancel")
    log.info("job %s cancelled; its state is being deleted", name)
    return new


def _forget_computations(core: MasterCore, specs: Iterable[ComputationSpec], gone: list[TabletKey]) -> None:
    for key in gone:
        forget_tablet(core, key)
    for s in specs:
        core.ranges.pop(s.name, None)
        core.published.pop(s.name, None)
        core.input_published.pop(s.name, None)
        core.computed.pop(s.name, None)
        core.counters.pop(s.name, None)


async def advance(core: MasterCore) -> None:
    """Carry draining jobs forward, end savepoint pauses nobody renewed (every leader tick)."""
    for name, pause in list(core.paused.items()):
        if core.now_ms() > pause.until:
            log.warning("job %s: the savepoint that paused its input was not renewed for %.0f s (its "
                        "client died?); resuming", name, PAUSE_LIMIT_S)
            await savepoint_end(core, name, pause.id)
    if not any(job.state == DRAINING for job in core.jobs.values()):
        return
    async with core._lock:  # a cancel or update meanwhile sees (and changes) the job as it is
        for name, job in list(core.jobs.items()):
            if job.state == DRAINING and name in core.topologies:
                await _drain_step(core, name, job)


async def _drain_step(core: MasterCore, name: str, job: Job) -> None:
    if not job.released:
        if not job.version:
            job.version = core.version  # a new leader: wait for its own routing
        # Every live worker refuses injectors for these streams from here on: what was
        # accepted before is in its tablets and reports, and holds the watermark itself.
        if any(core.routing_seen.get(w, 0) < job.version for w in core.workers):
            return
        release_streams(core, job.streams)
        job.released = True
        await core._io(core.store.apply, Change(jobs={name: job.to_doc()}))
        log.info("job %s draining: its input is released to the end of time", name)
        return
    if all(core.published.get(c) == END_OF_TIME for c in core.topologies[name].computations):
        job.state, job.since = DRAINED, time.time()
        await core._io(core.store.apply, Change(jobs={name: job.to_doc()}))
        await core._bump()
        log.info("job %s drained: every timer fired, nothing is pending", name)


def release_streams(core: MasterCore, streams: Iterable[str]) -> None:
    """Drop every injector's hold on ``streams``: their watermarks go to the end of time."""
    streams = set(streams)
    for n, (stream, _) in list(core.injectors.items()):
        if stream in streams:
            core.injector_incarnations[n] = {"": END_OF_TIME}
            core.injectors[n] = (stream, END_OF_TIME)
            core.settler.forget(("injector", n))
            core._dirty_injectors.add(n)
    for s in streams:  # also a stream nobody fed yet (it would hold its readers back)
        core.injectors[FINISHED + s] = (s, END_OF_TIME)
        core._dirty_injectors.add(FINISHED + s)


# ------------------------------------------------------------------ savepoint and restore

RESTORE_TOKEN_GAP = 1 << 20  # a restored tablet's token: the saved one + this


def _placed(core: MasterCore, key: TabletKey, saved: int | None = None) -> pb.TabletPlace:
    own, kr = core.tablets[key], core.bounds(*key)
    assert kr is not None
    return pb.TabletPlace(computation=key[0], key_range=key[1], start=kr.start, end=wire_end(kr.end),
                          address=core.workers.get(own.worker, ""), token=own.token,
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
    async with core._lock:
        topo, job = _job(core, name)
        if topo is None or (job is not None and job.state not in (DRAINED,)):
            raise MillstreamError(f"job {name!r} is {core.job_state(name)}; only a running or drained job "
                                  "has a savepoint taken")
        if name in core.paused:
            raise MillstreamError(f"a savepoint of job {name!r} is being taken; wait for it to finish")
        pause = Pause(uuid.uuid4().hex[:16], core.now_ms() + (timeout_s + PAUSE_LIMIT_S) * 1000)
        await core._io(core.store.apply, Change(pauses={name: pause.to_doc()}))
        core.paused[name] = pause
        await core._bump()
    try:
        keys = [k for c in _upstream_first(topo) for k in core._keys(topo.computations[c])]
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
        async with core._lock:
            if core.paused.get(name) is not pause:
                raise MillstreamError(f"savepoint of job {name!r}: its pause ended while it came to rest "
                                      "(cancelled?); nothing was saved")
            pause.cut, pause.until = cut, core.now_ms() + PAUSE_LIMIT_S * 1000
            await core._io(core.store.apply, Change(pauses={name: pause.to_doc()}))
    except BaseException:
        await savepoint_end(core, name, pause.id)
        raise
    log.info("job %s: paused and at rest: taking savepoint %s of %d tablets", name, pause.id, len(keys))
    return pb.SavepointResponse(topology_json=topo.to_json(), tablets=[_placed(core, k) for k in keys],
                                watermarks={c: core.published.get(c, MIN) for c in topo.computations},
                                savepoint_id=pause.id)


async def _round(core: MasterCore, keys: list[TabletKey],
                 deadline: float) -> tuple[dict[str, int] | None, list[str]]:
    """Bump the routing, wait for a report of every tablet taken after its worker applied it
    (or the deadline); returns what each committed so far if all are at rest (else None),
    and the tablets that are not."""
    # Above every version a worker reported, once every worker holding one of the tablets has
    # reported to this leader: a report under an earlier leader's routing is no proof of when
    # it was taken (leaders' versions come from their own clocks).
    while any(core.tablets[k].worker not in core.heard for k in keys if k in core.tablets):
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.02)
    await core._bump(above=max(core.routing_seen.values(), default=0))
    version = core.version
    while True:
        busy = _busy(core, keys, version)
        if not [b for b in busy if b.endswith("(no report yet)")] or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.02)  # waiting for the workers' next reports (every 50 ms)
    if busy:
        return None, busy
    return {f"{c}/{r}": core.report_marks[(c, r)][1] for c, r in keys}, []


def _busy(core: MasterCore, keys: list[TabletKey], version: int) -> list[str]:
    """The tablets not known to be at rest: no live primary, no report taken under routing
    ``version`` or later, or records or productions in flight, or a batch running."""
    out = []
    for key in keys:
        own = core.tablets.get(key)
        rep = core.reports.get(key)
        if own is None or not own.worker or own.worker not in core.workers:
            out.append(f"{key[0]}/{key[1]} (no live primary)")
        elif rep is None or rep.token != own.token or core.report_marks.get(key, (0, 0))[0] < version:
            out.append(f"{key[0]}/{key[1]} (no report yet)")
        elif core.in_flight.get(key, 1):
            out.append(f"{key[0]}/{key[1]} ({core.in_flight[key]} in flight)")
    return out


def _lost(name: str, savepoint_id: str, why: str) -> MillstreamError:
    return MillstreamError(
        f"savepoint {savepoint_id or '(no id)'} of job {name!r}: {why}. The tablets copied are not one "
        "consistent cut of the job, so no manifest is written; take the savepoint again")


async def savepoint_renew(core: MasterCore, name: str, savepoint_id: str) -> None:
    """The client is still copying: keep the pause another :data:`PAUSE_LIMIT_S`."""
    pause = core.paused.get(name)
    if pause is None or pause.id != savepoint_id or pause.cut is None:
        raise _lost(name, savepoint_id, "its pause is no longer in force (not renewed in time, or ended)")
    pause.until = core.now_ms() + PAUSE_LIMIT_S * 1000


async def savepoint_end(core: MasterCore, name: str, savepoint_id: str = "", verify: bool = False,
                        timeout_s: float = 30.0) -> None:
    """Resume the job a savepoint paused. With ``verify``, first check that the pause held
    throughout and that every tablet still reports what it reported at the agreed point (nothing
    ran while the tablets were copied); raise otherwise (the pause ends either way)."""
    pause = core.paused.get(name)
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
        async with core._lock:
            pause = core.paused.get(name)
            if pause is not None and (not savepoint_id or pause.id == savepoint_id):
                await core._io(core.store.apply, Change(pauses={name: None}))
                core.paused.pop(name, None)
                await core._bump()
                log.info("job %s: savepoint %s ended, input and timers resumed", name, pause.id)


async def restore_begin(core: MasterCore, manifest: dict[str, Any], name: str) -> pb.RestoreResponse:
    """Create the job of a savepoint with its tablets closed, placed on this cluster's workers
    under their saved token + RESTORE_TOKEN_GAP; the caller loads each tablet's files into its primary, then
    calls :func:`restore_commit`."""
    topo = Topology.from_json(str(manifest["topology"]))
    if name != topo.name:
        renamed = Topology(name)
        renamed.computations = topo.computations
        topo = renamed
    async with core._lock:
        if name in core.topologies or core.jobs.get(name, Job(CANCELLED, 0)).state != CANCELLED:
            raise MillstreamError(f"a job named {name!r} exists in this cluster; restore with --as NEW_NAME, "
                                  f"or cancel it first (`millstream cancel {name}`)")
        existing = [s for t in core.topologies.values() for s in t.computations.values()]
        validate_against(topo.computations.values(), existing)
        check_loadable(topo.computations.values(), core.code, core.workers)
        if not core.workers:
            raise MillstreamError("no worker is running in this cluster; start workers, then restore")
        saved: dict[str, list[dict[str, Any]]] = {}
        for t in manifest["tablets"]:
            saved.setdefault(str(t["computation"]), []).append(t)
        change = Change(topologies={name: topo.to_json()},
                        jobs={name: Job(RESTORING, time.time(), streams=tuple(input_streams(topo))).to_doc()})
        ids: dict[TabletKey, int] = {}  # new tablet -> its id in the savepoint
        for c in topo.computations:
            entries = sorted(saved.get(c, []), key=lambda t: int(t["start"]))
            if not entries:
                raise MillstreamError(f"the savepoint has no tablets of computation {c!r}; it is damaged")
            base = core.dropped.get(c, 0)
            keep = min(int(t["key_range"]) for t in entries) >= base
            ranges = {}
            for i, t in enumerate(entries):
                rid = int(t["key_range"]) if keep else base + i
                ranges[rid] = KeyRange(int(t["start"]), int(t["end"]))
                ids[(c, rid)] = int(t["key_range"])
            change.ranges[c] = Ranges(ranges, max(ranges) + 1)
        tokens = {(str(t["computation"]), int(t["key_range"])): int(t["token"]) for t in manifest["tablets"]}
        fresh = {k: topo.computations[k[0]] for k in ids}
        for c, r in change.ranges.items():
            assert r is not None
            core.ranges[c] = r
        placed = core._plan(fresh, extra={k: s.replication or core.config.replication for k, s in fresh.items()})
        for key in fresh:
            own = placed[key]
            # Well above the saved token: tokens never go back, and the restored tablets' claims
            # on sink output must outrank the old job's, however often its tablets moved after
            # the savepoint. Only the primary holds the state yet.
            change.tablets[key] = Ownership(own.worker, tokens[(key[0], ids[key])] + RESTORE_TOKEN_GAP,
                                            own.followers, (own.worker,))
        watermarks = {c: int(v) for c, v in dict(manifest.get("watermarks", {})).items() if c in topo.computations}
        change.watermarks = watermarks
        try:
            await core._io(core.store.apply, change)
        except BaseException:
            for c in topo.computations:
                core.ranges.pop(c, None)
            raise
        core.topologies[name] = topo
        core.jobs[name] = Job.from_doc(change.jobs[name] or {})
        core.tablets.update(change.tablets)
        core.published.update(watermarks)
        await core._rebalance("restore")
        return pb.RestoreResponse(name=name, tablets=[_placed(core, k, ids[k]) for k in fresh])


async def restore_commit(core: MasterCore, name: str) -> None:
    """Every tablet of a restored job is loaded: open them."""
    async with core._lock:
        job = core.jobs.get(name)
        if job is None or job.state != RESTORING:
            raise MillstreamError(f"job {name!r} is not being restored ({core.job_state(name)})")
        await core._io(core.store.apply, Change(jobs={name: None}))
        core.jobs.pop(name, None)
        await core._bump()
    log.info("job %s restored from a savepoint: %s", name, RUNNING)
