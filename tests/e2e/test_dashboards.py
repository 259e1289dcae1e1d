"""Every metric the shipped Grafana dashboard and Prometheus alert rules name is on a real
master's or worker's /metrics page, with samples (issue 32): a cluster of a master and two
workers runs a replicated word count and one tablet move, then both pages are read."""

from __future__ import annotations

import os
import re
import urllib.request
from collections import Counter

import pytest

from cli.demo import oracle, sample_lines
from examples import wordcount
from injectors import Injector
from runtime import Topology
from runtime.sinks import read_file_sink
from tests.dashboards import named_metrics
from tests.harness import Cluster, metric, wait_until


def _page(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read().decode()


def _sampled(text: str) -> set[str]:
    """The names of the samples on a /metrics page (``millstream_x_total``, ``_bucket``...)."""
    return set(re.findall(r"^(millstream_[a-z0-9_]+)(?:\{[^}]*\})? ", text, re.M))


def test_every_metric_the_dashboards_and_alerts_name_is_exported(cluster: Cluster) -> None:
    out = os.path.join(cluster.data_dir, "out")
    cluster.client.submit(wordcount.topology(out, name="wc"))
    cluster.wait_assigned()
    lines = sample_lines(500, seed=11)
    with Injector(cluster.masters_arg, "lines", "dash", batch_size=100) as inj:
        for i, line in enumerate(lines):
            inj.send(b"", line.encode(), 1_700_000_000_000_000 + i * 1000)
    total = sum(oracle(lines).values())
    wait_until(lambda: len(list(read_file_sink(out))) >= total, 120, "every count written")
    tablet = next(t for t in cluster.client.status()["tablets"] if t["computation"] == "counter")
    other = next(w["id"] for w in cluster.client.status()["workers"] if w["id"] != tablet["primary"])
    cluster.client.move("counter", tablet["key_range"], other)  # a tablet move, counted by reason

    leader = cluster.client.status()["masters"]["leader"]
    master = next(m for m in cluster.masters if m.address == leader)
    pages = [master.http.rstrip("/") + "/metrics"]
    for w in cluster.workers:
        port = next(line.rsplit(":", 1)[1].strip() for line in w.lines if " metrics on " in line)
        pages.append(f"http://127.0.0.1:{port}/metrics")

    def missing() -> set[str]:
        exported = set().union(*(_sampled(_page(p)) for p in pages))
        return named_metrics() - exported

    try:
        wait_until(lambda: not missing(), 60, "every metric the dashboards and alerts name on a /metrics page")
    except TimeoutError:
        pytest.fail(f"named by deploy/grafana or deploy/prometheus but on no /metrics page: {sorted(missing())}")
    assert len(named_metrics()) >= 20


def test_a_jobs_own_prometheus_metrics_are_on_its_workers_metrics_pages(cluster: Cluster) -> None:
    """docs/guide.md, "Your own metrics": a prometheus_client metric defined in the job's
    module is counted in the worker that runs the code and shown on its /metrics page."""
    topo = Topology("metered")
    topo.add_computation("metered", "tests.jobs:MeteredCounter", inputs={"metered.in": None}, outputs=["out"],
                         key_ranges=2)
    cluster.client.submit(topo)
    cluster.wait_assigned()
    words = ["a", "bb", "cc", "ddd"] * 5
    with Injector(cluster.masters_arg, "metered.in", "metered") as inj:
        for i, word in enumerate(words):
            inj.send(word.encode(), b"", 1_700_000_000_000_000 + i)
    want = Counter(len(w) for w in words)

    def seen() -> dict[int, float]:
        return {n: sum(metric(w, "tests_words_seen", f'length="{n}"') for w in cluster.workers) for n in want}

    wait_until(lambda: seen() == want, 60, "every word counted on the workers' /metrics pages")
