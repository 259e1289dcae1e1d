"""Key ranges of computations: intervals of the 64-bit key-hash space with stable ids.

``key_ranges=N`` is only the first cut (ids ``0..N-1``, equal widths). A split replaces a
range by two new ones, a merge two adjacent ranges by one; a new range gets the next id of
its computation and is never given an id used before, so an id (and the producer prefix
and storage directory derived from it) always names the same slice of one history. A new
range records the ranges it is built from (``parents``); its first primary builds its
storage from theirs (worker/reshard.py, docs/rescaling.md).

Pure data and arithmetic; the leader applies it (master/core.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.errors import MillstreamError
from runtime.keyspace import check_split, first_cut


@dataclass(frozen=True, slots=True)
class KeyRange:
    """One range: ``[start, end)`` of the hash space, and what it was built from."""

    start: int
    end: int
    parents: tuple[int, ...] = ()
    cut: int = 0  # where a split cut the parent, or where a merge's two parents met

    def to_doc(self) -> list[object]:
        return [self.start, self.end, list(self.parents), self.cut]

    @classmethod
    def from_doc(cls, doc: list[object]) -> KeyRange:
        start, end, parents, cut = doc
        assert isinstance(start, int) and isinstance(end, int) and isinstance(parents, list)
        assert isinstance(cut, int)
        return cls(start, end, tuple(int(p) for p in parents), cut)


@dataclass
class Ranges:
    """The ranges of one computation and the next id to give."""

    ranges: dict[int, KeyRange]
    next_id: int

    @classmethod
    def first(cls, n: int, base: int = 0) -> Ranges:
        """``n`` equal ranges with ids from ``base`` (above those of an earlier computation of
        the same name, whose state was deleted: master/lifecycle.py)."""
        return cls({base + i: KeyRange(lo, hi) for i, (lo, hi) in first_cut(n).items()}, base + n)

    def to_doc(self) -> dict[str, object]:
        return {"next": self.next_id, "ranges": {str(i): r.to_doc() for i, r in sorted(self.ranges.items())}}

    @classmethod
    def from_doc(cls, doc: dict[str, object]) -> Ranges:
        ranges = doc["ranges"]
        assert isinstance(ranges, dict)
        return cls({int(i): KeyRange.from_doc(r) for i, r in ranges.items()}, int(str(doc["next"])))

    def split(self, computation: str, rid: int, at: int | None) -> Ranges:
        """The ranges after cutting ``rid`` at ``at`` (the middle by default)."""
        old = self._get(computation, rid)
        try:
            cut = check_split(old.start, old.end, at)
        except ValueError as e:
            raise MillstreamError(f"cannot split {computation}/{rid}: {e}") from None
        ranges = {i: r for i, r in self.ranges.items() if i != rid}
        ranges[self.next_id] = KeyRange(old.start, cut, (rid,), cut)
        ranges[self.next_id + 1] = KeyRange(cut, old.end, (rid,), cut)
        return Ranges(ranges, self.next_id + 2)

    def merge(self, computation: str, left: int, right: int) -> Ranges:
        """The ranges after joining ``left`` and ``right`` (``right`` starts where ``left`` ends)."""
        a, b = self._get(computation, left), self._get(computation, right)
        if a.end != b.start:
            raise MillstreamError(
                f"cannot merge {computation}/{left} [{a.start}, {a.end}) and {computation}/{right} "
                f"[{b.start}, {b.end}): they are not adjacent in that order; `millstream status` "
                "lists each range's start and end")
        ranges = {i: r for i, r in self.ranges.items() if i not in (left, right)}
        ranges[self.next_id] = KeyRange(a.start, b.end, (left, right), a.end)
        return Ranges(ranges, self.next_id + 1)

    def _get(self, computation: str, rid: int) -> KeyRange:
        r = self.ranges.get(rid)
        if r is None:
            raise MillstreamError(f"computation {computation!r} has no range {rid} (it has "
                                  f"{', '.join(map(str, sorted(self.ranges)))}); `millstream status` lists them")
        return r
