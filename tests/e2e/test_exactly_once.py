"""Replays count once however late (issue 11): a finished injection re-run under its name,
after the receiving worker restarted and after its tablets moved, adds nothing."""

from __future__ import annotations

import logging
import os
from typing import Any

from injectors import Injector
from runtime import Topology
from runtime.sinks import read_file_sink
from tests.harness import Cluster, metric

BASE = 1_700_000_000_000_000
N = 3000


def _inject(c: Cluster, n: int = N, name: str = "nightly") -> None:
    with Injector(c.masters_arg, "events", name, batch_size=500) as inj:
        for i in range(n):
            inj.send(b"user%d" % (i % 97), b"%d" % i, BASE + i)


def _lines(out: str) -> list[str]:
    return sorted(str(r["value"]) for r in read_file_sink(out))


def test_a_finished_injection_re_run_under_its_name_adds_nothing(tmp_path: object) -> None:
    with Cluster(str(tmp_path), workers=2).running() as c:
        out = os.path.join(c.data_dir, "out")
        topo = Topology("replays")
        topo.add_computation("sink", "runtime.sinks:FileSink", inputs={"events": None},
                             params={"path": out}, key_ranges=4)
        c.client.submit(topo)
        c.wait_assigned()
        want = sorted(str(i) for i in range(N))
        _inject(c)
        assert _lines(out) == want  # finish() returned: every record is committed

        # The same injection again, right away: nothing new, all of it dropped.
        dropped = sum(metric(w, "millstream_duplicates_dropped") for w in c.workers)
        _inject(c)
        assert _lines(out) == want
        assert sum(metric(w, "millstream_duplicates_dropped") for w in c.workers) - dropped == N

        # A receiving worker dies: its tablets move to the other one; the re-run adds nothing.
        c.kill_worker(c.workers[0], graceful=False)
        c.wait_assigned()
        _inject(c)
        assert _lines(out) == want

        # A worker starts again (the restarted host); tablets spread back; again nothing.
        c.add_worker()
        c.wait_ready()
        _inject(c)
        assert _lines(out) == want

        # Longer than before: the first N are dropped, the rest is new and counts.
        _inject(c, N + 500)
        assert _lines(out) == sorted(str(i) for i in range(N + 500))


def test_a_new_injection_under_a_used_name_is_all_dropped_and_says_so(tmp_path: object, caplog: Any) -> None:
    """Review 3, E3: record ids are (injector name, position), so a fresh injector under a
    name already used for other data has every record dropped as a duplicate. It is told:
    one WARNING, and its counts; under a new name nothing is dropped and nothing is said."""
    n = 300
    with Cluster(str(tmp_path), workers=1).running() as c:
        out = os.path.join(c.data_dir, "out")
        topo = Topology("names")
        topo.add_computation("sink", "runtime.sinks:FileSink", inputs={"events": None},
                             params={"path": out}, key_ranges=2)
        c.client.submit(topo)
        c.wait_assigned()

        def inject(name: str, first: int) -> Injector:
            with Injector(c.masters_arg, "events", name, batch_size=100) as inj:
                for i in range(first, first + n):
                    # The same keys in the same places: each tablet had every position before
                    # (dedup is per receiving tablet; a later position than it had is new).
                    inj.send(b"user%d" % ((i - first) % 7), b"%d" % i, BASE + i)
            return inj

        warned = "already committed under this name"
        with caplog.at_level(logging.WARNING, logger="injectors.tablets"):
            first = inject("daily", 0)
            assert (first.accepted, first.duplicates) == (n, 0)
            assert warned not in caplog.text
            again = inject("daily", n)  # other values, the same name: the same ids
            assert (again.accepted, again.duplicates) == (0, n)
            assert caplog.text.count(warned) == 1
            assert "injector 'daily' on stream 'events'" in caplog.text
            fresh = inject("daily-2", n)
            assert (fresh.accepted, fresh.duplicates) == (n, 0)
            assert caplog.text.count(warned) == 1
        assert _lines(out) == sorted(str(i) for i in range(2 * n))  # the first and the renamed
