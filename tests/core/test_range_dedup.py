"""Range dedup equals per-record dedup (issue 29): a sequenced producer's delivery in order is
deduplicated by one range check against its mark (worker/batch.py); the same records as
opaque-form columns (each id carried whole) go through the per-record check. On random
interleavings of deliveries (re-sends, overlaps, gaps like a re-route leaves, out-of-order
ones, batches cut small) both commit exactly the records the per-record rule does: a record
is new if its sequence is above every sequence of its producer committed before it."""

from __future__ import annotations

import asyncio
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.columns import Columns
from runtime.record import producer_prefix
from runtime.wire import millstream_pb2 as pb
from tests.core.corekit import engine_options, make_core
from tests.core.jobs import IdLog
from worker.core import WorkerLimits
from worker.sender import OK

P = producer_prefix("injector/property")
BASE = 1_700_000_000_000_000


def _routing(exactly_once: bool = True) -> pb.Routing:
    r = pb.Routing(version=1)
    c = r.computations.add(name="log", code="tests.core.jobs:IdLog", key_ranges=1, exactly_once=exactly_once,
                           productions="strong", late_records="process", options=engine_options(exactly_once))
    c.inputs.add(stream="in")
    c.assignments.add(key_range=0, worker_id="w", address="self:1", token=1)
    return r


def _columns(seqs: list[int], sequenced: bool) -> Columns:
    keys = [b"k%d" % (s % 7) for s in seqs]
    values = [b"%d" % s for s in seqs]
    stamps = [BASE + s for s in seqs]
    if sequenced:
        return Columns(keys, values, stamps, P, list(seqs))
    return Columns(keys, values, stamps, ids=[P + s.to_bytes(8, "big") for s in seqs])


def _run(tmp: str, deliveries: list[list[int]], sequenced: bool, batch: int) -> list[bytes]:
    async def go() -> list[bytes]:
        core = await make_core(tmp, _routing(), WorkerLimits(max_batch_records=batch))
        try:
            for seqs in deliveries:
                assert await core.deliver("log", 0, 1, _columns(seqs, sequenced), {P: (0, 0)}) == OK
        finally:
            await core.close_all()
        return list(IdLog.ids)

    IdLog.ids = []
    return asyncio.run(go())


def _model(deliveries: list[list[int]]) -> list[bytes]:
    mark, out = 0, []
    for seqs in deliveries:
        for s in seqs:
            if s > mark:
                out.append(P + s.to_bytes(8, "big"))
                mark = s
    return out


@st.composite
def _deliveries(draw: st.DrawFn) -> list[list[int]]:
    rng = random.Random(draw(st.integers(0, 2**32)))
    out = []
    for _ in range(draw(st.integers(1, 8))):
        lo = rng.randint(1, 60)
        seqs = sorted(rng.sample(range(lo, lo + 30), rng.randint(1, 20)))  # gaps: a re-route's share
        if rng.random() < 0.15:
            rng.shuffle(seqs)  # a sender out of order: the per-record rule drops what falls behind
        out.append(seqs)
    return out


@settings(max_examples=30, deadline=None)
@given(deliveries=_deliveries(), batch=st.integers(1, 40))
def test_range_dedup_commits_what_per_record_dedup_does(tmp_path_factory: object, deliveries: list[list[int]],
                                                         batch: int) -> None:
    root = tmp_path_factory.mktemp("dedup")  # type: ignore[attr-defined]
    expected = _model(deliveries)
    assert _run(str(root / "range"), deliveries, True, batch) == expected
    assert _run(str(root / "each"), deliveries, False, batch) == expected


def test_an_at_least_once_reader_runs_a_sequenced_delivery_every_time(tmp_path: object) -> None:
    """No dedup: each delivery's records run, in the sequenced form as in the ids form."""
    async def go() -> list[bytes]:
        core = await make_core(str(tmp_path), _routing(exactly_once=False))
        try:
            for _ in range(2):
                assert await core.deliver("log", 0, 1, _columns([1, 2, 3], True), {P: (0, 0)}) == OK
        finally:
            await core.close_all()
        return list(IdLog.ids)

    IdLog.ids = []
    assert asyncio.run(go()) == [P + s.to_bytes(8, "big") for s in (1, 2, 3)] * 2
