"""One tablet's RocksDB: layout, opening under a sequencer token, and atomic commits.

Keys are prefixed by one byte per kind of data::

    S <hash:8> <key>                      user state
    H <producer prefix:8>                 producer mark -> <seq:8> <token:8> <seen_us:8>
    G <producer prefix:8> <start:8>       a lower mark for part of the range (after a merge)
                                          -> <end:8> <seq:8>
    O <bucket:8> <record id>              opaque dedup id, by wall-time bucket (worker/dedup.py)
    P <seq:8> <range:4> <kind:1> <computation>   checkpointed outgoing delivery (a Columns proto;
                                          kinds 0/1: one Record proto, written before columns)
    K <hash:8> <keylen:4> <key> <tag>     timer by key -> <domain:1> <time:8> <nonce>
    T <domain:1> <time:8> <hash:8> <keylen:4> <key> <tag>   timer index by due time
    M token | seq | sink | index | opened | term   metadata
    Msink+<range> / Msink-<computation>/<range>   a merged range's sink meta / a replaced
                                          range that committed none (worker/reshard.py)
    L <index:8>                           a follower's commit, logged whole, not yet applied
                                          (worker/writes.py; every opening applies them)

``hash`` is the key's 64-bit hash (runtime/keyspace.py): state and timers are in hash
order, so a key range's share of them is a range of storage keys (a split deletes the other
half with two range deletes, worker/reshard.py).

A :class:`Commit` collects one batch's effects and is written as one
``WriteBatch``: nothing the batch did is visible, or all of it is. A replicated tablet
also gets the commit's writes back, encoded (:func:`encode_ops`), numbered by ``index``:
its followers log exactly those writes in their copy (worker/replicastore.py) and apply them
coalesced, a few commits at a time (worker/writes.py, docs/replication.md). Every opening of a :class:`TabletStore` has its own ``term``, higher
than any before it in that copy, and every commit records its term: so a commit is named by
(index, term), and a reopened primary's commit N is never taken for the commit N of the
opening before it (one whose local write failed after its followers had it). A term's low
bits are the token the opening is under (:func:`next_term`): one primary holds a token, so
no two primaries' openings share a term, and a copy that holds commit N of term t holds
the same commits up to N as every copy that does (Raft's log matching). That is what lets
a demoted primary continue as its successor's follower without a snapshot
(worker/replica.py).
"""

from __future__ import annotations

import collections
import enum
import os
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from rocksdict import AccessType, Checkpoint, Options, Rdict, WriteBatch, WriteBufferManager, WriteOptions

from runtime.columns import Columns
from runtime.computation import TimeDomain
from runtime.errors import MillstreamError, StaleTokenError
from runtime.kernels import prefixed_keys
from runtime.keyspace import from_wire_end, hash_prefix, wire_end
from runtime.wire import millstream_pb2 as pb
from worker.dedup import Lower, Mark
from worker.readcache import ReadCache
from worker.rocksopen import open_rdict
from worker.writes import (
    DELETE,
    Writes,
    encode_ops,
    replay_log,
)
from worker.writes import PUT as PUT  # noqa: I001 (re-exported: bench/overhead.py runs in older checkouts too)
from worker.writes import apply_ops as apply_ops

MEMTABLE_BYTES = 16 << 20           # one tablet's memtable before it is flushed
WORKER_MEMTABLE_BYTES = 128 << 20   # all the tablets of one worker process together
_WRITE_BUFFERS = WriteBufferManager(WORKER_MEMTABLE_BYTES, False)
_TIME_OFFSET = 1 << 63  # maps signed microseconds onto unsigned, order-preserving
M_TOKEN, M_SEQ, M_SINK, M_INDEX = b"Mtoken", b"Mseq", b"Msink", b"Mindex"
M_OPENED, M_TERM = b"Mopened", b"Mterm"  # the term of the last opening; of the last commit
TERM_TOKEN_BITS = 24  # a term: (openings << 24) | (token mod 2**24)
# Msink+<range id>: the sink meta of a range merged into this one (its output may need settling)
M_SINK_ABSORBED = b"Msink+"
# Msink-<computation>/<range>: a range this one replaced that never committed a sink meta
# -> the token it last held (until this range commits a sink meta)
M_SINK_UNCOMMITTED = b"Msink-"
_NOSYNC = WriteOptions()


def write_durably(db: Rdict, wb: WriteBatch, sync: bool) -> None:
    """Write ``wb``; with ``sync``, return once it is on disk.

    Not ``WriteOptions.sync``: rocksdict holds the GIL through a synced write, fsync
    included, so every commit would stop the worker's event loop and every other tablet's
    thread for the length of an fsync (measured: a spinning thread made no progress during
    two thirds of them). ``flush_wal(sync=True)`` releases the GIL, and RocksDB's WAL sync
    gives the same guarantee (the WAL directory included, for a new log file); commits of
    different tablets then sync side by side. docs/performance.md has the figures."""
    db.write(wb, _NOSYNC)
    if sync:
        db.flush_wal(True)


def _options() -> Options:
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    # A worker holds many tablets: their memtables share one budget (flushed early when
    # the sum nears it) instead of RocksDB's 2 x 64 MiB each, so a worker's memory does
    # not grow with the number of tablets it was given (docs/performance.md, "Soak").
    opts.set_write_buffer_size(MEMTABLE_BYTES)
    opts.set_write_buffer_manager(_WRITE_BUFFERS)
    return opts


def _open(path: str, create: bool = True) -> Rdict:
    """Open the RocksDB in ``path``; unless ``create``, it must be there (never made anew)."""
    if create:
        os.makedirs(path, exist_ok=True)
    opts = _options()
    opts.create_if_missing(create)
    try:
        db = open_rdict(path, opts)
    except Exception as e:
        raise MillstreamError(f"cannot open tablet storage {path!r}: {e}") from None
    try:
        replay_log(db)
    except BaseException as e:
        db.close()
        raise MillstreamError(f"cannot apply the follower log of tablet storage {path!r}: {e}") from None
    return db


def _refuse_empty(path: str, token: int, what: str) -> MillstreamError:
    return MillstreamError(
        f"tablet storage {path!r} {what}, but the tablet existed (token {token}): refusing to open it "
        "empty. The leader promotes only workers holding an in-sync copy: was this state directory wiped "
        "(or this tablet's directory emptied) while its worker.id file was kept, or a savepoint's tablet "
        "copied without its files? Bring back the worker that holds the copy, or restore from a complete "
        "savepoint")


def is_tablet_copy(path: str) -> bool:
    """Whether ``path`` holds a RocksDB (its ``CURRENT`` file): what a tablet that existed must have."""
    return os.path.isfile(os.path.join(path, "CURRENT"))


def _after(prefix: bytes) -> bytes:
    """The first key past every key that starts with ``prefix``."""
    stripped = prefix.rstrip(b"\xff")
    return stripped[:-1] + bytes([stripped[-1] + 1]) if stripped else b"\xff" * (len(prefix) + 1)


def state_key(key: bytes) -> bytes:
    return b"S" + hash_prefix(key) + key


def state_keys(keys: Iterable[bytes]) -> list[bytes]:
    """:func:`state_key` of each key, in one call (runtime/kernels.py)."""
    return prefixed_keys(b"S", keys)


def saved_entries(path: str, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
    """Every entry under ``prefix`` of a tablet copy not in use (a savepoint's checkpoint),
    read-only, in key order."""
    db = Rdict(path, options=Options(raw_mode=True), access_type=AccessType.read_only())
    try:
        it = db.iter()
        it.seek(prefix)
        while it.valid() and it.key().startswith(prefix):
            yield it.key(), it.value()
            it.next()
        del it
    finally:
        db.close()


def saved_states(path: str) -> Iterator[tuple[bytes, bytes]]:
    """Every ``(key, state)`` (``ctx.state``) of a tablet copy not in use."""
    for k, v in saved_entries(path, b"S"):
        yield k[9:], v


def _timer_key(key: bytes, tag: str) -> bytes:
    return hash_prefix(key) + struct.pack(">I", len(key)) + key + tag.encode()


def _split_timer_key(raw: bytes) -> tuple[bytes, str]:
    (n,) = struct.unpack_from(">I", raw, 8)
    return raw[12:12 + n], raw[12 + n:].decode()


def lower_key(producer: bytes, start: int) -> bytes:
    return b"G" + producer + start.to_bytes(8, "big")


def _opaque_key(bucket: int, record_id: bytes) -> bytes:
    return b"O" + bucket.to_bytes(8, "big") + record_id


# What a checkpointed production holds: one record as a Record proto, its id opaque or
# sequenced (written before deliveries were columns), or a whole outgoing delivery's Columns.
CK_OPAQUE_ROW, CK_SEQUENCED_ROW, CK_COLUMNS = 0, 1, 2


def production_key(seq: int, computation: str, key_range: int, kind: int = CK_COLUMNS) -> bytes:
    """The checkpoint of an outgoing delivery (``kind``: what its value holds), in ``seq`` order."""
    return b"P" + struct.pack(">QIB", seq, key_range, kind) + computation.encode()


@dataclass(frozen=True, slots=True)
class Timer:
    """A pending timer. ``nonce`` tells one setting of a (key, tag, time) from another (the
    id of the record or firing that set it): weak productions of a firing derive their ids
    from it, so a timer set again at the same time fires with new ids, while a retried
    firing (read back from disk) repeats its ids. Equality ignores it."""

    key: bytes
    tag: str
    domain: TimeDomain
    time: int
    nonce: bytes = field(default=b"", compare=False)


class Share:
    """A checkpoint whose records re-routing spread over several shipments: deleted once
    every one of them is let go of."""

    __slots__ = ("ckey", "parts")

    def __init__(self, ckey: bytes, parts: int) -> None:
        self.ckey = ckey
        self.parts = parts


@dataclass(slots=True, eq=False)
class Shipment:
    """Records one commit produced for one tablet: one outgoing delivery, checkpointed as one
    entry (``ckey``: strong productions, and weak ones slow to be acknowledged), queued, sent
    and acknowledged as one. ``producers`` are the sequenced producers among its ids (listed
    in the delivery's orders; other ids are opaque, worker/dedup.py); ``oldest`` its lowest
    timestamp. A shipment re-routing made (worker/sender.py) holds ``shares`` of the
    checkpoints its records came from instead of a checkpoint of its own; ``order`` keeps
    the production order of a weak tablet's records (ids do not say it) for re-routing."""

    computation: str
    key_range: int
    cols: Columns
    producers: tuple[bytes, ...] = ()
    ckey: bytes | None = None
    oldest: int = 0
    shares: tuple[Share, ...] = ()
    order: list[int] | None = None  # a weak tablet's: each record's place in its production order (-1: not known)

    def __post_init__(self) -> None:
        self.oldest = min(self.cols.timestamps)

    def __len__(self) -> int:
        return len(self.cols)

    def let_go(self) -> list[bytes]:
        """The checkpoints to delete now that this shipment is let go of."""
        if not self.shares:
            return [self.ckey] if self.ckey is not None else []
        done = []
        for share in self.shares:
            share.parts -= 1
            if share.parts == 0:
                done.append(share.ckey)
        return done


class CommitState(enum.Enum):
    STARTED = "started"
    COMMITTED = "committed"
    FAILED = "failed"


@dataclass
class Commit:
    """The effects of one batch, written atomically by :meth:`TabletStore.commit`."""

    state: dict[bytes, bytes | None] = field(default_factory=dict)
    opaque_ids: list[bytes] = field(default_factory=list)  # new opaque ids, in opaque_bucket
    opaque_bucket: int = 0
    opaque_expire_below: int | None = None  # opaque ids of older buckets are dropped
    marks: dict[bytes, Mark] = field(default_factory=dict)  # producer marks advanced
    marks_expired: list[bytes] = field(default_factory=list)  # producers silent too long
    lower: dict[bytes, list[Lower]] = field(default_factory=dict)  # producer -> its lower marks now
    timers_set: dict[tuple[bytes, str], Timer] = field(default_factory=dict)
    timers_deleted: dict[tuple[bytes, str], Timer] = field(default_factory=dict)
    productions: list[Shipment] = field(default_factory=list)
    seq: int | None = None
    sink: bytes | None = None
    cells: dict[bytes, bytes | None] = field(default_factory=dict)  # typed state (runtime/state.py)
    cleared: list[bytes] = field(default_factory=list)  # typed-state prefixes range-deleted, before ``cells``
    status: CommitState = CommitState.STARTED


class TabletStore:
    """The RocksDB instance of one tablet, opened by the owner of ``token``."""

    def __init__(self, path: str, token: int, *, sync: bool, must_exist: bool = False,
                 replicated: bool = False) -> None:
        # A tablet that existed is never opened empty (DESIGN.md §5): its copy must be a RocksDB
        # (a CURRENT file; an empty directory or SSTs alone would open as a new, empty DB) that a
        # tablet wrote (its token or a commit recorded; every copy a primary, a follower, a split
        # or a restore makes has one).
        if must_exist and not os.path.isdir(path):
            raise _refuse_empty(path, token, "is missing")
        if must_exist and not is_tablet_copy(path):
            raise _refuse_empty(path, token, "has no RocksDB CURRENT file (an empty or partial directory)")
        self.path = path
        self.db = _open(path, create=not must_exist)
        if must_exist and self.db.get(M_TOKEN) is None and self.db.get(M_INDEX) is None:
            self.db.close()
            raise _refuse_empty(path, token, "holds a database no tablet wrote (no token, no commit recorded)")
        self.replicated = replicated  # commits return their writes, for the followers
        # Deletes to ship with the next commit (appended on the event loop, drained on the
        # tablet's thread: a deque's append and popleft are atomic).
        self._unshipped: collections.deque[tuple[int, bytes, bytes]] = collections.deque()
        recorded = self.db.get(M_TOKEN)
        if recorded is not None and int(recorded) > token:
            self.db.close()
            raise StaleTokenError(
                f"tablet storage {path!r} was last opened under token {int(recorded)}, "
                f"newer than ours ({token}); this owner is stale and must not write"
            )
        self.token = token
        self._sink_parents: dict[bytes, int] = {}  # (uncommitted_sink_tablets)
        self.seq = int(self.db.get(M_SEQ) or b"0")
        self.index = int(self.db.get(M_INDEX) or b"0")  # commits so far (replication numbers them)
        self.sync = sync
        # This opening's term: above every term this copy saw (a promoted follower's copy
        # holds its old primary's), recorded even if it commits nothing (and before any
        # commit of it, in the same log: a commit that survives a crash implies it did).
        self.opened_at = self.index
        self.base_term = int(self.db.get(M_TERM) or b"0")  # the term of commit ``opened_at``
        self.term = next_term(max(self.base_term, int(self.db.get(M_OPENED) or b"0")), token)
        # Called on the tablet's thread with (index, writes) of each replicated commit
        # before it is written here, so its followers get it while it is (worker/tablet.py).
        self.ship: Callable[[int, bytes], None] | None = None
        # Committed typed state (by storage key) and ctx.state (by the user's key), for the
        # tablet's thread only (worker/readcache.py).
        self.cache = ReadCache(self.db.get)
        self.state_cache = ReadCache(self.get_state, read_many=lambda keys: self.db.get(state_keys(keys)))  # type: ignore[arg-type]
        wb = WriteBatch(raw_mode=True)
        wb.put(M_TOKEN, str(token).encode())
        wb.put(M_OPENED, str(self.term).encode())
        write_durably(self.db, wb, sync)

    def term_of(self, index: int) -> int:
        """The term of commit ``index`` (one of this opening's, or the one it opened at)."""
        assert index >= self.opened_at, f"commit {index} is older than this opening ({self.opened_at})"
        return self.term if index > self.opened_at else self.base_term

    # ---------------------------------------------------------------- reads

    def get_state(self, key: bytes) -> bytes | None:
        return self.db.get(state_key(key))

    def get_cell(self, skey: bytes) -> bytes | None:
        return self.db.get(skey)

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Committed entries under ``prefix``, in key order, read as they are needed."""
        return self._scan(prefix)

    def has_opaque(self, record_id: bytes, buckets: Iterable[int]) -> bool:
        return any(self.db.get(_opaque_key(b, record_id)) is not None for b in buckets)

    def _scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        it = self.db.iter()
        it.seek(prefix)
        while it.valid():
            k = it.key()
            if not k.startswith(prefix):
                break
            yield k, it.value()
            it.next()

    def marks(self) -> dict[bytes, Mark]:
        return {k[1:]: Mark.unpack(v) for k, v in self._scan(b"H")}

    def lower_marks(self) -> dict[bytes, list[Lower]]:
        """Lower marks a merge left (worker/dedup.py): producer -> [(start, end, seq)]."""
        out: dict[bytes, list[Lower]] = {}
        for k, v in self._scan(b"G"):
            end, seq = struct.unpack(">QQ", v)
            out.setdefault(k[1:9], []).append(Lower(int.from_bytes(k[9:17], "big"), from_wire_end(end), seq))
        return out

    def opaque_ids(self, from_bucket: int) -> Iterator[tuple[int, bytes]]:
        """(bucket, id) of the opaque ids kept from ``from_bucket`` on."""
        it = self.db.iter()
        it.seek(_opaque_key(max(0, from_bucket), b""))
        while it.valid():
            k = it.key()
            if not k.startswith(b"O"):
                break
            yield int.from_bytes(k[1:9], "big"), k[9:]
            it.next()

    def dedup_bytes(self) -> int:
        """Bytes of dedup data (keys and values of producer marks and opaque ids), as stored
        before RocksDB's compression: what bounded dedup keeps bounded."""
        return sum(len(k) + len(v) for p in (b"H", b"O") for k, v in self._scan(p))

    def productions(self) -> list[Shipment]:
        """The checkpointed outgoing deliveries, in the order they were made."""
        out = []
        for k, v in self._scan(b"P"):
            _, key_range, kind = struct.unpack_from(">QIB", k, 1)
            if kind == CK_COLUMNS:
                c = pb.Columns.FromString(v)
                out.append(Shipment(k[14:].decode(), key_range, Columns.from_proto(c), tuple(c.producers), ckey=k))
            else:
                r = pb.Record.FromString(v)
                cols = Columns([r.key], [r.value], [r.timestamp], ids=[r.id])
                out.append(Shipment(k[14:].decode(), key_range, cols, (r.id[:8],) if kind else (), ckey=k))
        return out

    def timers(self) -> list[Timer]:
        out = []
        for k, v in self._scan(b"K"):
            key, tag = _split_timer_key(k[1:])
            domain, t = struct.unpack_from(">BQ", v)
            out.append(Timer(key, tag, TimeDomain(domain), t - _TIME_OFFSET, v[9:]))
        return out

    def sink_meta(self) -> bytes | None:
        return self.db.get(M_SINK)

    def absorbed_sink_metas(self) -> list[bytes]:
        """The sink metas of the ranges merged into this one (worker/reshard.py)."""
        return [v for _, v in self._scan(M_SINK_ABSORBED)]

    def uncommitted_sink_tablets(self) -> dict[str, int]:
        """The tablets this range replaced (split or merged) that never committed a sink meta,
        and the token each last held: their output, if any, is uncommitted and this range's to
        take back (worker/reshard.py); forgotten once this range commits a sink meta."""
        self._sink_parents = {k: int(v or b"0") for k, v in self._scan(M_SINK_UNCOMMITTED)}
        return {k[len(M_SINK_UNCOMMITTED):].decode(): v for k, v in self._sink_parents.items()}

    # --------------------------------------------------------------- writes

    def commit(self, c: Commit) -> bytes | None:
        """Write every effect of ``c`` in one ``WriteBatch`` (fsynced if configured). A
        replicated store returns the writes, encoded, for its followers (this commit's
        number is then ``self.index``), and hands them to :attr:`ship` before its own write:
        its followers take the commit while it is written and fsynced here."""
        assert c.status is CommitState.STARTED, f"commit is {c.status.value}"
        try:
            wb = Writes(self.replicated)
            for skey, value in zip(state_keys(c.state), c.state.values(), strict=True):
                if value is None:
                    wb.delete(skey)
                else:
                    wb.put(skey, value)
            for prefix in c.cleared:
                wb.delete_range(prefix, _after(prefix))
            wb.cells(c.cells)
            for rid in c.opaque_ids:
                wb.put(_opaque_key(c.opaque_bucket, rid), b"")
            if c.opaque_expire_below is not None:
                wb.delete_range(b"O", _opaque_key(max(0, c.opaque_expire_below), b""))
            for producer, mark in c.marks.items():
                wb.put(b"H" + producer, mark.pack())
            for producer in c.marks_expired:
                wb.delete(b"H" + producer)
            for producer, lows in c.lower.items():
                wb.delete_range(lower_key(producer, 0), b"G" + producer + b"\xff" * 9)
                for low in lows:
                    wb.put(lower_key(producer, low.start), struct.pack(">QQ", wire_end(low.end), low.seq))
            for (key, tag), t in c.timers_deleted.items():
                tk = _timer_key(key, tag)
                wb.delete(b"K" + tk)
                wb.delete(b"T" + struct.pack(">BQ", t.domain, t.time + _TIME_OFFSET) + tk)
            for (key, tag), t in c.timers_set.items():
                tk = _timer_key(key, tag)
                packed = struct.pack(">BQ", t.domain, t.time + _TIME_OFFSET)
                wb.put(b"K" + tk, packed + t.nonce)
                wb.put(b"T" + packed + tk, b"")
            for p in c.productions:
                if p.ckey is not None:
                    wb.put(p.ckey, p.cols.checkpoint(p.producers))
            if c.seq is not None:
                assert c.seq >= self.seq, f"producer sequence moved backwards: {c.seq} < {self.seq}"
                wb.put(M_SEQ, str(c.seq).encode())
            if c.sink is not None:
                wb.put(M_SINK, c.sink)
                for k in self._sink_parents:  # taken back at the open: forgotten with the first meta
                    wb.delete(k)
                self._sink_parents = {}
            wb.put(M_INDEX, str(self.index + 1).encode())
            wb.put(M_TERM, str(self.term).encode())
            ops = None if wb.ops is None else self._ops(wb.ops)
            if ops is not None and self.ship is not None:
                self.ship(self.index + 1, ops)
            write_durably(self.db, wb.wb, self.sync)
        except BaseException:
            c.status = CommitState.FAILED
            self.cache.forget()
            self.state_cache.forget()
            raise
        self.state_cache.committed(c.state)
        self.cache.committed(c.cells, bool(c.cleared))
        self.index += 1
        if c.seq is not None:
            self.seq = c.seq
        c.status = CommitState.COMMITTED
        return ops

    def _ops(self, ops: list[tuple[int, bytes, bytes]]) -> bytes:
        """The followers' writes of a commit: the deletes not shipped yet, then its own."""
        shipped = []
        while self._unshipped:
            shipped.append(self._unshipped.popleft())
        return encode_ops(shipped + ops)

    def delete_productions(self, ckeys: list[bytes]) -> None:
        """Forget checkpointed productions their receiver acknowledged (no fsync needed:
        if lost, they are re-sent and the receiver drops them as duplicates)."""
        wb = WriteBatch(raw_mode=True)
        for k in ckeys:
            wb.delete(k)
        write_durably(self.db, wb, False)
        if self.replicated:  # the followers forget them with the next commit
            self._unshipped.extend((DELETE, k, b"") for k in ckeys)

    def checkpoint(self, path: str) -> int:
        """A RocksDB checkpoint of this copy in ``path`` (hard links where it can); returns
        the index of the last commit it holds."""
        Checkpoint(self.db).create_checkpoint(path)
        return self.index

    def close(self) -> None:
        self.db.close()


def next_term(seen: int, token: int) -> int:
    """The term of an opening under ``token`` of a copy whose highest term so far is ``seen``:
    higher than it (the high bits count openings), and naming the token (the low bits), so
    that the openings of two primaries never share a term."""
    return (((seen >> TERM_TOKEN_BITS) + 1) << TERM_TOKEN_BITS) | (token & ((1 << TERM_TOKEN_BITS) - 1))
