"""The leader's state has one owner and one way to change (issue 31): the image
(master/image.py), changed through ``apply(change)`` and its own methods. Other master modules
use the core's and the image's public API: no reach into ``core._x``, no assignment to the
image's fields, and the image knows nothing of the core. A master module over ~500 lines is
two concepts sharing a room."""

from __future__ import annotations

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MASTER = os.path.join(ROOT, "master")
MODULES = sorted(f for f in os.listdir(MASTER) if f.endswith(".py"))
MAX_LINES = 500


def _tree(name: str) -> ast.Module:
    with open(os.path.join(MASTER, name)) as f:
        return ast.parse(f.read(), name)


def _private_reaches(tree: ast.Module) -> list[str]:
    """``core._x`` (any name ending in ``core``) other than dunders."""
    return [f"line {n.lineno}: {n.value.id}.{n.attr}" for n in ast.walk(tree)  # type: ignore[attr-defined]
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id.endswith("core")
            and n.attr.startswith("_") and not n.attr.startswith("__")]


def _image_writes(tree: ast.Module) -> list[str]:
    """Assignments to a field of an image (``image.x = ...``, ``core.image.x += ...``)."""
    out = []
    for n in ast.walk(tree):
        targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AugAssign) else []
        for t in targets:
            for e in ast.walk(t):
                if isinstance(e, ast.Attribute) and (
                        (isinstance(e.value, ast.Name) and e.value.id == "image")
                        or (isinstance(e.value, ast.Attribute) and e.value.attr == "image")):
                    out.append(f"line {n.lineno}: {ast.unparse(t)}")
    return out


@pytest.mark.parametrize("name", [m for m in MODULES if m != "core.py"])
def test_no_master_module_reaches_into_the_cores_private_fields(name: str) -> None:
    assert _private_reaches(_tree(name)) == []


@pytest.mark.parametrize("name", [m for m in MODULES if m != "image.py"])
def test_only_the_image_assigns_to_the_images_fields(name: str) -> None:
    assert _image_writes(_tree(name)) == []


def test_the_checks_see_what_they_forbid() -> None:
    tree = ast.parse("core._lock\nself.core._io(x)\ncore.__class__\nimage.version = 1\ncore.image.stale_reports += 1\n")
    assert _private_reaches(tree) == ["line 1: core._lock"]
    assert _image_writes(tree) == ["line 4: image.version", "line 5: core.image.stale_reports"]


def test_the_image_knows_nothing_of_the_core() -> None:
    imported = {n.module for n in ast.walk(_tree("image.py")) if isinstance(n, ast.ImportFrom)}
    assert not imported & {"master.core", "master.lifecycle", "master.savepoints", "master.reshard",
                           "master.membership", "master.progress", "master.server"}


@pytest.mark.parametrize("name", MODULES)
def test_no_master_module_is_two_rooms(name: str) -> None:
    with open(os.path.join(MASTER, name)) as f:
        lines = sum(1 for _ in f)
    assert lines <= MAX_LINES, f"master/{name} has {lines} lines; split the concepts that share it"
