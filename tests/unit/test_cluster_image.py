"""The leader's image (master/image.py): changed through apply, rebuilt by a new leader from
what etcd holds through the same apply, and read by pure views (master/views.py)."""

from __future__ import annotations

import asyncio
import json
import math

import pytest

from master import lifecycle, membership, progress
from master.change import Change, InjectorPromise, WorkerInfo
from master.core import MasterCore
from master.image import ClusterImage, Problem
from master.scheduler import Ownership
from master.views import routing_of
from runtime import Topology
from runtime.delivery import from_outside
from runtime.engine import DEFAULT_DEDUP_RETENTION_S, EngineOptions
from runtime.errors import ConfigError
from runtime.record import END_OF_TIME, MIN_TIME
from runtime.wire import millstream_pb2 as pb
from tests.masterkit import MemoryStore, leader


def _topology(name: str = "job", stream: str = "in") -> Topology:
    topo = Topology(name)
    topo.add_computation(f"{name}-a", "x:A", inputs={stream: None}, outputs=[f"{name}-ab"], key_ranges=2,
                         params={"n": "3"}, fsync=False, dedup_retention=90)
    topo.add_computation(f"{name}-b", "x:B", inputs={f"{name}-ab": None}, key_ranges=1, replication=3)
    return topo


def _durable(image: ClusterImage) -> dict[str, object]:
    """What etcd keeps, as the image holds it."""
    return {"topologies": {n: t.to_json() for n, t in image.topologies.items()},
            "jobs": {n: j.to_doc() for n, j in image.jobs.items()},
            "ranges": {c: r.to_doc() for c, r in image.ranges.items()}, "dropped": image.dropped,
            "tablets": image.owners(), "published": image.published,
            "workers": {w: (e.address, e.zone, e.code) for w, e in image.workers.items()},
            "identities": image.identities, "finished": image.finished_streams,
            "injectors": {n: i.promise() for n, i in image.injectors.items()}}


async def _busy_leader(store: MemoryStore) -> MasterCore:
    core = leader(store)
    await core.become_leader()
    for i in range(2):
        await membership.register(core, f"127.0.0.1:{i + 1}", zone=f"z{i}", allowed_code=["x"])
    await lifecycle.submit(core, _topology().to_json())
    await lifecycle.submit(core, _topology("other", "feed").to_json())
    core.report_injector("src", "in", 500, "i1")
    core.report_injector("daily", "in", 700, "run1", retired=True)  # its retirement is kept too
    core.report_injector("done", "feed", END_OF_TIME)
    await progress.advance(core)
    return core


def test_a_new_leader_builds_the_same_image_from_what_the_old_one_wrote() -> None:
    async def main() -> None:
        store = MemoryStore()
        old = await _busy_leader(store)
        assert old.image.finished_streams == {"feed"} and "done" not in old.image.injectors
        new = leader(store)
        await new.become_leader()
        assert _durable(new.image) == _durable(old.image)
        # What it heard is not stored: it trusts no worker until it reports.
        assert not any(w.heard for w in new.image.workers.values())

    asyncio.run(main())


def test_every_command_is_one_change_written_before_it_is_applied() -> None:
    class Checking(MemoryStore):
        def apply(self, change: Change, term: int | None = None) -> None:
            for key in change.tablets:  # written first: the image does not have it yet
                t = core.image.tablets.get(key)
                assert t is None or t.own != change.tablets[key], key
            super().apply(change)

    store = Checking()
    core = leader(store)

    async def main() -> None:
        await _busy_setup(core)

    async def _busy_setup(c: MasterCore) -> None:
        await c.become_leader()
        await membership.register(c, "127.0.0.1:1", allowed_code=["x"])
        await lifecycle.submit(c, _topology().to_json())
        await lifecycle.cancel(c, "job")

    asyncio.run(main())
    assert store.changes and all(isinstance(c, Change) for c in store.changes)
    assert "job" not in core.image.topologies and not core.image.tablets


def test_a_cancelled_jobs_closing_primary_cannot_drop_a_follower_from_its_kept_state() -> None:
    """Cancelled with its state kept, a job's tablets close; a primary's last batch that its
    follower (routed without the job) refuses used to drop that follower from the in-sync set,
    leaving the kept state on one copy until the job resumed (lifecycle chaos seed 507). The
    leader refuses the drop: the batch fails, and both copies keep the state. A running job's
    primary still drops a follower that stopped answering."""
    from runtime.errors import StaleTokenError

    core = leader()

    async def main() -> None:
        await core.become_leader()
        await core.commit(Change(topologies={"job": _topology(), "other": _topology("other", "in2")},
                                 workers={"w": WorkerInfo("a:1"), "v": WorkerInfo("a:2")},
                                 tablets={(c, r): Ownership("w", 1, ("v",), ("w", "v"))
                                          for c in ("job-a", "other-a") for r in (0, 1)}))
        await lifecycle.cancel(core, "job", keep_state=True)
        with pytest.raises(StaleTokenError, match="job is cancelled"):
            await core.update_in_sync("job-a", 0, 1, "v", add=False, primary="w")
        assert core.image.tablets[("job-a", 0)].own.in_sync == ("w", "v")
        assert await core.update_in_sync("other-a", 0, 1, "v", add=False, primary="w") == ("w",)

    asyncio.run(main())


def test_a_tablet_that_is_gone_leaves_nothing_behind() -> None:
    image = ClusterImage()
    image.apply(Change(topologies={"job": _topology()}, workers={"w": WorkerInfo("a:1")},
                       tablets={("job-a", 0): Ownership("w", 1), ("job-a", 1): Ownership("w", 1)}), 0.0)
    image.workers["w"].problems = {("job-a", 0): Problem("broken", 3, 1.0)}
    image.heartbeat("w", [pb.HeldTablet(computation="job-a", key_range=0, token=1, has_work=True, oldest_work=7)],
                    1, [pb.TabletProblem(computation="job-a", key_range=0, error="broken")], 0, 0.0)
    assert image.settler.value(("job-a", 0), 0.0) == 7
    image.apply(Change(gone=[("job-a", 0)]), 0.0)
    assert ("job-a", 0) not in image.tablets and not image.workers["w"].problems
    assert image.settler.value(("job-a", 0), 0.0) is None


def test_a_finished_name_goes_with_its_stream_marked_and_a_name_back_meanwhile_stays() -> None:
    image = ClusterImage()
    image.apply(Change(injectors={"n": InjectorPromise("s", END_OF_TIME, {"": END_OF_TIME}),
                                  "m": InjectorPromise("s", END_OF_TIME, {"": END_OF_TIME})}), 0.0)
    assert image.injectors["n"].finished and image.injectors["m"].finished
    image.injectors["m"].report("again", 5, False, 1.0)  # a new registration under the name
    image.apply(Change(injectors_gone=["n", "m"], finished_streams={"s": True}), 1.0)
    assert set(image.injectors) == {"m"} and image.injectors["m"].dirty and image.finished_streams == {"s"}


def test_the_routing_carries_the_engine_options_typed_and_the_users_params_alone() -> None:
    image = ClusterImage(replication=2)
    image.apply(Change(topologies={"job": _topology()}), 0.0)
    routes = {c.name: c for c in routing_of(image).computations}
    a, b = routes["job-a"], routes["job-b"]
    assert (a.options.fsync, a.options.dedup_retention_s, a.options.replication) == (False, 90.0, 2)
    assert (b.options.fsync, b.options.dedup_retention_s, b.options.replication) == (
        True, DEFAULT_DEDUP_RETENTION_S, 3)
    assert dict(a.params) == {"n": "3"} and dict(b.params) == {}
    assert EngineOptions.of_route(a) == EngineOptions(False, 90.0, 2)


@pytest.mark.parametrize(("options", "says"), [
    (None, "carries no engine options"),
    (pb.EngineOptions(fsync=True, dedup_retention_s=0, replication=1), "not a positive number of seconds"),
    (pb.EngineOptions(fsync=True, dedup_retention_s=math.inf, replication=1), "not a positive number"),
    (pb.EngineOptions(fsync=True, dedup_retention_s=60, replication=0), "replication 0 is not a number of copies"),
    (pb.EngineOptions(fsync=True, dedup_retention_s=60, replication=65), "from 1 to 64"),
])
def test_a_route_whose_engine_options_break_the_contract_is_refused(options: pb.EngineOptions | None,
                                                                     says: str) -> None:
    route = pb.ComputationRoute(name="c", exactly_once=True)
    if options is not None:
        route.options.CopyFrom(options)
    with pytest.raises(ConfigError, match=f"computation 'c': .*{says}"):
        EngineOptions.of_route(route)


def test_only_a_worker_saying_so_sends_from_inside_the_cluster() -> None:
    def req(kind: pb.SenderKind, sender: str = "") -> pb.DeliverRequest:
        return pb.DeliverRequest(computation="c", sender=sender, sender_kind=kind)

    assert not from_outside(req(pb.SENDER_WORKER), worker_role=True)
    assert from_outside(req(pb.SENDER_WORKER), worker_role=False)  # an injector's token cannot claim it
    assert from_outside(req(pb.SENDER_INJECTOR), worker_role=True)
    assert from_outside(req(pb.SENDER_UNSPECIFIED), worker_role=True)  # an older sender: from outside
    assert from_outside(req(pb.SENDER_UNSPECIFIED, "up"), worker_role=True)  # the name decides nothing


def test_the_status_document_keeps_every_field_and_is_plain_json() -> None:
    async def main() -> None:
        core = await _busy_leader(MemoryStore())
        for w in core.image.workers:  # every primary reports its tablets idle
            core.heartbeat(w, [pb.HeldTablet(computation=c, key_range=r, token=t.own.token)
                               for (c, r), t in core.image.tablets.items() if t.own.worker == w], 1)
        await progress.advance(core)
        doc = json.loads(json.dumps(core.status()))
        assert {"computations", "liveness", "etcd", "injectors", "finished_streams", "expired_injectors",
                "stale_reports", "workers", "jobs", "topologies", "tablets", "reshards", "replication"} <= set(doc)
        tablet = doc["tablets"][0]
        assert {"computation", "key_range", "start", "end", "primary", "worker", "address", "followers",
                "in_sync", "token", "load_median", "replication", "health"} == set(tablet)
        assert {"id", "address", "tablets", "followed", "zone", "last_heartbeat_ms_ago"} == set(doc["workers"][0])
        assert doc["liveness"]["registrations"] == 2 and doc["finished_streams"] == ["feed"]
        src, daily = sorted(doc["injectors"], key=lambda i: i["name"] != "src")
        assert (src["name"], src["watermark"], src["finished"], src["stale"]) == ("src", 500, False, False)
        assert (daily["name"], daily["watermark"]) == ("daily", 700)
        assert doc["computations"]["job-a"]["low_watermark"] == 500
        assert doc["computations"]["other-a"]["low_watermark"] == END_OF_TIME  # its stream finished
        assert doc["computations"]["job-b"]["low_watermark"] == 500  # held by its input, not by itself
        assert doc["computations"]["job-b"]["held_by"] == "injector 'src'"

    asyncio.run(main())


def test_a_new_job_reading_a_finished_stream_opens_it_again() -> None:
    async def main() -> None:
        core = await _busy_leader(MemoryStore())
        await lifecycle.cancel(core, "other")
        await lifecycle.submit(core, _topology("again", "feed").to_json())
        assert "feed" not in core.image.finished_streams
        await progress.advance(core)
        assert core.image.published.get("again-a", MIN_TIME) == MIN_TIME  # fed by nobody yet

    asyncio.run(main())
