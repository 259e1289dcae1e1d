"""Typed, named per-key state (DESIGN.md §3a): ``ValueState``, ``ListState``, ``MapState``.

Declared on the computation class, bound to the current key with ``ctx.state_of(spec)``::

    class Collector(Computation):
        seen = ListState("seen", codecs.INT)
        total = ValueState("total", codecs.INT, default=0, ttl=3600 * 1_000_000)

        def process_record(self, ctx, record):
            ctx.state_of(self.seen).append(int(record.value))     # O(1), not a rewrite
            t = ctx.state_of(self.total); t.set(t.get() + 1)

Every list element and map entry is its own RocksDB entry, so ``append`` and ``put`` cost the
same however large the state is, and iteration streams. Writes join the batch's effects and
commit atomically with it, like ``ctx.state``; they are replicated, survive failover, and follow
their key through splits and merges (storage keys start with the key's hash).

**Storage layout** (one tablet's RocksDB): a *cell* is ``Y <hash:8> <len(key):4> <key>
<len(name):1> <name>``; under it ``v`` holds a value, ``n`` a list's next index (8 bytes),
``e <index:8>`` a list element, ``m <encoded map key>`` a map entry. Every stored value starts
with its expiry (8 bytes, µs of event time, or of the wall clock for a wall-clock TTL; the
largest int64 for none).

**TTL** (event time, the default): a write with ``ttl`` expires at the timestamp of the record
(or timer) being processed plus ``ttl``. Once the computation's low watermark reaches that time
it is never read again, and the runtime deletes it with an internal timer of the key.

``ttl_domain=TimeDomain.WALL_TIME``: a write expires ``ttl`` after it was made by the wall clock
(``ctx.now()``; Flink's state TTL, Kafka Streams' retention), whatever the records' times: once
the clock reaches it, it is never read again, and an internal wall-time timer deletes it. For
state that must go some time after it was last written, even with no watermark (an input that
never advances it) or far behind one (a backfill of old data). Changing a state's
``ttl_domain`` in an update keeps its entries with the expiries they were written with,
judged by the new clock (an event time far behind the clock reads as expired at once).
"""

from __future__ import annotations

import datetime
import functools
import json
import struct
import time
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from runtime.codecs import Codec, check_codec
from runtime.errors import ConfigError, MillstreamError, UsageError
from runtime.keyspace import hash_prefix
from runtime.record import END_OF_TIME, TimeDomain

TYPED = b"Y"
VALUE, COUNT, ELEMENT, ENTRY = b"v", b"n", b"e", b"m"
NEVER = END_OF_TIME
TTL_TAG = "millstream.ttl/"  # internal timers: "millstream.ttl/<state name>"
TTL_REARM_US = 1_000_000     # ... come back at the next expiry, but not before this much later
_EXPIRY = struct.Struct(">q")
_INDEX = struct.Struct(">Q")
NEVER_EXPIRES = _EXPIRY.pack(NEVER)  # what a stored value that never expires starts with (kept())



@functools.lru_cache(maxsize=1 << 16)
def cell(key: bytes, name: str) -> bytes:
    """The storage prefix of one key's state ``name`` (memoized: a hot key's state is touched
    by every batch, and its prefix costs a BLAKE2b)."""
    n = name.encode()
    return TYPED + hash_prefix(key) + struct.pack(">I", len(key)) + key + bytes([len(n)]) + n


def split_cell(skey: bytes) -> tuple[bytes, str, bytes]:
    """``(key, name, rest)`` of a typed-state storage key."""
    klen = struct.unpack_from(">I", skey, 9)[0]
    key = skey[13:13 + klen]
    nlen = skey[13 + klen]
    name = skey[14 + klen:14 + klen + nlen].decode()
    return key, name, skey[14 + klen + nlen:]


def expiry_of(stored: bytes) -> int:
    return int(_EXPIRY.unpack_from(stored)[0])


def ttl_rearm(time: int, nxt: int, watermark: int, domain: TimeDomain = TimeDomain.EVENT_TIME) -> int:
    """When a key's TTL timer that fired at ``time`` (deleting what expired by then) comes back,
    its next expiry being ``nxt``: not sooner than :data:`TTL_REARM_US` later, nor than half way
    to the watermark, so a key written on and on is not rescanned at every watermark tick, and
    one far behind the watermark (a jump, a drain) catches up in a few firings, not one per
    expiry. Each firing deletes only what expired by its own time, and nothing past a timer of
    its key that its batch set earlier (worker/batch.py): timers fire in time order, so every
    timer of the key due earlier and set before the firing reads its key's state first. A
    wall-time TTL's timer: at the next expiry, not sooner than :data:`TTL_REARM_US` later."""
    if domain == TimeDomain.WALL_TIME:
        return min(END_OF_TIME, max(nxt, time + TTL_REARM_US))
    return min(END_OF_TIME, max(nxt, time + TTL_REARM_US, time + (watermark - time) // 2))


def is_expired(stored: bytes, now: int) -> bool:
    """Whether a stored value expired by ``now``; one stored without a TTL never does (its
    expiry, NEVER, is also the end of time: it outlives even a finished input)."""
    e = expiry_of(stored)
    return e != NEVER and e <= now


def payload(stored: bytes) -> bytes:
    return stored[_EXPIRY.size:]


def kept(data: bytes) -> bytes:
    """``data`` as a stored value that never expires (what built-in operators store)."""
    return NEVER_EXPIRES + data


def _ttl_us(ttl: int | float | datetime.timedelta | None, name: str, domain: object) -> int | None:
    if not isinstance(domain, TimeDomain) and domain not in (0, 1):
        raise MillstreamError(f"state {name!r}: ttl_domain={domain!r} must be TimeDomain.EVENT_TIME (the records' "
                              "times) or TimeDomain.WALL_TIME (the clock's)")
    if ttl is None:
        return None
    us = int(ttl.total_seconds() * 1_000_000) if isinstance(ttl, datetime.timedelta) else ttl
    if isinstance(us, bool) or not isinstance(us, int) or us <= 0:
        clock = "event time" if domain == TimeDomain.EVENT_TIME else "wall-clock time"
        raise MillstreamError(f"state {name!r}: ttl={ttl!r} must be a positive int of microseconds of {clock} "
                              "(or a timedelta)")
    return us


class _Spec:
    kind = ""

    def __init__(self, name: str, ttl: int | float | datetime.timedelta | None,
                 ttl_domain: TimeDomain = TimeDomain.EVENT_TIME) -> None:
        if not isinstance(name, str) or not name or len(name.encode()) > 200 or not name.isprintable():
            raise MillstreamError(f"state name {name!r} must be printable text of 1-200 bytes")
        self.name = name
        self.ttl = _ttl_us(ttl, name, ttl_domain)
        self.ttl_domain = TimeDomain(ttl_domain)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def __set_name__(self, owner: type, attr: str) -> None:
        """Declared on a class: another spec of it (or of a base) with this state name would
        share its storage, each reading the other's bytes with its own codec; refused."""
        for klass in owner.__mro__:
            for other_attr, other in vars(klass).items():
                if other is not self and other_attr != attr and isinstance(other, _Spec) and other.name == self.name:
                    raise UsageError(f"{owner.__name__}.{attr} and {klass.__name__}.{other_attr} both declare typed "
                                     f"state {self.name!r}; they would share its storage: give each its own name")


class ValueState(_Spec):
    """One value per key: ``get()``, ``set(v)``, ``clear()``."""

    kind = "value"

    def __init__(self, name: str, codec: Codec, *, default: Any = None,
                 ttl: int | float | datetime.timedelta | None = None,
                 ttl_domain: TimeDomain = TimeDomain.EVENT_TIME) -> None:
        super().__init__(name, ttl, ttl_domain)
        self.codec = check_codec(codec, f"ValueState {name!r}")
        self.default = default


class ListState(_Spec):
    """A list per key: ``append(v)`` and ``extend(vs)`` in O(1) each, iteration, ``clear()``."""

    kind = "list"

    def __init__(self, name: str, codec: Codec, *, ttl: int | float | datetime.timedelta | None = None,
                 ttl_domain: TimeDomain = TimeDomain.EVENT_TIME) -> None:
        super().__init__(name, ttl, ttl_domain)
        self.codec = check_codec(codec, f"ListState {name!r}")


class MapState(_Spec):
    """A map per key: ``get``, ``put``, ``remove``, ``contains``, ``items``, ``keys``,
    ``values``, ``clear``; one storage entry per map entry."""

    kind = "map"

    def __init__(self, name: str, key_codec: Codec, value_codec: Codec, *,
                 ttl: int | float | datetime.timedelta | None = None,
                 ttl_domain: TimeDomain = TimeDomain.EVENT_TIME) -> None:
        super().__init__(name, ttl, ttl_domain)
        self.key_codec = check_codec(key_codec, f"MapState {name!r} keys")
        self.codec = check_codec(value_codec, f"MapState {name!r} values")


StateSpec = ValueState | ListState | MapState


class Cells(Protocol):
    """What a handle needs of the context that runs user code (worker/context.py)."""

    @property
    def key(self) -> bytes: ...

    @property
    def low_watermark(self) -> int: ...

    def call_id(self) -> object: ...

    def write_time(self) -> int: ...

    def now(self) -> int: ...

    def cell_get(self, skey: bytes) -> bytes | None: ...

    def cell_scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]: ...

    def cell_put(self, skey: bytes, stored: bytes) -> None: ...

    def cell_delete(self, skey: bytes) -> None: ...

    def cell_write(self, writes: dict[bytes, bytes | None]) -> None: ...

    def cell_clear(self, prefix: bytes) -> None: ...

    def expire_at(self, name: str, time: int, domain: TimeDomain = TimeDomain.EVENT_TIME) -> None: ...


class _Handle:
    """Bound to one key for the duration of one call of user code."""

    __slots__ = ("_spec", "_cells", "_call", "_key", "_cell")

    def __init__(self, spec: StateSpec, cells: Cells) -> None:
        self._spec = spec
        self._cells = cells
        self._call = cells.call_id()
        self._key = cells.key
        self._cell = cell(cells.key, spec.name)

    def _check(self) -> Cells:
        cells = self._cells
        if cells.call_id() is not self._call:
            raise MillstreamError(f"state handle {self._spec.name!r} used outside the call that obtained it; "
                                  "call ctx.state_of(...) again in each process_record / process_timer")
        if cells.key != self._key:  # a flow's step runs a batch of keys in one call of the stage
            raise MillstreamError(f"state handle {self._spec.name!r} obtained for key {self._key!r:.40} used for key "
                                  f"{cells.key!r:.40}; call ctx.state_of(...) again for each record")
        return self._cells

    def _live(self, stored: bytes | None) -> bytes | None:
        if stored is None:
            return None
        if stored.startswith(NEVER_EXPIRES):  # no TTL: no clock to read
            return stored[_EXPIRY.size:]
        if self._spec.ttl_domain == TimeDomain.WALL_TIME:
            if is_expired(stored, self._cells.now()):
                return None
        # Judged at the call's own time when the watermark is past it (a timer firing late,
        # after the input watermark jumped): state live at the timer's time reads as live.
        elif is_expired(stored, min(self._cells.low_watermark, self._cells.write_time())):
            return None
        return payload(stored)

    def _stored(self, data: bytes) -> bytes:
        spec = self._spec
        ttl = spec.ttl
        if ttl is None:
            return _EXPIRY.pack(NEVER) + data
        domain = spec.ttl_domain
        expiry = min(NEVER - 1, (self._cells.now() if domain == TimeDomain.WALL_TIME else self._cells.write_time())
                     + ttl)
        self._cells.expire_at(spec.name, expiry, domain)
        return _EXPIRY.pack(expiry) + data


class ValueHandle(_Handle):
    __slots__ = ()

    def get(self) -> Any:
        data = self._live(self._check().cell_get(self._cell + VALUE))
        return getattr(self._spec, "default", None) if data is None else self._spec.codec.decode(data)

    def set(self, value: Any) -> None:
        self._check().cell_put(self._cell + VALUE, self._stored(self._spec.codec.encode(value)))

    def clear(self) -> None:
        self._check().cell_delete(self._cell + VALUE)


class ListHandle(_Handle):
    __slots__ = ()

    def append(self, value: Any) -> None:
        cells = self._check()
        stored = cells.cell_get(self._cell + COUNT)
        n = _INDEX.unpack(stored)[0] if stored is not None else 0
        cells.cell_put(self._cell + ELEMENT + _INDEX.pack(n), self._stored(self._spec.codec.encode(value)))
        cells.cell_put(self._cell + COUNT, _INDEX.pack(n + 1))

    def extend(self, values: Iterable[Any]) -> None:
        for v in values:
            self.append(v)

    def __iter__(self) -> Iterator[Any]:
        decode = self._spec.codec.decode
        for _, stored in self._check().cell_scan(self._cell + ELEMENT):
            data = self._live(stored)
            if data is not None:
                yield decode(data)

    def clear(self) -> None:
        self._check().cell_clear(self._cell)


class MapHandle(_Handle):
    __slots__ = ()

    def _k(self, k: Any) -> bytes:
        return self._cell + ENTRY + self._spec.key_codec.encode(k)  # type: ignore[union-attr]

    def get(self, k: Any, default: Any = None) -> Any:
        data = self._live(self._check().cell_get(self._k(k)))
        return default if data is None else self._spec.codec.decode(data)

    def put(self, k: Any, value: Any) -> None:
        self._check().cell_put(self._k(k), self._stored(self._spec.codec.encode(value)))

    def remove(self, k: Any) -> None:
        self._check().cell_delete(self._k(k))

    def contains(self, k: Any) -> bool:
        return self._live(self._check().cell_get(self._k(k))) is not None

    def items(self) -> Iterator[tuple[Any, Any]]:
        prefix = self._cell + ENTRY
        decode_key, decode = self._spec.key_codec.decode, self._spec.codec.decode  # type: ignore[union-attr]
        for skey, stored in self._check().cell_scan(prefix):
            data = self._live(stored)
            if data is not None:
                yield decode_key(skey[len(prefix):]), decode(data)

    def keys(self) -> Iterator[Any]:
        return (k for k, _ in self.items())

    def values(self) -> Iterator[Any]:
        return (v for _, v in self.items())

    def clear(self) -> None:
        self._check().cell_clear(self._cell)


def bind(spec: object, cells: Cells) -> ValueHandle | ListHandle | MapHandle:
    """The handle of ``spec`` for the key being processed (``ctx.state_of``)."""
    handle = _HANDLES.get(type(spec))
    if handle is not None:  # (a spec of a subclass: below)
        return handle(spec, cells)  # type: ignore[arg-type]
    if isinstance(spec, ValueState):
        return ValueHandle(spec, cells)
    if isinstance(spec, ListState):
        return ListHandle(spec, cells)
    if isinstance(spec, MapState):
        return MapHandle(spec, cells)
    raise UsageError(f"ctx.state_of() takes a ValueState, ListState or MapState declared on the computation "
                    f"class, not {type(spec).__name__}")


_HANDLES: dict[type, type[ValueHandle | ListHandle | MapHandle]] = {
    ValueState: ValueHandle, ListState: ListHandle, MapState: MapHandle}


def expired(prefix: bytes, entries: Iterable[tuple[bytes, bytes]], time: int,
            limit: int | None = None) -> tuple[list[bytes], int | None]:
    """Of the ``entries`` (storage key, stored value) of the cell ``prefix``: the keys expired at
    ``time``, and the earliest expiry among the others (None: none will expire). A list's
    counter has no expiry: it goes with its last element (else a key seen once would keep it
    for ever, and no timer would come back for it); the next append starts again at 0. With
    ``limit``: the first ``limit`` expired keys at most (and no expiry), once it is reached."""
    gone, nxt = [], None
    counter, kept = False, False
    for skey, stored in entries:
        if skey == prefix + COUNT:
            counter = True
            continue
        if is_expired(stored, time):
            gone.append(skey)
            if limit is not None and len(gone) >= limit:
                return gone, None
        else:
            kept = True
            e = expiry_of(stored)
            if e != NEVER:
                nxt = e if nxt is None else min(nxt, e)
    if counter and not kept:
        gone.append(prefix + COUNT)
    return gone, nxt


def declared(cls: type) -> dict[str, StateSpec]:
    """The typed state a computation class declares, by state name (its base classes' too)."""
    found: dict[str, StateSpec] = {}
    for klass in reversed(cls.__mro__):
        for attr in vars(klass).values():
            if isinstance(attr, ValueState | ListState | MapState):
                found[attr.name] = attr
    return found


class _Committed:
    """:class:`Cells` over a tablet's committed storage, read only: reading one key's typed
    state outside any call of user code (``millstream state get --state``). TTL is judged at
    the computation's low watermark, as a call at that time would (a wall-time TTL at
    ``now``: the clock's time, µs)."""

    def __init__(self, key: bytes, get: Any, scan: Any, watermark: int, now: int | None = None) -> None:
        self._key, self._get, self._scan, self._watermark = key, get, scan, watermark
        self._now = time.time_ns() // 1000 if now is None else now

    @property
    def key(self) -> bytes:
        return self._key

    @property
    def low_watermark(self) -> int:
        return self._watermark

    def call_id(self) -> object:
        return self

    def write_time(self) -> int:
        return self._watermark

    def now(self) -> int:
        return self._now

    def cell_get(self, skey: bytes) -> bytes | None:
        return self._get(skey)  # type: ignore[no-any-return]

    def cell_scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        return self._scan(prefix)  # type: ignore[no-any-return]

    def _read_only(self, *args: Any) -> None:
        raise MillstreamError("committed state is read here, never written")

    cell_put = cell_delete = cell_write = cell_clear = expire_at = _read_only


def read_committed(spec: StateSpec, key: bytes, get: Any, scan: Any, watermark: int,
                   now: int | None = None) -> tuple[bool, Any]:
    """``(found, value)`` of ``spec`` for ``key`` from committed storage (``get(storage key)``,
    ``scan(prefix)``): the value of a ``ValueState`` (its default when unset), a list for a
    ``ListState``, a dict for a ``MapState``; ``found`` is whether anything live is stored
    (TTL judged at ``watermark``, or ``now`` for a wall-time TTL: :class:`_Committed`)."""
    handle = bind(spec, _Committed(key, get, scan, watermark, now))
    if isinstance(handle, ListHandle):
        items = list(handle)
        return bool(items), items
    if isinstance(handle, MapHandle):
        entries = dict(handle.items())
        return bool(entries), entries
    data = handle._live(get(cell(key, spec.name) + VALUE))  # one read: a commit between two could split them
    if data is None:
        return False, getattr(spec, "default", None)
    return True, spec.codec.decode(data)


def json_value(value: Any) -> Any:
    """A decoded state value as JSON can hold it: bytes as text (``0x…`` hex when not UTF-8), map
    keys as strings, anything else JSON does not know by its ``repr``."""
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return "0x" + value.hex()
    if isinstance(value, dict):
        return {k if isinstance(k, str) else json.dumps(json_value(k)): json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_value(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return repr(value)


def pick(specs: dict[str, StateSpec], name: str, owner: str, hint: str = "") -> StateSpec:
    """The spec of ``specs`` (readable typed states, by name: runtime/flows/stage.py
    ``readable_states``) named ``name``; :class:`ConfigError` naming them all when none is."""
    spec = specs.get(name)
    if spec is None:
        have = ", ".join(f"{n!r} ({type(s).__name__})" for n, s in specs.items()) or "none"
        raise ConfigError(f"{owner} declares no typed state {name!r} (it declares: {have}); name one of them{hint}")
    return spec


def read_as_json(spec: StateSpec, key: bytes, get: Any, scan: Any, watermark: int,
                 now: int | None = None) -> bytes | None:
    """``spec``'s state of ``key`` as JSON text (:func:`json_value`); None when nothing live is stored."""
    found, value = read_committed(spec, key, get, scan, watermark, now)
    return json.dumps(json_value(value)).encode() if found else None
