"""The public names (trio's test_exports.py): changing them breaks users."""

from __future__ import annotations

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
