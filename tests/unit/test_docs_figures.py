"""The docs' figures (issue 32) are what docs/figures/make.py draws, are well-formed SVG, and are
shown by the pages they were drawn for."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIGURES = os.path.join(ROOT, "docs", "figures")


def test_the_committed_figures_are_what_the_script_draws() -> None:
    done = subprocess.run([sys.executable, os.path.join(FIGURES, "make.py"), "--check"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_figure_is_svg_with_a_title_and_is_shown_where_it_belongs() -> None:
    shown = {}
    for page in ("architecture.md", "time.md"):
        with open(os.path.join(ROOT, "docs", page)) as f:
            for name in re.findall(r"!\[[^\]]+\]\(figures/([a-z-]+\.svg)\)", f.read()):
                shown[name] = page
    svgs = sorted(f for f in os.listdir(FIGURES) if f.endswith(".svg"))
    assert shown == {"processes.svg": "architecture.md", "record-path.svg": "architecture.md",
                     "watermark-graph.svg": "time.md", "watermark-timeline.svg": "time.md"}
    assert sorted(shown) == svgs, "a figure no page shows, or a page showing a figure that is not there"
    for name in svgs:
        root = ET.parse(os.path.join(FIGURES, name)).getroot()
        assert root.tag == "{http://www.w3.org/2000/svg}svg"
        title = root.find("{http://www.w3.org/2000/svg}title")
        assert title is not None and title.text, name
        assert len(list(root.iter())) > 30, f"{name} draws almost nothing"
