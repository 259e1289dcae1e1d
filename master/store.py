"""The master's durable state in etcd, and leadership through an etcd lease.

Layout under ``/millstream/``::

    leader                      {"id", "address"}          (held by the leader's lease)
    topologies/<name>           topology JSON
    workers/<id>                {"address", "zone"}
    tablets/<computation>/<r>   {"worker", "token", "followers", "in_sync"}
    ranges/<computation>        {"next", "ranges": {id: [start, end, parents]}}
                                (absent: the first cut of key_ranges, never split or merged)
    masters/<id>                {"id", "address"}          (held by that master's lease)
    identities/<worker id>      SHA-256 of that worker id's secret (kept when it leaves:
                                the id stays its disk's)
    watermarks/<computation>    published low watermark (never decreases)
    injectors/<name>            {"stream", "watermark", "incarnations", "floor" (if a run retired)}
    finished/<stream>           "1" once every injector of that stream finished (it counts as fed,
                                at the end of time) until a new job reads it
    jobs/<topology>             {"state", "since", ...} once a job left "running" (master/lifecycle.py)
    dropped/<computation>       the id below which its ranges' state was deleted (a cancel, a
                                removal or reset by an update); a name used again starts above it
    savepoints/<topology>       {"id", "cut"} while a savepoint pauses that job (master/lifecycle.py)

Every write the leader makes is a :class:`~master.change.Change` (:meth:`EtcdStore.apply`), in
etcd transactions guarded by the leader key still holding this master's identity and created
by the election the writing core leads for (its term), so a deposed leader can change nothing,
nor a write begun before the same master was elected again. :func:`as_change` turns what
etcd holds into the one Change a new leader applies. All calls here are blocking; the master
runs them off its event loop.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import grpc
import pyetcd
import pyetcd.exceptions

from master.change import Change, InjectorPromise, WorkerInfo
from master.jobs import Job, Pause
from master.ranges import Ranges
from master.scheduler import Ownership, TabletKey
from runtime.errors import ConfigError, EtcdUnavailableError, MillstreamError
from runtime.topology import Topology

log = logging.getLogger(__name__)

PREFIX = "/millstream/"
LEADER = PREFIX + "leader"
TOPOLOGIES = PREFIX + "topologies/"
WORKERS = PREFIX + "workers/"
MASTERS = PREFIX + "masters/"
WATERMARKS = PREFIX + "watermarks/"
INJECTORS = PREFIX + "injectors/"
TABLETS = PREFIX + "tablets/"
IDENTITIES = PREFIX + "identities/"
RANGES = PREFIX + "ranges/"
JOBS = PREFIX + "jobs/"
DROPPED = PREFIX + "dropped/"
SAVEPOINTS = PREFIX + "savepoints/"
FINISHED = PREFIX + "finished/"
_TXN_OPS = 100  # etcd's default --max-txn-ops is 128


class NotLeaderError(MillstreamError):
    """This master no longer leads; its writes are refused."""


@dataclass(frozen=True)
class EtcdConfig:
    """Where etcd is, and how to authenticate to it."""

    endpoints: tuple[str, ...]
    user: str | None = None
    password: str | None = field(default=None, repr=False)  # (never in a log line or a traceback's locals)
    ca_cert: str | None = None
    timeout_s: float = 5.0

    @classmethod
    def parse(cls, urls: str, **kw: Any) -> EtcdConfig:
        endpoints = tuple(u.strip() for u in urls.split(",") if u.strip())
        if not endpoints:
            raise ConfigError("--etcd is empty; pass a URL such as http://127.0.0.1:2379")
        for u in endpoints:
            p = urlparse(u if "://" in u else "http://" + u)
            if not p.hostname or not p.port:
                raise ConfigError(f"etcd URL {u!r} has no host:port; write it as http://HOST:PORT")
        return cls(endpoints, **kw)


@dataclass
class Snapshot:
    """Everything the master needs to rebuild itself after a failover."""

    topologies: dict[str, str]
    workers: dict[str, str]  # id -> address
    tablets: dict[TabletKey, Ownership]
    watermarks: dict[str, int]
    injectors: dict[str, tuple[str, int]]
    # name -> incarnation -> watermark; an injector of an older version has none stored
    injector_incarnations: dict[str, dict[str, int]] = field(default_factory=dict)
    injector_floors: dict[str, int] = field(default_factory=dict)
    zones: dict[str, str] = field(default_factory=dict)  # worker id -> zone
    code: dict[str, tuple[str, ...]] = field(default_factory=dict)  # worker id -> allowed code prefixes
    ranges: dict[str, Ranges] = field(default_factory=dict)  # split or merged computations
    identities: dict[str, str] = field(default_factory=dict)  # worker id -> SHA-256 of its secret
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)  # topology -> lifecycle document
    dropped: dict[str, int] = field(default_factory=dict)  # computation -> ids below this are gone
    pauses: dict[str, dict[str, Any]] = field(default_factory=dict)  # topology -> savepoint pause
    finished: set[str] = field(default_factory=set)  # streams every injector of which finished


def as_change(snap: Snapshot, pause_until: float) -> Change:
    """Everything ``snap`` holds as one :class:`Change` (a new leader applies it to an empty
    image). A savepoint being taken stays paused until ``pause_until`` (its client renews or
    ends it with this leader); an injector stored before incarnations holds as one."""
    return Change(
        topologies={n: Topology.from_json(doc, stored=True) for n, doc in snap.topologies.items()},
        jobs={n: Job.from_doc(doc) for n, doc in snap.jobs.items()},
        pauses={n: Pause.from_doc(doc, pause_until) for n, doc in snap.pauses.items() if n in snap.topologies},
        tablets=dict(snap.tablets), ranges=dict(snap.ranges), dropped=dict(snap.dropped),
        watermarks=dict(snap.watermarks),
        injectors={n: InjectorPromise(s, wm, dict(snap.injector_incarnations[n]) if n in snap.injector_incarnations
                                      else {"": wm}, snap.injector_floors.get(n))
                   for n, (s, wm) in snap.injectors.items()},
        finished_streams=dict.fromkeys(snap.finished, True),
        workers={w: WorkerInfo(a, snap.zones.get(w, ""), snap.code.get(w, ())) for w, a in snap.workers.items()},
        identities=dict(snap.identities))


class EtcdStore:
    """Blocking access to the master's keys in etcd."""

    def __init__(self, config: EtcdConfig) -> None:
        self.config = config
        eps = []
        for u in config.endpoints:
            p = urlparse(u if "://" in u else "http://" + u)
            if p.scheme == "https":
                if not config.ca_cert:
                    raise ConfigError(f"etcd URL {u!r} uses https; pass --etcd-ca CA.pem to verify it")
                with open(config.ca_cert, "rb") as f:
                    creds = grpc.ssl_channel_credentials(f.read())
                eps.append(pyetcd.Endpoint(p.hostname, p.port, secure=True, creds=creds))
            else:
                eps.append(pyetcd.Endpoint(p.hostname, p.port, secure=False))
        self._client = pyetcd.MultiEndpointEtcd3Client(
            endpoints=eps, timeout=config.timeout_s, user=config.user,
            password=config.password, failover=True,
        )
        self._lease: Any = None
        self._identity: bytes | None = None
        # The leader key's create revision while this master holds it: one per election, so a
        # write begun in one term of this master's is refused in the next (MasterCore.term).
        self.term: int | None = None

    def _call(self, fn: Any, *args: Any, **kw: Any) -> Any:
        try:
            return fn(*args, **kw)
        except (pyetcd.exceptions.ConnectionFailedError, pyetcd.exceptions.ConnectionTimeoutError,
                pyetcd.exceptions.NoServerAvailableError) as e:
            raise EtcdUnavailableError(
                f"cannot reach etcd at {','.join(self.config.endpoints)} ({type(e).__name__}); "
                "start etcd there or point --etcd / MILLSTREAM_ETCD at a running one"
            ) from None

    def check(self) -> None:
        """Raise :class:`EtcdUnavailableError` unless etcd answers."""
        self._call(self._client.status)

    # ------------------------------------------------------------ leadership

    def join(self, identity: dict[str, str], ttl_s: int) -> None:
        """Take a lease and list this master under ``masters/`` for as long as it lives.

        Written once per lease, not on every campaign: an idle follower must not add a
        revision to etcd's history every tick (review G2)."""
        if self._lease is None:
            self._lease = self._call(self._client.lease, ttl_s)
            self._call(self._client.put, MASTERS + identity["id"], json.dumps(identity), lease=self._lease)

    def db_size(self) -> int:
        """The size of etcd's database on the member that answers, in bytes."""
        return int(self._call(self._client.status).db_size)

    def defragment(self) -> None:
        """Give back the space compaction freed (etcd's `defrag`; blocks that member briefly)."""
        self._call(self._client.defragment)

    def masters(self) -> list[dict[str, str]]:
        return [json.loads(v) for v, _ in self._call(self._client.get_prefix, MASTERS)]

    def campaign(self, identity: dict[str, str], ttl_s: int) -> bool:
        """Try to become leader; true if this master now holds the leader key."""
        self.join(identity, ttl_s)
        payload = json.dumps(identity, sort_keys=True).encode()
        t = self._client.transactions

        def create() -> bool:
            won, _ = self._call(self._client.transaction, compare=[t.create(LEADER) == 0],
                                success=[t.put(LEADER, payload, lease=self._lease)], failure=[])
            return bool(won)

        if not create():
            value, meta = self._call(self._client.get, LEADER)
            if value != payload:
                return False
            # This master stepped down (etcd unreachable for a while, a failed tick) and its key
            # outlived it: a new election all the same, or a write its last core began would
            # carry this one's term. The key goes (if it is still that one) and is won anew.
            self._call(self._client.transaction,
                       compare=[t.value(LEADER) == payload, t.create(LEADER) == meta.create_revision],
                       success=[t.delete(LEADER)], failure=[])
            if not create():
                return False
        # The term is the key's create revision, read back (a lease lapsed meanwhile shows here).
        value, meta = self._call(self._client.get, LEADER)
        if value != payload:
            return False
        self._identity, self.term = payload, meta.create_revision
        return True

    def keep_alive(self) -> bool:
        """Refresh the lease; false if it has expired (leadership is lost)."""
        if self._lease is None:
            return False
        responses = self._call(self._lease.refresh)
        alive = bool(responses) and responses[0].TTL > 0
        if not alive:
            self._lease = None
            self._identity = None
        return alive

    def resign(self) -> None:
        if self._lease is not None:
            try:
                self._lease.revoke()
            except Exception:  # best effort: the lease expires anyway
                log.debug("lease revoke failed", exc_info=True)
        self._lease = None
        self._identity = None

    def leader(self) -> dict[str, str] | None:
        value, _ = self._call(self._client.get, LEADER)
        return json.loads(value) if value else None

    def _guarded(self, ops: list[Any], term: int | None = None) -> None:
        """``ops`` written only while the leader key holds this master's identity, and, given
        ``term``, was created by that election (not a later one of this same master's)."""
        if self._identity is None:
            raise NotLeaderError("this master is not the leader")
        t = self._client.transactions
        compare = [t.value(LEADER) == self._identity] + ([t.create(LEADER) == term] if term is not None else [])
        for i in range(0, max(len(ops), 1), _TXN_OPS):
            ok, _ = self._call(
                self._client.transaction,
                compare=compare,
                success=ops[i:i + _TXN_OPS],
                failure=[],
            )
            if not ok:
                if term is not None and term != self.term:  # an ended term's: the current one stands
                    raise NotLeaderError("a write begun in an earlier term of this master's leadership "
                                         "was refused by etcd")
                self._identity = None
                raise NotLeaderError("leadership was lost; the write was refused by etcd")

    # ------------------------------------------------------------------ data

    def load(self) -> Snapshot:
        snap = Snapshot({}, {}, {}, {}, {})
        for value, meta in self._call(self._client.get_prefix, PREFIX):
            key = meta.key.decode()
            if key.startswith(TOPOLOGIES):
                snap.topologies[key[len(TOPOLOGIES):]] = value.decode()
            elif key.startswith(WORKERS):
                doc = json.loads(value)
                snap.workers[key[len(WORKERS):]] = doc["address"]
                snap.zones[key[len(WORKERS):]] = doc.get("zone", "")
                snap.code[key[len(WORKERS):]] = tuple(doc.get("code", ()))
            elif key.startswith(WATERMARKS):
                snap.watermarks[key[len(WATERMARKS):]] = int(value)
            elif key.startswith(INJECTORS):
                doc = json.loads(value)
                snap.injectors[key[len(INJECTORS):]] = (doc["stream"], int(doc["watermark"]))
                if "incarnations" in doc:
                    snap.injector_incarnations[key[len(INJECTORS):]] = {
                        i: int(w) for i, w in doc["incarnations"].items()}
                if doc.get("floor") is not None:
                    snap.injector_floors[key[len(INJECTORS):]] = int(doc["floor"])
            elif key.startswith(IDENTITIES):
                snap.identities[key[len(IDENTITIES):]] = value.decode()
            elif key.startswith(JOBS):
                snap.jobs[key[len(JOBS):]] = json.loads(value)
            elif key.startswith(SAVEPOINTS):
                snap.pauses[key[len(SAVEPOINTS):]] = json.loads(value)
            elif key.startswith(FINISHED):
                snap.finished.add(key[len(FINISHED):])
            elif key.startswith(DROPPED):
                snap.dropped[key[len(DROPPED):]] = int(value)
            elif key.startswith(RANGES):
                snap.ranges[key[len(RANGES):]] = Ranges.from_doc(json.loads(value))
            elif key.startswith(TABLETS):
                comp, _, r = key[len(TABLETS):].rpartition("/")
                doc = json.loads(value)
                snap.tablets[(comp, int(r))] = Ownership(doc["worker"], doc["token"],
                                                         tuple(doc.get("followers", ())),
                                                         # stored before replication: its owner
                                                         tuple(doc.get("in_sync", [doc["worker"]] if doc["worker"] else [])))
        return snap

    def put_tablets(self, tablets: Mapping[TabletKey, Ownership]) -> None:
        self._guarded(self._tablet_ops(tablets))

    def apply(self, change: Change, term: int | None = None) -> None:
        """Write ``change`` (for the leadership ``term`` of :attr:`term`'s, if given: a
        write a core of an ended term begun is refused): one transaction when it fits (100 operations); else three steps,
        ordered so that a leader failing between any two transactions leaves etcd in a state
        the next leader repairs (:meth:`MasterCore.become_leader`, review N13):

        1. what only adds or raises (tablets written, ``dropped`` floors, new ranges and
           watermarks, workers, injectors): until the topology points at them they are
           orphans, collected;
        2. the topology, job and savepoint-pause documents, in one transaction: the change
           takes effect;
        3. what it leaves behind (tablets, ranges and watermarks deleted, finished injector
           names, workers gone): orphans of the new topology if the leader fails before them,
           collected.

        A tablet with state is so never deleted while its topology still wants it (the next
        leader would re-create it empty under token 1), and a restored tablet never wanted
        before it is written."""
        t = self._client.transactions
        first: list[Any] = [*self._tablet_ops(change.tablets)]
        first += [t.put(DROPPED + c, str(below)) for c, below in sorted(change.dropped.items())]
        first += [t.put(RANGES + c, json.dumps(r.to_doc())) for c, r in sorted(change.ranges.items()) if r is not None]
        first += [t.put(WATERMARKS + c, str(v)) for c, v in sorted(change.watermarks.items())]
        first += [t.put(INJECTORS + n, json.dumps({"stream": p.stream, "watermark": p.watermark,
                                                   "incarnations": dict(p.incarnations),
                                                   **({"floor": p.floor} if p.floor is not None else {})}))
                  for n, p in sorted(change.injectors.items())]
        first += [t.put(FINISHED + s, "1") for s, done in sorted(change.finished_streams.items()) if done]
        for w, info in sorted(change.workers.items()):
            if info is not None:
                first.append(t.put(WORKERS + w, json.dumps({"address": info.address, "zone": info.zone,
                                                            "code": list(info.code)})))
        first += [t.put(IDENTITIES + w, digest) for w, digest in sorted(change.identities.items())]
        docs: list[Any] = [t.delete(TOPOLOGIES + n) if topo is None else t.put(TOPOLOGIES + n, topo.to_json())
                           for n, topo in sorted(change.topologies.items())]
        docs += [t.delete(JOBS + n) if job is None else t.put(JOBS + n, json.dumps(job.to_doc()))
                 for n, job in sorted(change.jobs.items())]
        docs += [t.delete(SAVEPOINTS + n) if pause is None else t.put(SAVEPOINTS + n, json.dumps(pause.to_doc()))
                 for n, pause in sorted(change.pauses.items())]
        last: list[Any] = [t.delete(f"{TABLETS}{c}/{r}") for c, r in change.gone]
        last += [t.delete(RANGES + c) for c, r in sorted(change.ranges.items()) if r is None]
        last += [t.delete(WATERMARKS + c) for c in change.watermarks_gone]
        last += [t.delete(INJECTORS + n) for n in change.injectors_gone]
        last += [t.delete(FINISHED + s) for s, done in sorted(change.finished_streams.items()) if not done]
        last += [t.delete(WORKERS + w) for w, info in sorted(change.workers.items()) if info is None]
        if len(first) + len(docs) + len(last) <= _TXN_OPS:
            self._guarded([*first, *docs, *last], term)
            return
        assert len(docs) <= _TXN_OPS, "a change's documents are one transaction"
        for ops in (first, docs, last):
            if ops:
                self._guarded(ops, term)

    def _tablet_ops(self, tablets: Mapping[TabletKey, Ownership]) -> list[Any]:
        t = self._client.transactions
        return [
            t.put(f"{TABLETS}{c}/{r}", json.dumps({"worker": o.worker, "token": o.token,
                                                   "followers": list(o.followers),
                                                   "in_sync": list(o.in_sync)}))
            for (c, r), o in sorted(tablets.items())
        ]

    def close(self) -> None:
        self._client.close()
