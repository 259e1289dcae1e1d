"""The console's history (master/history.py): bounded, rates from counts, gaps where a watermark
is at the start or end of time, and a sampler that survives a failing status."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from master.history import END_OF_TIME, MIN, History, sample


def _doc(**comps: dict[str, Any]) -> dict[str, Any]:
    return {"computations": {name: {"processed": 0, "lag_ms": None, "low_watermark": MIN, "backlog": 0, **c}
                             for name, c in comps.items()}}


def test_rates_come_from_the_change_of_the_processed_count() -> None:
    h = History(every_s=2, keep_s=60)
    h.add(1000.0, _doc(c={"processed": 100}))
    h.add(1002.0, _doc(c={"processed": 300}))
    h.add(1004.0, _doc(c={"processed": 50}))  # a new leader counts from its own start
    h.add(1006.0, _doc(c={"processed": 60}))
    doc = h.document()["computations"]["c"]
    assert doc["t"] == [1_000_000, 1_002_000, 1_004_000, 1_006_000]
    assert doc["rate"] == [None, 100.0, None, 5.0]


def test_watermarks_at_the_start_or_end_of_time_are_gaps() -> None:
    h = History(every_s=1, keep_s=10)
    for at, wm in ((1.0, MIN), (2.0, 1_700_000_000_000_000), (3.0, END_OF_TIME)):
        h.add(at, _doc(c={"low_watermark": wm, "lag_ms": 5 if wm not in (MIN, END_OF_TIME) else None}))
    doc = h.document()["computations"]["c"]
    assert doc["watermark"] == [None, 1_700_000_000_000.0, None]
    assert doc["lag_ms"] == [None, 5, None]


def test_the_history_is_bounded_in_time_and_in_computations() -> None:
    h = History(every_s=1, keep_s=10, max_computations=3)
    for i in range(1000):
        h.add(float(i), _doc(a={"processed": i}, b={"processed": i}))
    assert all(len(s["t"]) == 11 for s in h.document()["computations"].values())
    for i, name in enumerate("cdef"):
        h.add(1000.0 + i, _doc(**{name: {}}))
    kept = set(h.document()["computations"])
    assert kept == {"d", "e", "f"}, kept  # at most 3: the least recently seen went first
    h.add(1020.0, _doc(f={}))
    assert set(h.document()["computations"]) == {"f"}  # not seen for keep_s: its job is gone


def test_a_bad_history_size_is_refused() -> None:
    with pytest.raises(ValueError, match="need 0 < every_s <= keep_s"):
        History(every_s=5, keep_s=1)


def test_the_sampler_skips_a_failing_status_and_a_follower() -> None:
    h = History(every_s=0.001, keep_s=1)
    answers: list[Any] = [RuntimeError("mid-change"), None, _doc(c={"processed": 1}), _doc(c={"processed": 2})]
    clock = iter(range(100, 200))

    async def status() -> dict[str, Any] | None:
        a = answers.pop(0) if answers else _doc(c={"processed": 2})
        if isinstance(a, Exception):
            raise a
        return a  # type: ignore[no-any-return]

    async def run() -> None:
        task = asyncio.create_task(sample(status, h, clock=lambda: float(next(clock))))
        while len(h.document()["computations"].get("c", {}).get("t", [])) < 2:
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    assert h.document()["computations"]["c"]["rate"][:2] == [None, 1.0]  # one more record, one second on
