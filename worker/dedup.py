"""The in-memory first stage of exactly-once dedup: Bloom filters over record ids.

A negative answer is certain, so most new records never touch the disk; a
possible hit is confirmed against the tablet's RocksDB. Bloom filters cannot
delete: ids are added to the newest generation, a new one starts when it
fills, and once there are too many the tablet rebuilds the filter from the
ids still on disk (garbage collection keeps those bounded, see
docs/architecture.md). Forgotten ids left in a filter only cost a disk check.
"""

from __future__ import annotations

from collections.abc import Iterable

from rbloom import Bloom


class DedupFilter:
    """Generations of Bloom filters answering "possibly seen" for record ids."""

    def __init__(self, capacity: int = 1_000_000, error_rate: float = 0.01, generations: int = 4) -> None:
        self.capacity = capacity
        self.error_rate = error_rate
        self.max_generations = generations
        self._gens: list[Bloom] = [Bloom(capacity, error_rate)]
        self._count = 0

    def add_all(self, ids: Iterable[bytes]) -> None:
        for rid in ids:
            if self._count >= self.capacity:
                self._gens.append(Bloom(self.capacity, self.error_rate))
                self._count = 0
            self._gens[-1].add(rid)
            self._count += 1

    @property
    def generations(self) -> int:
        return len(self._gens)

    def needs_rebuild(self) -> bool:
        """True when it holds more generations than wanted: rebuild it from the disk ids."""
        return len(self._gens) > self.max_generations

    def may_contain(self, rid: bytes) -> bool:
        return any(rid in g for g in reversed(self._gens))


def rebuilt(capacity: int, ids: Iterable[bytes]) -> DedupFilter:
    """A filter holding exactly ``ids`` (the ones still on disk after collection)."""
    fresh = DedupFilter(capacity=capacity)
    fresh.add_all(ids)
    # Without collection (ids from injectors) the disk set itself is large: allow it,
    # rather than rebuilding again at every commit.
    fresh.max_generations = max(fresh.max_generations, fresh.generations + 2)
    return fresh


class Collection:
    """The receiving side of dedup collection: producers' promises and tokens.

    A producer (an id prefix) promises, with each delivery, the lowest sequence it may still
    resend, under its tablet's token. Ids below a promise are forgotten in the next commit,
    which also persists the token that justified it; a producer older than one already
    heard from is refused, since ids it might resend may be gone on its successor's word.
    """

    def __init__(self, tokens: dict[bytes, int]) -> None:
        self._tokens = dict(tokens)          # producer prefix -> newest token heard
        self._floors: dict[bytes, int] = {}  # producer prefix -> resend floor of that token
        self._collected: dict[bytes, int] = {}  # producer prefix -> forgotten below

    def accept(self, floors: list[tuple[bytes, int, int]]) -> int | None:
        """Take a delivery's promises; returns the newer token it is refused for, if stale."""
        for producer, _, token in floors:
            if token < self._tokens.get(producer, 0):
                return self._tokens[producer]
        for producer, floor, token in floors:
            if token > self._tokens.get(producer, 0):
                self._tokens[producer] = token
                self._floors.pop(producer, None)  # an older owner's promise no longer counts
            if floor > self._floors.get(producer, 0):
                self._floors[producer] = floor
        return None

    def plan(self) -> tuple[dict[bytes, tuple[int, int]], dict[bytes, int]]:
        """What the next commit forgets (prefix -> [from, to) sequences) and the tokens it records."""
        ranges = {p: (self._collected.get(p, 0), f) for p, f in self._floors.items()
                  if f > self._collected.get(p, 0)}
        return ranges, {p: self._tokens.get(p, 0) for p in ranges}

    def committed(self, ranges: dict[bytes, tuple[int, int]]) -> None:
        for producer, (_, hi) in ranges.items():
            self._collected[producer] = hi
