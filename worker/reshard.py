"""Building a new key range's storage from the ranges it replaces (docs/rescaling.md).

A split's two halves and a merge's one range are built by the primary that held the old
tablets, from their closed storage on its own disk, the first time it opens the new tablet:

- **split**: a RocksDB checkpoint of the parent (hard links: no data copied), then two range
  deletes of state (``S``) and timers (``K``) outside the half, because both are stored in
  key-hash order (worker/storage.py); the timer index (``T``) is scanned. Dedup data (marks,
  opaque ids) is kept whole: whatever the parent committed, each half has too; lower marks
  are cut to the half (one outside it would, after a later merge, stand for keys of the
  other half that it never saw advance).
  The parent's checkpointed productions go to the first half only, which re-sends them.
- **merge**: a checkpoint of the left parent, then every entry of the right one written in.
  A producer's mark is the higher of the two; the lower one stays as a *lower mark* for
  its side (worker/dedup.py). The right parent's productions get new local numbers after
  the left's.

The tablet token in the copy is the parent's, below the new tablet's (its parents' highest
plus one), so the new tablet opens it normally. The build happens in a side directory that
is renamed into place: a crash part-way leaves nothing a later open would mistake for state.
"""

from __future__ import annotations

import os
import shutil
import struct
import threading
from dataclasses import dataclass

from rocksdict import Checkpoint, Rdict, WriteBatch

from runtime.durable import sync_dir
from runtime.errors import MillstreamError
from runtime.keyspace import HASH_SPACE
from worker.dedup import Lower, Mark
from worker.rocksopen import open_rdict
from worker.storage import (
    M_SEQ,
    M_SINK,
    M_SINK_ABSORBED,
    M_SINK_UNCOMMITTED,
    M_TOKEN,
    _options,
    lower_key,
    production_key,
)
from worker.writes import replay_log

_BATCH = 10_000  # entries per write while copying
_BUILDING = threading.Lock()  # a split's halves build from one parent: one at a time (its lock)


@dataclass(frozen=True)
class Parent:
    """A range the new one is built from: where its storage is, and its hash bounds."""

    path: str
    start: int
    end: int


@dataclass(frozen=True)
class Origin:
    """What a new range is built from: its parents, its bounds, and (for a split) whether it
    is the half that takes the parent's productions."""

    parents: list[Parent]
    start: int
    end: int
    first: bool

    def build(self, path: str) -> None:
        build(path, self.parents, self.start, self.end, self.first)


def _h(value: int) -> bytes:
    return value.to_bytes(8, "big")


def _open(path: str, create: bool = False) -> Rdict:
    opts = _options()
    opts.create_if_missing(create)  # a parent that is not there is an error, never an empty store
    try:
        db = open_rdict(path, opts)
    except Exception as e:
        raise MillstreamError(f"cannot open the storage {path!r} a new key range is built from: {e}") from None
    try:
        replay_log(db)  # a follower's logged commits, should these files have been one's
    except BaseException as e:
        db.close()
        raise MillstreamError(f"cannot apply the follower log of {path!r}, which a new key range is built "
                              f"from: {e}") from None
    return db


def build(path: str, parents: list[Parent], start: int, end: int, first: bool) -> None:
    """Build the storage of range ``[start, end)`` at ``path`` from its parents' storage.
    ``first``: of a split's two halves, the one that takes the parent's productions."""
    with _BUILDING:
        _build(path, parents, start, end, first)


def _build(path: str, parents: list[Parent], start: int, end: int, first: bool) -> None:
    missing = [p.path for p in parents if not os.path.isdir(p.path)]
    if missing:
        raise MillstreamError(
            f"cannot build key range storage {path!r}: the storage of the range(s) it replaces is not here "
            f"({', '.join(missing)}); only the worker that held them as primary can build it")
    building = path + ".building"
    if os.path.exists(building):
        shutil.rmtree(building)  # a build a crash interrupted
    base = _open(parents[0].path)
    try:
        Checkpoint(base).create_checkpoint(building)
    finally:
        base.close()
    db = _open(building)
    try:
        if len(parents) == 1:
            _keep_half(db, parents[0], start, end, first)
        else:
            _absorb(db, parents[0], parents[1])
        db.flush_wal(True)  # durable before the rename: the parents may be deleted after it
    finally:
        db.close()
    os.rename(building, path)
    sync_dir(os.path.dirname(path))


def _delete_outside(db: Rdict, wb: WriteBatch, kind: bytes, start: int, end: int) -> None:
    wb.delete_range(kind, kind + _h(start))
    if end < HASH_SPACE:
        wb.delete_range(kind + _h(end), bytes([kind[0] + 1]))


def _scan(db: Rdict, prefix: bytes) -> list[tuple[bytes, bytes]]:
    out = []
    it = db.iter()
    it.seek(prefix)
    while it.valid():
        k = it.key()
        if not k.startswith(prefix):
            break
        out.append((k, it.value()))
        it.next()
    return out


def _tablet(parent: Parent) -> bytes:
    """A parent's tablet name, ``<computation>/<range>``, from where its storage is
    (``<state dir>/<computation>/<range>``, worker/core.py ``path_of``)."""
    head, range_id = os.path.split(os.path.normpath(parent.path))
    return f"{os.path.basename(head)}/{range_id}".encode()


def _sink_uncommitted(db: Rdict, wb: WriteBatch, parent: Parent) -> None:
    """A parent (its storage ``db``) that never committed a sink meta goes on in no range's
    output: whatever it wrote is uncommitted, for the range built from it to take back as the
    parent's own reopen would (``Sink.restore``'s ``uncommitted``: its name and last token)."""
    if db.get(M_SINK) is None:
        wb.put(M_SINK_UNCOMMITTED + _tablet(parent), db.get(M_TOKEN) or b"0")


def _keep_half(db: Rdict, parent: Parent, start: int, end: int, first: bool) -> None:
    wb = WriteBatch(raw_mode=True)
    _delete_outside(db, wb, b"S", start, end)
    _delete_outside(db, wb, b"K", start, end)
    _delete_outside(db, wb, b"Y", start, end)  # typed state (runtime/state.py)
    # T <domain:1> <time:8> <hash:8> ...: in time order, so its other half is found by a scan.
    it = db.iter()
    it.seek(b"T")
    while it.valid():
        k = it.key()
        if not k.startswith(b"T"):
            break
        if not start <= int.from_bytes(k[10:18], "big") < end:
            wb.delete(k)
        it.next()
    del it
    for producer, lows in _lows(db).items():  # G <producer:8> <start:8> -> <end:8> <seq:8>
        for low in lows:
            wb.delete(lower_key(producer, low.start))
        for low in _clipped(lows, start, end):
            wb.put(lower_key(producer, low.start), struct.pack(">QQ", 0 if low.end == HASH_SPACE else low.end, low.seq))
    if first:
        _sink_uncommitted(db, wb, parent)
    else:
        wb.delete_range(b"P", b"Q")       # the first half re-sends the parent's productions
        wb.delete(M_SINK)                 # and goes on with its sink output (or takes it back)
        wb.delete_range(M_SINK_ABSORBED, M_SINK_ABSORBED[:-1] + b",")
        wb.delete_range(M_SINK_UNCOMMITTED, M_SINK_UNCOMMITTED[:-1] + b".")
    db.write(wb)


def _absorb(db: Rdict, left: Parent, right: Parent) -> None:
    """Write the right parent's entries into the left parent's copy ``db``."""
    src = _open(right.path)
    try:
        left_marks = {k[1:]: Mark.unpack(v) for k, v in _scan(db, b"H")}
        right_marks = {k[1:]: Mark.unpack(v) for k, v in _scan(src, b"H")}
        left_lows = _lows(db)
        right_lows = _lows(src)
        wb = WriteBatch(raw_mode=True)
        n = 0
        for kind in (b"S", b"K", b"T", b"O", b"Y"):  # streamed: a large parent is never all in memory
            it = src.iter()
            it.seek(kind)
            while it.valid() and it.key()[:1] == kind:
                wb.put(it.key(), it.value())
                n += 1
                if n % _BATCH == 0:
                    db.write(wb)
                    wb = WriteBatch(raw_mode=True)
                it.next()
            del it
        # The right parent's sink output is not continued (the left one's is): a sink that
        # buffers committed rows settles them from this meta when the merged range opens.
        right_sink = src.get(M_SINK)
        if right_sink is not None:
            wb.put(M_SINK_ABSORBED + os.path.basename(right.path).encode(), right_sink)
        else:
            _sink_uncommitted(src, wb, right)
        _sink_uncommitted(db, wb, left)
        for k, v in _scan(src, M_SINK_ABSORBED) + _scan(src, M_SINK_UNCOMMITTED):
            wb.put(k, v)
        # Marks: the higher of the two; the other side keeps its own as a lower mark.
        wb.delete_range(b"G", b"H")
        for producer in left_marks.keys() | right_marks.keys():
            lm, rm = left_marks.get(producer), right_marks.get(producer)
            top = max(m.seq for m in (lm, rm) if m is not None)
            token = max(m.token for m in (lm, rm) if m is not None)
            seen = max(m.seen_us for m in (lm, rm) if m is not None)
            wb.put(b"H" + producer, Mark(top, token, seen).pack())
            lows = []
            for side, mark, own in ((left, lm, left_lows), (right, rm, right_lows)):
                parts = _side(side, mark.seq if mark is not None else 0, own.get(producer, []))
                lows += [low for low in parts if low.seq < top]
            for low in lows:
                end = 0 if low.end == HASH_SPACE else low.end
                wb.put(lower_key(producer, low.start), struct.pack(">QQ", end, low.seq))
        # Productions: the right parent's after the left's, in their order.
        left_seq = int(db.get(M_SEQ) or b"0")
        last = max([left_seq, *(struct.unpack_from(">Q", k, 1)[0] for k, _ in _scan(db, b"P"))])
        for k, v in _scan(src, b"P"):
            _, key_range, kind = struct.unpack_from(">QIB", k, 1)
            last += 1
            wb.put(production_key(last, k[14:].decode(), key_range, kind), v)
        right_seq = int(src.get(M_SEQ) or b"0")
        wb.put(M_SEQ, str(max(last, right_seq)).encode())
        db.write(wb)
    finally:
        src.close()


def _clipped(lows: list[Lower], start: int, end: int) -> list[Lower]:
    """The parts of ``lows`` inside ``[start, end)``."""
    return [Lower(max(low.start, start), min(low.end, end), low.seq) for low in sorted(lows)
            if max(low.start, start) < min(low.end, end)]


def _side(side: Parent, seq: int, lows: list[Lower]) -> list[Lower]:
    """A parent's marks for one producer over its whole range: its lower marks where it has
    them (cut to its range: a half built by an older version kept its parent's whole), its
    mark ``seq`` elsewhere."""
    out, at = [], side.start
    for low in _clipped(lows, side.start, side.end):
        if low.start > at:
            out.append(Lower(at, low.start, seq))
        out.append(low)
        at = max(at, low.end)
    if at < side.end:
        out.append(Lower(at, side.end, seq))
    return out


def _lows(db: Rdict) -> dict[bytes, list[Lower]]:
    out: dict[bytes, list[Lower]] = {}
    for k, v in _scan(db, b"G"):
        end, seq = struct.unpack(">QQ", v)
        out.setdefault(k[1:9], []).append(Lower(int.from_bytes(k[9:17], "big"), end or HASH_SPACE, seq))
    return out
