"""Savepoints (issue 14, docs/lifecycle.md): taken under traffic, restored into a fresh cluster
of another size, the injection continued, the counts exact; the savepoint's state read back as a
Spark DataFrame equals the oracle's."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from typing import Any

import pytest

from cli.demo import oracle, sample_lines
from examples import wordcount
from injectors import Injector
from runtime.errors import MillstreamError
from runtime.sinks import read_file_sink
from spark_bridge import read_state
from tests.harness import Cluster, wait_until

BASE_TS = 1_700_000_000_000_000
BATCH = 50


def _feed(masters: str, lines: list[str], acked: list[int]) -> None:
    """The injector the savepoint is taken under: ``acked`` is how many lines are committed
    (a flush every ``BATCH`` lines). The splitter has one range, so its commits follow the
    injection's order and the savepoint holds a prefix of it."""
    inj = Injector(masters, "lines", "feed", batch_size=BATCH)
    try:
        for i, line in enumerate(lines):
            inj.send(b"", line.encode(), BASE_TS + i * 1000)
            if (i + 1) % BATCH == 0:
                inj.flush()
                acked[0] = i + 1
    finally:
        inj.close()  # not finished: the injection continues on the other cluster


def test_a_savepoint_under_traffic_restores_into_another_cluster_exactly(spark: Any, tmp_path: Any) -> None:
    lines = sample_lines(2400, seed=21)
    out = os.path.join(str(tmp_path), "counts")
    topo = wordcount.topology(out, name="wc")
    topo.computations["splitter"] = dataclasses.replace(topo.computations["splitter"], key_ranges=1)
    saved = os.path.join(str(tmp_path), "savepoint")
    with Cluster(os.path.join(str(tmp_path), "a"), workers=2).running() as a:
        a.client.submit(topo)
        a.wait_assigned()
        acked = [0]
        feeder = threading.Thread(target=_feed, args=(a.masters_arg, lines[:1500], acked))
        feeder.start()
        try:
            wait_until(lambda: acked[0] >= 400, 60, "the first lines injected")
            before = acked[0]
            manifest = a.client.savepoint("wc", saved)
            after = acked[0]
        finally:
            feeder.join(120)
        assert not feeder.is_alive()
        assert {t["computation"] for t in manifest["tablets"]} == {"splitter", "counter", "counts_sink"}
        with pytest.raises(MillstreamError, match="is not empty"):
            a.client.savepoint("wc", saved)
    # The cluster is gone (its processes and their state directories with it, as far as the
    # new cluster can tell). The savepoint holds a prefix of the injection: at least what was
    # acknowledged when it began, at most what was sent before the next flush after it ended.
    counts = {r.key: int(r.value_text) for r in read_state(spark, saved, "counter").collect()}
    prefixes = [k for k in range(before, after + BATCH + 1) if counts == oracle(lines[:k])]
    assert prefixes, f"the saved counts match no prefix of the injection between {before} and {after} lines"
    with open(os.path.join(saved, "manifest.json")) as f:
        assert json.load(f)["job"] == "wc"

    with Cluster(os.path.join(str(tmp_path), "b"), workers=3).running() as b:
        with pytest.raises(MillstreamError, match="not a millstream savepoint"):
            b.client.restore(str(tmp_path))
        assert b.client.restore(saved) == "wc"
        with pytest.raises(MillstreamError, match="a job named 'wc' exists"):
            b.client.restore(saved)
        b.wait_assigned()
        # The injection goes on where its producer is: from the start, with the same ids. What
        # the savepoint holds counts once; the rest (and what the old cluster did after the
        # savepoint, rolled back with it) counts now.
        with Injector(b.masters_arg, "lines", "feed", batch_size=BATCH) as inj:
            for i, line in enumerate(lines):
                inj.send(b"", line.encode(), BASE_TS + i * 1000)
        total = sum(oracle(lines).values())
        wait_until(lambda: len(list(read_file_sink(out))) >= total, 120, f"{total} count records")
        rows = list(read_file_sink(out))
        assert wordcount.final_counts(rows) == oracle(lines)
        assert len(rows) == total
        word, n = next(iter(oracle(lines).items()))
        assert b.client.state("counter", word.encode()) == str(n).encode()


def test_read_state_decodes_typed_state_of_a_savepoint(spark: Any, tmp_path: Any) -> None:
    lines = sample_lines(400, seed=22)
    topo = wordcount.topology(os.path.join(str(tmp_path), "counts"), name="typed")
    topo.computations["counter"] = dataclasses.replace(topo.computations["counter"], code="tests.jobs:TypedCounter")
    saved = os.path.join(str(tmp_path), "savepoint")
    with Cluster(os.path.join(str(tmp_path), "c"), workers=2).running() as c:
        c.client.submit(topo)
        c.wait_assigned()
        with Injector(c.masters_arg, "lines", "typed", batch_size=BATCH) as inj:
            for i, line in enumerate(lines):
                inj.send(b"", line.encode(), BASE_TS + i * 1000)
        total = sum(oracle(lines).values())
        wait_until(lambda: len(list(read_file_sink(os.path.join(str(tmp_path), "counts")))) >= total, 60,
                   "every count")
        c.client.savepoint("typed", saved)
    counts = {r.key: json.loads(r.value) for r in read_state(spark, saved, "counter", state="count").collect()}
    assert counts == oracle(lines)
    history = read_state(spark, saved, "counter", state="history")
    per_key = {r.key: r.n for r in history.groupBy("key").count().withColumnRenamed("count", "n").collect()}
    assert per_key == oracle(lines)
    assert {r.item for r in history.where("key = 'etcd'").collect()} == {str(i) for i in range(oracle(lines)["etcd"])}
    with pytest.raises(MillstreamError, match="declares no typed state 'nope' .*count, history"):
        read_state(spark, saved, "counter", state="nope")
