"""Live split and merge of key ranges, as the leader does them (docs/rescaling.md).

A split replaces one tablet by two, a merge two by one, in one etcd transaction: the new
ranges (master/ranges.py) and their tablets, owned by the old primary under token 1, the
old tablets deleted. The primary learns it from the routing like any other change: it
closes the old tablets (their last commit is the last one), builds the new tablets' storage
from theirs on its own disk (worker/reshard.py), and opens them; senders find the old
ranges gone and re-route what they hold by key. Nothing pauses the rest of the job.

A merge needs both tablets on one primary: if they are apart, the right one moves first
(a move catches its target up before promoting it) and the merge commits once it is there.

:func:`autoscale` carries out the rebalancing policy's decisions (master/rebalance.py), one
at a time, off the leader's tick.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from master.change import Change
from master.core import MasterCore
from master.ranges import Ranges
from master.rebalance import Decision
from master.scheduler import Ownership, TabletKey
from runtime.errors import MillstreamError

log = logging.getLogger(__name__)

MERGE_MOVE_TIMEOUT_S = 60.0
OPEN_TIMEOUT_S = 10.0  # a split waits this long for its range to be open on its primary


@dataclass(frozen=True)
class RangeView:
    """A range as the split and merge commands print it."""

    key_range: int
    start: int
    end: int
    worker: str
    token: int


def _settled(core: MasterCore, key: TabletKey) -> Ownership:
    """The tablet's ownership, if it can be resharded now: a live primary the leader has
    heard from, not stopping, and no move under way."""
    c, r = key
    image = core.image
    if not any(c in t.computations for t in image.live_topologies()):
        raise MillstreamError(f"no computation {c!r} is running; `millstream jobs` lists the jobs")
    t = image.tablets.get(key)
    if t is None or image.bounds(c, r) is None:
        raise MillstreamError(f"computation {c!r} has no range {r}; `millstream status` lists its ranges")
    own, w = t.own, image.workers.get(t.own.worker)
    if not own.worker or w is None:
        raise MillstreamError(f"tablet {c}/{r} has no live primary now; try again once it is assigned")
    if not w.heard or w.draining:
        raise MillstreamError(f"tablet {c}/{r}: its primary {own.worker} is joining or stopping; try again")
    if c in image.paused_computations():
        raise MillstreamError(f"tablet {c}/{r}: a savepoint of its job is being taken, and its tablets stay "
                              "where they are until it ends; try again then")
    if key in image.pinned:
        raise MillstreamError(f"tablet {c}/{r} is moving to {image.pinned[key]}; try again once it has moved")
    return own


def _heard_since(core: MasterCore, worker: str, asked_ms: float) -> bool:
    """Whether ``worker`` heartbeated after the split or merge was asked. A worker killed a
    moment ago is still in the worker list until its lease runs out; new tablets built on it
    would have their only copy there (docs/rescaling.md): a heartbeat that arrives after the
    request shows the process was alive when the reshard commits."""
    w = core.image.workers.get(worker)
    return w is not None and w.last_seen > asked_ms


def _open(core: MasterCore, key: TabletKey, own: Ownership) -> bool:
    """Whether the primary has the tablet open under its current token (it reported it so):
    only then is its storage there to build new ranges from. A range just made by a split
    or merge may not be built yet, and one just moved may still be a follower's copy."""
    t = core.image.tablets.get(key)
    return t is not None and t.report is not None and t.report.token == own.token


def _views(core: MasterCore, computation: str, ids: list[int]) -> list[RangeView]:
    out = []
    for i in ids:
        kr = core.image.ranges[computation].ranges[i]
        own = core.image.tablets[(computation, i)].own
        out.append(RangeView(i, kr.start, kr.end, own.worker, own.token))
    return out


async def _commit(core: MasterCore, computation: str, gone: list[TabletKey], new_ids: list[int],
                  owner: Ownership, ranges: Ranges, what: str, why: str) -> list[RangeView]:
    # The old primary builds the new tablets from its own storage; until their followers catch
    # up from it (replication's snapshot), it holds their only copy (docs/rescaling.md). Their
    # token is above their parents': they re-send the parents' checkpointed productions, and
    # receivers refuse a producer older than one they heard from.
    token = max(core.image.tablets[k].own.token for k in gone) + 1
    tablets = {(computation, i): Ownership(owner.worker, token, owner.followers, (owner.worker,))
               for i in new_ids}
    # One etcd transaction: the new ranges, the tablets that replace ``gone``.
    await core.commit(Change(ranges={computation: ranges}, gone=gone, tablets=tablets))
    core.image.note_reshard(core.now_ms(), f"{what}: {why}")
    await core.rebalance(what)
    views = _views(core, computation, new_ids)
    log.info("%s (%s): %s", what, why, ", ".join(f"{computation}/{v.key_range} [{v.start}, {v.end})"
                                                for v in views))
    return views


async def split(core: MasterCore, computation: str, key_range: int, at: int | None,
                why: str = "asked by an operator") -> list[RangeView]:
    """Cut a range in two while records flow (at ``at``; else where its recent load divides
    evenly, as its primary reports it; else at the middle); returns the two new ranges. Waits
    (a little) for the range to be open on its primary."""
    key = (computation, key_range)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + OPEN_TIMEOUT_S
    asked = core.now_ms()
    while True:
        async with core.lock:
            own = _settled(core, key)
            core.image.ranges[computation].split(computation, key_range, at)  # refuses a bad cut at once
            if _open(core, key, own) and _heard_since(core, own.worker, asked):
                kr = core.image.bounds(computation, key_range)
                median = core.image.tablets[key].load_median
                if at is None and kr is not None and kr.start < median < kr.end:
                    at = median
                    why += f"; cut where its load divides evenly, {median:#018x}"
                ranges = core.image.ranges[computation].split(computation, key_range, at)
                ids = [ranges.next_id - 2, ranges.next_id - 1]
                return await _commit(core, computation, [key], ids, own, ranges,
                                     f"split {computation}/{key_range} into {ids[0]} and {ids[1]}", why)
        if loop.time() > deadline:
            if not _heard_since(core, own.worker, asked):
                raise MillstreamError(f"tablet {computation}/{key_range}: its primary {own.worker} has not been "
                                      f"heard from for {OPEN_TIMEOUT_S:.0f} s (it may have just died); try again "
                                      "once the range has a live primary")
            raise MillstreamError(f"tablet {computation}/{key_range} is not open on its primary {own.worker} "
                                  f"after {OPEN_TIMEOUT_S:.0f} s (still being opened or built); try again")
        await core.changed(0.1)


async def merge(core: MasterCore, computation: str, left: int, right: int,
                why: str = "asked by an operator") -> list[RangeView]:
    """Join two adjacent ranges while records flow; returns the merged range."""
    lk, rk = (computation, left), (computation, right)
    asked = core.now_ms()
    async with core.lock:
        lo, ro = _settled(core, lk), _settled(core, rk)
        core.image.ranges[computation].merge(computation, left, right)  # refuses non-adjacent ranges now
        # Both stay on the left's primary until the merge commits: count balancing would
        # otherwise move one away again as soon as the move is done.
        core.image.hold([lk, rk], lo.worker)
        target = lo.worker
        if ro.worker != lo.worker:
            log.info("merge %s/%d + %d: moving %s/%d to %s first", computation, left, right,
                     computation, right, lo.worker)
            core.image.pin(rk, lo.worker)
            await core.rebalance("merge")
    merged = False
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + MERGE_MOVE_TIMEOUT_S
        while True:
            async with core.lock:
                lo, t = _settled(core, lk), core.image.tablets.get(rk)
                now = t.own if t is not None else None
                if (now is not None and now.worker == lo.worker and rk not in core.image.pinned
                        and _open(core, lk, lo) and _open(core, rk, now) and _heard_since(core, lo.worker, asked)):
                    ranges = core.image.ranges[computation].merge(computation, left, right)
                    merged = True
                    return await _commit(core, computation, [lk, rk], [ranges.next_id - 1], lo, ranges,
                                         f"merge {computation}/{left} and {right} into {ranges.next_id - 1}", why)
            if loop.time() > deadline:
                raise MillstreamError(
                    f"cannot merge {computation}/{left} and {right}: they were not both open on {lo.worker} "
                    f"(the primary of {left}, {'heard from' if _heard_since(core, lo.worker, asked) else 'silent'} "
                    f"since the merge was asked) within {MERGE_MOVE_TIMEOUT_S:.0f} s; try again")
            await core.changed(0.2)
    finally:
        core.image.hold([lk, rk], None)
        if not merged and core.image.pinned.get(rk) == target:
            # Given up (a savepoint began, the timeout): the move was only for the merge.
            core.image.unpin(rk)


def autoscale(core: MasterCore) -> None:
    """Start carrying out the policy's next decision, unless one is under way."""
    if core.autoscaling is not None and not core.autoscaling.done():
        return
    ranges = core.image.rebalanced()
    if not ranges:
        return
    workers = len(core.image.eligible_workers())
    decisions = core.rebalancer.decide(ranges, workers, core.now_ms())
    if decisions:
        core.autoscaling = asyncio.create_task(_carry_out(core, decisions[0]), name="autoscale")


async def _carry_out(core: MasterCore, d: Decision) -> None:
    try:
        if d.kind == "split":
            before = _worker_loads(core)  # the parent's load still counts on its primary
            parent = core.rebalancer.load.rate((d.computation, d.ranges[0]), core.now_ms()) or 0.0
            views = await split(core, d.computation, d.ranges[0], None, f"policy: {d.reason}")
            await _spread(core, d.computation, views[1].key_range, before, parent / 2)
        else:
            views = await merge(core, d.computation, d.ranges[0], d.ranges[1], f"policy: {d.reason}")
        core.rebalancer.done(d, [v.key_range for v in views], core.now_ms())
    except MillstreamError as e:  # the cluster changed meanwhile: decided again next time
        log.info("rebalancing %s %s/%s not done: %s", d.kind, d.computation, d.ranges, e)
        core.rebalancer.done(d, [], core.now_ms())


def _worker_loads(core: MasterCore) -> dict[str, float]:
    """Records/s of the primaries of every live worker the leader has heard from."""
    now = core.now_ms()
    load = dict.fromkeys(core.image.eligible_workers(), 0.0)
    for k, t in core.image.tablets.items():
        if t.own.worker in load:
            load[t.own.worker] += core.rebalancer.load.rate(k, now) or 0.0
    return load


async def _spread(core: MasterCore, computation: str, key_range: int, load: dict[str, float],
                  rate: float) -> None:
    """Move a new half (about ``rate`` records/s) to the least loaded worker, if that evens
    the load out."""
    async with core.lock:
        key = (computation, key_range)
        t = core.image.tablets.get(key)
        workers = core.image.workers
        live = [w for w in load if w in workers and not workers[w].draining]
        if t is None or not live:
            return
        own = t.own
        coolest = min(live, key=lambda w: (load[w], sum(x.own.worker == w for x in core.image.tablets.values()), w))
        if coolest != own.worker and load[coolest] + rate < load.get(own.worker, 0.0):
            core.image.pin(key, coolest)
            log.info("moving %s/%d (about %.0f rec/s) to %s, the least loaded worker (%.0f rec/s)",
                     computation, key_range, rate, coolest, load[coolest])
            await core.rebalance("rebalance")
