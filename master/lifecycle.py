"""The lifecycle of jobs, as the leader carries it out: submit, update, drain, cancel
(docs/lifecycle.md; savepoints and restores are master/savepoints.py).

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
a new tablet's storage. Every step is one :class:`~master.change.Change`, committed by the core.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import Any

from master import injectors, savepoints
from master.change import Change
from master.code import check_loadable
from master.core import MasterCore
from master.jobs import CANCELLED, DRAINED, DRAINING, RESTORING, Diff, Job, diff, input_streams
from master.ranges import Ranges
from master.scheduler import Ownership
from runtime.client import check_topology_size
from runtime.errors import MillstreamError, TopologyError
from runtime.record import END_OF_TIME
from runtime.topology import Topology, validate_against

log = logging.getLogger(__name__)

# ------------------------------------------------------------------ submit and update


async def submit(core: MasterCore, topology_json: str) -> tuple[str, int]:
    """Submit a job (returns its name and how many tablets it has); a job cancelled with its
    state kept resumes (as an update would); the same topology again changes nothing."""
    topo = Topology.from_json(topology_json)
    check_topology_size(topo.name, topology_json)
    image = core.image
    job = image.jobs.get(topo.name)
    if job is not None and job.state == CANCELLED and job.kept:
        await update(core, topology_json)
        return topo.name, sum(len(image.keys(s)) for s in image.topologies[topo.name].computations.values())
    async with core.lock:
        old, state = image.topologies.get(topo.name), image.job_state(topo.name)
        if old is not None and state == DRAINED:
            raise TopologyError(f"job {topo.name!r} is drained; cancel it (`millstream cancel {topo.name}`) "
                                "before submitting it again")
        if old is not None and state != CANCELLED:
            if old.to_json() == topo.to_json():
                return topo.name, sum(len(image.keys(s)) for s in topo.computations.values())
            raise TopologyError(
                f"a different topology named {topo.name!r} is already running; change it in place with "
                "`millstream update MODULE:ATTR`, or submit it under a new name")
        assert old is None, "a cancelled job with its state kept is resumed by update"
        validate_against(topo.computations.values(), image.specs())
        check_loadable(topo.computations.values(), *_policies(core))
        # A name used before starts above the range ids its state had.
        ranges = {s.name: Ranges.first(s.key_ranges, base=image.dropped.get(s.name, 0))
                  for s in topo.computations.values()}
        new = {(s.name, r): s.replication or image.replication for s in topo.computations.values()
               for r in ranges[s.name].ranges}
        owners = image.owners()
        placed = core.plan(new, extra=new)
        # A stream whose injectors all finished (for jobs before this one) is open again for
        # this job: it starts with nothing, not at the end of time.
        await core.commit(Change(
            topologies={topo.name: topo}, tablets={k: v for k, v in placed.items() if owners.get(k) != v},
            ranges=dict(ranges),
            jobs={topo.name: None} if topo.name in image.jobs else {},
            finished_streams=dict.fromkeys(image.finished_markers(input_streams(topo)), False)))
        await core.bump()
    log.info("submitted topology %s (%d tablets)", topo.name, len(new))
    return topo.name, len(new)


def _policies(core: MasterCore) -> tuple[dict[str, tuple[str, ...]], dict[str, str]]:
    """Each live worker's code policy and address (master/code.py)."""
    workers = core.image.workers
    return {w: e.code for w, e in workers.items()}, {w: e.address for w, e in workers.items()}


async def update(core: MasterCore, topology_json: str, drop_state: bool = False,
                 reset: Sequence[str] = ()) -> dict[str, Any]:
    """Replace a job's topology in place; returns what changed (:meth:`Diff.summary`)."""
    new = Topology.from_json(topology_json)
    check_topology_size(new.name, topology_json)
    image = core.image
    async with core.lock:
        old = image.topologies.get(new.name)
        if old is None:
            raise MillstreamError(f"no job named {new.name!r} to update; `millstream jobs` lists the jobs, "
                                  "`millstream submit` starts a new one")
        job = image.jobs.get(new.name)
        if job is not None and job.state in (DRAINING, DRAINED, RESTORING):
            raise MillstreamError(f"job {new.name!r} is {job.state}; it takes no update. Cancel it "
                                  f"(`millstream cancel {new.name}`) and submit the new topology")
        resume = job is not None and job.state == CANCELLED
        d = diff(old, new, drop_state, reset)
        validate_against(new.computations.values(), [s for n, t in image.topologies.items() if n != new.name
                                                     for s in t.computations.values()])
        # What opens anew (added, changed, or all of a resumed job) must load on every worker.
        check_loadable([s for s in new.computations.values() if resume or old.computations.get(s.name) != s],
                       *_policies(core))
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
    while any(w.routing_seen < version for w in core.image.workers.values()):
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            log.info("routing %d not confirmed by every worker within %.1f s", version, timeout)
            return
        await asyncio.sleep(min(0.02, left))  # heartbeats confirm it every progress interval


async def _replace(core: MasterCore, old: Topology, new: Topology, d: Diff, resume: bool) -> None:
    image = core.image
    change = Change(topologies={new.name: new}, jobs={new.name: None} if resume else {})
    for c in (*d.removed, *d.reset):
        change.gone += image.keys(old.computations[c])
        change.dropped[c] = image.ranges[c].next_id
        change.ranges[c] = None
    change.watermarks_gone += d.removed
    for c in (*d.added, *d.reset):
        change.ranges[c] = Ranges.first(new.computations[c].key_ranges,
                                        base=change.dropped.get(c, image.dropped.get(c, 0)))
    fresh = {(c, i): new.computations[c].replication or image.replication
             for c in (*d.added, *d.reset) for i in change.ranges[c].ranges}  # type: ignore[union-attr]
    placed = core.plan(fresh, extra=fresh)
    change.tablets = {k: v for k, v in placed.items() if k in fresh}
    # What stays reopens under the next token (new code and options; resumed: closed until now).
    for c in [c for c in (d.same if resume else ()) if c not in d.reset] + list(d.changed):
        for key in image.keys(old.computations[c]):
            t = image.tablets.get(key)
            if t is not None:
                change.tablets[key] = _next_token(t.own)
    await core.commit(change)
    await core.rebalance("update")


def _next_token(own: Ownership) -> Ownership:
    """The same owners under the next token: the primary reopens; only it is surely in sync."""
    if not own.worker:
        return own
    return Ownership(own.worker, own.token + 1, own.followers, (own.worker,))


# ------------------------------------------------------------------ drain and cancel


async def drain(core: MasterCore, name: str) -> Job:
    """Close a job's input streams and let everything in it finish (see the module doc)."""
    image = core.image
    async with core.lock:
        topo, job = image.job(name)
        if job is not None and job.state in (DRAINING, DRAINED):
            return job
        if job is not None or topo is None:
            raise MillstreamError(f"job {name!r} is {image.job_state(name)}; only a running job drains")
        streams = input_streams(topo)
        for other, t in image.topologies.items():
            shared = sorted(set(streams) & {i for s in t.computations.values() for i in s.inputs})
            if other != name and shared and image.job_state(other) != CANCELLED:
                raise MillstreamError(
                    f"job {name!r} cannot drain alone: job {other!r} also reads {', '.join(shared)}, and a drain "
                    "closes those streams to every injector; drain or cancel that job first")
        # Its streams close with the next routing version; the drain waits until every live
        # worker has applied it (a version above the current one: bumped right after).
        job = Job(DRAINING, time.time(), streams=tuple(streams), version=image.version + 1)
        await core.commit(Change(jobs={name: job}))
        await core.bump()
    log.info("job %s draining: streams %s take no more input", name, ", ".join(streams) or "(none)")
    return job


async def cancel(core: MasterCore, name: str, keep_state: bool = False) -> Job:
    """Stop a job at once; delete its state unless ``keep_state``."""
    image = core.image
    async with core.lock:
        topo, job = image.job(name)
        if topo is None or (job is not None and job.state == CANCELLED and (keep_state or not job.kept)):
            assert job is not None
            if keep_state and not job.kept:
                raise MillstreamError(f"job {name!r} was cancelled without --keep-state; its state is deleted")
            return job
        streams = tuple(input_streams(topo))
        if keep_state:
            new = Job(CANCELLED, time.time(), kept=True, streams=streams)
            await core.commit(Change(jobs={name: new}))
            await core.bump()
            log.info("job %s cancelled; its state is kept (submit it again to resume)", name)
            return new
        new = Job(CANCELLED, time.time(), streams=streams, computations=tuple(topo.computations))
        change = Change(topologies={name: None}, jobs={name: new}, pauses={name: None} if name in image.pauses else {})
        for spec in topo.computations.values():
            change.gone += image.keys(spec)
            change.dropped[spec.name] = image.ranges[spec.name].next_id
            change.ranges[spec.name] = None
            change.watermarks_gone.append(spec.name)
        await core.commit(change)
        await core.rebalance("cancel")
    log.info("job %s cancelled; its state is being deleted", name)
    return new


async def advance(core: MasterCore) -> None:
    """Carry draining jobs forward, end savepoint pauses nobody renewed (every leader tick)."""
    await savepoints.end_unrenewed(core)
    if not any(job.state == DRAINING for job in core.image.jobs.values()):
        return
    async with core.lock:  # a cancel or update meanwhile sees (and changes) the job as it is
        for name, job in list(core.image.jobs.items()):
            if job.state == DRAINING and name in core.image.topologies:
                await _drain_step(core, name, job)


async def _drain_step(core: MasterCore, name: str, job: Job) -> None:
    image = core.image
    if not job.released:
        # Every live worker refuses injectors for these streams from here on: what was
        # accepted before is in its tablets and reports, and holds the watermark itself.
        if not job.version:  # a new leader's: it waits for its own routing
            image.note_drain_version(name, image.version)
        version = image.jobs[name].version
        if any(w.routing_seen < version for w in image.workers.values()):
            return
        streams = injectors.release_streams(image, job.streams, core.now_ms())
        await core.commit(Change(jobs={name: dataclasses.replace(job, released=True, version=version)},
                                 finished_streams=dict.fromkeys(streams, True)))
        log.info("job %s draining: its input is released to the end of time", name)
        return
    if any(inj.stream in job.streams and inj.watermark != END_OF_TIME for inj in image.injectors.values()):
        # Released, but a failover came before the next tick wrote the injectors out: this
        # leader loaded their old promises, which nothing would move again (their streams
        # take no report any more). Released again, written out by the next tick.
        injectors.release_streams(image, job.streams, core.now_ms())
        log.info("job %s draining: its input released again (a new leader)", name)
    if all(image.published.get(c) == END_OF_TIME for c in image.topologies[name].computations):
        await core.commit(Change(jobs={name: dataclasses.replace(job, state=DRAINED, since=time.time())}))
        await core.bump()
        log.info("job %s drained: every timer fired, nothing is pending", name)
