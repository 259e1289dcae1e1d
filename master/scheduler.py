"""Tablet placement: a pure function from the cluster's state to an assignment.

Tablets stay where they are while their owner lives; orphans go to the least
loaded workers; then the most loaded give tablets to the least loaded until
no two workers differ by more than one. Every change of owner issues the
tablet's next sequencer token (tokens never move backwards).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

TabletKey = tuple[str, int]  # (computation, key range)


@dataclass(frozen=True, slots=True)
class Ownership:
    """Who owns a tablet, under which sequencer token ("" = nobody)."""

    worker: str
    token: int


def place(
    tablets: Iterable[TabletKey],
    current: Mapping[TabletKey, Ownership],
    live_workers: Iterable[str],
) -> dict[TabletKey, Ownership]:
    """The new ownership of every tablet; unchanged entries keep their token."""
    workers = sorted(set(live_workers))
    tablets = sorted(set(tablets))
    if not workers:
        return {t: Ownership("", current[t].token if t in current else 0) for t in tablets}
    load: dict[str, list[TabletKey]] = {w: [] for w in workers}
    orphans: list[TabletKey] = []
    for t in tablets:
        own = current.get(t)
        if own is not None and own.worker in load:
            load[own.worker].append(t)
        else:
            orphans.append(t)
    base, extra = divmod(len(tablets), len(workers))
    # The most loaded workers keep the extra tablets, so fewer tablets move.
    by_load = sorted(workers, key=lambda w: (-len(load[w]), w))
    quota = {w: base + (1 if i < extra else 0) for i, w in enumerate(by_load)}
    for w in workers:
        while len(load[w]) > quota[w]:
            orphans.append(load[w].pop())
    orphans.sort()
    for t in orphans:
        w = min(workers, key=lambda w: (len(load[w]) - quota[w], len(load[w]), w))
        load[w].append(t)
    result: dict[TabletKey, Ownership] = {}
    for w, ts in load.items():
        for t in ts:
            old = current.get(t)
            if old is not None and old.worker == w:
                result[t] = old
            else:
                result[t] = Ownership(w, (old.token if old else 0) + 1)
    return result
