"""Loading user code by import path (runtime/imports.py)."""

from __future__ import annotations

import os.path

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
