"""A primary's side of replication: its followers, and the wait for their acknowledgements.

Every commit of a replicated tablet goes, in order, to each follower (DESIGN.md §5,
docs/replication.md), while the primary writes it itself: :meth:`Replicator.send` starts
it, and :meth:`Replicator.wait` returns once every follower of the in-sync set has it
durable; a follower that fails or does not answer within
``replica_timeout_ms`` is first removed from the in-sync set by the leader, and only
then does the primary go on without it. A follower that is not in sync catches up in the
background: from a checkpoint of the primary's copy when it holds nothing usable, then
from the commits after it; once it has acknowledged everything, its acknowledgements
are awaited and the leader is asked to add it to the in-sync set.

No gRPC here: the worker hands in a :class:`ReplicaChannel`.
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
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from runtime import metrics
from runtime.errors import MillstreamError, StaleTokenError
from runtime.wire import millstream_pb2 as pb
from worker.chunks import checkpoint_chunks

if TYPE_CHECKING:
    from worker.tablet import Tablet

log = logging.getLogger(__name__)
R = pb.ReplicateResponse
SEND_MAX_ENTRIES = 256        # commits per Replicate call while catching up
SEND_MAX_BYTES = 8 << 20
QUEUE_MAX_BYTES = 256 << 20   # a follower further behind starts again from a snapshot


class ReplicaChannel(Protocol):
    """How a primary reaches its followers and the leader (worker/server.py)."""

    async def replicate(self, address: str, req: pb.ReplicateRequest) -> pb.ReplicateResponse | None:
        """None: not reachable."""

    def post(self, address: str, req: pb.ReplicateRequest,
             answered: Callable[[pb.ReplicateResponse | None], None]) -> None:
        """Send ``req``; ``answered`` takes its answer (None: not reachable) when it comes."""

    async def snapshot(self, address: str, chunk: pb.SnapshotChunk) -> pb.ReplicateResponse | None:
        """None: not reachable."""

    async def update_in_sync(self, req: pb.InSyncRequest) -> tuple[str, ...]:
        """The tablet's in-sync set after the change; raises StaleTokenError if refused."""


class Posting:
    """:meth:`ReplicaChannel.post` from its ``replicate`` coroutine, for a channel that has
    only that (a test's)."""

    async def replicate(self, address: str, req: pb.ReplicateRequest) -> pb.ReplicateResponse | None:
        raise NotImplementedError

    def post(self, address: str, req: pb.ReplicateRequest,
             answered: Callable[[pb.ReplicateResponse | None], None]) -> None:
        def done(task: asyncio.Task[pb.ReplicateResponse | None]) -> None:
            answered(None if task.cancelled() or task.exception() is not None else task.result())
        asyncio.get_running_loop().create_task(self.replicate(address, req)).add_done_callback(done)


class _Acks:
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
class Sending:
    """What a commit's replication waits for: (follower, its link, its acknowledgement, whether
    it was in the in-sync set when the commit was sent), and when all of them are in."""

    waits: list[tuple[str, _Link | None, asyncio.Future[bool], bool]]  # (None: an addressless follower, being dropped)
    acks: _Acks


class ReplicationError(MillstreamError):
    """A commit could not be made durable on the in-sync set (the primary is stale, or
    lost its lease while the leader was unreachable): nothing of it is acknowledged."""


@dataclass(slots=True)
class _Entry:
    index: int
    ops: bytes
    done: asyncio.Future[bool]
    acks: _Acks | None  # (None: not waited for)

    def settle(self, ok: bool) -> None:
        if not self.done.done():
            self.done.set_result(ok)
            if self.acks is not None:
                self.acks.one()


class _Link:
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

    def push(self, index: int, ops: bytes, acks: _Acks | None = None) -> asyncio.Future[bool]:
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
        if rep.blocked(self.address):
            self._answered(entries[-1].index, 0.0, None)
        else:
            req = self.request()
            req.entries.extend(entries)
            req.prev_term = rep.tablet.store.term_of(entries[0].index - 1)
            rep.channel.post(self.address, req,
                             functools.partial(self._answered, entries[-1].index, time.perf_counter()))
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


class Replicator:
    """The followers of one primary tablet (created with the tablet, closed with it)."""

    def __init__(self, tablet: Tablet, channel: ReplicaChannel, checkpoints: str, timeout_s: float,
                 blocked: Callable[[str], bool] = lambda address: False, added: set[str] | None = None) -> None:
        self.tablet = tablet
        self.channel = channel
        self.checkpoints = checkpoints
        self.timeout_s = timeout_s
        self.blocked = blocked      # a test's fault hook: the network to this address is cut
        self.links: dict[str, _Link] = {}
        self.in_sync: set[str] = set()   # followers the leader lists in the in-sync set
        # Followers we asked to add (the answer may be lost): the worker's, for this tablet and
        # token, kept across its openings (a reopened primary whose routing does not list an
        # add yet still waits for that follower: review of replication).
        self.added: set[str] = set() if added is None else added
        self._drops: dict[str, asyncio.Task[bool]] = {}  # in-sync followers with no address, being dropped
        self._listed: set[str] = set()  # the routing's followers, with an address or not
        self.stale = False
        # One change of the in-sync set asked of the leader at a time: each answer is the whole
        # set, so two asked at once could be applied in the other order than the leader's.
        self._asking = asyncio.Lock()

    def configure(self, assignment: pb.Assignment) -> None:
        """Follow the routing: links to the tablet's followers, and its in-sync set."""
        listed = self._listed = {f.worker_id for f in assignment.followers}
        self.added &= listed  # (the worker's set, kept across openings: not for a follower no longer listed)
        followers = {f.worker_id: f.address for f in assignment.followers if f.address}
        # A follower listed with no address (its worker expired) stays required while the leader
        # lists it in sync: a commit waits until the leader has dropped it (send, _dropping).
        self.in_sync = {w for w in assignment.in_sync if w in listed}
        for w in [w for w in self.links if w not in followers]:
            link = self.links.pop(w)
            self.added.discard(w)
            asyncio.get_running_loop().create_task(link.close())
        for w, address in followers.items():
            old = self.links.get(w)
            if old is not None and old.address != address:  # restarted elsewhere
                del self.links[w]
                asyncio.get_running_loop().create_task(old.close())
            if w not in self.links:
                self.links[w] = _Link(self, w, address)
            elif w not in assignment.in_sync:
                # Dropped by the leader (a restart, an expiry): it stays required until we
                # have shrunk it ourselves (a stale routing must not hide a member).
                self.dropped(w)
        self.in_sync = {w for w in assignment.in_sync if w in listed}

    def dropped(self, follower: str) -> None:
        """``follower`` is out of the in-sync set (the leader's routing says so, or our own
        request to drop a probing one was answered): it proves its copy (or takes a snapshot)
        before it is added again, even if this tablet commits nothing meanwhile and no
        routing comes (an idle tablet's probing link would otherwise wait for either)."""
        link = self.links.get(follower)
        if link is not None and (link.synced or link.probe):
            link.synced = link.probe = False
            link.verify = True
            link.nudge()

    def required(self) -> set[str]:
        """Followers without whose acknowledgement nothing may be acknowledged."""
        return self.in_sync | self.added

    def send(self, index: int, ops: bytes) -> Sending:
        """Queue commit ``index`` for every follower (called before the primary's own write
        of it: they take it meanwhile); :meth:`wait` for what this returns."""
        required = self.required()
        sending = Sending([], _Acks())
        for w, link in self.links.items():
            awaited = w in required or link.synced
            fut = link.push(index, ops, sending.acks if awaited else None)
            if awaited:
                sending.waits.append((w, link, fut, w in required))
        for w in (required & self._listed) - self.links.keys():
            drop = self._dropping(w)
            sending.acks.left += 1
            drop.add_done_callback(lambda _: sending.acks.one())
            sending.waits.append((w, None, drop, True))
        sending.acks.one()  # (send's hold)
        return sending

    def _dropping(self, follower: str) -> asyncio.Task[bool]:
        """A required follower this primary has no address for: have the leader drop it (one
        request at a time per follower); True once it has."""
        task = self._drops.get(follower)
        if task is None or task.done():
            async def drop() -> bool:
                await self._shrink(follower)
                return True
            task = self._drops[follower] = asyncio.get_running_loop().create_task(drop())
        return task

    async def wait(self, sending: Sending) -> None:
        """Return once the commit :meth:`send` gave is durable on every in-sync follower (the
        others get it too, as they can); raises :class:`ReplicationError` if that cannot be."""
        if self.stale:
            raise ReplicationError(f"tablet {self.tablet.name}: a newer primary exists")
        if not sending.waits:
            return
        acks = sending.acks.all
        if not acks.done():
            timer = asyncio.get_running_loop().call_later(self.timeout_s, sending.acks.expire)
            try:
                await acks  # (in the turn the last answer is read in: _Acks)
            finally:
                timer.cancel()
        for w, link, fut, required in sending.waits:
            if fut.done() and fut.result():
                continue
            if link is None:  # dropped through the leader first (or the lease runs out: it raises)
                await asyncio.shield(fut)  # (shared by the commits waiting: one cancelled stops no other)
                continue
            if self.stale:
                raise ReplicationError(f"tablet {self.tablet.name}: follower {w} has seen a newer primary")
            was_synced = link.synced
            link.fail()
            if required or was_synced:  # the leader may list it (an add's answer lost)
                await self._shrink(w)

    async def _shrink(self, follower: str) -> None:
        """Have the leader remove ``follower`` from the in-sync set (waiting for as long as our
        lease holds): only then may a commit be acknowledged without it."""
        tablet = self.tablet
        log.warning("tablet %s: follower %s did not take the commit (unreachable, silent for %.0f ms, or its "
                    "copy needs a snapshot from this primary); removing it from the in-sync set", tablet.name,
                    follower, self.timeout_s * 1000)
        req = pb.InSyncRequest(computation=tablet.computation, key_range=tablet.key_range, token=tablet.token,
                               follower=follower, add=False, primary=tablet.host.worker_id)
        while True:
            try:
                async with self._asking:
                    self.in_sync = set(await self.channel.update_in_sync(req))
                self.added.discard(follower)
                metrics.IN_SYNC_CHANGES.labels("leave").inc()
                link = self.links.get(follower)
                if link is not None and link.probe:
                    # A link waiting for a commit to probe with (a reopened primary's: its
                    # question went unanswered, _confirm): it proves the copy now. Not a
                    # synced one: its acknowledgements stay awaited (its own caught_up may be
                    # waiting to add it back, and may only once it holds every commit).
                    self.dropped(follower)
                return
            except StaleTokenError as e:
                self.stale = True
                raise ReplicationError(str(e)) from None
            except Exception as e:
                if not tablet.host.lease_valid():
                    raise ReplicationError(
                        f"tablet {tablet.name}: cannot reach the leader to drop follower {follower} "
                        f"and the lease ran out ({e})") from None
                await asyncio.sleep(0.1)

    async def confirm(self) -> None:
        """Return once every follower this primary must wait for holds its last commit, or has
        been removed from the in-sync set through the leader; commits nothing.

        Each is asked which commit it holds (an empty Replicate, which changes nothing there;
        a copy built under an older token answers too, worker/replica.py). Before this, a copy
        with a commit this one lacks may still be promoted back; after it, none can. A sink
        calls this before it cuts its output back to its commit (worker/tablet.py). The
        followers are asked side by side, within the replica timeout as a commit's
        acknowledgement is: one that hangs holds the opening up that long, no longer."""
        store = self.tablet.store
        want = (store.index, store.term_of(store.index))
        deadline = time.monotonic() + self.timeout_s
        asks = [asyncio.ensure_future(self._confirm(w, want, deadline)) for w in sorted(self.required())]
        try:
            await asyncio.gather(*asks)
        finally:  # one failed (a newer primary, the leader unreachable): the others stop too
            for ask in asks:
                ask.cancel()
            await asyncio.gather(*asks, return_exceptions=True)

    async def _confirm(self, w: str, want: tuple[int, int], deadline: float) -> None:
        link = self.links.get(w)
        while link is not None:
            resp = None
            left = deadline - time.monotonic()
            if left > 0 and not self.blocked(link.address):
                try:
                    resp = await asyncio.wait_for(self.channel.replicate(link.address, link.request()), left)
                except TimeoutError:
                    pass
            if resp is not None and resp.status == R.STALE_TOKEN:
                self.stale = True
                raise ReplicationError(f"tablet {self.tablet.name}: follower {w} has seen a newer primary")
            if resp is not None and resp.status == R.OK and (resp.index, resp.term) == want:
                return
            if (resp is not None and resp.status not in (R.NOT_YET, R.WRONG_WORKER)) or time.monotonic() > deadline:
                break  # another commit there, or silent too long
            await asyncio.sleep(0.05)  # its routing lags, or it is still closing as primary: ask again
        await self._shrink(w)

    async def caught_up(self, link: _Link) -> None:
        """``link``'s follower acknowledged every commit: await it from now on, and ask the
        leader to add it to the in-sync set (added first on our side: if the answer is lost,
        we still treat it as in sync). The leader is asked even if our copy of the set lists
        it already: the leader's set is the one that counts (an add it holds changes nothing)."""
        link.synced = True
        tablet = self.tablet
        joins = link.follower not in self.in_sync
        self.added.add(link.follower)
        req = pb.InSyncRequest(computation=tablet.computation, key_range=tablet.key_range, token=tablet.token,
                               follower=link.follower, add=True, primary=tablet.host.worker_id)
        try:
            async with self._asking:
                self.in_sync = set(await self.channel.update_in_sync(req))
            if joins:
                metrics.IN_SYNC_CHANGES.labels("join").inc()
        except StaleTokenError:
            raise
        except Exception as e:  # the leader moves; the link tries again when it next catches up
            log.info("tablet %s: could not add follower %s to the in-sync set yet: %s", tablet.name,
                     link.follower, e)
            link.synced = False
            await asyncio.sleep(0.2)

    def lag(self) -> dict[str, int]:
        """Commits each follower has not acknowledged."""
        return {w: link.lag() for w, link in self.links.items()}

    async def close(self) -> None:
        links, self.links = list(self.links.values()), {}
        drops, self._drops = list(self._drops.values()), {}
        for task in drops:
            task.cancel()
        await asyncio.gather(*(link.close() for link in links), *drops, return_exceptions=True)
