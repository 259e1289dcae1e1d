"""The public names (trio's test_exports.py): changing them breaks users."""

from __future__ import annotations

import runtime


def test_runtime_all_is_pinned() -> None:
    assert runtime.__all__ == [
        "Client",
        "Computation",
        "Context",
        "ListState",
        "MapState",
        "MillstreamError",
        "Record",
        "Sink",
        "State",
        "TimeDomain",
        "Topology",
        "ValueState",
        "codecs",
        "connect",
    ]


def test_every_exported_name_exists() -> None:
    for name in runtime.__all__:
        assert getattr(runtime, name) is not None, name


def test_user_api_imports() -> None:
    from injectors import Injector
    from runtime import Computation, Context, Record, TimeDomain, Topology, connect

    assert callable(connect)
    assert {Computation, Context, Record, Topology, TimeDomain, Injector}
    assert TimeDomain.EVENT_TIME != TimeDomain.WALL_TIME


def test_millstream_error_is_the_errors_module_base() -> None:
    from runtime.errors import MillstreamError

    assert runtime.MillstreamError is MillstreamError
