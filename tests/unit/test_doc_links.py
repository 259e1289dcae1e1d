"""Every link between the docs lands: a link to a page (``guide.md``, ``../README.md``) names
a file that exists, and one to a section (``performance.md#targets``, ``#running-it``) names a
heading that page has, by GitHub's rule for a heading's anchor. Sections move between pages
(the performance journal, say); this says which links a move left behind."""

from __future__ import annotations

import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = ["README.md", *(os.path.join("docs", f) for f in sorted(os.listdir(os.path.join(ROOT, "docs")))
                       if f.endswith(".md"))]
LINK = re.compile(r"\]\(([^)#\s]*\.md)?(?:#([^)\s]+))?\)")


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: str) -> set[str]:
    """The anchors of ``path``'s headings (outside code blocks); a repeated one gets -1, -2..."""
    out: set[str] = set()
    seen: dict[str, int] = {}
    in_code = False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("```"):
                in_code = not in_code
            m = None if in_code else re.match(r"#{1,6}\s+(.*)", line)
            if m:
                a = anchor(m.group(1))
                n = seen[a] = seen.get(a, -1) + 1
                out.add(a if n == 0 else f"{a}-{n}")
    return out


def test_the_anchor_rule() -> None:
    assert anchor("Issue 29's figures on a quiet machine, 2026-12-04") == "issue-29s-figures-on-a-quiet-machine-2026-12-04"
    assert anchor("W2 and W1 on flows, side by side (issue 30)") == "w2-and-w1-on-flows-side-by-side-issue-30"
    assert anchor("Strong productions routed once per batch, as columns (2026-12-05)") == \
        "strong-productions-routed-once-per-batch-as-columns-2026-12-05"


@pytest.mark.parametrize("doc", DOCS)
def test_every_link_to_a_doc_or_its_section_lands(doc: str) -> None:
    here = os.path.join(ROOT, doc)
    with open(here, encoding="utf-8") as f:
        text = f.read()
    wrong = []
    for target, section in LINK.findall(text):
        if not target and not section:
            continue
        path = os.path.normpath(os.path.join(os.path.dirname(here), target)) if target else here
        if not os.path.exists(path):
            wrong.append(f"{target}: no such file")
        elif section and section not in anchors(path):
            wrong.append(f"{target}#{section}: no such heading in {os.path.relpath(path, ROOT)}")
    assert not wrong, f"{doc}: " + "; ".join(wrong)
