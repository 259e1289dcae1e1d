"""What a flow's event-time step has due when (:class:`DueIndex`): the in-memory index that
lets a window, join or interval join fire every key due by a watermark from one timer per
due time, instead of one timer per key and window (runtime/flows/windowing.py)."""

from __future__ import annotations

import heapq
import itertools
from typing import Any


class DueIndex:
    """What a step has due when: due time -> {(key, sub): None}, where each (key, sub) is due
    (``where``: so the index also says which windows exist, without a read), and the times
    with a timer in this tablet. Changes a call makes are kept apart until it ends
    (``commit``), so a call the worker undoes leaves no trace (``rollback``)."""

    def __init__(self) -> None:
        self.due: dict[int, dict[tuple[bytes, int], None]] = {}
        self.where: dict[tuple[bytes, int], int] = {}
        self._heap: list[int] = []
        self.timed: set[int] = set()
        self._undo: list[tuple[str, Any]] = []

    def add(self, time: int, key: bytes, sub: int) -> None:
        """``(key, sub)`` is due at ``time`` (and no longer at any other time it was due at)."""
        k = (key, sub)
        was = self.where.get(k)
        if was == time:
            return
        if was is not None:
            self.discard(was, key, sub)
        entries = self.due.get(time)
        if entries is None:
            entries = self.due[time] = {}
            heapq.heappush(self._heap, time)
        entries[k] = None
        self.where[k] = time
        self._undo.append(("add", (time, key, sub)))

    def discard(self, time: int, key: bytes, sub: int) -> None:
        entries = self.due.get(time)
        k = (key, sub)
        if entries is not None and k in entries:
            del entries[k]
            del self.where[k]
            self._undo.append(("discard", (time, key, sub)))

    def timed_again(self, time: int) -> None:
        """A timer for ``time`` is set (again): what is left due by then fires on it."""
        self.needs_timer(time)

    def needs_timer(self, time: int) -> bool:
        """Whether a timer for ``time`` must be set (none is yet); it is taken as set."""
        if time in self.timed:
            return False
        self.timed.add(time)
        self._undo.append(("timed", time))
        return True

    def take(self, upto: int, limit: int | None = None) -> list[tuple[int, bytes, int]]:
        """What is due by ``upto`` (at most ``limit`` entries), in due-time order (then by key,
        then sub). A due time taken in part keeps its place, and its timer (the caller sets
        it again)."""
        out: list[tuple[int, bytes, int]] = []
        heap = self._heap
        where = self.where
        while heap and heap[0] <= upto and (limit is None or len(out) < limit):
            time = heap[0]
            entries = self.due.get(time) or {}
            room = None if limit is None else limit - len(out)
            if room is None or len(entries) <= room:
                self._pop_first()
                taken = entries
            else:
                taken = dict.fromkeys(itertools.islice(entries, room))
                for k in taken:
                    del entries[k]
                self._undo.append(("took", (time, taken)))  # (the due time keeps its place)
            for k in taken:
                del where[k]
            out += sorted((time, k, s) for k, s in taken)
        return out

    def pending(self, upto: int) -> tuple[bytes, int] | None:
        """A (key, due time) still due by ``upto``, or None. (Due times whose entries all went
        elsewhere are dropped on the way: O(log n) each, never a scan of every due time.)"""
        heap = self._heap
        while heap and heap[0] <= upto:
            entries = self.due.get(heap[0])
            if entries:
                return next(iter(entries))[0], heap[0]
            self._pop_first()
        return None

    def _pop_first(self) -> None:
        """Take the earliest due time out, with what is left of it, undoably."""
        time = heapq.heappop(self._heap)
        entries = self.due.pop(time, None)
        timed = time in self.timed
        self.timed.discard(time)
        self._undo.append(("popped", (time, entries or {}, timed)))

    def commit(self) -> None:
        self._undo.clear()

    def rollback(self) -> None:
        for what, arg in reversed(self._undo):
            if what == "add":
                time, key, sub = arg
                self.due.get(time, {}).pop((key, sub), None)
                self.where.pop((key, sub), None)
            elif what == "discard":
                time, key, sub = arg
                self.due.setdefault(time, {})[(key, sub)] = None  # (at the end of its due time)
                self.where[(key, sub)] = time
            elif what == "timed":
                self.timed.discard(arg)
            elif what in ("took", "popped"):  # back in front of what the take left, in order
                time, entries = arg[:2]
                rest = self.due.get(time)
                self.due[time] = {**entries, **rest} if rest else dict(entries)
                for k in entries:
                    self.where[k] = time
                if what == "popped":  # (a part taken left the due time in the heap)
                    heapq.heappush(self._heap, time)
                    if arg[2]:
                        self.timed.add(time)
        self._undo.clear()

    def timers(self) -> list[tuple[bytes, int]]:
        """One (key, time) per due time: the timers a tablet that just opened needs."""
        out = []
        for time, entries in self.due.items():
            if entries:
                out.append((next(iter(entries))[0], time))
                self.timed.add(time)
        return out
