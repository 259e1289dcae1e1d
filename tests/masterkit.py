"""The leader without etcd: a :class:`MemoryStore` that keeps what the leader writes (a new
leader loads it back), and a leader whose image is built the way every leader builds it,
through :meth:`ClusterImage.apply` of a change. For unit tests of the master's logic."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from typing import Any

from master.change import Change, WorkerInfo
from master.config import MasterConfig
from master.core import MasterCore
from master.scheduler import Ownership
from master.store import Snapshot
from runtime import Topology
from runtime.wire import millstream_pb2 as pb

END = (1 << 63) - 1


class MemoryStore:
    """What an EtcdStore keeps, in memory: every change the leader applied (``changes``), and
    :meth:`load` gives a new leader what they left, as etcd would."""

    term = None  # (EtcdStore's election term: one store, one term here)

    def __init__(self) -> None:
        self.changes: list[Change] = []
        self.snap = Snapshot({}, {}, {}, {}, {})

    def apply(self, change: Change, term: int | None = None) -> None:
        self.changes.append(change)
        s = self.snap
        for n, topo in change.topologies.items():
            _put(s.topologies, n, None if topo is None else topo.to_json())
        for n, job in change.jobs.items():
            _put(s.jobs, n, None if job is None else job.to_doc())
        for n, pause in change.pauses.items():
            _put(s.pauses, n, None if pause is None else pause.to_doc())
        for key in change.gone:
            s.tablets.pop(key, None)
        s.tablets.update(change.tablets)
        for c, r in change.ranges.items():
            _put(s.ranges, c, r)
        s.dropped.update(change.dropped)
        for c in change.watermarks_gone:
            s.watermarks.pop(c, None)
        s.watermarks.update(change.watermarks)
        for n, p in change.injectors.items():
            s.injectors[n] = (p.stream, p.watermark)
            s.injector_incarnations[n] = dict(p.incarnations)
            _put(s.injector_floors, n, p.floor)
        for n in change.injectors_gone:
            s.injectors.pop(n, None)
            s.injector_incarnations.pop(n, None)
            s.injector_floors.pop(n, None)
        for stream, done in change.finished_streams.items():
            (s.finished.add if done else s.finished.discard)(stream)
        for w, info in change.workers.items():
            if info is None:
                for per_worker in (s.workers, s.zones, s.code):
                    per_worker.pop(w, None)
            else:
                s.workers[w], s.zones[w], s.code[w] = info.address, info.zone, info.code
        s.identities.update(change.identities)

    def load(self) -> Snapshot:
        return copy.deepcopy(self.snap)

    def db_size(self) -> int:
        return 0

    def defragment(self) -> None:
        pass


def _put(mapping: dict[Any, Any], key: Any, value: Any) -> None:
    if value is None:
        mapping.pop(key, None)
    else:
        mapping[key] = value


def leader(store: Any = None, config: MasterConfig | None = None,
           clock: Callable[[], float] = lambda: 0.0) -> MasterCore:
    """A leader over ``store`` (a new :class:`MemoryStore` if None), not yet leading."""
    return MasterCore(store if store is not None else MemoryStore(), config or MasterConfig(), clock)


def seed(core: MasterCore, topology: Topology, workers: tuple[str, ...] = ("w",), token: int = 1) -> None:
    """Put ``topology`` on ``core``'s image with every tablet on the first worker under ``token``,
    as an applied change (what a submit leaves, without placement)."""
    keys = [(s.name, r) for s in topology.computations.values() for r in range(s.key_ranges)]
    asyncio.run(core.commit(Change(
        topologies={topology.name: topology},
        workers={w: WorkerInfo(f"127.0.0.1:{i + 1}") for i, w in enumerate(workers)},
        tablets={k: Ownership(workers[0], token) for k in keys})))


def idle_report(computation: str, key_range: int = 0, token: int = 1) -> pb.HeldTablet:
    return pb.HeldTablet(computation=computation, key_range=key_range, token=token, has_work=False)


def hold(core: MasterCore, name: str) -> tuple[str, int] | None:
    """The stream and watermark injector ``name`` holds (None: no such name)."""
    inj = core.image.injectors.get(name)
    return None if inj is None else (inj.stream, inj.watermark)
