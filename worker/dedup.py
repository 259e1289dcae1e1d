"""The in-memory first stage of exactly-once dedup: Bloom filters over record ids.

A negative answer is certain, so most new records never touch the disk; a
possible hit is confirmed against the tablet's RocksDB. Bloom filters cannot
delete, so ids are added to the newest of a few generations, rotated when it
fills; the oldest generation is dropped only together with the disk ids it
covered (see docs/exactly-once.md).
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
                if len(self._gens) > self.max_generations:
                    # Merge the two oldest rather than lose ids: answers stay safe.
                    merged = self._gens.pop(0)
                    merged.update(self._gens[0])
                    self._gens[0] = merged
            self._gens[-1].add(rid)
            self._count += 1

    def may_contain(self, rid: bytes) -> bool:
        return any(rid in g for g in reversed(self._gens))
