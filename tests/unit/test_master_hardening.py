"""The leader against concurrent injectors, oversized input and abusive HTTP clients,
without etcd (an in-memory store) and without a cluster."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest

from master import lifecycle, membership, progress, web
from master.change import Change
from master.core import MasterConfig, MasterCore
from master.scheduler import Ownership
from master.server import Master, MasterOptions
from master.store import EtcdConfig
from runtime import Topology, http
from runtime.client import MAX_TOPOLOGY_BYTES, check_topology_size
from runtime.errors import ConfigError, MillstreamError, RoleError, TopologyError
from runtime.wire import millstream_pb2 as pb
from tests.masterkit import END, MemoryStore, hold, idle_report, leader, seed


def _core(store: MemoryStore | None = None) -> MasterCore:
    core = leader(store)
    topo = Topology("one")
    topo.add_computation("a", "x:A", inputs={"in": None}, key_ranges=1)
    seed(core, topo)
    return core


def _idle(core: MasterCore, seq: int) -> None:
    core.heartbeat("w", [idle_report("a")], seq)


# ------------------------------------------------------------------ W4: incarnations


def test_w4_two_live_injectors_under_one_name_each_hold_the_stream() -> None:
    """One finishing must not release records the other still has in flight."""
    core = _core()

    async def main() -> None:
        core.report_injector("loader", "in", 100, "first")
        core.report_injector("loader", "in", 40, "second")  # a second, slower incarnation
        core.report_injector("loader", "in", 200, "first")  # the first moves on: min still 40
        _idle(core, 1)
        await progress.advance(core)
        assert core.image.published["a"] == 40
        core.report_injector("loader", "in", END, "first")  # the first finishes
        _idle(core, 2)
        await progress.advance(core)
        assert hold(core, "loader") == ("in", 40)
        assert core.image.published["a"] == 40  # not at the end of time: "second" still holds
        core.report_injector("loader", "in", END, "second")
        _idle(core, 3)
        await progress.advance(core)
        assert hold(core, "loader") is None
        assert core.image.published["a"] == END

    asyncio.run(main())


def test_w4_a_new_leader_keeps_the_hold_of_every_incarnation() -> None:
    store = MemoryStore()
    core = _core(store)

    async def main() -> None:
        core.report_injector("loader", "in", 100, "first")
        core.report_injector("loader", "in", 40, "second")
        await progress.advance(core)
        assert store.load().injector_incarnations["loader"] == {"first": 100, "second": 40}
        successor = leader(store)
        await successor.become_leader()
        successor.report_injector("loader", "in", END, "second")
        assert hold(successor, "loader") == ("in", 100)  # "first" still holds

    asyncio.run(main())


def test_w4_an_operator_release_drops_every_incarnation_and_unknown_names_are_refused() -> None:
    core = _core()

    async def main() -> None:
        core.report_injector("loader", "in", 10, "crashed")
        core.report_injector("loader", "in", 20, "other")
        with pytest.raises(MillstreamError, match="no injector 'typo' holds stream 'in'"):
            core.report_injector("typo", "in", END, release=True, operator=True)
        core.report_injector("loader", "in", END, release=True, operator=True)
        _idle(core, 1)
        await progress.advance(core)
        assert hold(core, "loader") is None
        assert core.image.published["a"] == END

    asyncio.run(main())


def test_n9_only_an_operator_may_release_and_a_live_name_cannot_be_moved_to_another_stream() -> None:
    """Review N9: an injector's token could release every hold under any name, or drop them
    by reporting the name on another stream: either jumped that stream to the end of time."""
    core = leader()
    topo = Topology("one")
    topo.add_computation("a", "x:A", inputs={"in": None}, key_ranges=1)
    topo.add_computation("b", "x:B", inputs={"other": None}, key_ranges=1)
    seed(core, topo)

    async def main() -> None:
        core.report_injector("loader", "in", 10, "theirs")
        with pytest.raises(RoleError, match="releasing injector 'loader' .* operator token"):
            core.report_injector("loader", "in", END, release=True)
        with pytest.raises(MillstreamError, match="injector 'loader' still holds stream 'in' .* release"):
            core.report_injector("loader", "other", END, "mine")
        assert core.image.injectors["loader"].incarnations == {"theirs": 10}
        core.report_injector("loader", "in", END, "theirs")  # finished: the name is free again
        core.report_injector("loader", "other", 20, "next")
        assert hold(core, "loader") == ("other", 20)

    asyncio.run(main())


def test_n9_the_servicer_takes_release_from_the_operator_token_only() -> None:
    """Through the role check and the master's servicer: the injector token is refused."""
    from types import SimpleNamespace

    import grpc

    from master.server import MasterServicer
    from runtime.security import Security
    from runtime.wire import millstream_pb2_grpc as rpc

    core = _core()
    core.report_injector("loader", "in", 10, "theirs")
    tokens = {"worker": "w-secret", "injector": "i-secret", "operator": "o-secret"}

    async def main() -> None:
        server = grpc.aio.server(interceptors=Security(role_tokens=tokens).server_interceptors())
        master = SimpleNamespace(core=core, leadership_confirmed=lambda: True)
        rpc.add_MasterServicer_to_server(MasterServicer(master), server)  # type: ignore[arg-type]
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        release = pb.InjectorReport(name="loader", stream="in", watermark=END, release=True)
        try:
            async with Security(token=tokens["injector"]).aio_channel(f"127.0.0.1:{port}") as ch:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await rpc.MasterStub(ch).ReportInjector(release)
                assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
                assert hold(core, "loader") == ("in", 10)
            async with Security(token=tokens["operator"]).aio_channel(f"127.0.0.1:{port}") as ch:
                await rpc.MasterStub(ch).ReportInjector(release)
            assert hold(core, "loader") == ("in", END)
        finally:
            await server.stop(None)

    asyncio.run(main())


def test_w4_an_incarnation_that_is_not_a_short_printable_id_is_refused() -> None:
    core = _core()
    with pytest.raises(ConfigError, match="incarnation 'x+' is not an id of at most 64"):
        core.report_injector("loader", "in", 0, "x" * 65)
    with pytest.raises(ConfigError, match="printable"):
        core.report_injector("loader", "in", 0, "a\nb")
    assert hold(core, "loader") is None


# ------------------------------------------------------------------ B31: topology size


def _huge_topology() -> Topology:
    topo = Topology("huge")
    topo.add_computation("a", "x:A", inputs={"in": None}, params={"blob": "x" * 2_000_000})
    return topo


def test_b31_a_topology_too_large_for_etcd_is_refused_by_the_master_with_its_size() -> None:
    core = _core()
    with pytest.raises(TopologyError, match=r"topology 'huge' is \d+ bytes of JSON, over the limit of 1000000"):
        asyncio.run(lifecycle.submit(core, _huge_topology().to_json()))
    assert "huge" not in core.image.topologies


def test_b31_the_client_refuses_it_before_sending() -> None:
    doc = _huge_topology().to_json()
    with pytest.raises(TopologyError, match="keep large data out of computation params"):
        check_topology_size("huge", doc)
    check_topology_size("small", "x" * MAX_TOPOLOGY_BYTES)  # at the limit: accepted


# ------------------------------------------------------------------ S7: HTTP side


async def _http(raw: bytes, client_ssl: Any = None, **serve: Any) -> bytes:
    """``raw`` sent to a console serving ``{"ok": true}`` as its status (``serve``: more of
    ``web.serve``'s arguments), and all it answered."""
    async def status() -> dict[str, Any]:
        return {"ok": True}

    server, address = await web.serve("127.0.0.1:0", status, **serve)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", int(address.rpartition(":")[2]), ssl=client_ssl)
        writer.write(raw)
        await writer.drain()
        reply = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        return reply
    finally:
        server.close()
        await server.wait_closed()


def test_s7_a_request_with_too_many_header_lines_is_refused() -> None:
    headers = b"".join(b"X-%d: y\r\n" % i for i in range(http.MAX_HEADER_LINES + 1))
    reply = asyncio.run(_http(b"GET /status.json HTTP/1.1\r\n" + headers + b"\r\n"))
    assert reply.startswith(b"HTTP/1.1 431 ")
    assert b"at most 100 header lines" in reply


def test_s7_an_overlong_request_line_is_refused() -> None:
    reply = asyncio.run(_http(b"GET /" + b"a" * (2 * http.MAX_LINE_BYTES) + b" HTTP/1.1\r\n\r\n"))
    assert reply.startswith(b"HTTP/1.1 431 ")


def test_s7_an_ordinary_request_is_served() -> None:
    reply = asyncio.run(_http(b"GET /status.json HTTP/1.1\r\nHost: x\r\n\r\n"))
    assert reply.startswith(b"HTTP/1.1 200 OK")
    assert json.loads(reply.split(b"\r\n\r\n", 1)[1]) == {"ok": True}


def test_s7_status_does_not_read_etcd_per_request() -> None:
    class NoEtcd:
        def masters(self) -> list[dict[str, str]]:
            raise AssertionError("status read the masters list from etcd")

    master = Master.__new__(Master)
    master.store = NoEtcd()  # type: ignore[assignment]
    master.core = _core()
    master.address, master.identity = "127.0.0.1:7070", "m1"
    master._masters_cache = ["127.0.0.1:7071"]
    doc = asyncio.run(master._status_doc())
    assert doc is not None
    assert doc["masters"]["all"] == ["127.0.0.1:7070", "127.0.0.1:7071"]


# ------------------------------------------------------------------ N12: etcd upkeep off the tick


class SlowDefragStore(MemoryStore):
    """An etcd over the defragment threshold whose defragment takes until ``done`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.defragmenting = threading.Event()
        self.done = threading.Event()
        self.keep_alives = 0

    def db_size(self) -> int:
        return 1 << 40 if not self.done.is_set() else 1 << 20

    def defragment(self) -> None:
        self.defragmenting.set()
        assert self.done.wait(30), "the test never let the defragment end"

    def campaign(self, identity: Any, ttl_s: int) -> bool:
        return True

    def keep_alive(self) -> bool:
        self.keep_alives += 1
        return True

    def masters(self) -> list[dict[str, str]]:
        return []


def test_n12_a_long_defragment_does_not_hold_up_the_leaders_tick() -> None:
    store = SlowDefragStore()
    clock = [0.0]
    core = MasterCore(store, MasterConfig(), lambda: clock[0])  # type: ignore[arg-type]

    async def main() -> None:
        await asyncio.wait_for(core.tick(), 10)  # starts the upkeep, which defragments
        assert await asyncio.to_thread(store.defragmenting.wait, 10)
        for _ in range(3):  # the leader keeps ticking while etcd defragments
            clock[0] += 50
            await asyncio.wait_for(core.tick(), 10)
        clock[0] += MasterConfig().etcd_check_s * 1000
        upkeep = core.upkeep
        await asyncio.wait_for(core.tick(), 10)
        assert core.upkeep is upkeep, "one upkeep at a time"
        store.done.set()
        assert upkeep is not None
        await asyncio.wait_for(upkeep, 10)
        assert core.image.etcd_db_bytes == 1 << 20  # measured again after the defragment

    try:
        asyncio.run(main())
    finally:
        store.done.set()


def test_n12_the_leader_keeps_its_lease_alive_through_a_long_defragment() -> None:
    store = SlowDefragStore()
    master = Master.__new__(Master)
    master.options = MasterOptions(etcd=None, listen="", config=MasterConfig(lease_ms=1000))  # type: ignore[arg-type]
    master.store = store  # type: ignore[assignment]
    master.identity, master.address, master.core, master.leader_address = "m1", "127.0.0.1:1", None, None
    master.sure_until, master._refreshed_at = 0.0, float("-inf")
    master._masters_cache, master._autoscaled_at, master._masters_read_at = [], -1e18, float("-inf")

    async def main() -> None:
        lead = asyncio.create_task(master._lead())
        try:
            assert await asyncio.to_thread(store.defragmenting.wait, 10)
            before = store.keep_alives
            # Refreshed every quarter of the 2 s TTL: two more within the deadline, while the
            # defragment still runs (the leader's loop used to wait for it).
            await wait_until_async(lambda: store.keep_alives >= before + 2, 10, "two lease refreshes")
            assert not store.done.is_set() and master.leadership_confirmed()
        finally:
            store.done.set()
            lead.cancel()
            await asyncio.gather(lead, return_exceptions=True)

    try:
        asyncio.run(main())
    finally:
        store.done.set()


async def wait_until_async(cond: Any, timeout: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)  # poll interval of this deadline-bounded wait


# ------------------------------------------------------------------ N17: per-worker state


def test_n17_a_worker_that_leaves_or_expires_leaves_nothing_behind() -> None:
    """Everything the leader keeps of a worker is its one image entry: gone when it leaves or
    its lease expires (review N17: one entry per worker ever, in seven dicts, before)."""
    clock = [0.0]
    core = leader(clock=lambda: clock[0])

    async def main() -> None:
        for i in range(3):
            wid, _ = await membership.register(core, f"127.0.0.1:{i + 1}", zone=f"z{i}")
            core.heartbeat(wid, report_seq=1, routing_version=core.version)
        workers = core.image.workers
        leaving, expiring, staying = sorted(workers, key=lambda w: workers[w].address)
        await membership.drain(core, leaving)
        assert workers[leaving].draining and workers[leaving].heard and workers[leaving].zone == "z0"
        await membership.leave(core, leaving)
        clock[0] += core.config.lease_ms / 2
        core.heartbeat(staying, report_seq=2, routing_version=core.version)
        clock[0] += core.config.lease_ms / 2 + 1
        await core.tick()  # `expiring` missed its lease
        assert set(workers) == set(core.reported()) == {staying}
        assert set(core.image.identities) == {leaving, expiring, staying}  # they may come back on their disks

    asyncio.run(main())


class _HeldWrites(MemoryStore):
    """A store whose write of watermarks waits until the test lets it go (etcd slow)."""

    def __init__(self) -> None:
        super().__init__()
        self.writing = threading.Event()
        self.go = threading.Event()

    def apply(self, change: Any, term: int | None = None) -> None:
        if change.watermarks:
            self.writing.set()
            assert self.go.wait(10)
        super().apply(change)


def test_an_injector_registering_during_a_ticks_write_is_answered_after_its_publish() -> None:
    """Review of watermarks (1): a tick took the injectors' holds, then wrote the watermarks
    they allowed to etcd; a new name registering (at the start of time) during that write was
    answered at once, and the tick then published a watermark computed without it: the new
    injector, told it holds its stream, had records below it counted late."""
    store = _HeldWrites()
    core = _core(store)

    async def main() -> None:
        core.report_injector("old", "in", 2_000, "first")
        _idle(core, 1)
        tick = asyncio.ensure_future(progress.advance(core))
        await asyncio.to_thread(store.writing.wait, 10)  # the tick writes a = 2000
        order: list[str] = []
        tick.add_done_callback(lambda _: order.append("published"))
        joining = asyncio.ensure_future(core.report_injector_between_ticks("new", "in", -(1 << 63), "n"))
        joining.add_done_callback(lambda _: order.append("registered"))
        await asyncio.sleep(0)  # (one turn: the report runs as far as it can)
        store.go.set()
        await asyncio.wait_for(asyncio.gather(tick, joining), 10)
        assert order == ["published", "registered"]  # answered once the tick it missed is out
        core.report_injector("old", "in", 3_000, "first")
        _idle(core, 2)
        await progress.advance(core)
        assert core.image.published["a"] == 2_000  # and from then on it holds the stream (at MIN)

    asyncio.run(main())


def test_a_worker_that_left_no_longer_vouches_for_its_tablets() -> None:
    """Review of watermarks (4): a worker leaving cleanly stops reporting before its last
    batches commit, then leaves; a tablet with no other copy stays unassigned under the same
    token, and its last report (idle, from before those batches) kept counting until it timed
    out: the tick could publish past a timer the last batch had set."""
    core = _core()

    async def main() -> None:
        core.report_injector("feed", "in", 1_000, "f")
        _idle(core, 1)
        await progress.advance(core)
        assert core.image.published["a"] == 1_000
        await membership.leave(core, "w")
        assert core.image.tablets[("a", 0)].own.worker == ""  # (no copy elsewhere: unassigned)
        core.report_injector("feed", "in", 5_000, "f")
        await progress.advance(core)
        assert core.image.published["a"] == 1_000  # held until its tablet reports again

    asyncio.run(main())


def test_an_older_heartbeat_served_late_does_not_replace_a_newer_report() -> None:
    """Review of watermarks (lesser): reports were taken whatever their sequence, so an older
    heartbeat served after a newer one (a retried call) put back a tablet's older progress:
    idle, where the newer report held a record at 1,500."""
    core = _core()

    async def main() -> None:
        core.report_injector("feed", "in", 5_000, "f")
        core.heartbeat("w", [pb.HeldTablet(computation="a", key_range=0, token=1, has_work=True,
                                           oldest_work=1_500)], 5)
        _idle(core, 4)  # the older heartbeat, served late
        await progress.advance(core)
        assert core.image.published["a"] == 1_500

    asyncio.run(main())


def test_a_tablet_moved_off_its_worker_in_the_change_that_removes_the_worker_loses_its_report() -> None:
    """Review of this round's fix: the reports were cleared with the worker's removal, after
    the same change had already moved its tablets (unassigned under the same token), so the
    stale report stayed. A tablet whose owner changes now loses its report."""
    core = _core()
    _idle(core, 1)
    assert core.image.tablets[("a", 0)].report is not None
    asyncio.run(core.commit(Change(workers={"w": None}, tablets={("a", 0): Ownership("", 1)})))
    assert core.image.tablets[("a", 0)].report is None


def test_a_drain_whose_release_a_failover_lost_still_reaches_drained() -> None:
    """Review of the master: a drain released its input's injectors in memory and wrote only
    'released'; a leader lost before the next tick wrote the injectors out left a successor
    with their old promises, which nothing moved again (the stream takes no report any more):
    the job stayed draining, its windows unfired, for the injectors' expiry (a day)."""
    store = MemoryStore()
    core = _core(store)

    async def main() -> None:
        core.report_injector("feeder", "in", 100, "f1")
        _idle(core, 1)
        await progress.advance(core)
        assert core.image.published["a"] == 100
        await lifecycle.drain(core, "one")
        core.heartbeat("w", [idle_report("a")], 2, (), core.version)  # the drain's routing applied
        await lifecycle.advance(core)
        assert core.image.jobs["one"].released
        successor = leader(store)  # the leader is lost before its next tick wrote the release out
        await successor.become_leader()
        assert hold(successor, "feeder") == ("in", 100)
        for seq in range(3, 8):
            successor.heartbeat("w", [idle_report("a")], seq, (), successor.version)
            await progress.advance(successor)
            await lifecycle.advance(successor)
        assert successor.image.published["a"] == END
        assert successor.image.jobs["one"].state == "drained"

    asyncio.run(main())


def test_a_worker_heard_while_the_tick_waits_for_the_lock_keeps_its_lease() -> None:
    """Review of the master: the tick chose the workers past their lease, then waited for the
    leader's lock; a heartbeat answered meanwhile (the worker trusts its lease again) did not
    save it from being deleted and its tablets moved: two primaries at once."""
    clock = [0.0]
    core = leader(clock=lambda: clock[0])
    topo = Topology("one")
    topo.add_computation("a", "x:A", inputs={"in": None}, key_ranges=1)
    seed(core, topo)

    async def nothing(_: Any) -> None:
        return None

    async def main() -> None:
        core.heartbeat("w", [idle_report("a")], 1)
        clock[0] += core.config.lease_ms + 1  # w is past its lease now
        core._replan_soon = ""  # (no rebalance first: it would wait for the lock before choosing)
        await core._lock.acquire()  # a command holds the leader's lock (an etcd write, say)
        tick = asyncio.get_running_loop().create_task(core.tick())
        for _ in range(100):  # until the tick waits for the lock
            await asyncio.sleep(0)
            if core._lock._waiters:  # type: ignore[attr-defined]
                break
        assert core._lock._waiters, "the tick never waited for the lock"  # type: ignore[attr-defined]
        core.heartbeat("w", [idle_report("a")], 2)  # answered: w trusts its lease again
        core._lock.release()
        await tick
        assert "w" in core.image.workers

    original = progress.advance
    progress.advance = nothing  # type: ignore[assignment]  # (the tick's watermark step: not the point)
    try:
        asyncio.run(main())
    finally:
        progress.advance = original  # type: ignore[assignment]


def test_losing_leadership_stops_a_split_or_merge_under_way() -> None:
    """Review of the master: a leader stepping down left its autoscaling task running, whose
    waits for the next routing return at once on a closed core: it spun the event loop for up
    to a minute, then answered its caller with a misleading error."""
    core = leader()

    async def main() -> None:
        started = asyncio.Event()

        async def resharding() -> None:
            started.set()
            await asyncio.Event().wait()  # (waits for routings: for ever here)

        core.autoscaling = asyncio.get_running_loop().create_task(resharding())
        await started.wait()
        core.shutdown()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(core.autoscaling, 5)

    asyncio.run(main())


def test_a_core_whose_leadership_ended_writes_nothing() -> None:
    """Review of the master: a command of a core that stepped down could still write once the
    same master was elected again (etcd's guard compares the leader key, which the new term
    wrote the same): the new core's image never saw it (an in-sync removal, a pause ended)."""
    store = MemoryStore()
    core = _core(store)

    async def main() -> None:
        core.shutdown()
        with pytest.raises(MillstreamError, match="leadership ended"):
            await core.commit(Change(finished_streams={"in": True}))

    written = len(store.changes)
    asyncio.run(main())
    assert len(store.changes) == written


def test_a_split_or_merge_waiting_on_a_core_whose_leadership_ended_stops() -> None:
    """After review: an operator's split or merge (not the autoscaling task) waits for its
    ranges with core.changed(), which returned at once on a closed core: it spun until its
    timeout. It raises now."""
    core = leader()

    async def main() -> None:
        core.shutdown()
        with pytest.raises(MillstreamError, match="leadership ended"):
            await core.changed(5)

    asyncio.run(main())


def test_the_etcd_password_is_not_in_the_configs_repr() -> None:
    config = EtcdConfig.parse("http://127.0.0.1:2379", user="millstream", password="s3cr3t-pw")
    assert "s3cr3t-pw" not in repr(config) and "s3cr3t-pw" not in str(config)
    assert "millstream" in repr(config) and config.password == "s3cr3t-pw"
