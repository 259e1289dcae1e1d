"""The leader's status document: what `millstream status`, /status.json and the web page
show. Reads a :class:`~master.core.MasterCore`; changes nothing."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from master.code import describe, refusals
from master.core import FINISHED
from master.jobs import input_streams
from master.scheduler import replication_health
from master.watermarks import END_OF_TIME, MIN
from runtime.status import show_key

if TYPE_CHECKING:
    from master.core import MasterCore
    from master.scheduler import Ownership


def _injector(core: MasterCore, name: str, stream: str, wm: int, now: float, idle: set[str]) -> dict[str, Any]:
    """An injector silent for longer than ``injector_stale_s`` still holds its stream (it
    may yet send records its promise covers) but is flagged, with how long it has been
    silent, so an operator can finish or release it; after ``injector_expiry_s`` it is
    released (review G4). A live Injector reports every 10 s, so only a gone one goes
    stale. ``idle``: it says it is idle (docs/time.md, "Idle sources")."""
    seen = core.injector_seen.get(name)
    quiet = None if seen is None else round(now - seen)
    stale = (quiet is not None and quiet > core.config.injector_stale_s * 1000
             and wm != END_OF_TIME and not name.startswith(FINISHED))
    return {"name": name, "stream": stream, "watermark": wm, "last_report_ms_ago": quiet, "stale": stale,
            "idle": name in idle}


def _problems_of(core: MasterCore, computation: str) -> list[dict[str, Any]]:
    """Tablets of a computation whose owner reports it cannot run them (code that does not
    load, storage that does not open, a batch that does not finish)."""
    out = []
    for worker, problems in core.problems.items():
        for (c, r), (error, attempts, seconds) in sorted(problems.items()):
            own = core.tablets.get((c, r))
            if c == computation and own is not None and own.worker == worker:
                out.append({"key_range": r, "worker": worker, "error": error, "attempts": attempts,
                            "seconds": round(seconds, 1)})
    return out


def _code_refused(core: MasterCore) -> dict[str, list[str]]:
    """Computations of running jobs whose code some live worker may not load (its
    --allow-code), one line each naming the workers and the flag to add: known as soon as
    such a worker joins, before any of its tablets fails to open."""
    out: dict[str, list[str]] = {}
    specs = [s for t in core.live_topologies() for s in t.computations.values()]
    for r in refusals(specs, core.code, core.workers):
        out.setdefault(r.computation, []).append(describe(r, core.workers))
    return out


def _slowest(core: MasterCore, computation: str, n: int = 5) -> list[dict[str, Any]]:
    """The slowest recent calls of user code of a computation, running ones first."""
    now = core.now_ms()
    fresh = core.config.report_timeout_ms * 4  # a tablet that stopped reporting shows nothing
    calls = [(running, seconds, r, key) for (c, r), (at, slow) in core._slow.items()
             if c == computation and now - at <= fresh for key, seconds, running in slow]
    calls.sort(reverse=True)
    return [{"key": show_key(key), "key_range": r, "seconds": round(seconds, 3), "running": running}
            for running, seconds, r, key in calls[:n]]


def status_document(core: MasterCore, wall_us: int | None = None) -> dict[str, Any]:
    now = core.now_ms()
    wall_us = wall_us if wall_us is not None else int(time.time() * 1_000_000)
    computations = {}
    refused = _code_refused(core)
    for t in core.topologies.values():
        for c in t.computations:
            wm = core.published.get(c, MIN)
            totals = core.counters.get(c, {})
            computations[c] = {
                "topology": t.name,
                "low_watermark": wm,
                "lag_ms": None if wm in (MIN, END_OF_TIME) else round((wall_us - wm) / 1000),
                "held_by": (core.computed[c].holder
                            if c in core.computed and core.computed[c].value >= wm else ""),
                "processed": totals.get("processed", 0),
                "late": totals.get("late", 0),
                "dead_lettered": totals.get("dead_lettered", 0),
                "backlog": sum(b for (cc, _), b in core._backlog.items() if cc == c),
                # the lowest watermark any of its tablets acts on (workers learn it ~50 ms later)
                "watermark_seen": min((core._seen.get(k, MIN) for k in core._keys(t.computations[c])),
                                      default=MIN),
                "slow_keys": _slowest(core, c),
                "problems": _problems_of(core, c),
                "code_refused": refused.get(c, []),
            }
    counts: dict[str, int] = {}
    copies: dict[str, int] = {}
    for own in core.tablets.values():
        counts[own.worker] = counts.get(own.worker, 0) + 1
        for f in own.followers:
            copies[f] = copies.get(f, 0) + 1
    replication = core.replication_factors()
    under, unavailable = core.replication_counts()
    idle = core.idle_injectors()
    return {
        "computations": computations,
        "liveness": dict(core.liveness),
        "etcd": {"db_size_bytes": core.etcd_db_bytes},
        "injectors": [_injector(core, n, s, w, now, idle) for n, (s, w) in sorted(core.injectors.items())],
        "expired_injectors": [{"name": n, "stream": s, "watermark": w, "expired_ms_ago": round(now - at)}
                              for at, n, s, w in core.expired_injectors],
        "stale_reports": core.stale_reports,
        "workers": [
            {"id": w, "address": a, "tablets": counts.get(w, 0), "followed": copies.get(w, 0),
             "zone": core.zones.get(w, ""),
             "last_heartbeat_ms_ago": round(now - core.last_seen.get(w, now))}
            for w, a in sorted(core.workers.items())
        ],
        "jobs": _jobs(core),
        "topologies": {
            n: {"state": core.job_state(n), "computations": {
                c.name: {"inputs": c.inputs, "outputs": c.outputs, "key_ranges": c.key_ranges,
                         "code": c.code}
                for c in t.computations.values()}}
            for n, t in sorted(core.topologies.items())
        },
        "tablets": [_tablet(core, c, r, o, replication.get((c, r), 1))
                    for (c, r), o in sorted(core.tablets.items())],
        "reshards": [{"ago_s": round((now - at) / 1000, 1), "what": what} for at, what in core.reshards],
        "replication": {"default": core.config.replication, "under_replicated": under,
                        "unavailable": unavailable},
    }


def _jobs(core: MasterCore) -> list[dict[str, Any]]:
    """Every job: running, draining, drained or cancelled, with its computations' ranges and
    watermarks (`millstream jobs`)."""
    out = []
    refused = _code_refused(core)
    for name in sorted(set(core.topologies) | set(core.jobs)):
        job = core.jobs.get(name)
        topo = core.topologies.get(name)
        comps = list(topo.computations) if topo is not None else list(job.computations if job else ())
        doc: dict[str, Any] = {
            "name": name, "state": core.job_state(name),
            "since": job.since if job is not None else None,
            "state_kept": bool(job.kept) if job is not None else None,
            "input_streams": list(job.streams) if job is not None and job.streams else
            (input_streams(topo) if topo is not None else []),
            "computations": [{"name": c, "ranges": sorted(core.ranges[c].ranges) if c in core.ranges else [],
                              "low_watermark": core.published.get(c, MIN) if topo is not None else None,
                              "problems": _problems_of(core, c), "code_refused": refused.get(c, [])}
                             for c in comps],
        }
        out.append(doc)
    return out


def _tablet(core: MasterCore, c: str, r: int, o: Ownership, wanted: int) -> dict[str, Any]:
    kr = core.bounds(c, r)
    start, end = (kr.start, kr.end) if kr is not None else (0, 0)
    return {"computation": c, "key_range": r, "start": start, "end": end,
            "primary": o.worker, "worker": o.worker, "address": core.workers.get(o.worker, ""),
            "followers": list(o.followers), "in_sync": list(o.in_sync), "token": o.token,
            "load_median": core.load_medians.get((c, r), 0),
            "replication": wanted,
            "health": replication_health(o, wanted)}
