"""Loading user code by import path (runtime/imports.py)."""

from __future__ import annotations

import os.path
from typing import Any

import pytest

from runtime.errors import ImportPathError, TopologyError
from runtime.imports import check_syntax, load


@pytest.mark.parametrize("path", ["nocolon", "", ":A", "mod:", "a:b:c", "1mod:A", "mod:1A", "a b:C", "mod:A-b"])
def test_check_syntax_rejects(path: str) -> None:
    with pytest.raises(ImportPathError, match=r"code .* is not an import path; write it as 'package.module:Name'"):
        check_syntax(path, "code")


@pytest.mark.parametrize("path", [None, 3, b"os:path"])
def test_check_syntax_rejects_non_strings(path: object) -> None:
    with pytest.raises(ImportPathError, match="is not an import path"):
        check_syntax(path, "code")  # type: ignore[arg-type]


@pytest.mark.parametrize("path", ["os:path", "os.path:join", "pkg._x:Cls.attr", "_m:_a"])
def test_check_syntax_accepts(path: str) -> None:
    check_syntax(path, "code")


def test_check_syntax_rejects_trailing_newline() -> None:
    with pytest.raises(ImportPathError, match="is not an import path"):
        check_syntax("os:path\n", "code")


def test_load_nocolon() -> None:
    with pytest.raises(ImportPathError, match="import path 'nocolon' is not an import path"):
        load("nocolon")


def test_load_missing_attribute() -> None:
    with pytest.raises(ImportPathError,
                       match="code 'os:nope': module 'os' has no attribute 'nope'; check the name after the colon"):
        load("os:nope", "code")


def test_load_missing_module() -> None:
    with pytest.raises(ImportPathError,
                       match="'no_such_module_xyz:A': cannot import module 'no_such_module_xyz' .*PYTHONPATH"):
        load("no_such_module_xyz:A")


def test_load_missing_nested_attribute() -> None:
    with pytest.raises(ImportPathError, match="has no attribute 'path.nope'"):
        load("os:path.nope")


def test_load_finds_modules_and_dotted_attributes() -> None:
    assert load("os.path:join") is os.path.join
    assert load("os:path.join") is os.path.join


def test_import_path_error_is_a_topology_error() -> None:
    assert issubclass(ImportPathError, TopologyError)


def test_a_computation_that_overrides_nothing_is_refused_at_submit() -> None:
    import pytest

    from runtime.client import check_importable
    from runtime.errors import TopologyError
    from runtime.topology import Topology

    topo = Topology("noop").add_computation("noop", "runtime.sinks:Sink", inputs={"x": None})
    with pytest.raises(TopologyError, match="overrides neither process_record nor process_timer"):
        check_importable(topo)


# ------------------------------------------------------------------ N10: what a policy admits


class Holder:
    """A class defined here, with an attribute: ``module:Class.attr`` stays loadable."""

    @staticmethod
    def key(record: object) -> bytes:
        return b"k"


def test_n10_a_walk_through_an_allowed_module_to_code_elsewhere_is_refused() -> None:
    """Review N10: the policy checked the module only, then walked the attribute path: a
    module the allowed one imports led to anything (``runtime.sinks:os.sys.exit``)."""
    from runtime.imports import CodeNotAllowedError, CodePolicy

    with pytest.raises(CodeNotAllowedError, match=r"'runtime.sinks:os.sys.exit': 'os' is not a class "
                                                  r"defined in an allowed module"):
        load("runtime.sinks:os.sys.exit", "key extractor", CodePolicy())
    with pytest.raises(CodeNotAllowedError, match="'runtime.sinks:os' is a module, not code of an allowed module"):
        load("runtime.sinks:os", "key extractor", CodePolicy())
    # Imported into an allowed module from elsewhere: named where it is defined, or not at all.
    with pytest.raises(CodeNotAllowedError, match=r"is defined in 'runtime.imports', not code of an allowed"):
        load("tests.unit.test_imports:load", "key extractor", CodePolicy(("tests.unit",)))
    nested = load("tests.unit.test_imports:Holder.key", "key extractor", CodePolicy(("tests.unit",)))
    assert nested.__qualname__ == "Holder.key"
    assert load("runtime.sinks:Sink", "code", CodePolicy()).__name__ == "Sink"
    assert load("os:path.join") is os.path.join  # no policy: the caller's own code, as before


def test_n10_a_package_named_like_a_built_in_one_elsewhere_on_the_path_is_not_built_in(
        tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """``examples`` is built in as millstream's own examples, not any package of that name."""
    import pathlib
    import sys

    from runtime import imports
    from runtime.imports import CodeNotAllowedError, CodePolicy

    assert CodePolicy().permits("examples.wordcount")  # millstream's own
    other = pathlib.Path(str(tmp_path)) / "examples"
    other.mkdir()
    (other / "__init__.py").write_text("")
    (other / "tool.py").write_text("import sys\nexit = sys.exit\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "examples" or m.startswith("examples.")]:
        monkeypatch.delitem(sys.modules, name)
    imports._is_own.cache_clear()
    try:
        assert not CodePolicy().permits("examples.tool")
        with pytest.raises(CodeNotAllowedError, match="module 'examples.tool' is not allowed on this worker"):
            load("examples.tool:exit", "key extractor", CodePolicy())
        assert "examples.tool" not in sys.modules  # refused before anything was imported
    finally:
        imports._is_own.cache_clear()


def test_n10_an_injector_loads_key_extractors_under_a_policy() -> None:
    """Review N10: injectors (and Spark executors) loaded the routing's key extractors with no
    policy at all, so whoever writes the routing ran any code in every loader's process."""
    import threading

    from injectors.tablets import Tablets
    from runtime.imports import CodePolicy
    from runtime.record import Record
    from runtime.security import Security
    from runtime.wire import millstream_pb2 as pb

    def tablets(path: str, policy: CodePolicy) -> Tablets:
        routing = pb.Routing(version=1)
        c = routing.computations.add(name="reader", key_ranges=1)
        c.inputs.add(stream="in", key_extractor=path)
        c.assignments.add(key_range=0, worker_id="w", address="w:1", token=1)

        class OneRouting:
            def routing(self) -> pb.Routing:
                return routing

        return Tablets("src", "in", OneRouting(), Security(), {}, threading.Event(),  # type: ignore[arg-type]
                       committed=lambda *a: None, code_policy=policy)

    record = Record(b"k", b"v", 1, bytes(16))
    mine = "tests.unit.test_imports:Holder.key"
    with pytest.raises(ImportPathError, match="'runtime.sinks:os.sys.exit': 'os' is not a class"):
        tablets("runtime.sinks:os.sys.exit", CodePolicy()).routing.route("in", record)
    with pytest.raises(ImportPathError, match=r"module 'tests.unit.test_imports' is not allowed in this "
                                              r"injector .*; pass allow_code=\['tests'\] to the Injector"):
        tablets(mine, CodePolicy.parse("", where="injector")).routing.route("in", record)
    assert tablets(mine, CodePolicy.parse("tests.unit")).routing.route("in", record)[0][0] == "reader"



def test_an_injector_is_refused_only_when_every_reader_keys_with_code_it_may_not_load(caplog: Any) -> None:
    """One reader's key extractor from a module the injector may not load does not stop the
    stream for the others (their records go on; its go to its dead letters, with a warning);
    every reader's refused: the injector is, before it registers."""
    from injectors.checks import check_code
    from runtime.imports import CodeNotAllowedError, CodePolicy
    from runtime.routing import RoutingTable
    from runtime.wire import millstream_pb2 as pb

    def table(*extractors: str) -> RoutingTable:
        routing = pb.Routing(version=1)
        for i, path in enumerate(extractors):
            c = routing.computations.add(name=f"reader{i}", key_ranges=1)
            c.inputs.add(stream="in", key_extractor=path)
            c.assignments.add(key_range=0, worker_id="w", address="w:1", token=1)
        t = RoutingTable(routing)
        t.load_extractors({}, CodePolicy.parse("", where="injector"))
        return t

    mine = "tests.unit.test_imports:Holder.key"
    with pytest.raises(CodeNotAllowedError, match=r"injector 'src' cannot key the records of 'in'.*nothing was sent"):
        check_code(table(mine), "src", "in")
    with caplog.at_level("WARNING"):
        check_code(table("", mine), "src", "in")  # reader0 keys by the record's key: it gets its records
    assert "the records of 'in' for 'reader1' go to their dead letters" in caplog.text
    check_code(table(""), "src", "in")
