"""Typed state on real processes (issue 15): a word count on ValueState and ListState stays
exact through a split and a worker killed right after it (failover to its replica)."""

from __future__ import annotations

from tests.e2e.test_rescaling import split_and_kill
from tests.e2e.wordcount_run import run_wordcount
from tests.harness import Cluster


def test_typed_state_survives_a_split_and_a_failover(tmp_path: object) -> None:
    c = Cluster(str(tmp_path), workers=2)
    c.start()
    try:
        c.wait_ready(60)
        counts = run_wordcount(c, n_lines=2000, midway=lambda: split_and_kill(c), name="typed",
                               counter="tests.jobs:TypedCounter")
        word, n = max(counts.items(), key=lambda kv: kv[1])
        assert n >= 20  # the history check ran for this word, after the split
        dead = c.client.status()["computations"]["counter"]["dead_lettered"]
        assert dead == 0, f"{dead} records dead-lettered: typed state was torn"
    finally:
        c.close()
