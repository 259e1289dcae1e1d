"""Pipelined replication (performance study P7) with a primary and its follower in process:
a commit reaches the follower while the primary writes it, so the follower may hold a
commit its primary never wrote. Promoted, it is the tablet's (nothing of it was
acknowledged); but a primary that reopens after that failed write must not leave it
there under the same number as a different commit of its own (the term,
docs/replication.md)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Any

from runtime import Record
from runtime.faults import Faults
from runtime.wire import millstream_pb2 as pb
from tests.core.corekit import Posting, WriteFails, engine_options, nowhere
from worker.core import WorkerCore
from worker.sender import OK
from worker.storage import state_key
from worker.writes import read_log

KEY = ("tally", 0)


def _routing(version: int, token: int, primary: str, followers: list[str]) -> pb.Routing:
    r = pb.Routing(version=version)
    c = r.computations.add(name="tally", code="tests.core.jobs:Tally", outputs=[], key_ranges=1, exactly_once=True,
                           productions="strong", late_records="process", options=engine_options(replication=2))
    c.inputs.add(stream="in")
    a = c.assignments.add(key_range=0, worker_id=primary, address=f"{primary}:1", token=token)
    for f in followers:
        a.followers.add(worker_id=f, address=f"{f}:1")
    a.in_sync.extend([primary, *followers])
    return r


def _rec(i: int, value: bytes) -> Record:
    return Record(b"k", value, 1_700_000_000_000_000 + i, i.to_bytes(16, "big"))


class _Wire(Posting):
    """The network from the primary "w" to its follower "f", and the in-sync set as the
    leader keeps it (with every change asked for, in order)."""

    def __init__(self) -> None:
        self.follower: WorkerCore | None = None
        self.in_sync = {"w", "f"}
        self.changes: list[tuple[str, bool]] = []

    async def replicate(self, address: str, req: pb.ReplicateRequest) -> pb.ReplicateResponse | None:
        assert self.follower is not None
        return await self.follower.replicas.replicate(req)

    async def snapshot(self, address: str, chunk: pb.SnapshotChunk) -> pb.ReplicateResponse | None:
        assert self.follower is not None
        return await self.follower.replicas.install(chunk)

    async def update_in_sync(self, req: pb.InSyncRequest) -> tuple[str, ...]:
        self.changes.append((req.follower, req.add))
        (self.in_sync.add if req.add else self.in_sync.discard)(req.follower)
        return tuple(sorted(self.in_sync))


async def _until(cond: Callable[[], bool], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)  # poll interval of this deadline-bounded wait


async def _pair(tmp: str, wire: _Wire) -> tuple[WorkerCore, WorkerCore]:
    cores = []
    for name, channel in (("f", _Wire()), ("w", wire)):
        core = WorkerCore(os.path.join(tmp, name), f"{name}:1", nowhere, channel=channel)  # type: ignore[arg-type]
        core.worker_id = name
        core.renewed(core.now_ms(), 600_000)
        await core.apply_routing(_routing(1, 1, "w", ["f"]))
        cores.append(core)
    follower, primary = cores
    wire.follower = follower
    await _until(lambda: KEY in primary.tablets and KEY in follower.replicas.copies, "the tablet and its copy")
    return primary, follower


def _copy(follower: WorkerCore) -> tuple[int, bytes | None]:
    """The follower copy's last commit and its state of key k (as its log, not yet applied,
    leaves it: worker/replicastore.py)."""
    copy = follower.replicas.copies.get(KEY)
    if copy is None:
        return 0, None
    held, _ = read_log(copy.db)
    skey = state_key(b"k")
    return copy.index, held.last[skey] if skey in held.last else copy.db.get(skey)


async def _fail_next_write(primary: WorkerCore, follower: WorkerCore, value: bytes) -> None:
    """Deliver ``value`` as commit 2; the follower applies it, the primary's write fails."""
    store = primary.tablets[KEY].store
    store.db = WriteFails(store.db, lambda: _copy(follower)[0] >= 2)
    assert await primary.deliver("tally", 0, 1, [_rec(2, value)]) != OK  # acknowledged nowhere
    assert _copy(follower) == (2, b"a;" + value + b";")


def test_a_follower_holding_a_commit_its_dead_primary_never_wrote_is_promoted_with_it(tmp_path: Any) -> None:
    """The follower has commit N + 1 and the primary dies: promoted, the follower has it, and
    its sender's retry finds it there (a duplicate): nothing lost, nothing twice."""
    async def run() -> None:
        wire = _Wire()
        primary, follower = await _pair(str(tmp_path), wire)
        assert await primary.deliver("tally", 0, 1, [_rec(1, b"a")]) == OK
        await _fail_next_write(primary, follower, b"b")
        await primary.close_all()  # the primary dies
        await follower.apply_routing(_routing(2, 2, "f", []))  # the leader promotes the follower
        await _until(lambda: KEY in follower.tablets, "the promoted primary")
        assert await follower.deliver_counted("tally", 0, 2, [_rec(2, b"b")]) == (OK, 1)  # the retry
        assert await follower.deliver("tally", 0, 2, [_rec(3, b"c")]) == OK
        assert follower.tablets[KEY].store.get_state(b"k") == b"a;b;c;"
        await follower.close_all()
    asyncio.run(run())


def test_a_primary_reopened_after_a_failed_write_does_not_leave_its_follower_a_different_commit(
        tmp_path: Any) -> None:
    """The primary's write of commit N fails after the follower applied it; reopened (same
    token, next term), its commit N is another batch: the follower must not take it for a
    retry of the one it holds, but leave the in-sync set before it is acknowledged and
    catch up from a snapshot."""
    async def run() -> None:
        wire = _Wire()
        primary, follower = await _pair(str(tmp_path), wire)
        assert await primary.deliver("tally", 0, 1, [_rec(1, b"a")]) == OK
        term = primary.tablets[KEY].store.term
        await _fail_next_write(primary, follower, b"lost")
        deadline = time.monotonic() + 10
        while await primary.deliver("tally", 0, 1, [_rec(3, b"b")]) != OK:  # as a sender retries
            assert time.monotonic() < deadline, "the tablet never reopened"
            await primary.reconcile()
        store = primary.tablets[KEY].store
        assert store.term > term and store.index == 2 and store.get_state(b"k") == b"a;b;"
        assert ("f", False) in wire.changes, "commit 2 was acknowledged while the follower held another"
        await _until(lambda: _copy(follower) == (2, b"a;b;") and "f" in wire.in_sync,
                     "the follower to catch up from a snapshot and join again")
        await primary.close_all()
        await follower.close_all()
    asyncio.run(run())


def test_a_reopened_primary_still_waits_for_a_follower_it_had_the_leader_add(tmp_path: Any) -> None:
    """Review of replication: the leader added the follower to the in-sync set at the primary's
    request, but no routing saying so reached the primary (a leader failover between the two).
    Reopened under the same token (a failed write), the primary forgot that it had asked and
    acknowledged commits without that follower, which the leader could promote."""
    async def run() -> None:
        wire = _Wire()
        wire.in_sync = {"w"}
        cores = []
        for name, channel in (("f", _Wire()), ("w", wire)):
            core = WorkerCore(os.path.join(str(tmp_path), name), f"{name}:1", nowhere, channel=channel)  # type: ignore[arg-type]
            core.worker_id = name
            core.renewed(core.now_ms(), 600_000)
            r = _routing(1, 1, "w", ["f"])
            del r.computations[0].assignments[0].in_sync[:]
            r.computations[0].assignments[0].in_sync.append("w")  # the routing lists the primary alone
            await core.apply_routing(r)
            cores.append(core)
        follower, primary = cores
        wire.follower = follower
        await _until(lambda: KEY in primary.tablets and KEY in follower.replicas.copies, "the tablet and its copy")
        assert await primary.deliver("tally", 0, 1, [_rec(1, b"a")]) == OK
        await _until(lambda: "f" in wire.in_sync, "the leader to add the follower")
        assert primary.tablets[KEY].replicator.in_sync == {"f"} or "f" in primary.tablets[KEY].replicator.required()
        await _fail_next_write(primary, follower, b"lost")  # the tablet closes; no routing came
        # The network to the follower is cut from here: it cannot catch up (and be added) again.
        cut = Faults(None)  # (the primary's own: WorkerCore's default is shared by every core)
        cut.blocked = lambda address: address == "f:1"  # type: ignore[method-assign]
        primary.faults = cut
        deadline = time.monotonic() + 10
        while await primary.deliver("tally", 0, 1, [_rec(3, b"b")]) != OK:  # as a sender retries
            assert time.monotonic() < deadline, "the tablet never reopened"
            await primary.reconcile()
        # Acknowledged only once the leader dropped the follower it still listed in sync.
        assert ("f", False) in wire.changes and "f" not in wire.in_sync, "acknowledged without the follower"
        await primary.close_all()
        await follower.close_all()
    asyncio.run(run())
