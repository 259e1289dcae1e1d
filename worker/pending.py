"""A call's or a batch's typed-state writes over what is stored (runtime/state.py's cells):
what a read in the middle of a batch sees, and the index its scans find them by."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Iterator


def merged(base: Iterator[tuple[bytes, bytes]], pending: dict[bytes, bytes | None],
           cleared: Iterable[bytes] = (), prefix: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
    """``base`` (what is stored under ``prefix``, sorted by key) with ``pending`` writes over it
    (None deletes) and what lies under ``cleared`` prefixes of ``base`` left out; sorted by key."""
    cleared = tuple(cleared)
    if cleared:
        base = iter(()) if prefix.startswith(cleared) else ((k, v) for k, v in base if not k.startswith(cleared))
    over = sorted(pending.items())
    tagged_base = ((k, 1, v) for k, v in base)
    tagged_over = ((k, 0, v) for k, v in over)
    last = None
    for k, _, v in heapq.merge(tagged_over, tagged_base, key=lambda t: (t[0], t[1])):
        if k == last:
            continue  # a pending write hides the stored value
        last = k
        if v is not None:
            yield k, v


_GROUP = 9  # TYPED and the key's hash prefix: what every storage key of one key's state starts with


class Pending:
    """An index of the typed-state writes of a call or a batch (``cells``: storage key ->
    stored value, None deletes) for scans: the writes under a prefix are found among those of
    the prefix's key, not all of them (an interval join scans once per record, and a batch's
    writes grow with it: quadratic). It follows ``cells`` lazily: the dict only grows, so what
    is new since the last scan is its last entries; :meth:`forget` after taking one out."""

    __slots__ = ("cells", "_groups", "_seen")

    def __init__(self, cells: dict[bytes, bytes | None]) -> None:
        self.cells = cells
        self._groups: dict[bytes, list[bytes]] = {}
        self._seen = 0

    def under(self, prefix: bytes) -> dict[bytes, bytes | None]:
        cells = self.cells
        if len(prefix) < _GROUP:
            return {k: v for k, v in cells.items() if k.startswith(prefix)}
        n = len(cells)
        if n != self._seen:
            groups = self._groups
            if n < self._seen:
                groups.clear()
                self._seen = 0
            for k in itertools.islice(reversed(cells), n - self._seen):
                groups.setdefault(k[:_GROUP], []).append(k)
            self._seen = n
        return {k: cells[k] for k in self._groups.get(prefix[:_GROUP], ()) if k.startswith(prefix)}

    def forget(self) -> None:
        """An entry was taken out of :attr:`cells`: the index is made again at the next scan."""
        self._groups.clear()
        self._seen = 0
