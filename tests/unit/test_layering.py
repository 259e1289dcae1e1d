"""The package graph points one way (issue 15, part 5): ``runtime`` (the user API and the
shared core) imports nothing above it; the master and the worker know nothing of each
other; the command line is the top and nothing imports it. Imports inside functions count
too: a lazy import is still a dependency."""

from __future__ import annotations

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# What each package may import, besides itself and libraries.
ALLOWED = {
    "runtime": set(),
    "master": {"runtime"},
    "worker": {"runtime"},
    "injectors": {"runtime"},
    # read_state reads savepoints in the worker's storage format, which worker/storage.py owns
    "spark_bridge": {"runtime", "injectors", "worker"},
    "examples": {"runtime", "spark_bridge", "millstream"},  # (user code: the user API's one import)
    "bench": {"runtime", "master", "worker", "injectors", "spark_bridge", "examples"},
    "cli": {"runtime", "master", "worker", "injectors", "spark_bridge", "examples", "bench", "millstream"},
    # the one import of the user API: re-exports runtime's and the Injector, nothing else
    "millstream": {"runtime", "injectors"},
}
# The one deliberate exception: the test kit runs the real worker in-process, and the real
# leader (its image, routing view and watermark tick: master/core.py with nothing to store), so
# that a unit test exercises what production runs. The views stay in master/: they read the
# leader's image, which is the master's.
EXCEPTIONS = {"runtime/testing.py": {"worker", "master"}}


def _imports(path: str) -> set[str]:
    """Top-level packages of this repository that ``path`` imports, anywhere in the file."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out & set(ALLOWED)


def _modules(package: str) -> list[str]:
    found = []
    for d, _, files in os.walk(os.path.join(ROOT, package)):
        found += [os.path.relpath(os.path.join(d, f), ROOT) for f in files
                  if f.endswith(".py") and not f.endswith(("_pb2.py", "_pb2_grpc.py"))]
    return sorted(found)


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_no_package_imports_one_above_it(package: str) -> None:
    wrong = {}
    for module in _modules(package):
        allowed = ALLOWED[package] | {package} | EXCEPTIONS.get(module, set())
        bad = _imports(os.path.join(ROOT, module)) - allowed
        if bad:
            wrong[module] = sorted(bad)
    assert not wrong, f"imports against the layering (ALLOWED in {__file__}): {wrong}"


def test_the_check_sees_a_lazy_import(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "m.py")
    with open(path, "w") as f:
        f.write("def f():\n    from worker.core import WorkerCore\n    import cli.main\n")
    assert _imports(path) == {"worker", "cli"}


# ----------------------------------------------------------------- cycles between modules

# Cycles that exist only for the type checker (imports under ``if TYPE_CHECKING:``), stated
# (issue 31): the batch processor and the replicator annotate the tablet they serve, which
# owns them; at run time the tablet imports them and they never import it. The record loop
# annotates the batch processor it runs for, which imports it; a follower's link annotates
# the replicator that holds it, which imports it.
TYPE_ONLY_CYCLES = [["worker.batch", "worker.followerlink", "worker.recordloop", "worker.replication",
                     "worker.tablet"]]


def _module_graph(with_type_only: bool) -> dict[str, set[str]]:
    """Module -> the project's modules it imports (lazy imports count; imports under ``if
    TYPE_CHECKING:`` only when ``with_type_only``)."""
    names = {m[:-3].replace(os.sep, ".").removesuffix(".__init__"): m for p in ALLOWED for m in _modules(p)}
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        with open(os.path.join(ROOT, path)) as f:
            tree = ast.parse(f.read(), path)
        if not with_type_only:
            for node in ast.walk(tree):
                if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                    node.body = []
        out: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                out.update(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in names else node.module
                           for a in node.names)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
        graph[name] = (out & set(names)) - {name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_no_module_imports_one_that_imports_it() -> None:
    assert _cycles(_module_graph(with_type_only=False)) == []


def test_the_only_cycles_are_the_stated_type_only_ones() -> None:
    assert _cycles(_module_graph(with_type_only=True)) == TYPE_ONLY_CYCLES


def test_the_cycle_check_sees_a_lazy_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
