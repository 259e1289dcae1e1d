"""What a sender queues for a tablet, and how its records are kept in their owner's order
when they must be cut or re-routed (runtime/courier.py).

A *parcel* is records one owner made for one tablet (a commit's productions for one
destination, an injector round's records for one tablet): the unit a sender queues, puts in
a delivery, and hears acknowledged. Its *owner* is who made it: a producing tablet, an
injector.

Receivers deduplicate a sequenced producer's records by one mark (worker/dedup.py): a record
at or below the highest sequence a tablet committed of its producer is a duplicate. So every
sender must hand a tablet each producer's records in the order the producer made them, or
a later record committed first makes the earlier ones look like duplicates: lost. That
order is what an *order key* says, per record:

- ``parcel.order`` when the owner gives it (a weak tablet's production order, an injector's
  send order: ids do not say it there), ``-1`` for a record whose place is not known;
- else the record's sequence (a strong tablet's own, sequenced, productions);
- else not known (``-1``).

A record whose place is not known was re-sent from a checkpoint when its owner opened: older
than anything the owner made since, so it goes first; among themselves such records keep
the order they were given in. :func:`arrange` is the one place records of parcels are
re-ordered and cut: per owner, by order key, into new parcels per destination range.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Generic, Protocol, TypeVar

from runtime.columns import PREFIX_BYTES, Columns
from runtime.delivery import cut_columns

UNKNOWN = -1  # the order key of a record whose place in its owner's order is not known


class Parcel(Protocol):
    """Records one owner made for one tablet (worker/storage.py ``Shipment`` is one)."""

    computation: str
    key_range: int
    cols: Columns
    producers: tuple[bytes, ...]      # the sequenced producers among its ids (listed in orders)
    order: list[int] | None           # each record's order key, if the ids do not say it


class Owner(Protocol):
    """Who made parcels and hears what became of them (a tablet, an injector)."""

    @property
    def token(self) -> int:
        """The owner's token, named in its producers' orders (0: an injector's)."""

    @property
    def closing(self) -> bool:
        """True once what it queued is no longer its to send (its successor re-sends it)."""


ParcelT = TypeVar("ParcelT", bound=Parcel)
OwnerT = TypeVar("OwnerT", bound=Owner)

# Makes a parcel of records drawn from ``sources`` (parcels of one owner): the sources, its
# computation and range, its records, their producers and their order keys (None: the
# records are sequenced and their sequences say it).
PieceMaker = Callable[[list[ParcelT], str, int, Columns, tuple[bytes, ...], "list[int] | None"], ParcelT]


def order_keys(p: Parcel) -> list[int]:
    """Each record's order key (see the module's docstring)."""
    if p.order is not None:
        return p.order
    seqs = p.cols.seqs
    if seqs is not None:
        return seqs
    return [UNKNOWN] * len(p.cols)


def first_key(p: Parcel) -> int:
    if not len(p.cols):
        return UNKNOWN
    if p.order is not None:
        return p.order[0]
    seqs = p.cols.seqs
    return seqs[0] if seqs is not None else UNKNOWN


def last_key(p: Parcel) -> int:
    if not len(p.cols):
        return UNKNOWN
    if p.order is not None:
        return p.order[-1]
    seqs = p.cols.seqs
    return seqs[-1] if seqs is not None else UNKNOWN


def in_order(keys: Sequence[int]) -> bool:
    """Whether order keys are as :func:`arrange` would leave them: the unknown ones first,
    then the known ones not falling."""
    last = UNKNOWN
    for k in keys:
        if k < last:
            return False
        last = max(last, k)
    return True


@dataclass(slots=True)
class Rerouted(Generic[ParcelT, OwnerT]):
    """Parcels ``old`` of ``owner`` were cut into ``new`` (its records, none lost, none
    added); ``parts``: id of an old parcel -> the new ones holding its records."""

    owner: OwnerT
    old: list[ParcelT]
    new: list[ParcelT]
    parts: dict[int, list[ParcelT]] = field(default_factory=dict)


def arrange(items: Sequence[tuple[ParcelT, OwnerT]], computation: str, ranges_of: Callable[[list[bytes]], list[int]],
            piece: PieceMaker[ParcelT], streams: Sequence[int] | None = None
            ) -> tuple[dict[int, list[tuple[ParcelT, OwnerT]]], list[Rerouted[ParcelT, OwnerT]]]:
    """Parcels of one computation cut into parcels per destination range (``ranges_of``:
    the range of each key): per owner, its records in its order (by order key; the unknown
    ones first, see :func:`_merge_unknown`), one parcel per owner and range (cut where one
    delivery would pass its bound). ``streams``: for each item, the queue it comes from
    (items of one queue are in their owner's order there; default: each item its own).
    Returns the new parcels by range, each range's in owner order (owners as they first
    occur in ``items``), and what replaced what, per owner."""
    out: dict[int, list[tuple[ParcelT, OwnerT]]] = {}
    moves: list[Rerouted[ParcelT, OwnerT]] = []
    by_owner: dict[int, tuple[OwnerT, list[ParcelT], list[int]]] = {}
    for n, (p, o) in enumerate(items):
        entry = by_owner.setdefault(id(o), (o, [], []))
        entry[1].append(p)
        entry[2].append(n if streams is None else streams[n])
    for owner, group, where in by_owner.values():
        rows: list[tuple[tuple[int, int, int], int, int]] = []  # (sort key, source, index)
        unknown: list[tuple[int, int]] = []
        for pos, p in enumerate(group):
            for i, k in enumerate(order_keys(p)):
                if k < 0:
                    unknown.append((pos, i))
                else:
                    rows.append(((1, k, 0), pos, i))
        rows.sort(key=itemgetter(0))
        if unknown:
            rows[:0] = [((0, n, 0), pos, i) for n, (pos, i) in enumerate(_merge_unknown(group, where, unknown))]
        ranges = ranges_of([group[pos].cols.keys[i] for _, pos, i in rows])
        members: dict[int, list[tuple[int, int, int]]] = {}  # range -> [(source, index, key)]
        for (sort_key, pos, i), r in zip(rows, ranges, strict=True):
            members.setdefault(r, []).append((pos, i, sort_key[1] if sort_key[0] else UNKNOWN))
        move: Rerouted[ParcelT, OwnerT] = Rerouted(owner, list(group), [])
        for r, ms in members.items():
            for made, sources in _pieces(group, computation, r, ms, piece):
                move.new.append(made)
                out.setdefault(r, []).append((made, owner))
                for pos in sources:
                    move.parts.setdefault(id(group[pos]), []).append(made)
        moves.append(move)
    return out, moves


def _merge_unknown(group: Sequence[Parcel], streams: Sequence[int], records: list[tuple[int, int]]
                   ) -> list[tuple[int, int]]:
    """Records whose order is not known (re-sent from checkpoints when their owner opened:
    ``(source, index)``, each source's in its order) in one order that keeps the order of
    each stream (a queue: ``streams[source]``) and each sequenced producer's records in
    sequence. One commit's records for two ranges were checkpointed apart, so neither queue
    order says how they interleave; the producers' sequences do. From the first stream on,
    one record at a time: a record whose producer has a lower sequence still waiting in
    another stream waits for it (that stream's head is taken first, and so on)."""
    heads: dict[int, deque[tuple[int, int, bytes | None, int]]] = {}  # stream -> (source, index, producer, seq)
    ahead: dict[bytes, dict[int, deque[int]]] = {}  # producer -> stream -> its sequences there, in order
    for pos, i in records:
        p = group[pos]
        rid = p.cols.id(i)
        producer = rid[:PREFIX_BYTES] if rid[:PREFIX_BYTES] in p.producers else None
        seq = int.from_bytes(rid[PREFIX_BYTES:], "big") if producer is not None else 0
        stream = streams[pos]
        heads.setdefault(stream, deque()).append((pos, i, producer, seq))
        if producer is not None:
            ahead.setdefault(producer, {}).setdefault(stream, deque()).append(seq)
    out: list[tuple[int, int]] = []
    order = list(heads)  # streams as they first occur
    while order:
        cur = order[0]
        seen = {cur}
        while True:  # follow what the head waits for
            _, _, producer, seq = heads[cur][0]
            if producer is None:
                break
            lower = [(q[0], s) for s, q in ahead[producer].items() if s != cur and q and q[0] < seq]
            if not lower or min(lower)[1] in seen:
                break
            cur = min(lower)[1]
            seen.add(cur)
        pos, i, producer, _ = heads[cur].popleft()
        if producer is not None:
            ahead[producer][cur].popleft()
        out.append((pos, i))
        if not heads[cur]:
            del heads[cur]
            order.remove(cur)
    return out


def unknown_sequences(p: Parcel) -> dict[bytes, tuple[int, int]]:
    """Per sequenced producer, the first and last sequence among ``p``'s records whose order
    is not known (they must not fall between parcels of one owner: :func:`_merge_unknown`)."""
    keys = order_keys(p)
    out: dict[bytes, tuple[int, int]] = {}
    cols = p.cols
    for i, k in enumerate(keys):
        if k >= 0:
            continue
        rid = cols.id(i)
        producer = rid[:PREFIX_BYTES]
        if producer in p.producers:
            seq = int.from_bytes(rid[PREFIX_BYTES:], "big")
            first = out.get(producer)
            out[producer] = (seq, seq) if first is None else (first[0], seq)
    return out


def _pieces(group: list[ParcelT], computation: str, r: int, members: list[tuple[int, int, int]],
            piece: PieceMaker[ParcelT]) -> list[tuple[ParcelT, list[int]]]:
    """The parcels of ``members`` (source, index, order key, in order) for range ``r``, cut at
    the delivery bound, each with the sources it draws from."""
    runs: list[Columns] = []
    run_src, run_ix = -1, list[int]()  # consecutive records of one source: one select
    for pos, i, _ in members:
        if pos != run_src and run_ix:
            runs.append(group[run_src].cols.select(run_ix))
            run_ix = []
        run_src = pos
        run_ix.append(i)
    if run_ix:
        runs.append(group[run_src].cols.select(run_ix))
    cols = Columns.concat(runs)
    keys = [k for _, _, k in members]
    # Keys kept with the records unless their sequences say them (one sequenced owner's).
    keep = cols.seqs is None or any(group[pos].order is not None for pos, _, _ in members)
    producers = tuple(dict.fromkeys(p for pos in dict.fromkeys(m[0] for m in members) for p in group[pos].producers))
    out: list[tuple[ParcelT, list[int]]] = []
    start = 0
    for part in cut_columns(cols):
        n = len(part)
        sources = list(dict.fromkeys(m[0] for m in members[start:start + n]))
        out.append((piece([group[s] for s in sources], computation, r, part, producers,
                          keys[start:start + n] if keep else None), sources))
        start += n
    return out
