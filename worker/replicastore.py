"""A follower's copy of a tablet (docs/replication.md): its primary's commits, logged whole
and applied coalesced (worker/writes.py), on the tablet's RocksDB (worker/storage.py)."""

from __future__ import annotations

import os
import shutil

from rocksdict import WriteBatch

from worker.storage import M_INDEX, M_TERM, M_TOKEN, _open, write_durably
from worker.writes import (
    APPLY_EVERY_BYTES,
    APPLY_EVERY_COMMITS,
    LOG,
    Coalesced,
    apply_log,
    decode_ops,
    has_ranges,
    read_log,
    write_ops,
)

QUICK_BYTES = 32 << 10  # a quick apply's writes at most (ReplicaStore.apply)


class ReplicaStore:
    """A follower's copy of a tablet: it applies its primary's commits, in order, and
    refuses a primary older than one it has seen (DESIGN.md §5).

    A commit is held durably once its writes are logged (``L<index>``, one put); the log is
    applied coalesced (worker/writes.py) every :data:`APPLY_EVERY_COMMITS` commits, when the
    copy closes, and by whoever opens it after a crash (:func:`replay_log`)."""

    def __init__(self, path: str, token: int | None = None) -> None:
        """Open the copy in ``path``; with ``token``, a new tablet's empty copy is made there,
        its token recorded (durably: promoted, it must open as the copy it is, not be taken
        for a lost one)."""
        self.path = path
        self.db = _open(path)
        if token is not None and self.db.get(M_TOKEN) is None:
            wb = WriteBatch(raw_mode=True)
            wb.put(M_TOKEN, str(token).encode())
            write_durably(self.db, wb, True)
        self.token = int(self.db.get(M_TOKEN) or b"0")
        self.index = int(self.db.get(M_INDEX) or b"0")
        self.term = int(self.db.get(M_TERM) or b"0")  # the term of commit ``index``
        self._pending = Coalesced()  # the logged commits' writes (the log on disk, coalesced)
        self._logged = 0  # bytes of writes in the log
        self._stale = False  # a write failed: the log in memory is read from disk again first

    def apply(self, token: int, term: int, entries: list[tuple[int, bytes]], *, sync: bool,
              quick: bool = False) -> bool:
        """Hold consecutive commits ``(index, writes)`` of a primary's ``term`` (the caller
        checked that they continue this copy): each logged, to be applied with the next ones,
        in one write with the copy's index and term. A commit that deletes ranges is not
        logged (coalescing it would scan the writes held for each range): the commits before
        it are held, the log is applied, and then it is, in a write of its own. A commit whose
        writes do not decode is refused before anything is written.

        ``quick``: only if it is one short write (an event loop makes it: worker/replica.py),
        not one that deletes ranges, applies the log or reads it again; False (nothing
        written) otherwise."""
        size = sum(len(data) for _, data in entries)
        if quick and (self._stale or size > QUICK_BYTES or self._logged + size >= APPLY_EVERY_BYTES
                      or self._pending.commits + len(entries) >= APPLY_EVERY_COMMITS):
            return False
        decoded = [decode_ops(data) for _, data in entries]
        if quick and any(has_ranges(cols[0]) for cols in decoded):
            return False
        final = entries[-1][0]
        try:
            pending = self._held()
            wb, held = WriteBatch(raw_mode=True), None  # held: the last commit in ``wb``
            for (index, data), cols in zip(entries, decoded, strict=True):
                if has_ranges(cols[0]):
                    if held is not None:  # the commits before it, held first
                        self._hold(wb, token, term, held, sync=False)
                        wb, held = WriteBatch(raw_mode=True), None
                    self.apply_log()  # what the log holds comes first
                    write_ops(wb, *cols)
                    self._hold(wb, token, term, index, sync=sync and index == final)
                    wb = WriteBatch(raw_mode=True)
                else:
                    wb.put(LOG + index.to_bytes(8, "big"), data)
                    pending.take(*cols)
                    self._logged += len(data)
                    held = index
            if held is not None:
                self._hold(wb, token, term, held, sync=sync)
        except BaseException:
            self._stale = True  # the log in memory may differ from the disk's: read again
            raise
        if pending.commits >= APPLY_EVERY_COMMITS or self._logged >= APPLY_EVERY_BYTES:
            self.apply_log()
        return True

    @property
    def held(self) -> tuple[int, int, int]:
        """What this copy holds: its primary's token, and the term and number of its last commit."""
        return self.token, self.term, self.index

    def sync(self, held: tuple[int, int, int]) -> None:
        """Put the writes of unsynced applies on disk, as a synced one would
        (:func:`~worker.storage.write_durably`); if that fails, the copy holds again only what it
        held before them (``held``), and the primary's retry writes them again."""
        try:
            self.db.flush_wal(True)
        except BaseException:
            self.unhold(held)
            raise

    def unhold(self, held: tuple[int, int, int]) -> None:
        """Hold again only ``held`` (unsynced writes after it may not reach the disk): the
        primary's retry writes them again, the log read again first."""
        self.token, self.term, self.index = held
        self._stale = True

    def _hold(self, wb: WriteBatch, token: int, term: int, index: int, *, sync: bool) -> None:
        """Write ``wb`` with the copy's index (``index``), term and token: the commits up to
        ``index`` are held (on disk once a synced write follows)."""
        if token != self.token:
            wb.put(M_TOKEN, str(token).encode())
        wb.put(M_INDEX, str(index).encode())
        wb.put(M_TERM, str(term).encode())
        write_durably(self.db, wb, sync)
        self.token, self.term, self.index = token, term, index

    def _held(self) -> Coalesced:
        if self._stale:
            self._pending, self._logged = read_log(self.db)
            self._stale = False
        return self._pending

    def apply_log(self) -> None:
        """Apply the logged commits now (coalesced: :func:`~worker.writes.apply_log`)."""
        pending = self._held()
        if pending.commits:
            apply_log(self.db, pending)
        self._logged = 0

    def close(self) -> None:
        try:
            self.apply_log()
        finally:
            self.db.close()

    @staticmethod
    def install(path: str, incoming: str) -> ReplicaStore:
        """Replace the copy at ``path`` (closed by the caller) with the checkpoint received in
        ``incoming``."""
        if os.path.exists(path):
            shutil.rmtree(path)
        os.rename(incoming, path)
        return ReplicaStore(path)
