"""One change of the cluster's durable facts: what the leader writes to etcd, then applies.

Every decision of the leader (a submit, a move, a failover, a split, a worker joining, the
watermarks it publishes) is one :class:`Change`. :meth:`master.core.MasterCore.commit` writes
it to etcd (:meth:`master.store.EtcdStore.apply`, ordered so that a leader failing half-way
leaves nothing the next one cannot repair) and then applies the same object to the leader's
image (:meth:`master.image.ClusterImage.apply`): one path, in one place, for every command.
A new leader applies everything etcd holds as one Change (:func:`master.store.as_change`).
As in Kafka's KRaft (a ``MetadataDelta`` applied to a ``MetadataImage``) and etcd's applier.

In every mapping, ``None`` deletes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from master.jobs import Job, Pause
from master.ranges import Ranges
from master.scheduler import Ownership, TabletKey
from runtime.topology import Topology


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """What etcd keeps of a live worker: where it listens, its failure domain, and the module
    prefixes it loads user code from (master/code.py)."""

    address: str
    zone: str = ""
    code: tuple[str, ...] = ()


@dataclass(frozen=True)
class InjectorPromise:
    """What etcd keeps of an injector name: its stream, the lowest promise of its live
    incarnations, and each incarnation's own (a new leader keeps every hold)."""

    stream: str
    watermark: int
    incarnations: dict[str, int] = field(default_factory=dict)
    floor: int | None = None  # the latest promise of a run that retired (the name holds there with none live)


@dataclass
class Change:
    """A set of writes of the leader's durable facts (see the module doc)."""

    topologies: dict[str, Topology | None] = field(default_factory=dict)
    jobs: dict[str, Job | None] = field(default_factory=dict)             # jobs not running
    pauses: dict[str, Pause | None] = field(default_factory=dict)         # savepoint pauses
    tablets: dict[TabletKey, Ownership] = field(default_factory=dict)
    gone: list[TabletKey] = field(default_factory=list)                   # tablets deleted
    ranges: dict[str, Ranges | None] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)   # computation -> range ids below are deleted
    watermarks: dict[str, int] = field(default_factory=dict)              # published low watermarks
    watermarks_gone: list[str] = field(default_factory=list)
    injectors: dict[str, InjectorPromise] = field(default_factory=dict)
    injectors_gone: list[str] = field(default_factory=list)  # finished names (kept if one came back)
    # stream -> True: every injector of it finished (it counts as fed, at the end of time);
    # False: open again (a new job reads it).
    finished_streams: dict[str, bool] = field(default_factory=dict)
    workers: dict[str, WorkerInfo | None] = field(default_factory=dict)
    identities: dict[str, str] = field(default_factory=dict)  # worker id -> SHA-256 of its secret

    def __bool__(self) -> bool:
        return any(bool(v) for v in vars(self).values())
