"""One follower of a primary tablet (worker/replication.py's :class:`~worker.replication.Replicator`
holds one per follower): the commits it has not acknowledged, and how they go to it.

A caught-up follower's link streams: each commit goes in the call that pushes it, each answer
is taken as the stream's reader reads it, and a commit's acknowledgements (:class:`Acks`)
resolve in that same turn of the loop. Everything else (probing a copy, verifying it after
the leader dropped it, a snapshot, backing off from an unreachable follower, asking the leader
to add it once caught up) is the link's task's (docs/replication.md).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from runtime import metrics
from runtime.errors import MillstreamError, StaleTokenError
from runtime.wire import millstream_pb2 as pb
from worker.chunks import checkpoint_chunks

if TYPE_CHECKING:
    from worker.replication import Replicator

log = logging.getLogger(__name__)
R = pb.ReplicateResponse
SEND_MAX_ENTRIES = 256        # commits per Replicate call while catching up
SEND_MAX_BYTES = 8 << 20
QUEUE_MAX_BYTES = 256 << 20   # a follower further behind starts again from a snapshot


class Acks:
    """One commit's acknowledgements: ``all`` resolves once every follower it waits for has
    answered, in the turn of the loop the last answer is read in."""

    __slots__ = ("left", "all")

    def __init__(self) -> None:
        self.left = 1  # held by Replicator.send until every follower has it
        self.all: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def one(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.expire()

    def expire(self) -> None:
        """Every answer is in, or the time for them ran out."""
        if not self.all.done():
            self.all.set_result(None)


@dataclass(slots=True)
class _Entry:
    index: int
    ops: bytes
    done: asyncio.Future[bool]
    acks: Acks | None  # (None: not waited for)

    def settle(self, ok: bool) -> None:
        if not self.done.done():
            self.done.set_result(ok)
            if self.acks is not None:
                self.acks.one()


class FollowerLink:
    """One follower: the commits it has not acknowledged, and how they go to it.

    A follower that is caught up is *streaming*: each commit goes to it as it is pushed (at
    most one Replicate out at a time, the rest with its answer), and each answer is taken as
    it is read, in that turn of the loop, no task woken on the way. Anything else (probing,
    verifying, a snapshot, a failure, catching up) is the link's task's, which streaming
    wakes and hands over to on anything but a clean answer."""

    def __init__(self, rep: Replicator, follower: str, address: str) -> None:
        self.rep = rep
        self.follower = follower
        self.address = address
        self.queue: collections.deque[_Entry] = collections.deque()
        self.queued_bytes = 0
        self.base: int | None = None   # the last commit the follower holds (None: unknown)
        self.synced = False            # caught up: its acknowledgements are awaited
        # In the in-sync set already (a new tablet's empty copy, or a copy this primary fed
        # before it reopened): try sending commits before falling back to a snapshot.
        self.probe = follower in rep.in_sync
        # The leader dropped this follower from the in-sync set (it restarted, say): before
        # it counts as caught up again, it must say which commit it holds.
        self.verify = False
        self.streaming = False  # commits go as pushed; the task waits to be woken (nudge)
        self.out: asyncio.Future[bool] | None = None  # the Replicate out: sent, or not reachable
        self.unreachable = False  # streaming ended on one the follower did not take: back off first
        self.refused = False      # the follower has seen a newer primary: this link is done
        self.wake = asyncio.Event()
        self.task = asyncio.create_task(self._run(), name=f"replicate {rep.tablet.name} to {follower}")

    def push(self, index: int, ops: bytes, acks: Acks | None = None) -> asyncio.Future[bool]:
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        if self.base is not None and index <= self.base:
            fut.set_result(True)
            return fut
        if acks is not None:
            acks.left += 1
        self.queue.append(_Entry(index, ops, fut, acks))
        self.queued_bytes += len(ops)
        if self.queued_bytes > QUEUE_MAX_BYTES and not self.synced:
            log.warning("tablet %s: follower %s is %d MiB behind; it starts again from a snapshot",
                        self.rep.tablet.name, self.follower, self.queued_bytes >> 20)
            self._drop(False)
            self.base = None
            self.nudge()
        elif not self.streaming:
            self.wake.set()
        elif self.out is None:
            self._post()
        return fut

    def nudge(self) -> None:
        """Hand over to the task: it looks at the link's state again (once no Replicate is out)."""
        self.streaming = False
        self.wake.set()

    def _drop(self, ok: bool, upto: int | None = None) -> None:
        while self.queue and (upto is None or self.queue[0].index <= upto):
            e = self.queue.popleft()
            self.queued_bytes -= len(e.ops)
            e.settle(ok)
        if upto is None:
            self.queued_bytes = 0

    def lag(self) -> int:
        return len(self.queue)

    def fail(self) -> None:
        """A send failed: whoever waits hears so; this follower is no longer caught up."""
        self.synced = False
        for e in self.queue:
            e.settle(False)

    async def close(self) -> None:
        self.streaming = False
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        self._drop(False)

    async def _run(self) -> None:
        backoff = 0.05
        while True:
            try:
                if self.out is not None:  # streaming handed over with a Replicate out: its answer first
                    await asyncio.shield(self.out)
                    continue
                if self.refused:
                    return
                if self.unreachable:
                    self.unreachable = False
                    await asyncio.sleep(backoff)
                    backoff = min(2.0, backoff * 2)
                    continue
                if self.base is None and self.probe:
                    if not self.queue:
                        await self.wake.wait()
                        self.wake.clear()
                        continue
                    if await self._send():
                        continue
                    await asyncio.sleep(backoff)  # not reachable: never spin the event loop
                    backoff = min(2.0, backoff * 2)
                    continue
                if self.base is None:
                    self.synced = False
                    await self._snapshot()
                    backoff = 0.05
                    continue
                self._drop(True, self.base)
                if not self.queue and self.verify:
                    if await self._check():
                        backoff = 0.05
                        continue
                    await asyncio.sleep(backoff)  # not reachable: ask again (nothing to send meanwhile)
                    backoff = min(2.0, backoff * 2)
                    continue
                elif not self.queue:
                    if not self.synced:
                        await self.rep.caught_up(self)
                        if not self.synced:
                            # The leader could not be told (it was moving): ask again, not only
                            # at the next commit, which an idle tablet may not make for a long time
                            # (chaos seed 7: under-replicated for 60 s after the leader's restart).
                            await asyncio.sleep(backoff)
                            backoff = min(2.0, backoff * 2)
                            continue
                        backoff = 0.05
                    self.streaming = True
                    await self.wake.wait()
                    self.wake.clear()
                    self.streaming = False
                    continue
                if await self._send():
                    backoff = 0.05
                    continue
                if self.refused:
                    return
            except asyncio.CancelledError:
                raise
            except StaleTokenError:
                self.rep.stale = True
                self.fail()
                return
            except Exception as e:  # a full disk for the checkpoint, a bug: log, back off, retry
                log.warning("tablet %s: replication to %s failed: %s", self.rep.tablet.name, self.follower, e)
                self.fail()
            await asyncio.sleep(backoff)
            backoff = min(2.0, backoff * 2)

    async def _send(self) -> bool:
        """Send the queue's first commits and wait for the answer. True: the follower took
        them, or needs a snapshot (``base`` is None); False: not reachable, or it refused."""
        return await self._post()

    def _post(self) -> asyncio.Future[bool]:
        """Send the queue's first commits (up to a call's worth); :meth:`_answered` takes the answer."""
        entries: list[pb.ReplicaEntry] = []
        size = 0
        for e in self.queue:
            if len(entries) >= SEND_MAX_ENTRIES or (entries and size + len(e.ops) > SEND_MAX_BYTES):
                break
            entries.append(pb.ReplicaEntry(index=e.index, ops=e.ops))
            size += len(e.ops)
        rep = self.rep
        out = self.out = asyncio.get_running_loop().create_future()
        if rep.blocked(self.address):  # (a test's fault hook: the network to it is cut)
            self._answered(entries[-1].index, 0.0, None)
            return out
        try:
            req = self.request()
            req.entries.extend(entries)
            req.prev_term = rep.tablet.store.term_of(entries[0].index - 1)
            rep.channel.post(self.address, req,
                             functools.partial(self._answered, entries[-1].index, time.perf_counter()))
        except Exception as e:  # not sent: as unreachable (whoever waits hears so; it is tried again)
            log.warning("tablet %s: replication to %s failed: %r", rep.tablet.name, self.follower, e)
            self._answered(entries[-1].index, 0.0, None)
        return out

    def _answered(self, last: int, sent_at: float, resp: pb.ReplicateResponse | None) -> None:
        """The answer to the Replicate that ended with commit ``last`` (None: not reachable):
        while streaming, the next commits go at once; on anything but a clean answer, or once
        an unsynced follower holds everything, the task takes over."""
        rep = self.rep
        if sent_at:
            metrics.REPLICATION_RPC_SECONDS.labels(rep.tablet.computation).observe(time.perf_counter() - sent_at)
        out, self.out = self.out, None
        ok = False
        if resp is None or resp.status in (R.WRONG_WORKER, R.NOT_YET):  # NOT_YET: its routing lags
            self.fail()
            self.unreachable = self.streaming
        elif resp.status == R.OK:
            self.probe = False
            self.base = max(self.base or 0, last)
            self._drop(True, self.base)
            ok = True
        elif resp.status == R.STALE_TOKEN:
            metrics.REPLICATION_REFUSED.labels(rep.tablet.computation).inc()
            log.warning("tablet %s: follower %s refused our commits (token %d): %s", rep.tablet.name,
                        self.follower, rep.tablet.token, resp.detail)
            rep.stale = self.refused = True
            self.fail()
        else:  # NEED_SNAPSHOT
            self.probe = False
            self.fail()
            self.base = None
            ok = True
        if out is not None and not out.done():
            out.set_result(ok)
        if self.streaming:
            if self.base is not None and ok and self.synced and not self.verify:
                if self.queue:
                    self._post()
            else:
                self.nudge()

    async def _check(self) -> bool:
        """Ask the follower which commit it holds (an empty Replicate): if not the last one
        sent, it catches up from a snapshot. False: not reachable."""
        rep = self.rep
        resp = None if rep.blocked(self.address) else await rep.channel.replicate(self.address, self.request())
        if resp is None or resp.status in (R.WRONG_WORKER, R.NOT_YET):
            return False
        if resp.status == R.STALE_TOKEN:
            raise StaleTokenError(resp.detail or "a newer primary exists")
        self.verify = False
        if (resp.status != R.OK or self.base is None or resp.index != self.base
                or resp.term != rep.tablet.store.term_of(self.base)):
            self.base = None
        return True

    def request(self) -> pb.ReplicateRequest:
        """A Replicate to this follower, without entries."""
        tablet = self.rep.tablet
        return pb.ReplicateRequest(computation=tablet.computation, key_range=tablet.key_range, token=tablet.token,
                                   sync=tablet.sync, follower=self.follower, term=tablet.store.term)

    async def _snapshot(self) -> None:
        """Send a checkpoint of the primary's copy; the follower then holds commits up to it."""
        rep = self.rep
        tablet = rep.tablet
        session = uuid.uuid4().hex[:12]
        path = os.path.join(rep.checkpoints, f"{tablet.computation}-{tablet.key_range}-{session}")
        os.makedirs(rep.checkpoints, exist_ok=True)
        assert tablet.thread is not None
        index = await tablet.thread.run(tablet.store.checkpoint, path)
        try:
            base = pb.SnapshotChunk(computation=tablet.computation, key_range=tablet.key_range,
                                    token=tablet.token, index=index, session=session, follower=self.follower)
            sent = 0
            async for chunk in checkpoint_chunks(path, base):
                await self._chunk(chunk)
                sent += len(chunk.data)
            done = pb.SnapshotChunk()
            done.CopyFrom(base)
            done.done = True
            await self._chunk(done)
        finally:
            await asyncio.to_thread(shutil.rmtree, path, True)
        metrics.SNAPSHOTS_SENT.labels(tablet.computation).inc()
        log.info("tablet %s: follower %s caught up from a snapshot at commit %d (%.1f MiB)",
                 tablet.name, self.follower, index, sent / 2**20)
        self.base = index

    async def _chunk(self, chunk: pb.SnapshotChunk) -> None:
        resp = None if self.rep.blocked(self.address) else await self.rep.channel.snapshot(self.address, chunk)
        if resp is None:
            raise MillstreamError(f"follower at {self.address} is not reachable")
        if resp.status == R.STALE_TOKEN:
            raise StaleTokenError(resp.detail or "a newer primary exists")
        if resp.status != R.OK:
            raise MillstreamError(f"follower refused the snapshot: {resp.detail}")
