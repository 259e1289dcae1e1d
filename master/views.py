"""Pure views of the leader's image: the routing table workers and injectors follow, and the
status document `millstream status`, ``/status.json`` and the web page show.

Both read a :class:`~master.image.ClusterImage` and change nothing. The status document is
typed (:class:`StatusDocument`); its JSON form is what `millstream status --json` prints, field
for field (tests and tools read ``computation``, ``key_range``, ``start``, ``end``,
``primary``, ``followers``, ``in_sync``, ``token``, ``health``, ``workers``, ``liveness``...).
"""

from __future__ import annotations

import time
from typing import NotRequired, TypedDict

from master.code import describe, refusals
from master.config import MasterConfig
from master.image import ClusterImage, InjectorEntry
from master.jobs import closed_streams, input_streams
from master.scheduler import Ownership, replication_health
from runtime.engine import EngineOptions
from runtime.keyspace import wire_end
from runtime.record import END_OF_TIME, MIN_TIME
from runtime.status import show_key
from runtime.wire import millstream_pb2 as pb

# ---------------------------------------------------------------------- routing


def routing_of(image: ClusterImage) -> pb.Routing:
    """The routing table: every live computation with its inputs, options and the owners of
    its ranges; the streams closed to input; the computations whose old state workers delete."""
    out = pb.Routing(version=image.version, closed_streams=closed_streams(image.topologies, image.jobs))
    for name, below in sorted(image.dropped.items()):
        out.dropped.add(computation=name, below=below)
    for topo in image.live_topologies():
        for s in topo.computations.values():
            c = out.computations.add(
                name=s.name, topology=topo.name, code=s.code, outputs=s.outputs,
                key_ranges=s.key_ranges, exactly_once=s.exactly_once,
                productions=s.productions, late_records=s.late_records,
                job_state=image.job_state(topo.name), input_paused=topo.name in image.pauses,
                options=EngineOptions.of_spec(s, image.replication).to_wire(), params=s.params,
            )
            for stream, ex in s.inputs.items():
                c.inputs.add(stream=stream, key_extractor=ex or "")
            for r, kr in sorted(image.ranges[s.name].ranges.items()):
                t = image.tablets.get((s.name, r))
                own = t.own if t is not None else Ownership("", 0)
                a = c.assignments.add(key_range=r, worker_id=own.worker, address=_address(image, own.worker),
                                      token=own.token, in_sync=own.in_sync, start=kr.start,
                                      end=wire_end(kr.end), parents=kr.parents, cut=kr.cut % (1 << 64))
                for f in own.followers:
                    a.followers.add(worker_id=f, address=_address(image, f))
    return out


def _address(image: ClusterImage, worker: str) -> str:
    w = image.workers.get(worker)
    return w.address if w is not None else ""


# ---------------------------------------------------------------------- status


class SlowKeyDoc(TypedDict):
    key: str
    key_range: int
    seconds: float
    running: bool


class ProblemDoc(TypedDict):
    key_range: int
    worker: str
    error: str
    attempts: int
    seconds: float


class ComputationDoc(TypedDict):
    topology: str
    low_watermark: int
    lag_ms: int | None
    held_by: str
    processed: int
    late: int
    dead_lettered: int
    backlog: int
    watermark_seen: int   # the lowest watermark any of its tablets acts on
    slow_keys: list[SlowKeyDoc]
    problems: list[ProblemDoc]
    code_refused: list[str]


class InjectorDoc(TypedDict):
    name: str
    stream: str
    watermark: int
    last_report_ms_ago: int | None
    stale: bool
    idle: bool
    finished: bool
    retired: bool  # every incarnation retired: held at their promise until a next run reports


class ExpiredInjectorDoc(TypedDict):
    name: str
    stream: str
    watermark: int
    expired_ms_ago: int


class WorkerDoc(TypedDict):
    id: str
    address: str
    tablets: int
    followed: int
    zone: str
    last_heartbeat_ms_ago: int


class JobComputationDoc(TypedDict):
    name: str
    ranges: list[int]
    low_watermark: int | None
    problems: list[ProblemDoc]
    code_refused: list[str]


class JobDoc(TypedDict):
    name: str
    state: str
    since: float | None
    state_kept: bool | None
    input_streams: list[str]
    computations: list[JobComputationDoc]


class SpecDoc(TypedDict):
    inputs: dict[str, str | None]
    outputs: list[str]
    key_ranges: int
    code: str


class TopologyDoc(TypedDict):
    state: str
    computations: dict[str, SpecDoc]


class TabletDoc(TypedDict):
    computation: str
    key_range: int
    start: int
    end: int           # exclusive
    primary: str
    worker: str        # the primary, under its older name
    address: str
    followers: list[str]
    in_sync: list[str]
    token: int
    load_median: int
    replication: int
    health: str


class ReshardDoc(TypedDict):
    ago_s: float
    what: str


class ReplicationDoc(TypedDict):
    default: int
    under_replicated: int
    unavailable: int


class EtcdDoc(TypedDict):
    db_size_bytes: int


class MastersDoc(TypedDict):
    leader: str
    leader_id: str
    all: list[str]


class StatusDocument(TypedDict):
    """The leader's status document (its JSON form is `millstream status --json`)."""

    computations: dict[str, ComputationDoc]
    liveness: dict[str, int]
    etcd: EtcdDoc
    injectors: list[InjectorDoc]
    finished_streams: list[str]   # streams every injector of which finished
    expired_injectors: list[ExpiredInjectorDoc]
    stale_reports: int
    workers: list[WorkerDoc]
    jobs: list[JobDoc]
    topologies: dict[str, TopologyDoc]
    tablets: list[TabletDoc]
    reshards: list[ReshardDoc]
    replication: ReplicationDoc
    masters: NotRequired[MastersDoc]  # added by the master serving it (master/server.py)


def status_of(image: ClusterImage, config: MasterConfig, now_ms: float,
              wall_us: int | None = None) -> StatusDocument:
    """The status document of ``image`` at the leader's clock ``now_ms`` (and the wall clock,
    for lags)."""
    wall_us = wall_us if wall_us is not None else int(time.time() * 1_000_000)
    refused = _code_refused(image)
    computations: dict[str, ComputationDoc] = {}
    for t in image.topologies.values():
        for c, spec in t.computations.items():
            wm = image.published.get(c, MIN_TIME)
            totals = image.counters.get(c, {})
            held = image.computed.get(c)
            keys = image.keys(spec)
            computations[c] = {
                "topology": t.name, "low_watermark": wm,
                "lag_ms": None if wm in (MIN_TIME, END_OF_TIME) else round((wall_us - wm) / 1000),
                "held_by": held.holder if held is not None and held.value >= wm else "",
                "processed": totals.get("processed", 0), "late": totals.get("late", 0),
                "dead_lettered": totals.get("dead_lettered", 0),
                "backlog": sum(image.tablets[k].backlog for k in keys if k in image.tablets),
                "watermark_seen": min((image.tablets[k].seen if k in image.tablets else MIN_TIME for k in keys),
                                      default=MIN_TIME),
                "slow_keys": _slowest(image, c, now_ms, config.report_timeout_ms * 4),
                "problems": _problems_of(image, c), "code_refused": refused.get(c, []),
            }
    counts: dict[str, int] = {}
    copies: dict[str, int] = {}
    for tablet in image.tablets.values():
        counts[tablet.own.worker] = counts.get(tablet.own.worker, 0) + 1
        for f in tablet.own.followers:
            copies[f] = copies.get(f, 0) + 1
    factors = image.replication_factors()
    under, unavailable = image.health_counts()
    return {
        "computations": computations,
        "liveness": dict(image.liveness),
        "etcd": {"db_size_bytes": image.etcd_db_bytes},
        "injectors": [_injector(n, inj, now_ms, config.injector_stale_s * 1000)
                      for n, inj in sorted(image.injectors.items())],
        "finished_streams": sorted(image.finished_streams),
        "expired_injectors": [{"name": n, "stream": s, "watermark": w, "expired_ms_ago": round(now_ms - at)}
                              for at, n, s, w in image.expired],
        "stale_reports": image.stale_reports,
        "workers": [{"id": w, "address": e.address, "tablets": counts.get(w, 0), "followed": copies.get(w, 0),
                     "zone": e.zone, "last_heartbeat_ms_ago": round(now_ms - e.last_seen)}
                    for w, e in sorted(image.workers.items())],
        "jobs": _jobs(image, refused),
        "topologies": {n: {"state": image.job_state(n), "computations": {
            c.name: {"inputs": c.inputs, "outputs": c.outputs, "key_ranges": c.key_ranges, "code": c.code}
            for c in t.computations.values()}} for n, t in sorted(image.topologies.items())},
        "tablets": [_tablet(image, c, r, t.own, t.load_median, factors.get((c, r), 1))
                    for (c, r), t in sorted(image.tablets.items())],
        "reshards": [{"ago_s": round((now_ms - at) / 1000, 1), "what": what} for at, what in image.reshards],
        "replication": {"default": image.replication, "under_replicated": under, "unavailable": unavailable},
    }


def _injector(name: str, inj: InjectorEntry, now_ms: float, stale_ms: float) -> InjectorDoc:
    """An injector silent for longer than ``stale_ms`` still holds its stream (it may yet send
    records its promise covers) but is flagged, with how long it has been silent, so an
    operator can finish or release it; after ``injector_expiry_s`` it is released (review
    G4). A live Injector reports every 10 s, so only a gone one goes stale."""
    quiet = None if inj.seen is None else round(now_ms - inj.seen)
    return {"name": name, "stream": inj.stream, "watermark": inj.watermark, "last_report_ms_ago": quiet,
            "stale": quiet is not None and quiet > stale_ms and not inj.finished and not inj.waiting,
            "idle": inj.all_idle, "finished": inj.finished, "retired": inj.waiting}


def _problems_of(image: ClusterImage, computation: str) -> list[ProblemDoc]:
    """Tablets of a computation whose owner reports it cannot run them (code that does not
    load, storage that does not open, a batch that does not finish)."""
    out: list[ProblemDoc] = []
    for worker, w in image.workers.items():
        for (c, r), p in sorted(w.problems.items()):
            t = image.tablets.get((c, r))
            if c == computation and t is not None and t.own.worker == worker:
                out.append({"key_range": r, "worker": worker, "error": p.error, "attempts": p.attempts,
                            "seconds": round(p.seconds, 1)})
    return out


def _code_refused(image: ClusterImage) -> dict[str, list[str]]:
    """Computations of running jobs whose code some live worker may not load (its
    --allow-code), one line each naming the workers and the flag to add: known as soon as
    such a worker joins, before any of its tablets fails to open."""
    out: dict[str, list[str]] = {}
    policies = {w: e.code for w, e in image.workers.items()}
    addresses = {w: e.address for w, e in image.workers.items()}
    for r in refusals(image.specs(live=True), policies, addresses):
        out.setdefault(r.computation, []).append(describe(r, addresses))
    return out


def _slowest(image: ClusterImage, computation: str, now_ms: float, fresh_ms: float, n: int = 5) -> list[SlowKeyDoc]:
    """The slowest recent calls of user code of a computation, running ones first (a tablet
    that stopped reporting shows nothing)."""
    calls = [(running, seconds, r, key) for (c, r), t in image.tablets.items() if c == computation and t.slow
             and now_ms - t.slow[0] <= fresh_ms for key, seconds, running in t.slow[1]]
    calls.sort(reverse=True)
    return [{"key": show_key(key), "key_range": r, "seconds": round(seconds, 3), "running": running}
            for running, seconds, r, key in calls[:n]]


def _jobs(image: ClusterImage, refused: dict[str, list[str]]) -> list[JobDoc]:
    """Every job: running, draining, drained or cancelled, with its computations' ranges and
    watermarks (`millstream jobs`)."""
    out: list[JobDoc] = []
    for name in sorted(set(image.topologies) | set(image.jobs)):
        job, topo = image.jobs.get(name), image.topologies.get(name)
        comps = list(topo.computations) if topo is not None else list(job.computations if job else ())
        out.append({
            "name": name, "state": image.job_state(name),
            "since": job.since if job is not None else None,
            "state_kept": bool(job.kept) if job is not None else None,
            "input_streams": list(job.streams) if job is not None and job.streams else
            (input_streams(topo) if topo is not None else []),
            "computations": [{"name": c, "ranges": sorted(image.ranges[c].ranges) if c in image.ranges else [],
                              "low_watermark": image.published.get(c, MIN_TIME) if topo is not None else None,
                              "problems": _problems_of(image, c), "code_refused": refused.get(c, [])}
                             for c in comps],
        })
    return out


def _tablet(image: ClusterImage, c: str, r: int, o: Ownership, load_median: int, wanted: int) -> TabletDoc:
    kr = image.bounds(c, r)
    start, end = (kr.start, kr.end) if kr is not None else (0, 0)
    return {"computation": c, "key_range": r, "start": start, "end": end,
            "primary": o.worker, "worker": o.worker, "address": _address(image, o.worker),
            "followers": list(o.followers), "in_sync": list(o.in_sync), "token": o.token,
            "load_median": load_median, "replication": wanted, "health": replication_health(o, wanted, image.workers)}
