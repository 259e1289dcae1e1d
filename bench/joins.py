"""What a flow's joins cost as a batch or a firing grows: ``python -m bench.joins [N ...]``.

For each N (default 1,000, 4,000 and 16,000), in process (``TestRun``: the real worker, its
batches and commits to RocksDB):

- ``join``: N keys each get one value on both sides of a one-second window, then the
  watermark passes it: the CPU of that firing, per key;
- ``interval_join``: one delivery of N records a side on N/10 keys, within one second, so
  each record has ten partners: the CPU of the run, per record (a flow's batch takes 8,000
  records: past 4,000 a side, each side is a batch of its own).

The CPU is the whole process's (``TestRun``'s master ticks and RocksDB's threads too): a cost
that does not grow with N, which weighs most at the smallest N.

A cost per unit that rises with N is work that grows with the square of a batch or a firing
(docs/performance-history.md, "Joins that grew with the square of a batch"). Prints one JSON
line per figure, with the load average.
"""

from __future__ import annotations

import json
import os
import resource
import sys

from runtime import Dataflow, codecs
from runtime.testing import TestRun
from runtime.windows import SECOND, Tumbling

T0 = 1_700_000_000_000_000


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def join_firing(n: int) -> float:
    """CPU µs per key of a window join's firing of ``n`` keys."""
    flow = Dataflow("jf", key_ranges=1)
    left, right = flow.input("l", keyed=True, codec=codecs.JSON), flow.input("r", keyed=True, codec=codecs.JSON)
    left.join(right, Tumbling(SECOND), name="pairs").output("out", codec=codecs.JSON)
    with TestRun(flow) as run:
        run.inject_batch("l", [(b"k%d" % i, b"1", T0 + i) for i in range(n)])
        run.inject_batch("r", [(b"k%d" % i, b"2", T0 + i) for i in range(n)])
        run.run_until_idle()
        c0 = _cpu_s()
        run.advance_watermark("l", T0 + 2 * SECOND)
        run.advance_watermark("r", T0 + 2 * SECOND)
        run.run_until_idle()
        spent = _cpu_s() - c0
        assert len(run.output("out")) == n, "every key's pair"
    return 1e6 * spent / n


def interval_join_batch(n: int) -> float:
    """CPU µs per record of one batch of ``n`` records a side into an interval join."""
    flow = Dataflow("ij", key_ranges=1)
    left, right = flow.input("l", keyed=True, codec=codecs.JSON), flow.input("r", keyed=True, codec=codecs.JSON)
    left.interval_join(right, -SECOND, SECOND, name="near").output("out", codec=codecs.JSON)
    keys, step = max(1, n // 10), SECOND // n
    with TestRun(flow) as run:
        c0 = _cpu_s()
        run.inject_batch("l", [(b"k%d" % (i % keys), b"1", T0 + i * step) for i in range(n)])
        run.inject_batch("r", [(b"k%d" % (i % keys), b"2", T0 + i * step) for i in range(n)])
        run.run_until_idle()
        spent = _cpu_s() - c0
        assert len(run.output("out")) == 10 * n if n >= 10 else run.output("out"), "every pair, once"
    return 1e6 * spent / (2 * n)


def main(argv: list[str] | None = None) -> int:
    sizes = [int(a) for a in (sys.argv[1:] if argv is None else argv)] or [1_000, 4_000, 16_000]
    for what, fn, unit in (("join", join_firing, "us_per_key"), ("interval_join", interval_join_batch,
                                                                  "us_per_record")):
        for n in sizes:
            print(json.dumps({"what": what, "n": n, unit: round(fn(n), 1), "load": os.getloadavg()[0]}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
