"""The routing table: which tablets, on which workers, receive a stream's records.

Producers (worker tablets and injectors) route; the key extractor of each
subscription is the consumer's, and runs here, on the producing side.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runtime import kernels
from runtime.errors import ImportPathError, UsageError
from runtime.flows import FLOW_KEY, PLAN_PARAM, SKIP
from runtime.imports import CodeNotAllowedError, CodePolicy, load
from runtime.keyspace import from_wire_end, key_hash
from runtime.record import Record
from runtime.wire import millstream_pb2 as pb

KeyExtractor = Callable[[Record], bytes]
TabletKey = tuple[str, int]  # a tablet: (computation, key range id)


@dataclass(frozen=True, slots=True)
class Destination:
    """One tablet that must receive a record, under the token it is owned with."""

    computation: str
    key_range: int
    address: str  # "" while unassigned
    token: int


@dataclass(slots=True)
class _Subscription:
    computation: str
    extractor: KeyExtractor | None


class _Ranges:
    """One computation's key ranges, by hash: the range of a key is a binary search."""

    def __init__(self, bounds: list[tuple[int, int, int]]) -> None:
        bounds.sort()
        self.starts = [lo for lo, _, _ in bounds]
        self.ids = [r for _, _, r in bounds]
        self.bounds = {r: (lo, hi) for lo, hi, r in bounds}

    def of(self, key: bytes) -> int:
        i = bisect.bisect_right(self.starts, key_hash(key)) - 1
        if i < 0:
            raise LookupError("the routing has no range at the start of the hash space")
        return self.ids[i]


class _Unloadable:
    """Stands in for a key extractor that could not be loaded: routing through it fails."""

    def __init__(self, error: ImportPathError) -> None:
        self.error = error

    def __call__(self, record: Record) -> bytes:
        raise ImportPathError(str(self.error))


class RoutingTable:
    """An immutable view of one routing version."""

    def __init__(self, routing: pb.Routing) -> None:
        self.version = routing.version
        self.proto = routing
        self.computations = {c.name: c for c in routing.computations}
        self._owners: dict[TabletKey, Destination] = {}
        self.assignments: dict[TabletKey, pb.Assignment] = {}
        self._subs: dict[str, list[_Subscription]] = {}
        self._extractor_paths: dict[tuple[str, str], str] = {}
        self._ranges: dict[str, _Ranges] = {}
        for c in routing.computations:
            for a in c.assignments:
                self.assignments[(c.name, a.key_range)] = a
                self._owners[(c.name, a.key_range)] = Destination(c.name, a.key_range, a.address, a.token)
            self._ranges[c.name] = _Ranges([(a.start, from_wire_end(a.end), a.key_range) for a in c.assignments])
            for i in c.inputs:
                self._subs.setdefault(i.stream, []).append(_Subscription(c.name, None))
                if i.key_extractor:
                    self._extractor_paths[(c.name, i.stream)] = i.key_extractor

    def load_extractors(self, cache: dict[str, KeyExtractor], policy: CodePolicy | None = None) -> list[str]:
        """Import every key extractor; returns what could not be loaded.

        One bad extractor does not stop the others (or the routing table): its subscription
        raises :class:`ImportPathError` when a record must be routed through it, so only
        that reader misses the records (they go to its dead letters, saying why), see
        :meth:`route_fields`.
        """
        errors = []
        for (comp, stream), path in self._extractor_paths.items():
            cache_key = path
            if path == FLOW_KEY:  # a Dataflow stage's: made from its plan, per reader and stream
                plan = self.computations[comp].params.get(PLAN_PARAM, "")
                cache_key = f"{path}|{comp}|{stream}|{hash(plan)}"
            fn = cache.get(cache_key)
            if fn is None:
                what = f"key extractor of {comp!r} on {stream!r}"
                try:
                    if path == FLOW_KEY:
                        from runtime.flows.keys import build

                        def loader(p: str, w: str, what: str = what) -> Any:
                            return load(p, f"{what}: {w}", policy)

                        obj = build(self.computations[comp].params, stream, loader)
                    else:
                        obj = load(path, what, policy)
                    if not callable(obj) or isinstance(obj, type):
                        raise ImportPathError(f"{what} {path!r} is a {type(obj).__name__}, not a function "
                                              "of a Record; name a function")
                    fn = cache[cache_key] = obj
                except ImportPathError as e:
                    errors.append(str(e))
                    fn = _Unloadable(e)
                except Exception as e:  # a plan a worker cannot read: its reader's records fail, not routing
                    errors.append(f"{what}: {type(e).__name__}: {e}")
                    fn = _Unloadable(ImportPathError(f"{what}: {type(e).__name__}: {e}"))
            for sub in self._subs[stream]:
                if sub.computation == comp:
                    sub.extractor = fn
        return errors

    def refused(self, stream: str) -> dict[str, str]:
        """The readers of ``stream`` whose key extractor the code policy refused to load (after
        :meth:`load_extractors`), each with why; empty: none."""
        return {s.computation: str(s.extractor.error) for s in self._subs.get(stream, ())
                if isinstance(s.extractor, _Unloadable) and isinstance(s.extractor.error, CodeNotAllowedError)}

    def closed_to_input(self, computation: str) -> str:
        """Why ``computation`` takes no records from injectors now ("" if it does): its job is
        draining or drained (docs/lifecycle.md)."""
        c = self.computations.get(computation)
        if c is None or c.job_state not in ("draining", "drained"):
            return ""
        return (f"computation {computation!r} takes no more input from injectors: its job {c.topology!r} is "
                f"{c.job_state} (`millstream drain`); submit a job that reads the stream to send more")

    def has_subscribers(self, stream: str) -> bool:
        return bool(self._subs.get(stream))

    def readers(self, stream: str) -> set[str]:
        """The computations that read ``stream``."""
        return {sub.computation for sub in self._subs.get(stream, ())}

    def destination(self, computation: str, key_range: int) -> Destination:
        return self._owners.get((computation, key_range)) or Destination(computation, key_range, "", 0)

    def route(self, stream: str, record: Record) -> list[tuple[str, int, bytes]]:
        """``(computation, key_range, key)`` for every tablet that must receive ``record``."""
        return self.route_fields(stream, record.key, record.value, record.timestamp, record)

    def route_fields(self, stream: str, key: bytes, value: bytes, timestamp: int,
                     record: Record | None = None,
                     failed: Callable[[str, BaseException], None] | None = None) -> list[tuple[str, int, bytes]]:
        """:meth:`route` of a record given by its fields: a :class:`Record` is made only
        for a reader with a key extractor (a production has no id before it is routed).

        A reader's key extractor is that reader's code: when it raises (or returns no bytes),
        ``failed(reader, error)`` is told and the record goes to every other reader; without
        ``failed`` the error is raised. Anything it raises is caught then, ``SystemExit``
        included, as for any user code."""
        out = []
        for sub in self._subs.get(stream, ()):
            if sub.extractor is None:
                out.append((sub.computation, self._ranges[sub.computation].of(key), key))
                continue
            if record is None:
                record = Record(key, value, timestamp, b"")
            try:
                extracted = sub.extractor(record)
                if extracted is SKIP:
                    continue
                if not isinstance(extracted, bytes):
                    raise UsageError(
                        f"the key extractor of {sub.computation!r} returned {type(extracted).__name__}, "
                        "not bytes; return the key as bytes (encode it)"
                    )
            except BaseException as e:
                if failed is None:
                    raise
                failed(sub.computation, e)
                continue
            out.append((sub.computation, self._ranges[sub.computation].of(extracted), extracted))
        return out

    def plain_readers(self, stream: str) -> list[tuple[str, list[int], list[int]]] | None:
        """``(computation, range starts, range ids)`` of each reader of ``stream`` if none has
        a key extractor (a record goes to the range of its own key's hash in each), else None:
        what a producer may route with one hash per record and no objects."""
        out = []
        for sub in self._subs.get(stream, ()):
            if (sub.computation, stream) in self._extractor_paths:
                return None
            ranges = self._ranges[sub.computation]
            out.append((sub.computation, ranges.starts, ranges.ids))
        return out

    def subscriptions(self, stream: str) -> list[tuple[str, KeyExtractor | None]]:
        """``(computation, key extractor or None)`` of every reader of ``stream``, in the
        order :meth:`route_fields` routes to them."""
        return [(sub.computation, sub.extractor) for sub in self._subs.get(stream, ())]

    def sole_range(self, computation: str) -> int | None:
        """The range of ``computation`` if it has one only, covering every hash (then routing
        needs no hash); else None."""
        ranges = self._ranges[computation]
        return ranges.ids[0] if len(ranges.ids) == 1 and ranges.starts[0] == 0 else None

    def ranges_of(self, computation: str, hashes: list[int]) -> list[int]:
        """The range of ``computation`` holding each key hash (runtime/keyspace.py
        ``key_hashes``), in order: :meth:`range_for` of a column of keys."""
        ranges = self._ranges[computation]
        return kernels.ranges_of(hashes, ranges.starts, ranges.ids)

    def range_for(self, computation: str, key: bytes) -> int:
        """The range of ``computation`` that holds ``key`` now."""
        return self._ranges[computation].of(key)

    def has_range(self, computation: str, key_range: int) -> bool:
        return (computation, key_range) in self.assignments

    def replaced(self, computation: str, key_range: int) -> bool:
        """Whether a split or merge replaced that range (new ranges get higher ids than every
        range before them, so a missing id below the highest is gone, not yet to come)."""
        ranges = self._ranges.get(computation)
        return ranges is not None and key_range not in ranges.bounds and key_range < max(ranges.ids, default=0)

    def bounds(self, computation: str, key_range: int) -> tuple[int, int] | None:
        """``[start, end)`` of a range (None: no such range in this routing)."""
        ranges = self._ranges.get(computation)
        return ranges.bounds.get(key_range) if ranges is not None else None

    def copies_of(self, worker_id: str) -> set[TabletKey]:
        """Tablets ``worker_id`` holds a copy of: as primary, follower or in-sync member."""
        return {k for k, a in self.assignments.items()
                if a.worker_id == worker_id or worker_id in a.in_sync
                or any(f.worker_id == worker_id for f in a.followers)}

    def tablets_of(self, worker_id: str) -> dict[TabletKey, int]:
        """``{(computation, range): token}`` assigned to ``worker_id``."""
        return {
            (c.name, a.key_range): a.token
            for c in self.proto.computations
            for a in c.assignments
            if a.worker_id == worker_id
        }
