"""What a tablet's thread read lately, kept in memory as it is committed since: a stage that
touches a key in batch after batch (a count, a fused step's state, W2's EWMA) reads it from
a dict, not from RocksDB (~3.5 us a read; one per key, per stateful step, per batch).

Two generations, so a full cache keeps what is in use: reads go into the young one
(``values``), and so do commits of keys it holds (in either); when it holds ``entries`` it
becomes the old one, and a key found only in the old one is read from there and put back in
the young one. A key a commit writes and the cache does not hold stays out: on W2 most of a
batch's writes are window accumulators, which the window operator keeps in memory and reads
back only after a call it undid (then once each, from RocksDB). A key a stage touches in
every batch (a count, a step's state, W2's EWMA) stays; what is read once ages out. (It used
to start over when full, and to take in every key a commit wrote: on W2 the windows' entries
filled it every few batches and the per-key state was read from RocksDB again. `python -m
bench.w2_inprocess --records 100000 --flow --profile` read RocksDB 0.130 times per record
then, 0.080 with two generations, 0.045 with commits kept to what is held, each of W2's
keys' first window being a read of nothing.)

Single-threaded: only the tablet's thread reads through it, and only
:meth:`worker.storage.TabletStore.commit` changes what it holds, after its write succeeded,
so what it holds is always what is committed. Readers on other threads (a state query) read RocksDB
directly: a value they read could otherwise be put back after a commit replaced it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

ENTRIES = 1 << 14  # per tablet and generation; when the young one is full it becomes the old one


class ReadCache:
    """Committed values by storage key (``None``: absent), over ``read`` (the store's get)."""

    def __init__(self, read: Callable[[bytes], bytes | None], entries: int = ENTRIES,
                 read_many: Callable[[list[bytes]], Any] | None = None) -> None:
        self._read = read
        self._read_many = read_many
        self._entries = entries
        self.misses = 0  # reads that were not held (each one RocksDB read)
        # The young generation: read it, never write it (the tablet's hot path). Everything
        # in it is newer than what the old one holds for the same key.
        self.values: dict[bytes, bytes | None] = {}
        self._old: dict[bytes, bytes | None] = {}

    def get(self, skey: bytes) -> bytes | None:
        values = self.values
        try:
            return values[skey]
        except KeyError:
            pass
        old = self._old
        if skey in old:
            value = values[skey] = old[skey]
        else:
            self.misses += 1
            value = values[skey] = self._read(skey)
        if len(values) > self._entries:
            self._age()
        return value

    def prefetch(self, keys: Iterable[bytes]) -> int:
        """Read every one of ``keys`` not held, together (one RocksDB multi-get, with
        ``read_many``): a batch whose keys are new to the cache pays one read of them all
        instead of one call per key. How many it read."""
        missing = list(set(keys).difference(self.values).difference(self._old))
        if not missing or self._read_many is None:
            return 0
        self.values.update(zip(missing, self._read_many(missing), strict=True))
        if len(self.values) > self._entries:
            self._age()
        return len(missing)

    def committed(self, writes: Mapping[bytes, bytes | None], cleared: bool = False) -> None:
        """A commit wrote ``writes`` (None deletes); ``cleared``: it also deleted ranges.

        Only what is held is updated: a key written and not read since it was last held is
        left to be read from RocksDB if it ever is. The cache holds what is read, so keys
        that are written and never read (a window's accumulator, which its operator keeps in
        memory, on W2 most of a batch's writes) do not push the ones that are read out."""
        if cleared:
            self.forget()
        values, old = self.values, self._old
        # (An intersection of two dicts' keys goes over the smaller: the commit's writes. A
        # difference would go over the cache, ~16,000 keys a commit.)
        held = writes.keys() & values.keys()
        if len(held) < len(writes) and old:
            held |= writes.keys() & old.keys()
        if len(held) == len(writes):  # all held (a step's read-modify-write)
            values.update(writes)
        elif held:
            values.update({k: writes[k] for k in held})
        else:  # none held (a window's accumulators)
            return
        if len(values) > self._entries:
            self._age()

    def forget(self) -> None:
        """A commit failed: what it wrote is unknown, so nothing held is trusted."""
        self.values.clear()
        self._old = {}

    def held(self) -> dict[bytes, bytes | None]:
        """Everything held, as a reader sees it (tests)."""
        return self._old | self.values

    def _age(self) -> None:
        # The young generation becomes the old one; ``values`` stays the same dict (the
        # batch processor holds it).
        self._old = self.values.copy()
        self.values.clear()
