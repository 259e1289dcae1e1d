"""A follower's copies (worker/replica.py) on real RocksDB: order, fencing, snapshots."""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
import time
from typing import Any

from runtime.wire import millstream_pb2 as pb
from worker.replica import Replicas
from worker.replicastore import ReplicaStore
from worker.storage import PUT, Commit, TabletStore, encode_ops, next_term, state_key
from worker.writes import DELETE_RANGE

R = pb.ReplicateResponse
KEY = ("c", 0)


def _replicas(tmp: Any, primary: dict[tuple[str, int], int] | None = None,
              routed: dict[tuple[str, int], int] | None = None) -> Replicas:
    """Copies on a worker whose routing says it follows KEY under token 5 (or ``routed``)."""
    routed = {KEY: 5} if routed is None else routed
    return Replicas(str(tmp), lambda k: os.path.join(str(tmp), k[0], str(k[1])),
                    lambda k: (primary or {}).get(k), routed_token=lambda k: routed.get(k, 0))


def _entry(index: int, key: bytes, value: bytes) -> pb.ReplicaEntry:
    return pb.ReplicaEntry(index=index, ops=encode_ops([(PUT, b"S" + key, value)]))


def _req(token: int, *entries: pb.ReplicaEntry, term: int = 1, prev_term: int = 0) -> pb.ReplicateRequest:
    """Commits of a primary's first opening (term 1) onto an empty copy (term 0), by default."""
    return pb.ReplicateRequest(computation="c", key_range=0, token=token, entries=entries, sync=False,
                               term=term, prev_term=prev_term)


def test_commits_apply_in_order_retries_are_harmless_and_gaps_need_a_snapshot(tmp_path: Any) -> None:
    async def run() -> None:
        reps = _replicas(tmp_path)
        assert (await reps.replicate(_req(1, _entry(1, b"k", b"1")))).status == R.NEED_SNAPSHOT
        await reps.create_empty(KEY, 1)
        assert (await reps.replicate(_req(1, _entry(1, b"k", b"1"), _entry(2, b"k", b"2")))).status == R.OK
        again = await reps.replicate(_req(1, _entry(2, b"k", b"2")))
        assert again.status == R.OK and again.index == 2
        gap = await reps.replicate(_req(1, _entry(4, b"k", b"4")))
        assert gap.status == R.NEED_SNAPSHOT and gap.index == 2
        await reps.close_all()
        copy = ReplicaStore(os.path.join(str(tmp_path), "c", "0"))
        assert copy.db.get(b"Sk") == b"2" and copy.index == 2
        copy.close()
    asyncio.run(run())


def test_a_follower_refuses_a_primary_older_than_one_it_has_seen(tmp_path: Any) -> None:
    async def run() -> None:
        reps = _replicas(tmp_path)
        await reps.create_empty(KEY, 1)
        reps.raise_fence(KEY, 2)  # the routing promoted someone else under token 2
        refused = await reps.replicate(_req(1, _entry(1, b"k", b"zombie")))
        assert refused.status == R.STALE_TOKEN
        # A new primary (token 2) cannot continue a copy built from token 1's commits.
        assert (await reps.replicate(_req(2, _entry(1, b"k", b"x")))).status == R.NEED_SNAPSHOT
        await reps.close_all()
    asyncio.run(run())


def test_a_copy_open_here_as_primary_refuses_replication(tmp_path: Any) -> None:
    async def run() -> None:
        reps = _replicas(tmp_path, primary={KEY: 3})
        assert (await reps.replicate(_req(3, _entry(1, b"k", b"v")))).status == R.STALE_TOKEN
    asyncio.run(run())


def test_a_snapshot_of_a_primary_replaces_the_copy(tmp_path: Any) -> None:
    src = os.path.join(str(tmp_path), "primary")
    store = TabletStore(src, 5, sync=False, replicated=True)
    for i in range(3):
        store.commit(Commit(state={b"k%d" % i: b"v"}))
    ckpt = os.path.join(str(tmp_path), "ckpt")
    index = store.checkpoint(ckpt)
    assert index == 3

    async def run() -> None:
        reps = _replicas(os.path.join(str(tmp_path), "follower"))
        for name in sorted(os.listdir(ckpt)):
            with open(os.path.join(ckpt, name), "rb") as f:
                data = f.read()
            resp = await reps.install(pb.SnapshotChunk(computation="c", key_range=0, token=5, index=index,
                                                       session="s1", file=name, offset=0, data=data))
            assert resp.status == R.OK
        done = await reps.install(pb.SnapshotChunk(computation="c", key_range=0, token=5, index=index,
                                                   session="s1", done=True))
        assert done.status == R.OK and done.index == 3
        # The primary's next commit continues the copy.
        ops = store.commit(Commit(state={b"k9": b"w"}))
        assert ops is not None
        nxt = await reps.replicate(_req(5, pb.ReplicaEntry(index=store.index, ops=ops), term=store.term,
                                        prev_term=store.term))
        assert nxt.status == R.OK and nxt.index == 4
        await reps.close_all()
        copy = ReplicaStore(os.path.join(str(tmp_path), "follower", "c", "0"))
        assert copy.db.get(state_key(b"k9")) == b"w" and copy.db.get(state_key(b"k0")) == b"v"
        copy.close()
    asyncio.run(run())
    store.close()


def test_a_new_worker_at_a_followers_address_refuses_what_was_meant_for_the_old_one(tmp_path: Any) -> None:
    async def run() -> None:
        reps = Replicas(str(tmp_path), lambda k: os.path.join(str(tmp_path), k[0], str(k[1])),
                        lambda k: None, lambda: "newworker000", routed_token=lambda k: 1)
        req = _req(1, _entry(1, b"k", b"v"))
        req.follower = "oldworker000"
        assert (await reps.replicate(req)).status == R.WRONG_WORKER
        chunk = pb.SnapshotChunk(computation="c", key_range=0, token=1, index=0, session="s", done=True,
                                 follower="oldworker000")
        assert (await reps.install(chunk)).status == R.WRONG_WORKER
    asyncio.run(run())


def test_a_snapshot_records_its_tablet_before_its_copy_is_made(tmp_path: Any) -> None:
    """A copy sent before this worker's routing names the tablet is recorded as held first
    (worker/seen.py: a copy lost later is never taken for one never held)."""
    async def run() -> None:
        recorded: list[tuple[str, int]] = []

        async def remember(key: tuple[str, int]) -> None:
            assert not os.path.exists(os.path.join(str(tmp_path), "c", "0"))
            recorded.append(key)

        reps = Replicas(str(tmp_path), lambda k: os.path.join(str(tmp_path), k[0], str(k[1])),
                        lambda k: None, lambda: "", remember, routed_token=lambda k: 2)
        chunk = pb.SnapshotChunk(computation="c", key_range=0, token=2, index=0, session="s", file="CURRENT",
                                 data=b"x")
        assert (await reps.install(chunk)).status == R.OK
        assert recorded == [KEY]
        await reps.close_all()
    asyncio.run(run())


def test_n14_a_token_the_routing_does_not_confirm_neither_raises_the_fence_nor_installs(tmp_path: Any) -> None:
    """Review N14: peers share one worker token, so one forged Replicate(token=2**63-1) raised
    a follower's fence for ever and the real primary's every commit then failed; a forged
    snapshot under such a token replaced the copy. Only the routing's token is believed."""
    forged = (1 << 63) - 1

    async def run() -> None:
        routed = {KEY: 1}
        reps = _replicas(tmp_path, routed=routed)
        await reps.create_empty(KEY, 1)
        assert (await reps.replicate(_req(1, _entry(1, b"k", b"real")))).status == R.OK
        refused = await reps.replicate(_req(forged))
        assert refused.status == R.NOT_YET and "retry once the routing has reached this worker" in refused.detail
        assert reps.fence[KEY] == 1
        chunk = pb.SnapshotChunk(computation="c", key_range=0, token=forged, index=0, session="evil",
                                 file="CURRENT", offset=0, data=b"x")
        assert (await reps.install(chunk)).status == R.NOT_YET
        assert not os.path.exists(reps.incoming_dir) or os.listdir(reps.incoming_dir) == []
        # The real primary goes on.
        ok = await reps.replicate(_req(1, _entry(2, b"k", b"still"), prev_term=1))
        assert ok.status == R.OK and ok.index == 2
        # A tablet the routing does not say this worker follows: nothing comes in, whatever the token.
        other = pb.ReplicateRequest(computation="c", key_range=7, token=1, entries=[_entry(1, b"k", b"v")])
        assert (await reps.replicate(other)).status == R.NOT_YET and ("c", 7) not in reps.fence
        # The routing's promotion (token 2) is believed: a new primary, so a snapshot first.
        routed[KEY] = 2
        assert (await reps.replicate(_req(2, _entry(3, b"k", b"x")))).status == R.NEED_SNAPSHOT
        assert reps.fence[KEY] == 2
        await reps.close_all()
    asyncio.run(run())


def test_a_commit_held_under_an_older_term_is_never_taken_for_the_primarys(tmp_path: Any) -> None:
    """P7: a primary reopened after its own write of commit 2 failed (its follower had it)
    sends a different commit 2 under its next term: not a retry, a snapshot."""
    async def run() -> None:
        reps = _replicas(tmp_path)
        await reps.create_empty(KEY, 5)
        assert (await reps.replicate(_req(5, _entry(1, b"k", b"1"), term=1))).status == R.OK
        assert (await reps.replicate(_req(5, _entry(2, b"k", b"lost"), term=1, prev_term=1))).status == R.OK
        # Reopened (term 2) at commit 1: its commit 2 is another one.
        resent = await reps.replicate(_req(5, _entry(2, b"k", b"other"), term=2, prev_term=1))
        assert resent.status == R.NEED_SNAPSHOT and resent.index == 2
        # Nor does it continue a copy whose last commit is not of the term the primary's is.
        nxt = await reps.replicate(_req(5, _entry(3, b"k", b"3"), term=2, prev_term=2))
        assert nxt.status == R.NEED_SNAPSHOT
        # A late call of the earlier opening is refused once a later one wrote here.
        assert (await reps.replicate(_req(5, _entry(3, b"k", b"3"), term=2, prev_term=1))).status == R.OK
        late = await reps.replicate(_req(5, _entry(4, b"k", b"zombie"), term=1, prev_term=1))
        assert late.status == R.NEED_SNAPSHOT
        # A retry within one term is harmless, and a question names the commit and its term.
        assert (await reps.replicate(_req(5, _entry(3, b"k", b"3"), term=2, prev_term=1))).status == R.OK
        which = await reps.replicate(_req(5, term=2))
        assert which.status == R.OK and (which.index, which.term) == (3, 2)
        await reps.close_all()
        copy = ReplicaStore(os.path.join(str(tmp_path), "c", "0"))
        assert copy.db.get(b"Sk") == b"3" and (copy.index, copy.term) == (3, 2)
        copy.close()
    asyncio.run(run())


def test_every_opening_of_a_tablet_store_has_a_higher_term_and_its_commits_carry_it(tmp_path: Any) -> None:
    path = os.path.join(str(tmp_path), "t")
    t1 = next_term(0, 1)
    t2, t3 = next_term(t1, 1), next_term(next_term(t1, 1), 1)
    assert 0 < t1 < t2 < t3
    store = TabletStore(path, 1, sync=False, replicated=True)
    assert (store.term, store.term_of(0)) == (t1, 0)
    store.commit(Commit(state={b"a": b"1"}))
    store.close()
    store = TabletStore(path, 1, sync=False, replicated=True)  # reopened under the same token
    assert store.term == t2 and store.term_of(1) == t1 and store.term_of(2) == t2
    store.close()
    store = TabletStore(path, 1, sync=False, replicated=True)  # an opening that committed nothing counts
    assert store.term == t3 and store.term_of(1) == t1
    shipped: list[tuple[int, bytes]] = []
    store.ship = lambda index, ops: shipped.append((index, ops))
    ops = store.commit(Commit(state={b"a": b"2"}))
    assert shipped == [(2, ops)]
    store.close()


def test_the_openings_of_two_primaries_never_share_a_term(tmp_path: Any) -> None:
    """A zombie primary reopened under its old token and a follower promoted under the next
    one both open above the same commit: their terms differ (the low bits name the token),
    so neither's commit N is taken for the other's."""
    base = os.path.join(str(tmp_path), "old")
    old = TabletStore(base, 1, sync=False, replicated=True)
    old.commit(Commit(state={b"a": b"1"}))
    old.close()
    shutil.copytree(base, os.path.join(str(tmp_path), "new"))  # the follower's copy of commit 1
    zombie = TabletStore(base, 1, sync=False, replicated=True)
    promoted = TabletStore(os.path.join(str(tmp_path), "new"), 2, sync=False, replicated=True)
    assert zombie.term != promoted.term and zombie.term_of(1) == promoted.term_of(1)
    assert promoted.term > promoted.term_of(1)
    zombie.close()
    promoted.close()


def _demoted_and_successor(tmp_path: Any, extra: int) -> tuple[Replicas, TabletStore]:
    """A primary (token 4) that made 3 commits and closed, its files demoted to a copy on a
    worker whose routing now follows the tablet under token 5; and its successor, opened
    under token 5 on a copy of its first 3 commits. ``extra``: commits the old primary
    wrote after its successor's copy was taken (never acknowledged)."""
    old_path = os.path.join(str(tmp_path), "old", "c", "0")
    old = TabletStore(old_path, 4, sync=False, replicated=True)
    for i in range(3):
        old.commit(Commit(state={b"k%d" % i: b"v"}))
    new_path = os.path.join(str(tmp_path), "new")
    shutil.copytree(old_path, new_path)
    for i in range(extra):
        old.commit(Commit(state={b"unacknowledged%d" % i: b"x"}))
    old.close()
    reps = _replicas(os.path.join(str(tmp_path), "old"))
    reps.demoted(KEY)
    return reps, TabletStore(new_path, 5, sync=False, replicated=True)


def test_a_demoted_primary_continues_as_its_successors_follower_without_a_snapshot(tmp_path: Any) -> None:
    async def run() -> None:
        reps, new = _demoted_and_successor(tmp_path, extra=0)
        asked = await reps.replicate(_req(5, term=new.term))  # which commit is here? (changes nothing)
        assert asked.status == R.OK and (asked.index, asked.term) == (3, new.term_of(3))
        ops = new.commit(Commit(state={b"k9": b"w"}))
        assert ops is not None
        req = _req(5, pb.ReplicaEntry(index=new.index, ops=ops), term=new.term, prev_term=new.term_of(3))
        ok = await reps.replicate(req)
        assert ok.status == R.OK and (ok.index, ok.term) == (4, new.term)
        await reps.close_all()
        copy = ReplicaStore(os.path.join(str(tmp_path), "old", "c", "0"))
        assert copy.db.get(state_key(b"k9")) == b"w" and copy.db.get(state_key(b"k0")) == b"v"
        assert (copy.token, copy.index) == (5, 4)
        copy.close()
        new.close()
    asyncio.run(run())


def test_a_demoted_primary_with_a_commit_its_successor_lacks_takes_a_snapshot(tmp_path: Any) -> None:
    async def run() -> None:
        reps, new = _demoted_and_successor(tmp_path, extra=1)
        asked = await reps.replicate(_req(5, term=new.term))
        assert asked.status == R.OK and asked.index == 4  # not the successor's last commit (3)
        ops = new.commit(Commit(state={b"k9": b"w"}))
        assert ops is not None
        req = _req(5, pb.ReplicaEntry(index=new.index, ops=ops), term=new.term, prev_term=new.term_of(3))
        refused = await reps.replicate(req)
        assert refused.status == R.NEED_SNAPSHOT and refused.index == 4
        await reps.close_all()
        new.close()
    asyncio.run(run())


def test_a_tablet_still_closing_here_as_primary_asks_its_successor_to_retry(tmp_path: Any) -> None:
    async def run() -> None:
        reps = _replicas(tmp_path, primary={KEY: 4})  # routed under token 5, closing under 4
        busy = await reps.replicate(_req(5, _entry(1, b"k", b"v")))
        assert busy.status == R.NOT_YET and "still open here as primary" in busy.detail
    asyncio.run(run())


def test_a_snapshot_under_token_0_or_with_a_session_that_is_a_path_writes_nothing(tmp_path: Any) -> None:
    """Review of security: token 0 passed the follower's check for a tablet its routing does not
    say it follows (0 is not above the routing's 0), and a snapshot's session became a
    directory as given: a worker-token holder could write (and then delete) files anywhere
    the worker could, ``../`` in the session."""
    async def run() -> None:
        reps = _replicas(tmp_path, routed={KEY: 1})
        outside = os.path.join(str(tmp_path), "outside")
        for token, computation, session in ((0, "c", "x"), (0, "elsewhere", "x"), (1, "c", "x/../../../outside")):
            chunk = pb.SnapshotChunk(computation=computation, key_range=0, token=token, index=0, session=session,
                                     file="evil.pth", offset=0, data=b"import os")
            assert (await reps.install(chunk)).status in (R.NOT_YET, R.NEED_SNAPSHOT), (token, session)
        assert not os.path.exists(outside)
        assert not os.path.exists(reps.incoming_dir) or os.listdir(reps.incoming_dir) == []
        assert (await reps.replicate(pb.ReplicateRequest(computation="other", key_range=0, token=0))).status == R.NOT_YET
        await reps.close_all()
    asyncio.run(run())


def _req_of(key_range: int, token: int, *entries: pb.ReplicaEntry, sync: bool = True) -> pb.ReplicateRequest:
    """Commits for copy ("c", key_range) (the first ones onto an empty copy, or the next)."""
    req = _req(token, *entries, prev_term=0 if entries[0].index == 1 else 1)
    req.key_range, req.sync = key_range, sync
    return req


async def _two_copies(tmp: Any) -> Replicas:
    reps = _replicas(tmp, routed={KEY: 5, ("c", 1): 5})
    await reps.create_empty(KEY, 5)
    await reps.create_empty(("c", 1), 5)
    return reps


def _on_disk(tmp: Any, key_range: int, key: bytes) -> tuple[bytes | None, int]:
    copy = ReplicaStore(os.path.join(str(tmp), "c", str(key_range)))
    try:
        return copy.db.get(key), copy.index
    finally:
        copy.close()


def test_a_frames_short_commits_are_written_on_the_loop_and_synced_side_by_side(tmp_path: Any) -> None:
    """No copy's thread is started for them; each is answered with its own copy's commit,
    and both are on disk."""
    async def run() -> None:
        reps = await _two_copies(tmp_path)
        answers = await reps.replicate_many([_req_of(0, 5, _entry(1, b"a", b"1"), _entry(2, b"a", b"2")),
                                             _req_of(1, 5, _entry(1, b"b", b"1"))])
        assert [(a.status, a.index) for a in answers] == [(R.OK, 2), (R.OK, 1)]
        assert not reps._threads
        # One copy twice in a frame: the second continues the first.
        answers = await reps.replicate_many([_req_of(1, 5, _entry(2, b"b", b"2")), _req_of(1, 5, _entry(3, b"b", b"3"))])
        assert [(a.status, a.index) for a in answers] == [(R.OK, 2), (R.OK, 3)]
        # A refusal answers its own request only.
        answers = await reps.replicate_many([_req_of(0, 5, _entry(5, b"a", b"5")), _req_of(1, 5, _entry(4, b"b", b"4"))])
        assert [(a.status, a.index) for a in answers] == [(R.NEED_SNAPSHOT, 2), (R.OK, 4)]
        await reps.close_all()
        assert _on_disk(tmp_path, 0, b"Sa") == (b"2", 2) and _on_disk(tmp_path, 1, b"Sb") == (b"4", 4)
    asyncio.run(run())


def test_a_commit_that_deletes_a_range_is_written_on_its_copys_thread(tmp_path: Any) -> None:
    async def run() -> None:
        reps = await _two_copies(tmp_path)
        ranged = pb.ReplicaEntry(index=2, ops=encode_ops([(DELETE_RANGE, b"Sa", b"Sb")]))
        answers = await reps.replicate_many([_req_of(0, 5, _entry(1, b"a", b"1")), _req_of(0, 5, ranged)])
        assert [(a.status, a.index) for a in answers] == [(R.OK, 1), (R.OK, 2)]
        assert list(reps._threads) == [KEY]
        await reps.close_all()
        assert _on_disk(tmp_path, 0, b"Sa") == (None, 2)
    asyncio.run(run())


def test_a_commit_waits_for_a_write_its_copys_thread_still_runs(tmp_path: Any) -> None:
    """A write whose caller was cancelled still runs on the copy's thread: the next commit
    is not written on the loop beside it, but after it, on that thread."""
    async def run() -> None:
        reps = await _two_copies(tmp_path)
        release = threading.Event()
        busy = reps._thread(KEY).run(release.wait, 10)
        answer = asyncio.ensure_future(reps.replicate(_req_of(0, 5, _entry(1, b"a", b"1"))))
        thread, deadline = reps._threads[KEY], time.monotonic() + 10
        while thread._given < 2 and time.monotonic() < deadline:  # the commit queued behind the write
            await asyncio.sleep(0.001)
        assert thread._given == 2 and not answer.done() and reps.copies[KEY].index == 0
        release.set()
        await busy
        assert ((await answer).status, reps.copies[KEY].index) == (R.OK, 1)
        await reps.close_all()
    asyncio.run(run())


class _Disk:
    """A copy's RocksDB whose WAL syncs fail (a disk error) or wait until let go."""

    def __init__(self, db: Any, *, fails: bool = False) -> None:
        self.db, self.fails = db, fails
        self.syncing, self.go = threading.Event(), threading.Event()

    def flush_wal(self, sync: bool) -> None:
        self.syncing.set()
        if self.fails:
            raise OSError("EIO: the disk failed the fsync")
        self.go.wait(10)
        self.db.flush_wal(sync)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)


def test_a_copy_whose_sync_fails_holds_only_what_it_held_and_the_retry_writes_it_again(tmp_path: Any) -> None:
    async def run() -> None:
        reps = await _two_copies(tmp_path)
        first = _req_of(0, 5, _entry(1, b"a", b"1"))
        copy = reps.copies[KEY]
        real, copy.db = copy.db, _Disk(copy.db, fails=True)  # type: ignore[assignment]
        try:
            await reps.replicate_many([first, _req_of(1, 5, _entry(1, b"b", b"1"))])
        except OSError:
            pass
        else:
            raise AssertionError("a commit whose fsync failed was answered as held")
        assert copy.held == (5, 0, 0) and reps.copies[("c", 1)].index == 1
        copy.db = real
        again = await reps.replicate(first)
        assert (again.status, again.index) == (R.OK, 1)
        await reps.close_all()
        assert _on_disk(tmp_path, 0, b"Sa") == (b"1", 1)
    asyncio.run(run())


def test_a_commit_whose_caller_went_during_its_sync_keeps_its_copys_lock_until_the_sync_ends(tmp_path: Any) -> None:
    """The frame's stream closed while the fsync ran: the copy's lock stays until it ends, so
    the primary's retry cannot find the commit held before it is on disk, nor a close close
    the copy under it."""
    async def run() -> None:
        reps = await _two_copies(tmp_path)
        copy = reps.copies[KEY]
        real, disk = copy.db, _Disk(copy.db)
        copy.db = disk  # type: ignore[assignment]
        first = _req_of(0, 5, _entry(1, b"a", b"1"))
        answer = asyncio.ensure_future(reps.replicate(first))
        while not disk.syncing.is_set():
            await asyncio.sleep(0.001)
        answer.cancel()
        retry = asyncio.ensure_future(reps.replicate(first))
        for _ in range(5):  # (turns of the loop, not a wait: neither may finish while the fsync runs)
            await asyncio.sleep(0)
        assert not answer.done() and not retry.done()
        disk.go.set()
        await asyncio.gather(answer, return_exceptions=True)
        assert answer.cancelled()
        again = await retry
        assert (again.status, again.index) == (R.OK, 1)
        copy.db = real
        await reps.close_all()
        assert _on_disk(tmp_path, 0, b"Sa") == (b"1", 1)
    asyncio.run(run())


def test_the_loop_stops_waiting_for_syncs_while_the_disk_takes_longer_than_its_bound(tmp_path: Any,
                                                                                   monkeypatch: Any) -> None:
    """The loop waits for a frame's syncs only while they typically take less than
    SYNC_WAIT_S: a slow disk does not hold it for that long at every frame."""
    import concurrent.futures

    from worker import replica

    waits: list[int] = []
    real_wait = concurrent.futures.wait
    monkeypatch.setattr(concurrent.futures, "wait", lambda fs, timeout=None: waits.append(1) or real_wait(fs, timeout))

    class _Slow(_Disk):
        def flush_wal(self, sync: bool) -> None:
            time.sleep(4 * replica.SYNC_WAIT_S)  # (the disk is slow: what the loop must not wait for)
            self.db.flush_wal(sync)

    async def run() -> None:
        reps = await _two_copies(tmp_path)
        copy = reps.copies[KEY]
        real, copy.db = copy.db, _Slow(copy.db)  # type: ignore[assignment]
        for i in range(1, 9):
            assert (await reps.replicate(_req_of(0, 5, _entry(i, b"a", b"%d" % i)))).status == R.OK
        assert reps.sync_s > replica.SYNC_WAIT_S and 0 < len(waits) < 8
        copy.db = real
        await reps.close_all()
    asyncio.run(run())
