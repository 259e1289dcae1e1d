"""The injector's queue of records waiting for a round: first in, first out, in columns,
with the oldest timestamp it holds (what the injector's effective watermark may not pass).

Records are queued as columns (runtime/columns.py), in blocks of up to :data:`BLOCK`
records of one form: a sequenced producer's (its prefix once, a sequence number per record)
or records with opaque ids. A round takes the oldest records as one :class:`Columns`, so no
object is made per record between ``send`` and the wire. Each block keeps its lowest
timestamp: appending compares with the last block's, taking a round drops or cuts the first
blocks and looks again at the one it cut only (at most a block's worth of timestamps per
round), and the minimum over everything queued is a minimum over the blocks (a few hundred
at the default bound of 100,000 records). Recomputing it over the whole queue after each
round cost a fast sender a scan of the queue per round, under the lock ``send`` waits for.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from runtime.columns import Columns
from runtime.record import END_OF_TIME, Record

BLOCK = 1024  # records per block: what a round re-reads of the block it cuts


class Buffer:
    """Records in arrival order; :attr:`min_timestamp` is the lowest timestamp among them."""

    def __init__(self) -> None:
        self._blocks: deque[Columns] = deque()
        self._mins: deque[int] = deque()  # each block's lowest timestamp
        self.size = 0  # records queued: len(), read without a call on the send path

    def __len__(self) -> int:
        return self.size

    def __bool__(self) -> bool:
        return self.size > 0

    def __iter__(self) -> Iterator[Record]:
        for block in list(self._blocks):
            yield from block.records()

    @property
    def min_timestamp(self) -> int:
        return min(self._mins) if self._mins else END_OF_TIME

    def add(self, key: bytes, value: bytes, timestamp: int, producer: bytes, seq: int) -> int:
        """Queue one record of a sequenced producer (id ``producer`` + ``seq``); returns how
        many are queued now."""
        blocks = self._blocks
        tail = blocks[-1] if blocks else None
        if tail is None or tail.producer != producer or len(tail.keys) >= BLOCK:
            tail = Columns([], [], [], producer, [])
            blocks.append(tail)
            self._mins.append(timestamp)
        elif timestamp < self._mins[-1]:
            self._mins[-1] = timestamp
        tail.keys.append(key)
        tail.values.append(value)
        tail.timestamps.append(timestamp)
        tail.seqs.append(seq)  # type: ignore[union-attr]  # a sequenced block has seqs
        self.size += 1
        return self.size

    def add_id(self, key: bytes, value: bytes, timestamp: int, id: bytes) -> int:
        """Queue one record with an opaque id; returns how many are queued now."""
        blocks = self._blocks
        tail = blocks[-1] if blocks else None
        if tail is None or tail.producer is not None or len(tail.keys) >= BLOCK:
            tail = Columns([], [], [], ids=[])
            blocks.append(tail)
            self._mins.append(timestamp)
        elif timestamp < self._mins[-1]:
            self._mins[-1] = timestamp
        tail.keys.append(key)
        tail.values.append(value)
        tail.timestamps.append(timestamp)
        tail.ids.append(id)  # type: ignore[union-attr]  # an opaque block has ids
        self.size += 1
        return self.size

    def extend(self, columns: Columns) -> int:
        """Queue ``columns`` (taken over: the caller keeps no reference), in blocks; returns
        how many are queued now."""
        n = len(columns)
        for start in range(0, n, BLOCK):
            block = columns if n <= BLOCK else _slice(columns, start, start + BLOCK)
            self._blocks.append(block)
            self._mins.append(min(block.timestamps))
        self.size += n
        return self.size

    def take(self, n: int) -> Columns:
        """The (up to) ``n`` oldest records, removed, as one :class:`Columns` (sequenced if
        they are all one producer's)."""
        blocks, mins = self._blocks, self._mins
        parts: list[Columns] = []
        left = n
        while left and blocks:
            head = blocks[0]
            if len(head) <= left:
                parts.append(blocks.popleft())
                mins.popleft()
                left -= len(head)
            else:
                parts.append(_slice(head, 0, left))
                rest = blocks[0] = _slice(head, left, len(head))
                mins[0] = min(rest.timestamps)
                left = 0
        self.size -= n - left
        if not parts:
            return Columns([], [], [], ids=[])
        return Columns.concat(parts)

    def put_back(self, parts: list[Columns]) -> None:
        """Queue ``parts`` again ahead of everything, in order (rounds that failed)."""
        for columns in reversed(parts):
            if len(columns):
                # A copy: the tail block grows in place, and a round's columns are not to.
                self._blocks.appendleft(_slice(columns, 0, len(columns)))
                self._mins.appendleft(min(columns.timestamps))
                self.size += len(columns)


def _slice(c: Columns, start: int, stop: int) -> Columns:
    """Records ``start:stop`` of ``c`` (new lists)."""
    if c.producer is not None:
        return Columns(c.keys[start:stop], c.values[start:stop], c.timestamps[start:stop], c.producer,
                       c.seqs[start:stop] if c.seqs is not None else None)
    return Columns(c.keys[start:stop], c.values[start:stop], c.timestamps[start:stop],
                   ids=c.ids[start:stop] if c.ids is not None else None)
