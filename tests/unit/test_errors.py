"""The one error hierarchy (runtime/errors.py)."""

from __future__ import annotations

import inspect

import pytest

from runtime import errors
from runtime.errors import MillstreamError


def test_every_error_class_derives_from_millstream_error() -> None:
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass) if c.__module__ == errors.__name__]
    assert len(classes) >= 10
    for cls in classes:
        assert issubclass(cls, MillstreamError), cls
        assert issubclass(cls, Exception), cls
        assert cls.__doc__, f"{cls.__name__} has no docstring"


# StreamError stands in for grpc.RpcError (a frame's failure, handled where the unary call's
# was): it must be one, and never reaches a user as itself (runtime/streams.py).
# TimestampUnitWarning is issued through warnings.warn, not raised (a Warning, not an error).
NOT_OURS = {"runtime.streams.StreamError", "runtime.links.Unsent", "runtime.record.TimestampUnitWarning"}


def test_every_exception_class_of_the_project_is_a_millstream_error() -> None:
    """Not only runtime/errors.py's: any exception class a module of the project defines (an
    internal one may still escape to a user, or be caught as a MillstreamError upstream)."""
    import importlib
    import pkgutil

    found, wrong = 0, []
    for pkg in ["runtime", "worker", "master", "injectors", "cli", "spark_bridge", "millstream", "bench"]:
        root = importlib.import_module(pkg)
        for name in [pkg] + [m.name for m in pkgutil.walk_packages(root.__path__, pkg + ".")
                             if not m.name.endswith("__main__")]:
            for _, cls in inspect.getmembers(importlib.import_module(name), inspect.isclass):
                if cls.__module__ == name and issubclass(cls, BaseException):
                    found += 1
                    if not issubclass(cls, MillstreamError) and f"{name}.{cls.__name__}" not in NOT_OURS:
                        wrong.append(f"{name}.{cls.__name__}")
    assert found >= 20
    assert not wrong, f"derive these from MillstreamError (runtime/errors.py): {wrong}"


def test_the_documented_subclasses_exist() -> None:
    for name in ["TopologyError", "ImportPathError", "ConfigError", "MasterUnavailableError", "EtcdUnavailableError",
                 "StaleTokenError", "NotOwnerError", "UserCodeError", "InjectionError"]:
        assert issubclass(getattr(errors, name), MillstreamError)


def test_the_same_mistake_raises_the_same_error_in_user_code_and_at_an_injector() -> None:
    """A value that is not bytes is a UsageError wherever it is caught: in ctx.produce (user
    code), in a state codec, and at Injector.send (an InvalidRecordError, which is both a
    UsageError and an InjectionError); all are also TypeErrors, as Python code expects."""
    from runtime import codecs
    from runtime.errors import InjectionError, InvalidRecordError, UsageError
    from tests.unit.test_context import make_ctx
    from tests.unit.test_injector_input import _injector

    with pytest.raises(UsageError, match="must be bytes"):
        make_ctx().produce("counts", "text")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="INT codec stores int"):
        codecs.INT.encode("3")
    with pytest.raises(InvalidRecordError, match="must be bytes") as at_send:
        _injector().send(b"k", "text", 1)  # type: ignore[arg-type]
    assert isinstance(at_send.value, UsageError) and isinstance(at_send.value, InjectionError)
    assert isinstance(at_send.value, TypeError)
