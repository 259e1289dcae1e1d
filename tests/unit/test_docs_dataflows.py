"""docs/dataflows.md's snippets run, and print what the page says they print: the page is
the API's tutorial, so it must not drift from the code."""

from __future__ import annotations

import ast
import contextlib
import io
import os
import re
import sys
import types

import pytest

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "dataflows.md")
MARK = "Every snippet below this line is run"


def _snippets() -> list[tuple[str, list[object]]]:
    """(code, the values its "prints ..." paragraph names) for every snippet after MARK."""
    text = open(DOC).read()
    text = text[text.index(MARK):]
    out = []
    for m in re.finditer(r"```python\n(.*?)```\n\n(.*?)(?:\n\n|\Z)", text, re.S):
        code, after = m.group(1), m.group(2)
        said = []
        if after.startswith("prints"):
            for literal in re.findall(r"`([^`]+)`", after):
                with contextlib.suppress(ValueError, SyntaxError):
                    said.append(ast.literal_eval(literal))
        out.append((code, said))
    return out


SNIPPETS = _snippets()


def test_the_page_has_its_snippets() -> None:
    assert len(SNIPPETS) >= 3 and all(said for _, said in SNIPPETS)


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_a_snippet_prints_what_the_page_says(index: int) -> None:
    code, said = SNIPPETS[index]
    name = f"docs_dataflows_snippet_{index}"
    module = types.ModuleType(name)  # a real module: its functions are loaded by module path
    sys.modules[name] = module
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            exec(compile(code, f"docs/dataflows.md snippet {index}", "exec"), module.__dict__)
    finally:
        del sys.modules[name]
    printed = [ast.literal_eval(line) for line in buf.getvalue().splitlines()]
    assert printed == said
