"""The public names (trio's test_exports.py): changing them breaks users."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

import millstream
import runtime


def test_runtime_all_is_pinned() -> None:
    assert runtime.__all__ == [
        "Client",
        "Computation",
        "Context",
        "Dataflow",
        "KeyedStream",
        "ListState",
        "MapState",
        "MillstreamError",
        "Record",
        "Sink",
        "State",
        "Stream",
        "TimeDomain",
        "Topology",
        "ValueState",
        "codecs",
        "connect",
    ]


def test_every_exported_name_exists() -> None:
    for name in runtime.__all__:
        assert getattr(runtime, name) is not None, name


def test_the_dataflow_api_has_its_fixed_names() -> None:
    """DESIGN.md §3b: the names users of flows rely on."""
    from runtime import Dataflow, KeyedStream, Stream
    from runtime.windows import SECOND, Count, Session, Sliding, Tumbling, WindowResult

    for name in ("input", "topology"):
        assert callable(getattr(Dataflow, name)), name
    for name in ("map", "flat_map", "filter", "key_by", "output", "sink"):
        assert callable(getattr(Stream, name)), name
    for name in ("reduce", "window", "process", "join", "interval_join"):
        assert callable(getattr(KeyedStream, name)), name
    assert issubclass(KeyedStream, Stream)
    assert WindowResult._fields == ("start", "end", "value")
    assert SECOND == 1_000_000 and {Count, Session, Sliding, Tumbling}


def test_user_api_imports() -> None:
    from injectors import Injector
    from runtime import Computation, Context, Record, TimeDomain, Topology, connect

    assert callable(connect)
    assert {Computation, Context, Record, Topology, TimeDomain, Injector}
    assert TimeDomain.EVENT_TIME != TimeDomain.WALL_TIME


def test_millstream_error_is_the_errors_module_base() -> None:
    from runtime.errors import MillstreamError

    assert runtime.MillstreamError is MillstreamError


MILLSTREAM_ALL = [
    "Client",
    "Computation",
    "Context",
    "Dataflow",
    "Injector",
    "KeyedStream",
    "ListState",
    "MapState",
    "MillstreamError",
    "Record",
    "Sink",
    "State",
    "Stream",
    "TimeDomain",
    "Topology",
    "ValueState",
    "__version__",
    "codecs",
    "connect",
    "sinks",
    "testing",
    "windows",
]


def test_millstream_all_is_pinned() -> None:
    assert millstream.__all__ == MILLSTREAM_ALL


def test_millstream_exports_everything_runtime_does_as_the_same_objects() -> None:
    # A name added to runtime.__all__ (the lead's Dataflow) must be added to millstream too.
    missing = set(runtime.__all__) - set(millstream.__all__)
    assert not missing, f"runtime exports {sorted(missing)} but millstream does not: add them to millstream/__init__.py"
    for name in runtime.__all__:
        if name != "codecs":  # millstream.codecs is a module of its own, holding the same codecs
            assert getattr(millstream, name) is getattr(runtime, name), name


def test_the_submodules_hold_the_runtime_objects() -> None:
    from injectors import Injector
    from millstream import codecs, sinks, testing, windows
    from runtime import codecs as rcodecs
    from runtime import sinks as rsinks
    from runtime import testing as rtesting
    from runtime import windows as rwindows

    assert millstream.Injector is Injector
    for facade, impl in ((codecs, rcodecs), (windows, rwindows), (testing, rtesting), (sinks, rsinks)):
        assert facade.__all__, facade
        for name in facade.__all__:
            assert getattr(facade, name) is getattr(impl, name), (facade.__name__, name)
    assert {"BYTES", "STR", "INT", "FLOAT", "JSON"} <= set(codecs.__all__)
    assert windows.__all__ == rwindows.__all__  # (every aggregator: one import for a flow's windows)
    assert testing.__all__ == ["TestRun"]
    assert sinks.__all__ == ["FileSink", "Sink", "read_file_sink"]


def test_version_comes_from_the_package_metadata() -> None:
    from importlib.metadata import version

    assert millstream.__version__ == version("millstream")
    assert millstream.__version__[0].isdigit()


def test_the_package_is_marked_typed() -> None:
    # PEP 561: without py.typed, mypy ignores an installed package's annotations. The
    # re-exported names live in runtime/ and injectors/, so those carry the marker too.
    root = os.path.dirname(os.path.dirname(millstream.__file__))
    for package in ("millstream", "runtime", "injectors"):
        assert os.path.isfile(os.path.join(root, package, "py.typed")), package


def test_importing_millstream_pulls_in_neither_spark_nor_arrow_nor_pandas() -> None:
    # The core install has none of them (pyproject.toml: they are the [spark] extra).
    code = ("import sys, millstream, millstream.testing\n"
            "heavy = sorted(m for m in ('pyspark', 'pyarrow', 'pandas') if m in sys.modules)\n"
            "assert not heavy, heavy\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_typed_state_handle_is_typed_for_the_users_type_checker(tmp_path: Any, monkeypatch: Any) -> None:
    """User review: ``ctx.state_of(spec)`` returned ``Any``, so editors completed nothing and a
    misspelt method passed the user's mypy. Each kind of spec now gives its handle's type."""
    api = pytest.importorskip("mypy.api")  # (the dev extras: make test installs them)
    root = os.path.dirname(os.path.dirname(runtime.__file__))
    monkeypatch.chdir(root)  # mypy finds runtime/ as the checkout, however the package is installed
    monkeypatch.setenv("MYPYPATH", root)
    user = tmp_path / "job.py"
    user.write_text(
        "from runtime import Computation, Context, ListState, MapState, Record, ValueState, codecs\n"
        "class Job(Computation):\n"
        "    seen = ListState('seen', codecs.INT)\n"
        "    count = ValueState('count', codecs.INT)\n"
        "    tally = MapState('tally', codecs.STR, codecs.INT)\n"
        "    def process_record(self, ctx: Context, record: Record) -> None:\n"
        "        reveal_type(ctx.state_of(self.seen))\n"
        "        reveal_type(ctx.state_of(self.count))\n"
        "        reveal_type(ctx.state_of(self.tally))\n"
        "        ctx.state_of(self.seen).put(1, 2)\n")
    out, _, status = api.run([str(user), "--config-file", os.path.join(root, "pyproject.toml"),
                              "--cache-dir", str(tmp_path / "cache")])
    assert status == 1, out
    assert 'Revealed type is "runtime.state.ListHandle"' in out, out
    assert 'Revealed type is "runtime.state.ValueHandle"' in out, out
    assert 'Revealed type is "runtime.state.MapHandle"' in out, out
    assert '"ListHandle" has no attribute "put"' in out, out
