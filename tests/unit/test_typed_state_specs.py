"""Typed state specs declared on a computation class (runtime/state.py)."""

from __future__ import annotations

import pytest

from runtime import Computation, ListState, MapState, ValueState, codecs
from runtime.errors import MillstreamError, UsageError
from runtime.state import kept


def test_two_specs_of_one_class_with_one_state_name_are_refused() -> None:
    """Review of typed state: ``ValueState("x")`` and ``MapState("x")`` on one class shared a
    cell silently (a map's clear() wiped the value; each read the other's bytes)."""
    with pytest.raises((UsageError, RuntimeError)) as raised:
        class Twice(Computation):
            count = ValueState("x", codecs.INT)
            seen = MapState("x", codecs.STR, codecs.INT)
    error = raised.value if isinstance(raised.value, UsageError) else raised.value.__cause__
    assert isinstance(error, UsageError) and "Twice.count and Twice.seen both declare typed state 'x'" in str(error)

    class Base(Computation):
        history = ListState("h", codecs.INT)

    with pytest.raises((UsageError, RuntimeError)):
        class Child(Base):
            other = ValueState("h", codecs.INT)


def test_one_spec_under_two_attributes_and_an_override_are_fine() -> None:
    spec = ValueState("x", codecs.INT)

    class Aliased(Computation):
        a = spec
        b = spec

    class Base(Computation):
        count = ValueState("c", codecs.INT)

    class Child(Base):
        count = ValueState("c", codecs.INT, default=0)  # the same attribute, overridden

    assert Aliased.a is Aliased.b and Child.count.name == "c"


def test_a_committed_value_is_read_once() -> None:
    """Review of typed state: ``read_committed`` read a ValueState twice; a commit that cleared
    it between the two reads answered "found" with the default."""
    from runtime.state import read_committed

    spec = ValueState("x", codecs.INT, default=-1)
    stored = [kept(codecs.INT.encode(7))]  # the first read finds 7; a commit clears it after

    def get(skey: bytes) -> bytes | None:
        return stored.pop() if stored else None

    assert read_committed(spec, b"k", get, lambda prefix: iter(()), 0) == (True, 7)
    assert read_committed(spec, b"k", get, lambda prefix: iter(()), 0) == (False, -1)


def test_a_ttl_in_a_clock_that_is_not_one_is_refused() -> None:
    from runtime.computation import TimeDomain


    assert ValueState("v", codecs.INT, ttl=5, ttl_domain=TimeDomain.WALL_TIME).ttl_domain is TimeDomain.WALL_TIME
    assert ListState("l", codecs.INT, ttl=5).ttl_domain is TimeDomain.EVENT_TIME
    with pytest.raises(MillstreamError, match="ttl_domain='wall' must be TimeDomain.EVENT_TIME .* or TimeDomain.WALL"):
        ValueState("v", codecs.INT, ttl=5, ttl_domain="wall")  # type: ignore[arg-type]
    with pytest.raises(MillstreamError, match="positive int of microseconds of wall-clock time"):
        ValueState("v", codecs.INT, ttl=-1, ttl_domain=TimeDomain.WALL_TIME)
