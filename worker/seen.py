"""The tablets a worker has been told of: what lets it tell "never held a copy" from "lost it".

A tablet that existed is never opened empty (DESIGN.md §5): a primary under a token above 1
must find its copy on disk. One case has nothing to find, and nothing was lost: a new tablet
lists its followers in its in-sync set at once, and a primary that dies before a follower has
applied that routing (and made its empty copy) leaves a follower that is promoted without one
(review 3 N19). Its primary could not acknowledge anything: a commit is acknowledged only once
every in-sync member holds it, or after the leader removed that member. So a worker that
*never held a copy* of a tablet, yet is a member of its in-sync set (primary or follower), may
make the empty copy the tablet's creation would have given it.

"Never held a copy" is what this file records: every tablet this worker is given a role in
(by the routing, or a snapshot sent before the routing said so) is written here, durably,
before any copy of it is made here. A tablet first seen here is one never held here; one
seen before whose copy is missing was lost (a wiped directory, a bug): refused, as before.

The record is trusted only if it was started with the worker's identity (a new state
directory): a state directory from before it, or one that lost it, may have held copies the
record does not know of, and its workers never make such a copy. Ranges gone for good (split
or merged away, their job's state deleted) are forgotten: no routing names them again.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Iterable

from runtime.durable import sync_dir
from runtime.routing import TabletKey

FILE = "tablets.seen"
HEADER = "millstream tablets seen here, since this worker id was made\n"


def start(state_dir: str) -> None:
    """Begin the record of a new state directory (before its worker id is written)."""
    _write(os.path.join(state_dir, FILE), [])


def _write(path: str, keys: Iterable[TabletKey]) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(HEADER + "".join(json.dumps(list(k)) + "\n" for k in sorted(keys)))
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
    sync_dir(os.path.dirname(path))


class SeenTablets:
    """The record of one state directory (read at start; appended to on the worker's loop,
    written off it)."""

    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(state_dir, FILE)
        self.keys: set[TabletKey] = set()
        self._stale = 0  # forgotten ranges still in the file
        self._lock = asyncio.Lock()  # one writer of the file at a time
        try:
            with open(self.path) as f:
                lines = f.read().splitlines(keepends=True)
        except FileNotFoundError:
            lines = []
        self.trusted = bool(lines) and lines[0] == HEADER
        for line in lines[1:] if self.trusted else []:
            try:
                c, r = json.loads(line)
                self.keys.add((str(c), int(r)))
            except (ValueError, TypeError):
                continue  # a line a crash cut short: its tablet's copy was not made yet

    def first_seen(self, keys: Iterable[TabletKey]) -> set[TabletKey]:
        """Of ``keys``, those never seen here (none if the record is not trusted)."""
        return {k for k in keys if k not in self.keys} if self.trusted else set()

    async def remember(self, keys: Iterable[TabletKey]) -> None:
        """Record ``keys`` durably (written off the event loop)."""
        new = sorted({k for k in keys if k not in self.keys})
        if not new or not self.trusted:
            return
        async with self._lock:
            await asyncio.to_thread(self._append, new)
            self.keys.update(new)

    def _append(self, keys: list[TabletKey]) -> None:
        with open(self.path, "a") as f:
            f.write("".join(json.dumps(list(k)) + "\n" for k in keys))
            f.flush()
            os.fsync(f.fileno())

    async def forget(self, gone: Callable[[TabletKey], bool]) -> None:
        """Forget ranges ``gone`` for good; the file is rewritten once they are half of it."""
        dropped = {k for k in self.keys if gone(k)}
        self.keys -= dropped
        self._stale += len(dropped)
        if not self.trusted or self._stale <= max(64, len(self.keys)):
            return
        async with self._lock:
            await asyncio.to_thread(_write, self.path, list(self.keys))
        self._stale = 0
