"""A flow's joins: ``join`` (pairs of one key in one window, when it fires),
``interval_join`` (pairs within a time distance, as soon as both are in) and ``lookup_join``
(each value with the latest value of a table, in processing order). The first two are
event-time operators like ``window`` (runtime/flows/windowing.py): a due index, one timer per
due time, state in the key's typed-state cells; the third keeps a cell per key."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

from runtime.computation import Context
from runtime.errors import UsageError
from runtime.flows.assigners import Sliding, Tumbling, _Windows
from runtime.flows.ops import Item, Op
from runtime.flows.values import AUTO, VALUES
from runtime.flows.windowing import EventTimeOp, decode_time, encode_time
from runtime.state import COUNT, ENTRY, VALUE, cell, kept, payload

_U64 = struct.Struct(">Q")


class Join(EventTimeOp):
    """Pairs of a left and a right value of one key in one window, emitted when it fires.
    State per (key, window, side): a list of values (one cell each, appended in O(1))."""

    def __init__(self, name: str, windows: _Windows, late: str) -> None:
        super().__init__(name)
        if not isinstance(windows, (Tumbling, Sliding)):
            raise UsageError(f"join {name!r}: joins take Tumbling or Sliding windows (a session join is not "
                             "supported); for pairs within a time distance use interval_join")
        self.windows = windows
        self.late = late
        self.lateness = windows.lateness
        self._counts: dict[tuple[bytes, int, int], int] = {}  # (key, start, side) -> next index

    def _base(self, key: bytes, start: int, side: int) -> bytes:
        return cell(key, self.state_name) + ENTRY + encode_time(start) + bytes((side,))

    def push(self, ctx: Context, items: list[Item], side: int = 0) -> None:
        wm = self.watermark(ctx)
        lateness, late = self.lateness, []
        for key, value, ts in items:
            live = [(s, e) for s, e in self.windows.assign(ts) if e + lateness > wm]
            if not live:
                late.append((key, value, ts))
                continue
            for s, e in live:
                base = self._base(key, s, side)
                k = (key, s, side)
                n = self._counts.get(k)
                if n is None:
                    stored = ctx.cell_get(base + COUNT)  # type: ignore[attr-defined]
                    n = _U64.unpack(payload(stored))[0] if stored is not None else 0
                ctx.cell_put(base + ENTRY + _U64.pack(n), kept(VALUES.encode(value)))  # type: ignore[attr-defined]
                self._counts[k] = n + 1
                self.due_at(ctx, e + lateness, key, s)
        for key, value, ts in late:
            ctx.produce(self.late, AUTO.encode(value), key=key, timestamp=ts)

    def fire(self, ctx: Context, due: list[tuple[int, bytes, int]]) -> None:
        out = []
        for time, key, start in due:
            sides: list[list[Any]] = [[], []]
            for side in (0, 1):
                base = self._base(key, start, side)
                entry = len(base)
                for skey, stored in ctx.cell_scan(base):  # type: ignore[attr-defined]
                    if skey[entry:entry + 1] == ENTRY:  # (then its COUNT)
                        sides[side].append(VALUES.decode(payload(stored)))
                    ctx.cell_delete(skey)  # type: ignore[attr-defined]
                self._counts.pop((key, start, side), None)
            out += [(key, (left, right), time) for left in sides[0] for right in sides[1]]
        self.emit(ctx, out)

    def finish(self, ctx: Context) -> None:
        for (key, start, side), n in self._counts.items():
            ctx.cell_put(self._base(key, start, side) + COUNT, kept(_U64.pack(n)))  # type: ignore[attr-defined]
        self._counts.clear()

    def abort(self) -> None:
        self._counts.clear()
        super().abort()

    def recover(self, cells: Iterator[tuple[bytes, bytes, bytes]]) -> list[tuple[bytes, str, int]]:
        size = self.windows.size
        for key, rest, _ in cells:
            if rest[:1] == ENTRY:
                start = decode_time(rest[1:9])
                self.index.add(start + size + self.lateness, key, start)
        self.index.commit()
        return self.recover_timers()


class LookupJoin(Op):
    """``(value, latest)`` for each value of side 0, ``latest`` being the last value side 1
    (the table) carried for its key, in the order the stage gets them (runtime/flows/stage.py
    keeps its inputs' order within a batch). The table's values are a cell per key, held for
    the call and written once at its end, as ``reduce`` keeps its running values."""

    def __init__(self, name: str, how: str) -> None:
        super().__init__(name)
        self.left = how == "left"
        self._table: dict[bytes, Any] = {}  # key -> its table value, set or read this call
        self._dirty: set[bytes] = set()

    def push(self, ctx: Context, items: list[Item], side: int = 0) -> None:
        table = self._table
        if side == 1:
            for key, value, _ in items:
                table[key] = _MISSING if value is None else value  # None deletes (Kafka Streams' tombstone)
                self._dirty.add(key)
            return
        out, missing = [], _MISSING
        for key, value, ts in items:
            if key in table:  # set, deleted (missing) or read before in this call
                latest = table[key]
            else:
                stored = ctx.cell_get(cell(key, self.state_name) + VALUE)  # type: ignore[attr-defined]
                latest = table[key] = missing if stored is None else VALUES.decode(payload(stored))
            if latest is not missing:
                out.append((key, (value, latest), ts))
            elif self.left:
                out.append((key, (value, None), ts))
        self.emit(ctx, out)

    def finish(self, ctx: Context) -> None:
        for key in self._dirty:
            value, skey = self._table[key], cell(key, self.state_name) + VALUE
            if value is _MISSING:
                ctx.cell_delete(skey)  # type: ignore[attr-defined]
            else:
                ctx.cell_put(skey, kept(VALUES.encode(value)))  # type: ignore[attr-defined]
        self.abort()

    def abort(self) -> None:
        self._table.clear()
        self._dirty.clear()


_MISSING = object()


class IntervalJoin(EventTimeOp):
    """Pairs ``(left, right)`` of one key with ``right.ts - left.ts`` in ``[lower, upper]``,
    emitted as soon as both are in, stamped at the later one. Each side's values are kept
    until no value of the other side can still pair with them (the watermark passed), then
    dropped by a timer per second of event time (not per value)."""

    GRAIN = 1_000_000  # expiry is checked per second of event time

    def __init__(self, name: str, lower: int, upper: int, late: str = "") -> None:
        super().__init__(name)
        self.lower, self.upper = lower, upper
        self.late = late
        self._counts: dict[tuple[bytes, int], int] = {}

    def _base(self, key: bytes, side: int) -> bytes:
        return cell(key, self.state_name) + ENTRY + bytes((side,))

    def _expiry(self, side: int, ts: int) -> int:
        # A left at t pairs with rights up to t + upper; a right at t with lefts from t - upper ...
        last = ts + self.upper if side == 0 else ts - self.lower
        return -(-last // self.GRAIN) * self.GRAIN + self.GRAIN  # past it, on the grain

    def push(self, ctx: Context, items: list[Item], side: int = 0) -> None:
        wm = self.watermark(ctx)
        lower, upper, out = self.lower, self.upper, []
        other = 1 - side
        grain = self.GRAIN
        for key, value, ts in items:
            expiry = self._expiry(side, ts)
            if self.late and -(-ts // grain) * grain + grain <= wm:
                # Late: the earliest a partner of it expires (either side, any bounds: a
                # partner's own last partner is at ts or after) is behind the watermark, so
                # what it pairs with would depend on whether a cleanup ran yet. It goes to
                # the late stream, unpaired, the same whatever the batching.
                ctx.produce(self.late, AUTO.encode(value), key=key, timestamp=ts)
                continue
            lo, hi = (ts + lower, ts + upper) if side == 0 else (ts - upper, ts - lower)
            for skey, stored in ctx.cell_scan(self._base(key, other) + ENTRY):  # type: ignore[attr-defined]
                t = decode_time(skey[-16:-8])
                if lo <= t <= hi:
                    partner = VALUES.decode(payload(stored))
                    pair = (value, partner) if side == 0 else (partner, value)
                    out.append((key, pair, max(ts, t)))
            if expiry > wm:  # something of the other side may still come for it
                k = (key, side)
                n = self._counts.get(k)
                if n is None:
                    stored = ctx.cell_get(self._base(key, side) + COUNT)  # type: ignore[attr-defined]
                    n = _U64.unpack(payload(stored))[0] if stored is not None else 0
                ctx.cell_put(self._base(key, side) + ENTRY + encode_time(ts) + _U64.pack(n),  # type: ignore[attr-defined]
                             kept(VALUES.encode(value)))
                self._counts[k] = n + 1
                self.due_at(ctx, expiry, key, expiry)  # one entry per due time (a key's values expire at several)
        self.emit(ctx, out)

    def fire(self, ctx: Context, due: list[tuple[int, bytes, int]]) -> None:
        for time, key, _ in due:
            for side in (0, 1):  # values whose expiry is still ahead stay (their own time comes)
                dropped = left = 0
                for skey, _ in list(ctx.cell_scan(self._base(key, side) + ENTRY)):  # type: ignore[attr-defined]
                    if self._expiry(side, decode_time(skey[-16:-8])) <= time:
                        ctx.cell_delete(skey)  # type: ignore[attr-defined]
                        dropped += 1
                    else:
                        left += 1
                if dropped and not left and (key, side) not in self._counts:  # nothing kept: nor is its counter
                    ctx.cell_delete(self._base(key, side) + COUNT)  # type: ignore[attr-defined]

    def finish(self, ctx: Context) -> None:
        for (key, side), n in self._counts.items():
            ctx.cell_put(self._base(key, side) + COUNT, kept(_U64.pack(n)))  # type: ignore[attr-defined]
        self._counts.clear()

    def abort(self) -> None:
        self._counts.clear()
        super().abort()

    def recover(self, cells: Iterator[tuple[bytes, bytes, bytes]]) -> list[tuple[bytes, str, int]]:
        for key, rest, _ in cells:
            if rest[:1] == ENTRY and len(rest) == 3 + 16 and rest[2:3] == ENTRY:
                side, ts = rest[1], decode_time(rest[3:11])
                expiry = self._expiry(side, ts)
                self.index.add(expiry, key, expiry)
        self.index.commit()
        return self.recover_timers()
