"""What a worker keeps on disk and in memory once it no longer needs it (review 3: N11, N16,
N17): parent copies after a split, crash leftovers, per-range gauges and dictionaries."""

from __future__ import annotations

import asyncio
import os
import shutil
from typing import Any

from prometheus_client import REGISTRY

from runtime import metrics
from runtime.wire import millstream_pb2 as pb
from tests.core.corekit import engine_options, make_core
from tests.core.test_worker_core import _until, routing
from worker import seen
from worker.seen import SeenTablets
from worker.storage import TabletStore

HALF = 1 << 63


def _split_routing(version: int, halves: dict[int, tuple[str, list[str]]]) -> pb.Routing:
    """Computation ``c`` split from range 0 into 1 and 2: ``halves`` gives each half's primary
    and followers (worker ids; this core is "w")."""
    r = pb.Routing(version=version)
    c = r.computations.add(name="c", code="tests.core.jobs:Echo", outputs=[], key_ranges=2, exactly_once=True,
                           productions="strong", late_records="process", options=engine_options(replication=2))
    c.inputs.add(stream="in")
    for rid, (primary, followers) in halves.items():
        a = c.assignments.add(key_range=rid, worker_id=primary, address=f"{primary}:1", token=2,
                              start=0 if rid == 1 else HALF, end=HALF if rid == 1 else 0, parents=[0], cut=HALF)
        for f in followers:
            a.followers.add(worker_id=f, address=f"{f}:1")
        a.in_sync.append(primary)
    return r


def _copy(path: str) -> None:
    TabletStore(path, 1, sync=False).close()


def test_a_follower_of_one_half_of_a_split_deletes_the_parent_once_that_half_is_here(tmp_path: Any) -> None:
    """N11: the parent was deleted only once *every* half's directory was here: a follower of
    one half (the other moved away with its followers) kept the whole parent for ever."""
    async def run() -> None:
        core = await make_core(str(tmp_path), pb.Routing(version=1))
        parent = os.path.join(str(tmp_path), "c", "0")
        _copy(parent)  # this worker followed range 0; the split gave it half 1 only
        await core.apply_routing(_split_routing(2, {1: ("x", ["w"]), 2: ("y", ["z"])}))
        assert os.path.isdir(parent), "half 1's copy is not here yet: the parent may be its only copy here"
        _copy(os.path.join(str(tmp_path), "c", "1"))  # half 1 caught up (its primary's snapshot)
        await core.apply_routing(_split_routing(3, {1: ("x", ["w"]), 2: ("y", ["z"])}))
        assert not os.path.exists(parent)
        await core.close_all()

    asyncio.run(run())


def test_a_parent_stays_while_a_half_assigned_here_is_not_built(tmp_path: Any) -> None:
    async def run() -> None:
        core = await make_core(str(tmp_path), pb.Routing(version=1))
        parent = os.path.join(str(tmp_path), "c", "0")
        _copy(parent)
        _copy(os.path.join(str(tmp_path), "c", "1"))
        await core.apply_routing(_split_routing(2, {1: ("x", ["w"]), 2: ("y", ["w"])}))
        assert os.path.isdir(parent), "half 2 is to be followed here too, and is not here yet"
        await core.close_all()

    asyncio.run(run())


def _gauge(name: str, computation: str, key_range: int, **extra: str) -> float | None:
    return REGISTRY.get_sample_value(name, {"computation": computation, "key_range": str(key_range), **extra})


def test_a_tablet_leaving_a_worker_takes_its_gauges_and_entries_with_it(tmp_path: Any) -> None:
    """N17: per-range gauges kept their last value for ever on a worker the tablet had left (a
    move, a split, a merge), and per-range dictionaries kept one entry per range ever."""
    async def run() -> None:
        here = routing(("echo", "tests.core.jobs:Echo", ["in"], [], {}))
        core = await make_core(str(tmp_path), here)
        await _until(lambda: ("echo", 0) in core.tablets, "the tablet to open")
        core.next_report()  # exports the dedup gauges (fresh at every report)
        assert _gauge("millstream_dedup_producers", "echo", 0) == 0
        tablet = core.tablets[("echo", 0)]
        tablet._lag_labels = {"f1"}  # as if it had exported a follower's lag
        metrics.REPLICATION_LAG.labels("echo", "0", "f1").set(3)
        core._batch_limits[("echo", 0)] = 10  # as after a failed batch
        core.replicas.raise_fence(("echo", 0), 1)
        moved = pb.Routing()
        moved.CopyFrom(here)
        moved.version = 2
        a = moved.computations[0].assignments[0]
        a.worker_id, a.address, a.token = "x", "x:1", 2
        await core.apply_routing(moved)
        await _until(lambda: not core._closing, "the tablet to close")
        assert _gauge("millstream_dedup_producers", "echo", 0) is None
        assert _gauge("millstream_dedup_filter_bytes", "echo", 0) is None
        assert _gauge("millstream_replication_lag_commits", "echo", 0, follower="f1") is None
        assert not core._batch_limits and not core._opened_at
        split = pb.Routing()
        split.CopyFrom(moved)
        split.version = 3
        del split.computations[0].assignments[:]
        for rid in (1, 2):
            split.computations[0].assignments.add(key_range=rid, worker_id="x", address="x:1", token=3, parents=[0])
        await core.apply_routing(split)
        assert ("echo", 0) not in core.replicas.fence  # range 0 is gone for good
        await core.close_all()
        assert not core.replicas._locks

    asyncio.run(run())


def _promoted(version: int, token: int = 2, parents: tuple[int, ...] = ()) -> pb.Routing:
    """Tablet echo/0 given to this worker ("w") under ``token``: promoted from the in-sync set
    of a new tablet whose primary ("p") died (the routing of its creation never reached w)."""
    r = routing(("echo", "tests.core.jobs:Echo", ["in"], [], {}))
    r.version = version
    a = r.computations[0].assignments[0]
    a.token = token
    a.in_sync.append("w")
    a.parents.extend(parents)
    return r


def test_a_follower_promoted_before_it_made_a_new_tablets_empty_copy_opens_it(tmp_path: Any) -> None:
    """N19: it was refused for ever ("missing, but the tablet existed") though, in-sync and
    never holding a copy, it proves that no commit of the tablet was ever acknowledged."""
    async def run() -> None:
        seen.start(str(tmp_path))  # a new state directory: it knows every tablet it is given
        core = await make_core(str(tmp_path), _promoted(1))
        await _until(lambda: ("echo", 0) in core.tablets, "the promoted tablet to open, empty")
        assert core.tablets[("echo", 0)].store.index == 0
        await core.close_all()
        # A tablet seen here before whose copy is gone was lost: never opened empty.
        shutil.rmtree(os.path.join(str(tmp_path), "echo", "0"))
        core = await make_core(str(tmp_path), _promoted(2, token=3))
        await _until(lambda: "echo/0" in core.open_failures(), "the opening to fail")
        assert "is missing" in core.open_failures()["echo/0"] and ("echo", 0) not in core.tablets
        await core.close_all()

    asyncio.run(run())


def test_no_empty_copy_without_a_record_since_the_worker_id_or_for_a_built_range(tmp_path: Any) -> None:
    async def run() -> None:
        old = str(tmp_path / "old")  # a state directory from before the record: it may have lost copies
        core = await make_core(old, _promoted(1))
        await _until(lambda: "echo/0" in core.open_failures(), "the opening to fail")
        assert "is missing" in core.open_failures()["echo/0"]
        await core.close_all()
        built = str(tmp_path / "built")  # a split's half is built from its parent, never made empty
        os.makedirs(built)
        seen.start(built)
        core = await make_core(built, _promoted(1, parents=(7,)))
        await _until(lambda: "echo/0" in core.open_failures(), "the opening to fail")
        assert not os.path.exists(os.path.join(built, "echo", "0"))
        await core.close_all()

    asyncio.run(run())


def test_the_record_survives_a_restart_and_forgets_ranges_gone_for_good(tmp_path: Any) -> None:
    seen.start(str(tmp_path))
    record = SeenTablets(str(tmp_path))
    asyncio.run(record.remember([("c", 1), ("c", 2)]))
    with open(os.path.join(str(tmp_path), seen.FILE), "a") as f:
        f.write('["c", 3')  # a line a crash cut short
    again = SeenTablets(str(tmp_path))
    assert again.trusted and again.keys == {("c", 1), ("c", 2)}
    assert again.first_seen([("c", 2), ("c", 4)]) == {("c", 4)}
    for i in range(100, 200):
        asyncio.run(again.remember([("c", i)]))
    asyncio.run(again.forget(lambda k: k[1] >= 100))  # split away: rewritten without them
    assert SeenTablets(str(tmp_path)).keys == {("c", 1), ("c", 2)}


def test_a_parent_whose_half_was_replaced_before_its_copy_came_here_is_deleted(tmp_path: Any) -> None:
    """N11: half 1 (followed here) was split again before its copy reached this worker, and so
    was half 2: range 0 is then nobody's parent, and nothing here can need it."""
    async def run() -> None:
        core = await make_core(str(tmp_path), pb.Routing(version=1))
        parent = os.path.join(str(tmp_path), "c", "0")
        _copy(parent)
        await core.apply_routing(_split_routing(2, {1: ("x", ["w"]), 2: ("y", ["z"])}))
        assert os.path.isdir(parent)
        again = _split_routing(3, {})
        for rid in (3, 4, 5, 6):  # both halves split again (1 into 3 and 4, 2 into 5 and 6), none followed here
            again.computations[0].assignments.add(key_range=rid, worker_id="x", address="x:1", token=3,
                                                  parents=[1 if rid < 5 else 2])
        await core.apply_routing(again)
        assert not os.path.exists(parent)
        await core.close_all()

    asyncio.run(run())
