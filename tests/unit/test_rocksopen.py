"""A tablet copy this process closed, still held by garbage, opens again (worker/rocksopen.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rocksdict import Rdict

from worker.rocksopen import open_rdict
from worker.storage import _open, _options


class _Cycle:
    """Garbage that only the collector frees: it refers to itself."""

    def __init__(self, held: Any) -> None:
        self.me, self.held = self, held


def _abandon_a_scan(db: Rdict) -> None:
    """What a scan of a copy left unfinished in a reference cycle does: its iterator, and
    with it RocksDB's lock, outlives ``db.close()``."""
    def scan() -> Iterator[bytes]:
        it = db.iter()
        it.seek_to_first()
        while it.valid():
            yield it.key()
            it.next()

    g = scan()
    next(g)
    _Cycle(g)


def test_a_copy_closed_while_garbage_still_holds_an_iterator_of_it_opens_again(tmp_path: object) -> None:
    """CI's chaos seed 7 (2026-12-07): a worker that owned counts_sink/1 a second before was
    sent a snapshot of it as a follower, and refused it for a minute ("lock hold by current
    process"), the range under-replicated. The open collects the garbage and tries again."""
    path = f"{tmp_path}/copy"
    db = _open(path)  # a tablet's or follower's open (worker/storage.py), as the install's was
    db[b"k"] = b"v"
    _abandon_a_scan(db)
    db.close()
    again = _open(path, create=False)
    assert again[b"k"] == b"v"
    _abandon_a_scan(again)
    again.close()
    last = open_rdict(path, _options())  # (the open under both: reshard's too)
    assert last[b"k"] == b"v"
    last.close()
