"""What a split costs on disk: ``python -m bench.split_cost [KEYS ...]``.

For each size, a tablet with that many keys of state (and a timer on every tenth key) is
written with the real storage code, then split in two the way a worker does it
(worker/reshard.py: checkpoint, range deletes, a scan of the timer index). For comparison,
the same halves are also made the way a key-ordered layout would need: a checkpoint, then a
scan of every state entry, hashing its key and deleting the other half's. Prints one JSON
line per size (milliseconds, medians of 3) with the load average.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time

from rocksdict import Checkpoint, Rdict, WriteBatch

from runtime.computation import TimeDomain
from runtime.keyspace import HASH_SPACE, key_hash
from worker.reshard import Origin, Parent
from worker.storage import Commit, TabletStore, Timer, _options

HALF = HASH_SPACE // 2


def _parent(path: str, n: int) -> None:
    s = TabletStore(path, 1, sync=False)
    batch = 10_000
    for lo in range(0, n, batch):
        keys = [b"user-%09d" % i for i in range(lo, min(n, lo + batch))]
        timers = {(k, "t"): Timer(k, "t", TimeDomain.EVENT_TIME, i) for i, k in enumerate(keys) if i % 10 == 0}
        s.commit(Commit(state={k: b"v" * 32 for k in keys}, timers_set=timers))
    s.db.compact_range(None, None)
    s.close()


def _layout_split(parent: str, out: str) -> None:
    for i, (lo, hi) in enumerate(((0, HALF), (HALF, HASH_SPACE))):
        Origin([Parent(parent, 0, HASH_SPACE)], lo, hi, first=i == 0).build(os.path.join(out, str(i)))


def _scan_split(parent: str, out: str) -> None:
    """The same halves by a scan of the state (hashing every key), as a key-ordered layout needs."""
    for i, (lo, hi) in enumerate(((0, HALF), (HALF, HASH_SPACE))):
        base = Rdict(parent, options=_options())
        Checkpoint(base).create_checkpoint(os.path.join(out, str(i)))
        base.close()
        db = Rdict(os.path.join(out, str(i)), options=_options())
        wb = WriteBatch(raw_mode=True)
        it = db.iter()
        it.seek(b"S")
        while it.valid() and it.key()[:1] == b"S":
            k = it.key()
            if not lo <= key_hash(k[9:]) < hi:
                wb.delete(k)
            it.next()
        db.write(wb)
        db.close()


def _time(fn: object, parent: str, root: str) -> float:
    runs = []
    for _ in range(3):
        out = tempfile.mkdtemp(dir=root)
        t0 = time.perf_counter()
        fn(parent, out)  # type: ignore[operator]
        runs.append((time.perf_counter() - t0) * 1000)
        shutil.rmtree(out)
    return round(statistics.median(runs), 1)


def main(sizes: list[int]) -> None:
    root = tempfile.mkdtemp(prefix="split-cost-")
    try:
        for n in sizes:
            parent = os.path.join(root, f"parent-{n}")
            _parent(parent, n)
            layout = _time(_layout_split, parent, root)
            scan = _time(_scan_split, parent, root)
            size = sum(os.path.getsize(os.path.join(parent, f)) for f in os.listdir(parent))
            print(json.dumps({"keys": n, "timers": n // 10, "parent_bytes": size, "split_ms": layout,
                              "scan_split_ms": scan, "ratio": round(scan / max(layout, 0.01), 1),
                              "loadavg": os.getloadavg()}), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [100_000, 1_000_000])
