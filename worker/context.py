"""The :class:`~runtime.Context` user code sees, over one batch's uncommitted effects."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from runtime.computation import Context, State, TimeDomain
from runtime.errors import MillstreamError, UsageError
from runtime.record import MAX_KEY_BYTES, MAX_VALUE_BYTES, Timestamp, check_time
from runtime.state import TTL_TAG, bind
from worker.pending import Pending, merged
from worker.storage import Timer

MAX_TAG_BYTES = 1024
CLEAR_POINTS = 1024  # a typed state's clear of more entries is one range delete ...
BATCH_CLEAR_POINTS = 1 << 16  # ... and so is every clear once a batch deleted this many entries one by one


def _check_size(data: bytes, limit: int, what: str) -> None:
    if len(data) > limit:
        raise UsageError(f"{what} of {len(data):,} bytes is over the limit of {limit:,} bytes; "
                         "store large objects elsewhere and pass a reference")


def _check_tag(tag: str) -> None:
    """A tag the commit can store: checked here, where the error reaches the dead letters,
    not at commit time, where it would fail the whole batch again and again."""
    if not isinstance(tag, str):
        raise UsageError(f"timer tag must be str, not {type(tag).__name__}")
    try:
        encoded = tag.encode()
    except UnicodeEncodeError as e:  # e.g. a lone surrogate from surrogateescape decoding
        raise UsageError(f"timer tag {tag!r} cannot be stored as UTF-8 ({e.reason}); use text "
                         "without lone surrogates, e.g. decode bytes with errors='replace'") from None
    _check_size(encoded, MAX_TAG_BYTES, "timer tag")
    if tag.startswith(TTL_TAG):
        raise UsageError(f"timer tag {tag!r}: tags starting with {TTL_TAG!r} are the runtime's own (typed "
                         "state's TTL, which would take the timer and never call process_timer); use another")


Produced = tuple[str, bytes, bytes, int]  # what ctx.produce() was given: stream, key, value, ts


class Effects:
    """What one call of user code did to timers and typed state; merged into the batch only if
    it returned. (Its ``ctx.state`` writes and productions go straight into the batch, undone
    if it raised: :meth:`KeyContext.undo`.) Made only for a call that uses them."""

    __slots__ = ("timers_set", "timers_deleted", "cells", "pending", "cleared")

    def __init__(self) -> None:
        self.cells: dict[bytes, bytes | None] = {}  # typed state (runtime/state.py): writes, None deletes
        self.pending: Pending | None = None          # ... indexed for scans, once one scans
        self.cleared: list[bytes] = []              # prefixes cleared by a range delete, before ``cells``
        self.timers_set: dict[tuple[bytes, str], Timer] = {}
        self.timers_deleted: set[tuple[bytes, str]] = set()


_UNSAVED = object()


class _Rebound(list):  # type: ignore[type-arg]
    """A call's ``_saved`` once it moved to another key having written one (:meth:`KeyContext.rebind`):
    ``(key, (had, old))`` of each key it left, and ``current``, the key it works on now (as
    ``_saved`` is for a call of one key), so :meth:`KeyContext.undo` takes back every key's write."""

    __slots__ = ("current",)

    def __init__(self) -> None:
        super().__init__()
        self.current: Any = _UNSAVED


class _KeyState(State):
    __slots__ = ("_ctx",)

    def __init__(self, ctx: Any) -> None:  # a KeyContext (or, for worker/_loop.c, its core)
        self._ctx = ctx

    def get(self) -> bytes | None:
        ctx = self._ctx
        ctx.reads += 1
        key = ctx._key
        writes = ctx.writes
        if key in writes:
            return writes[key]
        return ctx.read_state(key)

    def set(self, value: bytes) -> None:
        if type(value) is not bytes:  # the common case first: no call
            if not isinstance(value, (bytearray, memoryview)):
                raise UsageError(f"state must be bytes, not {type(value).__name__}; encode it first")
            value = bytes(value)
        if len(value) > MAX_VALUE_BYTES:
            _check_size(value, MAX_VALUE_BYTES, "state value")
        ctx = self._ctx
        writes = ctx.writes
        key = ctx._key
        saved = ctx._saved
        if saved is _UNSAVED:  # KeyContext.write_state, inline: the common path
            ctx._saved = (key in writes, writes.get(key))
        elif type(saved) is _Rebound and saved.current is _UNSAVED:
            saved.current = (key in writes, writes.get(key))
        writes[key] = value

    def clear(self) -> None:
        self._ctx.write_state(None)


class _CoreRef:
    """What a call of user code is bound by (its key, timestamp, Effects and undo mark), the
    batch's ``ctx.state`` writes and productions, and the methods user code calls per record
    (``ctx.state``, ``ctx.produce``): in Python, the reference. ``worker/_loop.c``'s
    ``ContextCore`` is the same in C (its record loop binds a record with four pointer
    writes; ``get``, ``set`` and ``produce`` run in C on their common path and come back
    here for the rest); :data:`COMPILED` says which one :class:`KeyContext` is over."""

    def __init__(self) -> None:
        self._key = b""
        self._timestamp = 0
        self.eff: Effects | None = None              # this call's timers and typed state
        self._saved: Any = _UNSAVED                  # this call's key's state before it wrote
        self.writes: dict[bytes, bytes | None] = {}  # the batch's ctx.state writes
        self.out: list[Produced] = []                # the batch's productions, in order
        self.committed: dict[bytes, bytes | None] | None = None  # committed ctx.state held in memory
        self.read_state: Callable[[bytes], bytes | None] = lambda key: None  # ... and all of it
        self.outputs: frozenset[str] = frozenset()
        self.reads = 0  # ctx.state.get() calls so far (worker/batch.py's prefetch counts them)
        self._state = _KeyState(self)

    @property
    def state(self) -> State:
        return self._state

    def rebind(self, key: bytes, timestamp: int) -> None:
        """Work on ``key`` at ``timestamp`` from here on, within the same call: what the call
        did so far stays (built-in operators of a flow touch several keys in one call). Moved
        back in time, it makes the call's Effects, so the batch looks at what the call
        produced for a watermark hold (as :meth:`produce` does for an earlier timestamp).
        (``ContextCore.rebind`` does the common case in C: nothing saved, not back in time.)"""
        if timestamp < self._timestamp and self.eff is None:
            self.eff = Effects()
        saved = self._saved
        if saved is not _UNSAVED:  # the key it leaves was written: its state before is kept for undo
            if type(saved) is not _Rebound:
                rebound = self._saved = _Rebound()
                rebound.append((self._key, saved))
            elif saved.current is not _UNSAVED:
                saved.append((self._key, saved.current))
                saved.current = _UNSAVED
        self._key = key
        self._timestamp = timestamp

    def produce(self, stream: str, value: bytes, *, key: bytes | None = None,
                timestamp: Timestamp | None = None) -> None:
        if stream not in self.outputs:
            raise MillstreamError(
                f"produce() to unknown stream {stream!r}: this computation's outputs are "
                f"{sorted(self.outputs)}; add it to outputs= in add_computation"
            )
        if type(value) is not bytes:  # the common case first: no call
            if not isinstance(value, (bytearray, memoryview)):
                raise UsageError(f"produce() value must be bytes, not {type(value).__name__}")
            value = bytes(value)
        if key is None:
            key = self._key
        else:
            if not isinstance(key, (bytes, bytearray)):
                raise UsageError(f"produce() key must be bytes, not {type(key).__name__}")
            _check_size(key, MAX_KEY_BYTES, "produce() key")
            key = bytes(key)
        if timestamp is None:
            ts = self._timestamp
        else:
            ts = check_time(timestamp, "produce() timestamp")
            if ts < self._timestamp and self.eff is None:
                self.eff = Effects()  # so the batch looks at this call's productions: the hold
        if len(value) > MAX_VALUE_BYTES:
            _check_size(value, MAX_VALUE_BYTES, "produce() value")
        self.out.append((stream, key, value, ts))


_Core: Any = _CoreRef
if os.environ.get("MILLSTREAM_PURE_PYTHON", "") in ("", "0"):  # as worker/recordloop.py reads it
    try:
        import worker._loop as _compiled  # type: ignore[import-not-found]
        _compiled.init_context(_UNSAVED, _KeyState.get, _KeyState.set, _KeyState.clear, _CoreRef.produce,
                               MAX_VALUE_BYTES)
        _compiled.init_rebind(_CoreRef.rebind)
        State.register(_compiled.StateHandle)
        _Core = _compiled.ContextCore
    except (ImportError, AttributeError):  # not built, or built from an older _loop.c
        pass

COMPILED: bool = _Core is not _CoreRef
"""Whether :class:`KeyContext` is over the compiled core."""


if TYPE_CHECKING:
    _Base = _CoreRef
else:
    _Base = _Core


class KeyContext(_Base, Context):
    """A context reused across the records of a batch (rebound per record).

    ``ctx.state`` writes go into the batch's ``writes`` and productions onto its ``out``
    list as they are made; :meth:`begin` marks where a call starts and :meth:`undo` takes
    back what a call that raised did. Timers and typed state go into an :class:`Effects` of
    the call, made on first use (``effects``)."""

    def __init__(
        self,
        outputs: frozenset[str],
        read_state: Callable[[bytes], bytes | None],
        watermark: Callable[[], int],
        now_us: Callable[[], int] = lambda: time.time_ns() // 1000,
        read_cell: Callable[[bytes], bytes | None] = lambda skey: None,
        scan_cells: Callable[[bytes], Iterator[tuple[bytes, bytes]]] = lambda prefix: iter(()),
        pending_timer: Callable[[tuple[bytes, str]], Timer | None] = lambda k: None,
        committed: dict[bytes, bytes | None] | None = None,
    ) -> None:
        super().__init__()
        self.outputs = outputs
        # Committed state: ``read_state`` reads any key's; ``committed``, where given, holds
        # some keys' (a dict the store keeps: worker/readcache.py), read first (the batch's
        # own writes are ``writes``).
        self.read_state = read_state
        self.committed = committed
        self.read_cell = read_cell    # typed state committed or written earlier in the batch
        self.scan_cells = scan_cells
        self.pending_timer = pending_timer  # a (key, tag)'s timer, as of the batch so far
        self._watermark = watermark
        self._now_us = now_us
        self.cleared_points = 0                      # entries the batch's clears deleted one by one
        self.expired_points = 0                      # ... and its TTL timers (a budget of their own)
        self.timer_domain = TimeDomain.EVENT_TIME    # the clock of the timer firing (worker/batch.py)

    def start_batch(self, writes: dict[bytes, bytes | None]) -> None:
        self.writes = writes
        self.out = []
        self.cleared_points = self.expired_points = 0

    def begin(self, key: bytes, timestamp: int) -> None:
        """A call of user code for ``key`` at ``timestamp`` starts."""
        self._key = key
        self._timestamp = timestamp
        self.eff = None
        self._saved = _UNSAVED

    def undo(self, produced: int) -> None:
        """Take back what the call did (it raised): its state writes (of every key it was
        rebound to), its productions from index ``produced`` of ``out`` on, its timers and
        typed state."""
        saved = self._saved
        if saved is not _UNSAVED:
            if type(saved) is _Rebound:
                # The latest first: a key written, left and written again gets its first value back.
                kept = [*saved, (self._key, saved.current)]
            else:
                kept = [(self._key, saved)]
            writes = self.writes
            for key, was in reversed(kept):
                if was is _UNSAVED:
                    continue
                had, old = was
                if had:
                    writes[key] = old
                else:
                    writes.pop(key, None)
            self._saved = _UNSAVED
        del self.out[produced:]
        self.eff = None

    def write_state(self, value: bytes | None) -> None:
        writes = self.writes
        key = self._key
        saved = self._saved
        if saved is _UNSAVED:
            self._saved = (key in writes, writes.get(key))
        elif type(saved) is _Rebound and saved.current is _UNSAVED:
            saved.current = (key in writes, writes.get(key))
        writes[key] = value

    @property
    def effects(self) -> Effects:
        eff = self.eff
        if eff is None:
            eff = self.eff = Effects()
        return eff

    @property
    def key(self) -> bytes:
        return self._key

    @property
    def low_watermark(self) -> int:
        return self._watermark()

    _tablet = ""            # set by bind_tablet once the tablet opens
    _sequencer_token = 0

    def bind_tablet(self, tablet: str, token: int) -> None:
        """The tablet this context runs user code for, and its sequencer token."""
        self._tablet = tablet
        self._sequencer_token = token

    @property
    def tablet(self) -> str:
        return self._tablet

    @property
    def sequencer_token(self) -> int:
        return self._sequencer_token

    def set_timer(self, tag: str, time: Timestamp, domain: TimeDomain = TimeDomain.EVENT_TIME) -> None:
        _check_tag(tag)
        self._set_timer(tag, check_time(time, "timer time"), domain)

    def _set_timer(self, tag: str, time: int, domain: TimeDomain) -> None:
        """A timer set: user code's (checked), or one of the runtime's own (a reserved tag)."""
        t = Timer(self._key, tag, TimeDomain(domain), time)
        self.effects.timers_set[(self._key, tag)] = t
        self.effects.timers_deleted.discard((self._key, tag))

    def delete_timer(self, tag: str) -> None:
        _check_tag(tag)
        self.effects.timers_set.pop((self._key, tag), None)
        self.effects.timers_deleted.add((self._key, tag))

    def now(self) -> int:
        return self._now_us()

    # ---------------------------------------------------- typed state (runtime/state.py)

    def state_of(self, spec: object) -> Any:
        return bind(spec, self)

    def call_id(self) -> object:
        eff = self.eff  # a new Effects per call of user code (as self.effects, a call less: per state_of and get)
        if eff is None:
            eff = self.eff = Effects()
        return eff

    def write_time(self) -> int:
        return self._timestamp

    def cell_get(self, skey: bytes) -> bytes | None:
        eff = self.effects
        if skey in eff.cells:
            return eff.cells[skey]
        if eff.cleared and skey.startswith(tuple(eff.cleared)):
            return None
        return self.read_cell(skey)

    def _pending(self) -> Pending:
        eff = self.effects
        if eff.pending is None:
            eff.pending = Pending(eff.cells)
        return eff.pending

    def cell_pending(self, prefix: bytes) -> dict[bytes, bytes | None]:
        """The call's writes under ``prefix`` so far (None deletes)."""
        return self._pending().under(prefix)

    def cell_scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        return merged(self.scan_cells(prefix), self._pending().under(prefix), self.effects.cleared, prefix)

    def cell_put(self, skey: bytes, stored: bytes) -> None:
        _check_size(stored, MAX_VALUE_BYTES, "state value")
        self.effects.cells[skey] = stored

    def cell_delete(self, skey: bytes) -> None:
        self.effects.cells[skey] = None

    def cell_write(self, writes: dict[bytes, bytes | None]) -> None:
        """:meth:`cell_put` (None: :meth:`cell_delete`) of each of ``writes``, in one merge: an
        operator's writes of a batch (a window's every (key, window) it changed) cost one call,
        not one per cell. Refused whole if one is over the limit."""
        if not writes:
            return
        if max(map(len, filter(None, writes.values())), default=0) > MAX_VALUE_BYTES:
            for stored in writes.values():
                if stored is not None:
                    _check_size(stored, MAX_VALUE_BYTES, "state value")
        self.effects.cells.update(writes)

    def cell_clear(self, prefix: bytes) -> None:
        """Each entry under ``prefix`` deleted, one by one: a range delete leaves RocksDB a
        range tombstone that every iterator made afterwards pays for, until a compaction (a
        join firing thousands of windows, each cleared, made its own scans quadratic). Past
        :data:`CLEAR_POINTS` entries, or :data:`BATCH_CLEAR_POINTS` in the batch, one range delete
        (a commit of a million point deletes would not fit a replication frame), applied
        before the batch's writes."""
        eff = self.effects
        limit = min(CLEAR_POINTS, BATCH_CLEAR_POINTS - self.cleared_points)
        keys = [skey for skey, _ in itertools.islice(self.cell_scan(prefix), limit + 1)]
        if len(keys) > limit:
            keys = list(self._pending().under(prefix))
            eff.cleared.append(prefix)
        else:
            self.cleared_points += len(keys)
        cells = eff.cells
        for skey in keys:
            cells[skey] = None

    def expire_room(self) -> int:
        """How many expired entries the batch's TTL timers may still delete: a budget of their
        own (:data:`BATCH_CLEAR_POINTS`), so clears that spend theirs cannot starve them."""
        return max(0, BATCH_CLEAR_POINTS - self.expired_points)

    def delete_expired(self, skeys: list[bytes]) -> bool:
        """Delete ``skeys`` in order, one by one, as many as :meth:`expire_room` allows; False
        if some are left."""
        room = self.expire_room()
        cells = self.effects.cells
        for skey in skeys[:room]:
            cells[skey] = None
        self.expired_points += min(room, len(skeys))
        return len(skeys) <= room

    def expire_at(self, name: str, time: int, domain: TimeDomain = TimeDomain.EVENT_TIME) -> None:
        """The runtime's timer that deletes this key's expired entries of state ``name``: at
        the earliest expiry written, never moved later (each write moved it to its own expiry,
        so a key written more often than its TTL kept it ahead of the watermark for ever, and
        every entry that expired stayed stored). Its firing re-arms it at the next expiry. One
        of the other clock (the state's ``ttl_domain`` changed by an update) is replaced: its
        time means nothing in this one."""
        tag = TTL_TAG + name
        k = (self._key, tag)
        eff = self.effects
        t = eff.timers_set.get(k)
        if t is None and k not in eff.timers_deleted:
            t = self.pending_timer(k)
        if t is None or t.domain != domain or time < t.time:
            self._set_timer(tag, time, domain)
