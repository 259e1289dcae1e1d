"""What a follower's copy spends on its primary's commits (``python -m bench.overhead
follower``): a stream of W2-shaped commits (each rewrites 690 of its window's 850 window
accumulators, whose keys start with their key's hash, and deletes 180 of the window before;
a new window every 20 commits), applied one by one in one ``WriteBatch`` each, as followers
did before worker/writes.py, against :class:`~worker.replicastore.ReplicaStore`'s log applied
coalesced. CPU µs per write of every thread of the process (RocksDB's too), the median of
``runs`` interleaved rounds."""

from __future__ import annotations

import hashlib
import os
import random
import statistics
import tempfile
import time
from typing import Any

from rocksdict import WriteBatch

from worker.replicastore import ReplicaStore
from worker.storage import apply_ops, write_durably
from worker.writes import DELETE, PUT, encode_ops

PER_WINDOW, PUTS, DELETES, COMMITS_PER_WINDOW = 850, 690, 180, 20


def w2_commits(commits: int, seed: int = 7) -> list[bytes]:
    """``commits`` encoded commits shaped like W2's window step's (see the module docstring)."""
    rnd = random.Random(seed)
    value = rnd.randbytes(35)

    def keys(window: int) -> list[bytes]:
        return [b"Y" + hashlib.blake2b(b"%d" % k, digest_size=8).digest() + b"w2.windows" + window.to_bytes(8, "big")
                for k in range(PER_WINDOW)]

    out = []
    for c in range(commits):
        window = c // COMMITS_PER_WINDOW
        ops = [(PUT, k, value) for k in rnd.sample(keys(window), PUTS)]
        if window:
            ops += [(DELETE, k, b"") for k in rnd.sample(keys(window - 1), DELETES)]
        out.append(encode_ops(ops))
    return out


def _one_by_one(path: str, commits: list[bytes]) -> None:
    copy = ReplicaStore(path, token=1)
    try:
        for data in commits:
            wb = WriteBatch(raw_mode=True)
            apply_ops(wb, data)
            write_durably(copy.db, wb, False)
    finally:
        copy.close()


def _logged(path: str, commits: list[bytes]) -> None:
    copy = ReplicaStore(path, token=1)
    try:
        for i, data in enumerate(commits, 1):
            copy.apply(1, 1, [(i, data)], sync=False)
    finally:
        copy.close()


def follower_writes(commits: int = 400, runs: int = 3) -> dict[str, Any]:
    stream = w2_commits(commits)
    writes = sum(len(c) for c in stream)  # only for the ratio below; the per-write figures use the count
    count = sum(PUTS + (DELETES if c >= COMMITS_PER_WINDOW else 0) for c in range(commits))
    cpu: dict[str, list[float]] = {"one_by_one": [], "logged_coalesced": []}
    with tempfile.TemporaryDirectory(prefix="millstream-follower-") as tmp:
        for i in range(runs):
            for name, fn in (("one_by_one", _one_by_one), ("logged_coalesced", _logged)):
                started = time.process_time()
                fn(os.path.join(tmp, f"{name}-{i}"), stream)
                cpu[name].append((time.process_time() - started) / count * 1e6)
    median = {name: round(statistics.median(xs), 3) for name, xs in cpu.items()}
    return {"follower_cpu_us_per_write": median, "runs": {n: [round(x, 3) for x in xs] for n, xs in cpu.items()},
            "better_by": round(median["one_by_one"] / median["logged_coalesced"], 2), "commits": commits,
            "writes": count, "encoded_bytes": writes, "loadavg": os.getloadavg()}
