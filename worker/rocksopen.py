"""Opening a tablet copy's RocksDB, also one this process closed a moment ago."""

from __future__ import annotations

import gc

from rocksdict import Options, Rdict

LOCKED_HERE = "lock hold by current process"  # RocksDB's words for a lock this process holds


def open_rdict(path: str, options: Options) -> Rdict:
    """``Rdict(path, options=options)``. A copy this process closed can still be held by
    garbage: an iterator of it in a reference cycle keeps RocksDB's lock after ``close()``
    until the collector frees it, and the young generation is large (runtime/collector.py),
    so a follower's snapshot of a range it owned a second ago was refused for a minute. If
    the lock is this process's own, the collector runs once and the open is tried again."""
    try:
        return Rdict(path, options=options)
    except Exception as e:
        if LOCKED_HERE not in str(e):
            raise
    gc.collect()
    return Rdict(path, options=options)
