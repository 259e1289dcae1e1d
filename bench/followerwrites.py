"""What a follower's copy spends on its primary's commits (``python -m bench.overhead
follower``): a stream of W2-shaped commits (each rewrites 690 of its window's 850 window
accumulators, whose keys start with their key's hash, and deletes 180 of the window before;
a new window every 20 commits), applied one by one in one ``WriteBatch`` each, as followers
did before worker/writes.py, against :class:`~worker.replicastore.ReplicaStore`'s log applied
coalesced. CPU µs per write of every thread of the process (RocksDB's too), the median of
``runs`` interleaved rounds.

Then what the copy's writes cost the other threads of its worker (rocksdict holds the
interpreter lock through a write): a W2 follower's commits at rounds of 8,000 (each rewrites
2,000 of its window's 5,500 accumulators), logged and applied in one write, as before
``f8a7bc7``, or in pieces of :data:`~worker.writes.APPLY_CHUNK` keys, while a second thread
notes how long it waited for the lock each time (at least the switch interval, 5 ms, while
the copy runs Python; longer while it is inside a write). The longest wait, and how many
passed 10 and 20 ms: a window firing on another tablet of that worker waits as long."""

from __future__ import annotations

import functools
import hashlib
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

from rocksdict import WriteBatch

from worker import writes
from worker.replicastore import ReplicaStore
from worker.storage import apply_ops, write_durably
from worker.writes import DELETE, PUT, encode_ops

PER_WINDOW, PUTS, DELETES, COMMITS_PER_WINDOW = 850, 690, 180, 20
# W2 at rounds of 8,000: a tablet's commit rewrites ~2,000 of its window's ~5,500 accumulators
# (the counts a worker held, scratch); a window lasts about 8 commits.
ROUNDS_8000 = (5_500, 2_000, 500, 8)


def w2_commits(commits: int, seed: int = 7, shape: tuple[int, int, int, int] | None = None) -> list[bytes]:
    """``commits`` encoded commits shaped like W2's window step's (see the module docstring);
    ``shape``: accumulators per window, puts and deletes per commit, commits per window."""
    per_window, puts, deletes, per = shape or (PER_WINDOW, PUTS, DELETES, COMMITS_PER_WINDOW)
    rnd = random.Random(seed)
    value = rnd.randbytes(35)

    def keys(window: int) -> list[bytes]:
        return [b"Y" + hashlib.blake2b(b"%d" % k, digest_size=8).digest() + b"w2.windows" + window.to_bytes(8, "big")
                for k in range(per_window)]

    out = []
    for c in range(commits):
        window = c // per
        ops = [(PUT, k, value) for k in rnd.sample(keys(window), puts)]
        if window:
            ops += [(DELETE, k, b"") for k in rnd.sample(keys(window - 1), deletes)]
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
            "writes": count, "encoded_bytes": writes, "lock_waits": lock_waits(runs=runs),
            "loadavg": os.getloadavg()}


def _waits_beside(fn: Any) -> list[float]:
    """Run ``fn`` while a second thread notes each wait for the interpreter lock (seconds)."""
    waits: list[float] = []
    done = threading.Event()

    def note() -> None:
        last = time.perf_counter()
        while not done.is_set():
            now = time.perf_counter()
            waits.append(now - last)
            last = now

    other = threading.Thread(target=note)
    other.start()
    try:
        fn()
    finally:
        done.set()
        other.join()
    return waits


def lock_waits(commits: int = 160, runs: int = 3) -> dict[str, Any]:
    """The longest wait of another thread for the interpreter lock while a copy takes W2's
    commits at rounds of 8,000, its log applied in one write or in pieces (module docstring)."""
    stream = w2_commits(commits, shape=ROUNDS_8000)
    pieces = writes.APPLY_CHUNK
    out: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="millstream-follower-") as tmp:
        for i in range(runs):
            for name, chunk in (("one_write", 1 << 40), (f"pieces_of_{pieces}", pieces)):
                writes.APPLY_CHUNK = chunk
                try:
                    waits = _waits_beside(functools.partial(_logged, os.path.join(tmp, f"{name}-{i}"), stream))
                finally:
                    writes.APPLY_CHUNK = pieces
                row = out.setdefault(name, {"longest_ms": [], "over_10ms": [], "over_20ms": []})
                row["longest_ms"].append(round(max(waits) * 1e3, 1))
                row["over_10ms"].append(sum(w > 0.010 for w in waits))
                row["over_20ms"].append(sum(w > 0.020 for w in waits))
    return {"commits": commits, "shape": dict(zip(("per_window", "puts", "deletes", "commits_per_window"),
                                                   ROUNDS_8000, strict=True)),
            "switch_interval_ms": sys.getswitchinterval() * 1e3, "runs": out,
            "median_longest_ms": {n: statistics.median(r["longest_ms"]) for n, r in out.items()}}
