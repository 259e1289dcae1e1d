"""The leader against bad requests and a growing etcd (review S5, S6, G2, B29, B41)."""

from __future__ import annotations

import asyncio

import pytest

from injectors import Injector
from master.store import EtcdConfig, EtcdStore
from runtime.errors import MillstreamError
from tests.harness import Cluster, wait_until


def test_a_huge_or_unprintable_injector_name_is_refused_and_the_leader_keeps_leading(cluster: Cluster) -> None:
    """A 2 MB injector name used to crash the leader process (etcd: request too large)."""
    leader = cluster.client.status()["masters"]["leader"]
    with pytest.raises(MillstreamError, match="too long; use at most 512 bytes"):
        Injector(cluster.masters_arg, "lines", "x" * (2 << 20))
    with pytest.raises(MillstreamError, match="control characters"):
        Injector(cluster.masters_arg, "lines", "evil\n<img src=x onerror=alert(1)>")
    doc = cluster.client.status()
    assert doc["masters"]["leader"] == leader and all(m.alive() for m in cluster.masters)
    assert not doc["injectors"]


def test_status_shows_the_size_of_etcd(cluster: Cluster) -> None:
    wait_until(lambda: cluster.client.status()["etcd"]["db_size_bytes"] > 0, 30, "etcd's size in status")


def test_an_idle_follower_adds_nothing_to_etcd_history(tmp_path: object) -> None:
    """Campaigning as a follower used to rewrite masters/<id> every tick: ~16 revisions/s
    with nothing running, etcd's 2 GiB quota in about nine days."""
    with Cluster(str(tmp_path), masters=1, workers=0).running() as c:
        store = EtcdStore(EtcdConfig.parse(c.etcd_url))
        try:
            identity = {"id": "follower-under-test", "address": "127.0.0.1:1"}
            assert store.campaign(identity, 5) is False  # the running master leads
            before = store._client.get_response("/").header.revision
            for _ in range(50):  # fifty ticks' worth of campaigning
                store.campaign(identity, 5)
                assert store.keep_alive()
            after = store._client.get_response("/").header.revision
            assert after - before <= 3, (before, after)  # the leader may write meanwhile
        finally:
            store.resign()
            store.close()


def test_finish_raises_rather_than_leave_the_stream_held_silently(cluster: Cluster) -> None:
    """W5: finish() used to return after 5 s with its end of input never reported when the
    receivers of its last records did not report them. The stall is simulated by hiding the
    receivers' reports from this injector's view of the leader's answers (every other part
    is real); then they reappear and finish() goes through."""
    import os

    from runtime import Topology
    from runtime.errors import InjectionError

    topo = Topology("w5")
    topo.add_computation("w5-sink", "runtime.sinks:FileSink", inputs={"w5-in": None},
                         params={"path": os.path.join(cluster.data_dir, "w5")}, key_ranges=1)
    cluster.client.submit(topo)
    cluster.wait_assigned()
    inj = Injector(cluster.masters_arg, "w5-in", "w5-source", timeout=3)
    real = inj._marks._send
    stalled = [True]

    def report(wm: int, idle: bool) -> dict[str, int]:
        reported = real(wm, idle)
        return {w: 0 for w in reported} if stalled[0] else reported

    inj._marks._send = report  # type: ignore[method-assign]
    inj.send(b"k", b"v", 1_700_000_000_000_000)
    with pytest.raises(InjectionError, match="was not confirmed within 3s"):
        inj.finish()
    assert not inj.finished
    assert any(i["name"] == "w5-source" for i in cluster.client.status()["injectors"])  # still held
    stalled[0] = False
    inj.finish()
    inj.close()
    wait_until(lambda: not any(i["name"] == "w5-source" for i in cluster.client.status()["injectors"]), 30,
               "the finished injector to be cleaned up")


def test_two_live_injectors_under_one_name_each_hold_until_released(cluster: Cluster) -> None:
    """W4: the second injector under a name used to replace the first's registration, and
    the first one finishing deleted it: the stream jumped past the second's records."""
    import os

    from runtime import Topology

    topo = Topology("w4")
    topo.add_computation("w4-sink", "runtime.sinks:FileSink", inputs={"w4-in": None},
                         params={"path": os.path.join(cluster.data_dir, "w4")}, key_ranges=1)
    cluster.client.submit(topo)
    cluster.wait_assigned()
    t = 1_700_000_000_000_000

    def registration() -> int | None:
        return next((i["watermark"] for i in cluster.client.status()["injectors"] if i["name"] == "shared"), None)

    fast = Injector(cluster.masters_arg, "w4-in", "shared", timeout=10)
    slow = Injector(cluster.masters_arg, "w4-in", "shared", timeout=10)
    fast.advance_watermark(t + 100)
    slow.advance_watermark(t)
    fast.finish()
    fast.close()
    wait_until(lambda: registration() == t, 10, "the slower injector to hold the name at its promise")
    wm = cluster.client.status()["computations"]["w4-sink"]["low_watermark"]
    assert wm <= t, wm
    cluster.client.release_injector("shared", "w4-in")  # the operator gives up on it
    wait_until(lambda: registration() is None, 10, "the released name to be cleaned up")
    slow.close()


# ------------------------------------------------------------------ N13: large lifecycle changes


class Crash(BaseException):
    """The leader process dies here."""


@pytest.mark.parametrize("change", ["cancel", "update"])
def test_n13_a_leader_dying_inside_a_large_change_loses_no_tablet(tmp_path: object, change: str) -> None:
    """A change of more than 100 etcd operations spans several transactions. It used to
    delete tablets first and the topology last: a leader dying in between left the topology
    with tablets missing, and the next leader re-created them as new, empty, token-1 tablets.
    Only etcd runs here; the leaders are MasterCores in this process. The leader dies after
    the first, second and third of the change's four transactions."""

    from master import lifecycle, membership
    from master.core import MasterConfig, MasterCore
    from master.scheduler import Ownership
    from runtime import Topology

    big = Topology("big")
    for i in range(30):
        big.add_computation(f"c{i}", "tests.jobs:CountTo", inputs={f"s{i}": None}, key_ranges=4)
    smaller = Topology("big")  # the update keeps five of its computations, drops 25 with their state
    for i in range(5):
        smaller.add_computation(f"c{i}", "tests.jobs:CountTo", inputs={f"s{i}": None}, key_ranges=4)
    other = Topology("other")
    other.add_computation("bystander", "tests.jobs:CountTo", inputs={"b": None}, key_ranges=2)

    async def leader(store: EtcdStore) -> MasterCore:
        core = MasterCore(store, MasterConfig(replication=1, lease_ms=500), lambda: 0.0)
        await core.become_leader()
        return core

    async def run(core: MasterCore) -> None:
        if change == "cancel":
            await lifecycle.cancel(core, "big")
        else:
            await lifecycle.update(core, smaller.to_json(), drop_state=True)

    def check(store: EtcdStore, collected: bool = True) -> None:
        snap = store.load()
        wanted = {(s.name, r) for doc in snap.topologies.values()
                  for s in Topology.from_json(doc).computations.values() for r in range(s.key_ranges)}
        assert wanted <= set(snap.tablets), sorted(wanted - set(snap.tablets))  # none missing
        if collected:
            assert set(snap.tablets) == wanted  # none left behind
            assert set(snap.ranges) | set(snap.watermarks) <= {c for c, _ in wanted}
        # Every tablet holds state (token 5 and up): none was re-created empty under token 1.
        assert all(o.token >= 5 for o in snap.tablets.values()), sorted(
            k for k, o in snap.tablets.items() if o.token < 5)

    async def main(store: EtcdStore, crash_after: int) -> None:
        core = await leader(store)
        for i in range(2):
            await membership.register(core, f"127.0.0.1:{i + 2}")
        await lifecycle.submit(core, big.to_json())
        await lifecycle.submit(core, other.to_json())
        # Tablets that have moved and hold state: a token well above 1.
        held = {k: Ownership(t.own.worker, 5, t.own.followers, t.own.in_sync) for k, t in core.image.tablets.items()}
        store.put_tablets(held)
        core = await leader(store)  # reads them back
        real, calls = store._client.transaction, [0]

        def dies_after(*args: object, **kw: object) -> object:
            if calls[0] == crash_after:
                raise Crash
            calls[0] += 1
            return real(*args, **kw)

        store._client.transaction = dies_after  # one etcd transaction each
        with pytest.raises(Crash):
            await run(core)
        store._client.transaction = real
        check(store, collected=False)  # as the next leader finds it ...
        core = await leader(store)
        check(store)  # ... and after it collected what the change left behind
        await run(core)  # the command, repeated, completes the change
        check(store)
        snap = store.load()
        assert len(snap.tablets) == (2 if change == "cancel" else 22)
        assert ("cancelled" in snap.jobs["big"]["state"]) if change == "cancel" else "big" in snap.topologies

    with Cluster(str(tmp_path), masters=0, workers=0) as c:
        for crash_after in (1, 2, 3):
            store = EtcdStore(EtcdConfig.parse(c.etcd_url))
            try:
                store._client.delete_prefix("/millstream/")  # the round before's cluster
                assert store.campaign({"id": "m1", "address": "127.0.0.1:1"}, 30)
                asyncio.run(main(store, crash_after))
            finally:
                store.resign()
                store.close()


def test_a_write_begun_in_an_ended_term_is_refused_once_the_same_master_leads_again(tmp_path: object) -> None:
    """Review 3's list: writes were guarded by the leader key holding this master's identity,
    so a write a core began before its leadership lapsed, landing after the same master was
    elected again, passed. Each election is a term (the leader key's create revision): a core
    writes for its own, and etcd refuses another's without deposing the current one."""
    from master.change import Change
    from master.core import MasterConfig, MasterCore
    from master.store import NotLeaderError

    with Cluster(str(tmp_path), masters=0, workers=0) as c:
        store = EtcdStore(EtcdConfig.parse(c.etcd_url))
        try:
            identity = {"id": "m1", "address": "127.0.0.1:1"}
            assert store.campaign(identity, 30)
            first = MasterCore(store, MasterConfig(replication=1), lambda: 0.0)
            store.resign()  # its lease lapses: that leadership is over ...
            assert store.campaign(identity, 30)  # ... and the same master wins the next election
            second = MasterCore(store, MasterConfig(replication=1), lambda: 0.0)
            # A step-down that leaves the key alive (etcd unreachable for a tick): winning again
            # is a new term too.
            assert store.campaign(identity, 30)
            third = MasterCore(store, MasterConfig(replication=1), lambda: 0.0)
            assert len({first.term, second.term, third.term} - {None}) == 3
            for i, ended in enumerate((first, second)):
                with pytest.raises(NotLeaderError, match="earlier term"):
                    asyncio.run(ended.commit(Change(watermarks={f"c{i}": 5})))  # (its closed check passed)
            assert not {"c0", "c1"} & set(store.load().watermarks)
            asyncio.run(third.commit(Change(watermarks={"c": 6})))  # the current term still writes
            assert store.load().watermarks["c"] == 6
        finally:
            store.resign()
            store.close()
