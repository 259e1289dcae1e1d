"""The master's web page, rendered by a real browser (issue 14): headless Chromium loads it
against a live cluster, runs its script, and the test reads the graph, watermarks, tablets and
job states from the rendered page, not from status.json.

Skipped, saying why, where no Chromium is installed (CI installs Debian's `chromium`)."""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess

import pytest

from cli.demo import sample_lines
from examples import wordcount
from injectors import Injector
from runtime.topology import Topology
from tests.harness import Cluster, wait_until

BROWSER = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
pytestmark = pytest.mark.skipif(BROWSER is None, reason="no headless browser installed (CI installs Debian's "
                                                      "chromium: apt-get install chromium)")


def _rendered(url: str) -> str:
    """The page's DOM after its script ran (it fetches status.json and fills the tables)."""
    assert BROWSER is not None
    done = subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           "--virtual-time-budget=5000", "--dump-dom", url],
                          capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _table(dom: str, table_id: str) -> list[list[str]]:
    """The cells of a rendered table, as text, one list per row (the header row first)."""
    m = re.search(rf'<table id="{table_id}">(.*?)</table>', dom, re.S)
    assert m, f"no table {table_id!r} in the rendered page"
    rows = re.findall(r"<tr>(.*?)</tr>", m.group(1), re.S)
    return [[html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in re.findall(r"<t[hd]>(.*?)</t[hd]>", r, re.S)]
            for r in rows]


def test_the_web_page_shows_the_graph_watermarks_tablets_and_job_states(cluster: Cluster) -> None:
    out = os.path.join(cluster.data_dir, "out")
    cluster.client.submit(wordcount.topology(out, name="wc"))
    cluster.wait_assigned()
    with Injector(cluster.masters_arg, "lines", "page", batch_size=100) as inj:
        for i, line in enumerate(sample_lines(300, seed=2)):
            inj.send(b"", line.encode(), 1_700_000_000_000_000 + i * 1000)
    wait_until(lambda: cluster.client.status()["computations"]["counter"]["low_watermark"] == (1 << 63) - 1,
               60, "the word count's watermarks at the end of time")
    side = Topology("side")
    side.add_computation("side_counter", "tests.jobs:CountTo", inputs={"side_words": None},
                         outputs=["side_counts"], params={"out": "side_counts"})
    cluster.client.submit(side)
    cluster.client.cancel("side", keep_state=True)

    leader = cluster.client.status()["masters"]["leader"]
    master = next(m for m in cluster.masters if m.address == leader)
    url = next(line.split(" on ", 1)[1].strip() for line in master.lines if "web page" in line)
    dom = _rendered(url)

    jobs = {r[0]: r[1] for r in _table(dom, "jobs")[1:]}
    assert jobs == {"wc": "running", "side": "cancelled"}, jobs
    graph = _table(dom, "graph")
    assert graph[0][:3] == ["topology", "reads", "computation"]
    assert {(r[0], r[2]) for r in graph[1:]} >= {("wc", "splitter"), ("wc", "counter"), ("wc", "counts_sink")}
    comps = {r[0]: r for r in _table(dom, "comps")[1:]}
    assert comps["counter"][1] == "end of time", comps["counter"]
    tablets = _table(dom, "tablets")
    names = {r[0] for r in tablets[1:]}
    assert {f"counter/{i}" for i in range(4)} <= names and {f"splitter/{i}" for i in range(4)} <= names
    workers = {w["id"] for w in cluster.client.status()["workers"]}
    assert all(r[2] in workers for r in tablets[1:] if r[0].startswith("counter/")), tablets
