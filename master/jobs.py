"""Jobs and their lifecycle states, and how an update changes a job: pure data, no I/O.

The leader carries the lifecycle out in master/lifecycle.py (docs/lifecycle.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from runtime.errors import TopologyError
from runtime.topology import Topology

RUNNING, DRAINING, DRAINED, CANCELLED = "running", "draining", "drained", "cancelled"
RESTORING = "restoring"  # created from a savepoint; its tablets stay closed until they are loaded
PAUSE_LIMIT_S = 60.0  # a savepoint's pause not renewed for this long ends by itself (its client died)


@dataclass
class Job:
    """What the leader keeps of a job that left "running" (etcd ``jobs/<topology>``)."""

    state: str
    since: float                          # wall-clock seconds of the last change
    kept: bool = False                    # cancelled with its state kept: a resubmit resumes it
    streams: tuple[str, ...] = ()         # the input streams a drain closed
    released: bool = False                # draining: the holds on those streams are released
    computations: tuple[str, ...] = ()    # cancelled and deleted: what it ran
    version: int = 0                      # draining: the routing that closed its streams (not stored)

    def to_doc(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        del doc["version"]
        return doc

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> Job:
        return cls(str(doc["state"]), float(doc["since"]), bool(doc.get("kept", False)),
                   tuple(doc.get("streams", ())), bool(doc.get("released", False)),
                   tuple(doc.get("computations", ())))


@dataclass
class Pause:
    """A savepoint being taken of a job (etcd ``savepoints/<topology>``): its input is paused and
    its tablets fire no timers until the client ends it (docs/lifecycle.md). A new leader keeps it."""

    id: str
    until: float  # the leader's clock (ms): it ends by itself then unless renewed (not stored)
    # The agreed point, once the job came to rest: "computation/range" -> the commits its
    # storage held; the client's copy is a cut only if every tablet still reports the same after it.
    cut: dict[str, int] | None = None

    def to_doc(self) -> dict[str, Any]:
        return {"id": self.id, "cut": self.cut}

    @classmethod
    def from_doc(cls, doc: dict[str, Any], until: float) -> Pause:
        cut = doc.get("cut")
        return cls(str(doc["id"]), until, None if cut is None else {str(k): int(v) for k, v in dict(cut).items()})


def input_streams(topology: Topology) -> list[str]:
    """The streams a job reads from outside: read by its computations, produced by none of them."""
    produced = {o for s in topology.computations.values() for o in s.all_outputs}
    return sorted({i for s in topology.computations.values() for i in s.inputs} - produced)


@dataclass(frozen=True)
class Diff:
    """How an update changes a job's computations."""

    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]  # keep their state, reopen with the new spec
    reset: tuple[str, ...]    # start over with empty state
    same: tuple[str, ...]

    def summary(self) -> dict[str, list[str]]:
        return {k: list(v) for k, v in dataclasses.asdict(self).items()}


IN_PLACE_FIXED = ("key_ranges", "exactly_once", "productions")


def diff(old: Topology, new: Topology, drop_state: bool = False, reset: Iterable[str] = ()) -> Diff:
    """Compare a running job with its update; raise :class:`TopologyError` for a change that
    cannot be made safely (saying which, why, and what to do)."""
    reset = tuple(dict.fromkeys(reset))
    both = [c for c in new.computations if c in old.computations]
    for c in reset:
        if c not in both:
            raise TopologyError(f"--reset-state {c}: the job {old.name!r} and the new topology do not both "
                                "have a computation of that name; name one they share")
    removed = tuple(c for c in old.computations if c not in new.computations)
    if removed and not drop_state:
        raise TopologyError(
            f"the update of {old.name!r} removes {', '.join(removed)}, which would delete their state; "
            "pass --drop-state to confirm, or keep them in the topology")
    changed = []
    for c in both:
        a, b = old.computations[c], new.computations[c]
        if a == b or c in reset:
            continue
        for f in IN_PLACE_FIXED:
            if getattr(a, f) != getattr(b, f):
                how = ("its ranges split and merge while it runs: `millstream split` / `millstream merge`"
                       if f == "key_ranges" else "its dedup data and checkpointed productions follow it")
                raise TopologyError(
                    f"computation {c!r}: {f} cannot change in place ({getattr(a, f)!r} -> {getattr(b, f)!r}; "
                    f"{how}); pass --reset-state {c} to start it over with empty state")
        changed.append(c)
    return Diff(added=tuple(c for c in new.computations if c not in old.computations), removed=removed,
                changed=tuple(changed), reset=reset,
                same=tuple(c for c in both if c not in changed and c not in reset))


def closed_streams(topologies: Mapping[str, Topology], jobs: Mapping[str, Job]) -> dict[str, str]:
    """Streams that take no more input, and the reason injectors are told."""
    read = {i for n, t in topologies.items() if n not in jobs or jobs[n].state != CANCELLED
            for s in t.computations.values() for i in s.inputs}
    out = {}
    for name, job in jobs.items():
        for s in job.streams:
            if job.state in (DRAINING, DRAINED):
                out[s] = (f"stream {s!r} takes no more input: job {name!r} was drained (`millstream drain`); "
                          "submit a job that reads it to send more")
            elif job.state == CANCELLED and s not in read:
                out[s] = (f"stream {s!r} takes no more input: job {name!r} was cancelled (`millstream cancel`); "
                          "submit a job that reads it to send more")
    return out
