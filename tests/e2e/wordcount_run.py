"""Drive the word count through a cluster, optionally disrupting it half-way."""

from __future__ import annotations

import dataclasses
import os
import random
from collections.abc import Callable

from cli.demo import oracle, sample_lines
from examples import wordcount
from injectors import Injector
from runtime.security import Security
from runtime.sinks import read_file_sink
from runtime.topology import Productions
from tests.harness import Cluster, wait_until

BASE_TS = 1_700_000_000_000_000


def inject_lines(masters: str, source: str, lines: list[str], repeat_every: int,
                 midway: Callable[[], None] | None = None, security: Security = Security()) -> None:
    """Send ``lines`` to "lines"; every ``repeat_every``-th record is sent twice with one id."""
    rng = random.Random(3)
    with Injector(masters, "lines", source, batch_size=200, security=security) as inj:
        for i, line in enumerate(lines):
            ts = BASE_TS + i * 1000 + rng.randint(-100_000, 100_000)
            rid = inj.send(b"", line.encode(), ts)
            if i % repeat_every == 0:
                inj.send(b"", line.encode(), ts, id=rid)
            if midway is not None and i == len(lines) // 2:
                inj.flush()
                midway()


def run_wordcount(cluster: Cluster, n_lines: int = 3000, *, repeat_every: int = 7,
                  midway: Callable[[], None] | None = None, name: str = "wc",
                  productions: Productions = "strong", counter: str | None = None,
                  counter_params: dict[str, str] | None = None,
                  injector_security: Security | None = None) -> dict[str, int]:
    """Inject ``n_lines`` lines (some ids sent twice, timestamps out of order) as the injector
    ``test-<name>`` (with ``injector_security``, else the cluster's); return final counts
    once the sink holds the oracle's counts, or fail with what differs."""
    out = os.path.join(cluster.data_dir, "out-" + name)
    topo = wordcount.topology(out, name=name, productions=productions)
    if counter is not None:  # the same counting by other code (slow, flaky: tests/jobs.py)
        topo.computations["counter"] = dataclasses.replace(
            topo.computations["counter"], code=counter, params=counter_params or {})
    cluster.client.submit(topo)
    cluster.wait_assigned()
    lines = sample_lines(n_lines, seed=11)
    expected = oracle(lines)
    inject_lines(cluster.masters_arg, "test-" + name, lines, repeat_every, midway,
                 injector_security or cluster.security)
    total = sum(expected.values())

    def done() -> bool:
        return len(list(read_file_sink(out))) >= total

    try:
        wait_until(done, 120, f"{total} count records in the sink")
    finally:
        rows = list(read_file_sink(out))
    got = wordcount.final_counts(rows)
    assert got == expected, {w: (got.get(w), expected.get(w)) for w in expected if got.get(w) != expected[w]}
    assert len(rows) == total, f"{len(rows)} count records for {total} words"
    return got
