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

import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

from master.core import FINISHED, MasterCore, forget_tablet
from master.jobs import CANCELLED, DRAINED, DRAINING, Diff, Job, diff, input_streams
from master.ranges import Ranges
from master.scheduler import Ownership, TabletKey
from master.store import Change
from master.watermarks import END_OF_TIME
from runtime.client import check_topology_size
from runtime.errors import MillstreamError
from runtime.topology import ComputationSpec, Topology, validate_against

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
        if job is not None and job.state in (DRAINING, DRAINED):
            raise MillstreamError(f"job {new.name!r} is {job.state}; it takes no update. Cancel it "
                                  f"(`millstream cancel {new.name}`) and submit the new topology")
        resume = job is not None and job.state == CANCELLED
        d = diff(old, new, drop_state, reset)
        others = [s for n, t in core.topologies.items() if n != new.name for s in t.computations.values()]
        validate_against(new.computations.values(), others)
        await _replace(core, old, new, d, resume)
    log.info("job %s %s: %s", new.name, "resumed" if resume else "updated",
             {k: v for k, v in d.summary().items() if v and k != "same"})
    return {**d.summary(), "resumed": resume}


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
            raise MillstreamError(f"job {name!r} is cancelled; there is nothing to drain")
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
        change = Change(topologies={name: None}, jobs={name: new.to_doc()})
        for spec in topo.computations.values():
            change.gone += core._keys(spec)
            change.dropped[spec.name] = core.ranges[spec.name].next_id
            change.ranges[spec.name] = None
            change.watermarks_gone.append(spec.name)
        await core._io(core.store.apply, change)
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
        core.computed.pop(s.name, None)
        core.counters.pop(s.name, None)


async def advance(core: MasterCore) -> None:
    """Carry draining jobs forward (called every leader tick)."""
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
