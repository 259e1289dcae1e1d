"""Timestamps as ``datetime`` (user review, 7): every API that takes a timestamp, a timer's
time or a watermark takes a ``datetime`` with a time zone as its instant, and refuses one
without, saying so; ``Record.datetime`` gives a record's timestamp back as one."""

from __future__ import annotations

import datetime
import json

import pytest

from runtime import Record, Topology
from runtime.errors import UsageError
from runtime.flows import PLAN_PARAM
from runtime.record import check_time
from runtime.testing import TestRun
from tests import flowjobs as j

UTC = datetime.UTC
AT = datetime.datetime(2026, 12, 6, 1, 2, 3, 456789, tzinfo=UTC)
AT_US = 1_796_518_923_456_789


def test_a_datetime_with_a_time_zone_is_its_instant_in_microseconds() -> None:
    assert check_time(AT, "t") == AT_US
    assert check_time(AT.astimezone(datetime.timezone(datetime.timedelta(hours=-5))), "t") == AT_US
    assert check_time(datetime.datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC), "t") == -1_000_000
    assert check_time(AT_US, "t") == AT_US
    assert Record(b"k", b"v", AT_US, b"0" * 16).datetime == AT
    with pytest.raises(UsageError, match="timer time .* has no time zone, so its instant is not known"):
        check_time(datetime.datetime(2026, 12, 6), "timer time")
    with pytest.raises(UsageError, match="must be an int of microseconds .* or a datetime with a time zone"):
        check_time(1.5, "t")
    with pytest.raises(UsageError, match="outside the years a datetime holds .*time.time_ns\\(\\) needs // 1000"):
        _ = Record(b"k", b"v", AT_US * 1000, b"0" * 16).datetime  # nanoseconds


def test_a_job_sets_timers_and_produces_by_datetime_and_a_test_injects_by_datetime() -> None:
    topo = Topology("dt").add_computation("later", j.InAMinute, inputs={"in": None}, outputs=["out"], key_ranges=1)
    with TestRun(topo) as run:
        run.inject("in", b"k", b"x", AT)
        run.advance_watermark("in", AT + datetime.timedelta(minutes=2))
        run.run_until_idle()
        [out] = run.output("out")
    minute = AT + datetime.timedelta(minutes=1)
    assert out.value == minute.isoformat().encode() and out.timestamp == AT_US + 60_000_000
    assert out.datetime == minute


def test_an_interval_joins_bounds_may_be_timedeltas_and_windows_are_exact() -> None:
    from runtime import Dataflow
    from runtime.windows import Tumbling

    flow = Dataflow("ij")
    left, right = flow.input("l", keyed=True), flow.input("r", keyed=True)
    left.interval_join(right, -datetime.timedelta(seconds=1), datetime.timedelta(milliseconds=1), name="near") \
        .output("o")
    plan = json.loads(flow.topology().computations["near"].params[PLAN_PARAM])
    assert (plan["steps"]["near"]["lower"], plan["steps"]["near"]["upper"]) == (-1_000_000, 1_000)
    assert Tumbling(datetime.timedelta(days=36500, microseconds=1)).size == 36500 * 86_400_000_000 + 1  # exact
