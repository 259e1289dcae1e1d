"""The one error hierarchy (runtime/errors.py)."""

from __future__ import annotations

import inspect

from runtime import errors
from runtime.errors import MillstreamError


def test_every_error_class_derives_from_millstream_error() -> None:
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass) if c.__module__ == errors.__name__]
    assert len(classes) >= 10
    for cls in classes:
        assert issubclass(cls, MillstreamError), cls
        assert issubclass(cls, Exception), cls
        assert cls.__doc__, f"{cls.__name__} has no docstring"


def test_the_documented_subclasses_exist() -> None:
    for name in ["TopologyError", "ImportPathError", "ConfigError", "MasterUnavailable", "EtcdUnavailable",
                 "StaleTokenError", "NotOwner", "UserCodeError", "InjectionError"]:
        assert issubclass(getattr(errors, name), MillstreamError)
