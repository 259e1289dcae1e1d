"""A savepoint's pause on the leader (review N1, N2), without etcd or a cluster: the job is at
rest only when two rounds of reports, each taken under a newer routing, show nothing in flight
and the same batches committed; the pause is stored, so a new leader keeps it; the client's end
checks that it held and nothing ran, and fails loudly otherwise."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from master import lifecycle, progress, reshard, savepoints
from master.change import Change, WorkerInfo
from master.core import MasterConfig, MasterCore
from master.jobs import PAUSE_LIMIT_S
from master.scheduler import Ownership
from runtime import Topology
from runtime.errors import MillstreamError
from runtime.wire import millstream_pb2 as pb
from tests.masterkit import MemoryStore


class PauseStore(MemoryStore):
    """The job, its worker and tablet, and its savepoint pause, in memory (what a new leader loads)."""

    def __init__(self, topo: Topology) -> None:
        super().__init__()
        self.apply(Change(topologies={topo.name: topo}, workers={"w": WorkerInfo("127.0.0.1:1")},
                          tablets={("a", 0): Ownership("w", 1)}))

    @property
    def pauses(self) -> dict[str, dict[str, Any]]:
        return self.snap.pauses


def _topology() -> Topology:
    topo = Topology("one")
    topo.add_computation("a", "x:A", inputs={"in": None}, key_ranges=1)
    return topo


async def _leader(store: PauseStore, clock: list[float], replication: int = 1) -> MasterCore:
    core = MasterCore(store, MasterConfig(replication=replication), lambda: clock[0])  # type: ignore[arg-type]
    await core.become_leader()
    return core


async def _reporting(core: MasterCore, commits: Callable[[int], int], until: asyncio.Future[Any]) -> int:
    """Play worker "w": a report every 5 ms under the newest routing (applied at once), with
    nothing in flight and ``commits(n)`` batches committed at its n-th report; returns how many
    reports it sent."""
    n = 0
    while not until.done():
        n += 1
        held = pb.HeldTablet(computation="a", key_range=0, token=1, in_flight=0, commits=commits(n))
        core.heartbeat("w", [held], report_seq=n, routing_version=core.version)
        await asyncio.wait({until}, timeout=0.005)  # the worker's report interval
    return n


async def _while_reporting(core: MasterCore, commits: Callable[[int], int], call: Any) -> tuple[Any, int]:
    task = asyncio.ensure_future(call)
    n = await _reporting(core, commits, task)
    return task.result(), n


def test_at_rest_needs_two_rounds_of_reports_with_nothing_committed_between() -> None:
    # Every report says nothing is in flight, yet the tablet commits between reports (records
    # from a tablet that reported earlier, say): that is not rest. Only once its count stays
    # the same over two rounds is the job at rest.
    async def main() -> None:
        store, clock = PauseStore(_topology()), [0.0]
        core = await _leader(store, clock)
        plan, reports = await _while_reporting(core, lambda n: min(n, 10), savepoints.savepoint_begin(core, "one", 10))
        assert reports > 10
        assert store.pauses["one"] == {"id": plan.savepoint_id, "cut": {"a/0": 10}}
        await savepoints.savepoint_end(core, "one", plan.savepoint_id)
        assert store.pauses == {} and "one" not in core.image.pauses

    asyncio.run(main())


def test_a_new_leader_keeps_the_pause_and_the_end_checks_it() -> None:
    async def main() -> None:
        store, clock = PauseStore(_topology()), [0.0]
        old = await _leader(store, clock)
        plan, _ = await _while_reporting(old, lambda n: 7, savepoints.savepoint_begin(old, "one", 10))
        old.shutdown()
        new = await _leader(store, clock)  # a failover while the client copies
        assert [c.input_paused for c in new.routing().computations] == [True]
        # Its inputs' watermarks are known (as published), not left out of the heartbeat answer
        # (review N20: a worker started now would run the paused job's tablets at the start of time).
        await progress.advance(new)
        assert "a" in new.image.inputs
        await savepoints.savepoint_renew(new, "one", plan.savepoint_id)
        with pytest.raises(MillstreamError, match="pause is no longer in force"):
            await savepoints.savepoint_renew(new, "one", "another")
        await _while_reporting(new, lambda n: 7, savepoints.savepoint_end(new, "one", plan.savepoint_id, verify=True))
        assert store.pauses == {} and [c.input_paused for c in new.routing().computations] == [False]

    asyncio.run(main())


def test_the_end_fails_loudly_when_the_pause_was_lost_or_the_job_moved() -> None:
    async def main() -> None:
        store, clock = PauseStore(_topology()), [0.0]
        core = await _leader(store, clock)
        plan, _ = await _while_reporting(core, lambda n: 7, savepoints.savepoint_begin(core, "one", 10))
        # Something committed while the tablets were copied: no manifest.
        with pytest.raises(MillstreamError, match=r"did not stay at rest while they were copied \(a/0: 7 commits then, 8 now\).*take "
                                                  "the savepoint again"):
            await _while_reporting(core, lambda n: 8,
                                   savepoints.savepoint_end(core, "one", plan.savepoint_id, verify=True))
        assert store.pauses == {} and "one" not in core.image.pauses  # ended all the same
        # A copy that outlived an unrenewed pause: no manifest either.
        plan, _ = await _while_reporting(core, lambda n: 8, savepoints.savepoint_begin(core, "one", 10))
        clock[0] += PAUSE_LIMIT_S * 1000 + 1
        await lifecycle.advance(core)
        assert "one" not in core.image.pauses and store.pauses == {}
        with pytest.raises(MillstreamError, match="pause is no longer in force"):
            await savepoints.savepoint_renew(core, "one", plan.savepoint_id)
        with pytest.raises(MillstreamError, match="its pause ended before the copy did"):
            await savepoints.savepoint_end(core, "one", plan.savepoint_id, verify=True)

    asyncio.run(main())


def test_the_tablets_stay_where_they_are_while_the_copy_runs() -> None:
    """Lifecycle chaos seed 403: moving a tablet while the client copies it fails the
    savepoint ("it moved"). The pause holds every move of the job's tablets (not a failover)
    and its end lets them go ahead; a split or merge is refused, and the policy leaves the
    job's ranges alone (idle while paused, they would look cold)."""
    async def main() -> None:
        store, clock = PauseStore(_topology()), [0.0]
        store.apply(Change(workers={"v": WorkerInfo("127.0.0.1:2")},
                           tablets={("a", 0): Ownership("w", 1, ("v",), ("w", "v"))}))
        core = await _leader(store, clock, replication=2)
        core.heartbeat("v", [], report_seq=1)
        core.image.rebalance = True  # the policy looks after every computation
        assert "a" in core.image.rebalanced()
        plan, _ = await _while_reporting(core, lambda n: 7, savepoints.savepoint_begin(core, "one", 10))
        assert await core.move("a", 0, "v") == 2
        assert core.image.tablets[("a", 0)].own.worker == "w", "moved while the savepoint copies it"
        with pytest.raises(MillstreamError, match="a savepoint of its job is being taken"):
            await reshard.split(core, "a", 0, None)
        assert core.image.rebalanced() == {}
        await _while_reporting(core, lambda n: 7, savepoints.savepoint_end(core, "one", plan.savepoint_id, verify=True))
        await core.tick()
        own = core.image.tablets[("a", 0)].own
        assert (own.worker, own.token) == ("v", 2), "the move went ahead once the pause ended"

    asyncio.run(main())


def test_a_restore_outranks_the_old_job_and_every_earlier_restore_of_the_savepoint() -> None:
    """A restored tablet's token passes the saved one by the gap (the old job's tablet may have
    moved since), and an earlier restore's tablet that moved since (its token + moves), once
    the restore is a millisecond later; it fits a uint64 field and never goes below the
    saved token whatever the wall clock says."""
    t0 = 1_800_000_000_000.0  # 2027, in ms
    first = savepoints.restore_token(7, t0)
    assert first > 7 + 1_000 and first < 1 << 63
    assert savepoints.restore_token(7, t0 + 1) > first + 1_000  # the first one's tablet moved 1,000 times
    assert savepoints.restore_token(first + 5, t0) > first + 5  # a savepoint of the restored job, restored at once
    for clock in (0.0, float(1 << 50)):  # a clock at 1970, or far in the future: not believed
        assert savepoints.restore_token(7, clock) == 7 + savepoints.RESTORE_TOKEN_GAP


def test_a_restore_opens_again_the_finished_streams_its_job_reads() -> None:
    """Review of watermarks (3): a submit opens again a stream whose injectors all finished (a
    new job starts with nothing, not at the end of time); a restore did not, so the restored
    job's input read as finished: every saved window fired at once, and what was sent again
    counted late."""
    async def run() -> None:
        store = MemoryStore()
        store.apply(Change(workers={"w": WorkerInfo("127.0.0.1:1")}, finished_streams={"in": True}))
        core = await _leader(store, [0.0])  # type: ignore[arg-type]
        assert "in" in core.image.finished_streams
        manifest = {"topology": _topology().to_json(), "watermarks": {},
                    "tablets": [{"computation": "a", "key_range": 0, "start": 0, "end": 1 << 64, "token": 3}]}
        await savepoints.restore_begin(core, manifest, "one")
        assert "in" not in core.image.finished_streams
        assert "in" not in store.snap.finished  # stored: a new leader keeps it open

    asyncio.run(run())


def test_a_manifest_whose_ranges_do_not_tile_the_key_space_is_refused_before_anything_is_written() -> None:
    """Review of security: a manifest's ranges and tokens were stored as given; a token past 64
    bits (or a range past the key space) made every later routing fail to encode, stalling
    every job of the cluster, and a gap or an overlap broke exactly-once quietly."""
    import pytest

    from runtime.errors import MillstreamError

    async def run() -> None:
        store = MemoryStore()
        store.apply(Change(workers={"w": WorkerInfo("127.0.0.1:1")}))
        core = await _leader(store, [0.0])  # type: ignore[arg-type]
        written = len(store.changes)
        half = 1 << 63
        for tablets in ([{"key_range": 0, "start": 0, "end": 1 << 64, "token": (1 << 64) - 1}],
                        [{"key_range": 0, "start": 0, "end": (1 << 64) + 5, "token": 3}],
                        [{"key_range": 0, "start": 0, "end": half, "token": 3},
                         {"key_range": 1, "start": half + 1, "end": 1 << 64, "token": 3}],
                        [{"key_range": 0, "start": 0, "end": half, "token": 3}]):
            manifest = {"topology": _topology().to_json(), "watermarks": {},
                        "tablets": [{"computation": "a", **t} for t in tablets]}
            with pytest.raises(MillstreamError, match="the savepoint is damaged"):
                await savepoints.restore_begin(core, manifest, "one")
        assert len(store.changes) == written

    asyncio.run(run())
