"""The console in a real browser (issue 32): headless Chromium opens the leader's page while a
word count runs with live watermarks, and the test checks the plots, the graph picture and the
tablet map twice: in the rendered DOM (an SVG line per computation with more than one point, a
box per computation, an edge per stream, a square per tablet copy) and in a screenshot (the
plots' pixels are the lines' colours across the plot's width, not only background).

Skipped, saying why, where no Chromium is installed (CI installs Debian's `chromium`)."""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import time
import urllib.request
import zlib
from typing import Any

import pytest

from cli.demo import sample_lines
from examples import wordcount
from injectors import Injector
from tests.e2e.test_web_page import BROWSER, _rendered
from tests.harness import Cluster, wait_until

pytestmark = pytest.mark.skipif(BROWSER is None, reason="no headless browser installed (CI installs Debian's "
                                                      "chromium: apt-get install chromium)")
PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf"]  # master/console.py's first


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def _screenshot(url: str, path: str, width: int, height: int) -> None:
    assert BROWSER is not None
    done = subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           "--hide-scrollbars", f"--window-size={width},{height}", "--virtual-time-budget=5000",
                           f"--screenshot={path}", url], capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0 and os.path.isfile(path), done.stderr[-2000:]


def _pixels(path: str) -> tuple[int, int, list[bytes]]:
    """A PNG's width, height and rows of RGB bytes (8-bit RGB or RGBA, not interlaced: what
    Chromium writes)."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, head = 8, b"", b""
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            head = chunk
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + n
    width, height, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", head)
    assert depth == 8 and ctype in (2, 6) and interlace == 0, (depth, ctype, interlace)
    bpp = 3 if ctype == 2 else 4
    raw, stride, rows, prev = zlib.decompress(idat), width * bpp, [], bytearray(width * bpp)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        prev = line
        rows.append(bytes(line) if bpp == 3 else bytes(v for i, v in enumerate(line) if i % 4 != 3))
    return width, height, rows


def _columns_of(rows: list[bytes], rgb: tuple[int, int, int], tolerance: int = 30) -> set[int]:
    """The x of every pixel within ``tolerance`` of the colour ``rgb``."""
    xs = set()
    for line in rows:
        for x in range(len(line) // 3):
            r, g, b = line[3 * x:3 * x + 3]
            if abs(r - rgb[0]) + abs(g - rgb[1]) + abs(b - rgb[2]) <= tolerance:
                xs.add(x)
    return xs


def test_the_console_plots_throughput_lag_and_watermarks_and_draws_the_graph(cluster: Cluster) -> None:
    cluster.client.submit(wordcount.topology(os.path.join(cluster.data_dir, "out"), name="wc"))
    cluster.wait_assigned()
    leader = cluster.client.status()["masters"]["leader"]
    page = next(m.http for m in cluster.masters if m.address == leader)
    lines = sample_lines(2000, seed=3)

    def samples(name: str) -> int:
        h = _get(page.rstrip("/") + "/history.json")["computations"].get(name, {"watermark": []})
        return sum(w is not None for w in h["watermark"])

    # Records with event times of now and a watermark following them, until the console holds
    # four samples of every computation with a watermark (every 2 s: master/history.py).
    with Injector(cluster.masters_arg, "lines", "console", batch_size=50) as inj:
        i = 0
        while min(samples(c) for c in ("splitter", "counter", "counts_sink")) < 4:
            before = samples("counter")
            for line in lines[i % 2000:i % 2000 + 50]:
                inj.send(b"", line.encode(), int(time.time() * 1e6))
            inj.flush()
            inj.advance_watermark(int(time.time() * 1e6) - 1_000_000)
            i += 50
            wait_until(lambda b=before: samples("counter") > b or samples("counter") == 0, 30,  # type: ignore[misc]
                       "the console's next sample")
            assert i < 100_000, "the console never sampled four watermarks"

        dom = _rendered(page)
        shot = os.path.join(cluster.data_dir, "console.png")
        _screenshot(page, shot, 1280, 900)

    # The DOM: every plot has a line per computation with more than one point.
    for plot in ("plot-rate", "plot-lag", "plot-watermark", "plot-backlog"):
        svg = re.search(rf'<svg id="{plot}"[^>]*>(.*?)</svg>', dom, re.S)
        assert svg, f"no {plot} in the page"
        lines_in = dict(re.findall(r'<path class="series" data-computation="([^"]+)" data-points="(\d+)"', svg.group(1)))
        assert set(lines_in) == {"splitter", "counter", "counts_sink"}, (plot, lines_in)
        assert all(int(n) >= 2 for n in lines_in.values()), (plot, lines_in)
    graph = re.search(r'<svg id="graph-picture"[^>]*>(.*?)</svg>', dom, re.S)
    assert graph
    nodes = set(re.findall(r'<g class="node (computation|stream)" data-name="([^"]+)"', graph.group(1)))
    assert nodes == {("stream", "lines"), ("computation", "splitter"), ("computation", "counter"),
                     ("computation", "counts_sink")}, nodes
    assert len(re.findall(r'<path class="edge"', graph.group(1))) == 3  # lines, words, counts
    squares = re.findall(r'<rect class="tablet (primary|follower)" data-tablet="([^"]+)"', dom)
    tablets = cluster.client.status()["tablets"]
    assert sorted(t for k, t in squares if k == "primary") == sorted(f"{t['computation']}/{t['key_range']}"
                                                                      for t in tablets)
    assert len([k for k, _ in squares if k == "follower"]) == sum(len(t["followers"]) for t in tablets)

    # The screenshot: the plots are at the top of the page; each computation's colour is drawn
    # across most of a plot's width (a line over time, not a legend swatch).
    width, _, rows = _pixels(shot)
    drawn = 0
    for hexcolour in PALETTE[:3]:
        rgb = tuple(int(hexcolour[i:i + 2], 16) for i in (1, 3, 5))
        xs = _columns_of(rows, rgb)  # type: ignore[arg-type]
        if xs and max(xs) - min(xs) > width // 5:
            drawn += 1
    assert drawn == 3, f"{drawn} of 3 computations' lines are visible in the screenshot {shot}"
