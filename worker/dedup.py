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
