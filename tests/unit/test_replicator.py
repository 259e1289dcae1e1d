"""The primary's side of replication (worker/replication.py), with a fake leader and follower:
what a link does when the leader cannot be told, without a cluster's timing."""

from __future__ import annotations

import asyncio
import contextlib
import time
from types import SimpleNamespace
from typing import Any

from runtime.wire import millstream_pb2 as pb
from tests.core.corekit import Posting
from worker.followerlink import FollowerLink
from worker.replication import Replicator

R = pb.ReplicateResponse


class _Channel(Posting):
    """A follower that holds every commit; a leader that refuses the first ``refuse`` requests
    to change the in-sync set (it is moving), then adds the follower."""

    def __init__(self, refuse: int) -> None:
        self.refuse = refuse
        self.asked = 0
        self.in_sync: set[str] = set()

    async def replicate(self, address: str, req: pb.ReplicateRequest) -> pb.ReplicateResponse | None:
        return R(status=R.OK, index=req.entries[-1].index if req.entries else 0)

    async def snapshot(self, address: str, chunk: pb.SnapshotChunk) -> pb.ReplicateResponse | None:
        raise AssertionError("a caught-up follower needs no snapshot")

    async def update_in_sync(self, req: pb.InSyncRequest) -> tuple[str, ...]:
        self.asked += 1
        if self.asked <= self.refuse:
            raise ConnectionError("the leader is moving")
        self.in_sync.add(req.follower)
        return tuple(sorted(self.in_sync))


def _tablet() -> Any:
    store = SimpleNamespace(term=1, term_of=lambda index: 1)
    return SimpleNamespace(computation="counts", key_range=1, token=3, name="counts/1", sync=False,
                           host=SimpleNamespace(worker_id="w1"), store=store)


def test_a_caught_up_follower_the_leader_could_not_add_is_offered_again_without_a_commit() -> None:
    """A tablet with no traffic makes no commit: the link must ask the leader again by itself
    (CI, chaos seed 7: a follower caught up but left out of the in-sync set for 60 s after the
    leader's restart, one loss away from no copy)."""
    async def main() -> None:
        channel = _Channel(refuse=3)
        rep = Replicator(_tablet(), channel, checkpoints="/nonexistent", timeout_s=1.0)
        link = FollowerLink(rep, "w2", "127.0.0.1:1")
        link.base = 0  # it holds every commit there is (none): caught up, not in the in-sync set
        rep.links["w2"] = link
        try:
            deadline = time.monotonic() + 10
            while "w2" not in rep.in_sync:
                assert time.monotonic() < deadline, (
                    f"the follower was never added: the leader was asked {channel.asked} times")
                await asyncio.sleep(0.02)
            assert channel.asked == 4 and link.synced
        finally:
            await rep.close()

    asyncio.run(main())


class _OneHangs(Posting):
    """Two in-sync followers: w3 neither answers nor dies; w2 holds the primary's last commit
    but answers only once w3 has been asked too."""

    def __init__(self) -> None:
        self.w3_asked = asyncio.Event()
        self.dropped: list[str] = []

    async def replicate(self, address: str, req: pb.ReplicateRequest) -> pb.ReplicateResponse | None:
        if req.follower == "w3":
            self.w3_asked.set()
            await asyncio.Event().wait()
        await self.w3_asked.wait()
        return R(status=R.OK, index=5, term=1)

    async def update_in_sync(self, req: pb.InSyncRequest) -> tuple[str, ...]:
        assert not req.add
        self.dropped.append(req.follower)
        return ("w1", "w2")


def test_a_reopened_primary_asks_its_followers_side_by_side_and_gives_a_hung_one_the_replica_timeout() -> None:
    """Review of 8b1813d: the confirmation before re-sending asked one follower after the
    other, each call bounded by the replication call's own 10 s; one hung follower held the
    opening that long before the next was even asked."""
    async def main() -> None:
        channel = _OneHangs()
        tablet = _tablet()
        tablet.store.index = 5
        rep = Replicator(tablet, channel, checkpoints="/nonexistent", timeout_s=0.3)
        rep.in_sync = {"w2", "w3"}
        rep.links = {w: FollowerLink(rep, w, f"127.0.0.1:{n}") for n, w in enumerate(["w2", "w3"], 1)}
        try:
            await asyncio.wait_for(rep.confirm(), 10)
            assert channel.dropped == ["w3"], "only the follower that did not answer leaves the in-sync set"
            assert rep.in_sync == {"w1", "w2"}
        finally:
            await rep.close()

    asyncio.run(main())


class _BothSilent(Posting):
    """Two in-sync followers that never answer, and a leader that applies each drop as it
    arrives but holds the first answer back until a second request arrives (0.5 s at most):
    answers that cross on the way back."""

    def __init__(self) -> None:
        self.in_sync = {"w1", "w2", "w3"}
        self.second = asyncio.Event()
        self.calls = 0

    async def replicate(self, address: str, req: pb.ReplicateRequest) -> pb.ReplicateResponse | None:
        return None  # unreachable

    async def update_in_sync(self, req: pb.InSyncRequest) -> tuple[str, ...]:
        self.calls += 1
        self.in_sync.discard(req.follower)
        answer = tuple(sorted(self.in_sync))
        if self.calls == 1:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.second.wait(), 0.5)
        else:
            self.second.set()
        return answer


def test_the_in_sync_set_is_the_leaders_last_answer_when_two_followers_are_dropped_at_once() -> None:
    """Review of the side-by-side confirmation: two drops asked at once, their answers crossing
    on the way back, left the primary with the older set (a follower the leader had dropped
    still required: the first commit stalled for the replica timeout)."""
    async def main() -> None:
        channel = _BothSilent()
        tablet = _tablet()
        tablet.store.index = 5
        tablet.host.lease_valid = lambda: True
        rep = Replicator(tablet, channel, checkpoints="/nonexistent", timeout_s=0.2)
        rep.in_sync = {"w2", "w3"}
        rep.links = {w: FollowerLink(rep, w, f"127.0.0.1:{n}") for n, w in enumerate(["w2", "w3"], 1)}
        try:
            await asyncio.wait_for(rep.confirm(), 10)
            assert channel.in_sync == {"w1"}
            assert rep.in_sync == {"w1"}, "an older answer of the leader applied after a newer one"
        finally:
            await rep.close()

    asyncio.run(main())


class _Leader(Posting):
    """A leader that lists ``f`` in sync until asked to drop it; no follower is reachable."""

    def __init__(self) -> None:
        self.in_sync = {"w1", "f"}
        self.asked: list[tuple[str, bool]] = []

    async def replicate(self, address: str, req: pb.ReplicateRequest) -> pb.ReplicateResponse | None:
        raise AssertionError(f"nothing may be sent to a follower with no address ({address!r})")

    async def update_in_sync(self, req: pb.InSyncRequest) -> tuple[str, ...]:
        self.asked.append((req.follower, req.add))
        (self.in_sync.add if req.add else self.in_sync.discard)(req.follower)
        return tuple(sorted(self.in_sync))


def test_an_in_sync_follower_with_no_address_is_dropped_through_the_leader_before_a_commit_is_acknowledged() -> None:
    """Review of replication: a follower whose worker expired is listed with no address while
    the leader still lists it in sync (its removal is a later write). The primary took it as
    not in sync and acknowledged commits without it, without telling the leader, which could
    then promote it with those commits missing. Now the commit waits until the leader dropped it."""
    async def main() -> None:
        leader = _Leader()
        rep = Replicator(_tablet(), leader, checkpoints="/nonexistent", timeout_s=0.2)  # type: ignore[arg-type]
        a = pb.Assignment(key_range=1, worker_id="w1", address="w1:1", token=3, in_sync=["w1", "f"])
        a.followers.add(worker_id="f", address="")
        rep.configure(a)
        try:
            assert rep.required() == {"f"}
            waits = rep.send(1, b"")
            await rep.wait(waits)
            assert leader.asked == [("f", False)] and rep.in_sync == {"w1"}
            await rep.wait(rep.send(2, b""))  # dropped: the next commit waits for nobody
            assert leader.asked == [("f", False)]
        finally:
            await rep.close()

    asyncio.run(main())


class _ByHand:
    """A follower the test answers by hand: what the primary posted, in order, with what takes
    each answer; a leader that does as it is asked."""

    def __init__(self) -> None:
        self.posted: list[tuple[pb.ReplicateRequest, Any]] = []
        self.in_sync = {"w2"}
        self.raises = 0  # posts that raise

    async def replicate(self, address: str, req: pb.ReplicateRequest) -> pb.ReplicateResponse | None:
        raise AssertionError("a streaming link posts its commits")

    def post(self, address: str, req: pb.ReplicateRequest, answered: Any) -> None:
        if self.raises:
            self.raises -= 1
            raise RuntimeError("a bug on the way to the follower")
        self.posted.append((req, answered))

    async def update_in_sync(self, req: pb.InSyncRequest) -> tuple[str, ...]:
        (self.in_sync.add if req.add else self.in_sync.discard)(req.follower)
        return tuple(sorted(self.in_sync))

    def indexes(self, n: int) -> list[int]:
        return [e.index for e in self.posted[n][0].entries]


async def _streaming(wire: _ByHand, timeout_s: float = 5.0) -> tuple[Replicator, FollowerLink]:
    rep = Replicator(_tablet(), wire, checkpoints="/nonexistent", timeout_s=timeout_s)  # type: ignore[arg-type]
    link = rep.links["w2"] = FollowerLink(rep, "w2", "w2:1")
    link.base = 0  # it holds every commit there is (none): the link asks the leader to add it
    await _until(lambda: link.streaming, "the link to catch up and stream")
    return rep, link


async def _until(cond: Any, what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)  # poll interval of this deadline-bounded wait


def test_a_caught_up_follower_gets_each_commit_as_it_is_made_and_its_answer_acknowledges_it_at_once() -> None:
    """W1's round (docs/performance.md): a commit goes to a streaming follower in the call that
    makes it, with no task woken on the way; the next goes with the answer to the one out; the
    answer settles the commit's acknowledgement in the same call."""
    async def main() -> None:
        wire = _ByHand()
        rep, link = await _streaming(wire)
        try:
            first = rep.send(1, b"a")
            assert len(wire.posted) == 1 and wire.indexes(0) == [1]  # sent, nothing awaited
            second, third = rep.send(2, b"b"), rep.send(3, b"c")
            assert len(wire.posted) == 1  # one Replicate out at a time
            wire.posted[0][1](R(status=R.OK, index=1))
            assert first.acks.all.done() and not second.acks.all.done()
            assert len(wire.posted) == 2 and wire.indexes(1) == [2, 3]  # the rest, with the answer
            wire.posted[1][1](R(status=R.OK, index=3))
            assert second.acks.all.done() and third.acks.all.done()
            for s in (first, second, third):
                await rep.wait(s)
            assert link.streaming and link.base == 3 and not link.queue
        finally:
            await rep.close()

    asyncio.run(main())


def test_a_streaming_follower_that_does_not_answer_is_retried_by_its_task_and_streams_again() -> None:
    async def main() -> None:
        wire = _ByHand()
        rep, link = await _streaming(wire, timeout_s=0.1)
        try:
            first = rep.send(1, b"a")
            wire.posted[0][1](None)  # not reachable
            assert not link.streaming and first.acks.all.done()
            await rep.wait(first)  # acknowledged without it: the leader dropped it first
            assert wire.in_sync == set()
            await _until(lambda: len(wire.posted) == 2, "the task to send commit 1 again, after a back-off")
            assert wire.indexes(1) == [1]
            wire.posted[1][1](R(status=R.OK, index=1))
            await _until(lambda: link.streaming, "the follower to catch up and stream again")
            assert wire.in_sync == {"w2"}  # added back once it held everything
            second = rep.send(2, b"b")
            assert len(wire.posted) == 3 and wire.indexes(2) == [2]
            wire.posted[2][1](R(status=R.OK, index=2))
            await rep.wait(second)
        finally:
            await rep.close()

    asyncio.run(main())


def test_a_streaming_follower_that_saw_a_newer_primary_fails_the_commit_and_ends_its_link() -> None:
    from worker.replication import ReplicationError

    async def main() -> None:
        wire = _ByHand()
        rep, link = await _streaming(wire)
        try:
            first = rep.send(1, b"a")
            wire.posted[0][1](R(status=R.STALE_TOKEN, detail="token 4 seen here"))
            try:
                await rep.wait(first)
                raise AssertionError("a commit a newer primary's follower refused was acknowledged")
            except ReplicationError:
                pass
            await _until(lambda: link.task.done(), "the link's task to end")
            rep.send(2, b"b")
            assert len(wire.posted) == 1  # nothing more goes to it
        finally:
            await rep.close()

    asyncio.run(main())


def test_a_commit_that_could_not_be_posted_fails_and_is_sent_again_by_the_links_task() -> None:
    """Review of the callbacks: an error on the way out left the link's request "out" for
    ever, its task waiting on it and nothing more sent; now it is as an unreachable follower."""
    async def main() -> None:
        wire = _ByHand()
        rep, link = await _streaming(wire, timeout_s=0.1)
        try:
            wire.raises = 1
            first = rep.send(1, b"a")
            assert first.acks.all.done() and link.out is None and not link.streaming
            await _until(lambda: len(wire.posted) == 1, "the task to send commit 1 again")
            assert wire.indexes(0) == [1]
            wire.posted[0][1](R(status=R.OK, index=1))
            await _until(lambda: link.streaming, "the link to stream again")
        finally:
            await rep.close()

    asyncio.run(main())
