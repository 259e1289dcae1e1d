"""``millstream demo``: the main job end to end on an embedded local cluster.

Until the Zeitgeist demo lands (issue 5) this is the word count: an injector
sends lines (with repeated ids and out-of-order timestamps) through
splitter -> counter -> file sink, and the counts are checked against Python.
"""

from __future__ import annotations

import collections
import os
import random
import sys
import time

from examples import wordcount
from injectors import Injector
from runtime.client import connect
from runtime.cluster import LocalCluster, wait_until
from runtime.sinks import read_file_sink

WORDS = ("stream state timer watermark record tablet worker master etcd spark "
         "exactly once key range token batch commit").split()


def sample_lines(n: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8))) for _ in range(n)]


def oracle(lines: list[str]) -> dict[str, int]:
    return dict(collections.Counter(w.lower() for line in lines for w in line.split()))


def run_demo(data_dir: str, workers: int = 2, n_lines: int = 2000) -> int:
    out_dir = os.path.join(data_dir, "counts")
    lines = sample_lines(n_lines)
    expected = oracle(lines)
    t0 = time.monotonic()
    print(f"starting a local cluster (etcd, 1 master, {workers} workers) under {data_dir}", flush=True)
    with LocalCluster(data_dir, workers=workers) as cluster:
        cluster.wait_ready(60)
        with connect(cluster.masters_arg) as client:
            n = client.submit(wordcount.topology(out_dir))
            print(f"submitted word count: {n} tablets", flush=True)
            base = 1_700_000_000_000_000
            rng = random.Random(1)
            with Injector(cluster.masters_arg, "lines", "demo-lines") as inj:
                for i, line in enumerate(lines):
                    ts = base + i * 1000 + rng.randint(-50_000, 50_000)  # out of order
                    inj.send(b"", line.encode(), ts)
                    if i % 10 == 0:  # a deliberate repeat: same id, must count once
                        inj.send(b"", line.encode(), ts, id=inj._buffer[-1].id)
            print(f"injected {len(lines)} lines (+{(len(lines) + 9) // 10} repeated ids)", flush=True)
            total = sum(expected.values())
            wait_until(lambda: sum(int(r["value"]) == expected.get(str(r["key"]), -1)
                                   for r in read_file_sink(out_dir)) == len(expected)
                       and len(list(read_file_sink(out_dir))) >= total, 120, "the final counts")
    got = wordcount.final_counts(list(read_file_sink(out_dir)))
    ok = got == expected
    print(f"\nword counts ({sum(got.values())} words, {time.monotonic() - t0:.1f}s):")
    for word, count in sorted(got.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {word:<10} {count}")
    print(f"\nequal to the plain-Python oracle: {'yes' if ok else 'NO'}")
    print(f"output: {out_dir}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(run_demo(sys.argv[1] if len(sys.argv) > 1 else "/tmp/millstream-demo"))
