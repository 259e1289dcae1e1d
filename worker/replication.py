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
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from runtime import metrics
from runtime.errors import MillstreamError, StaleTokenError
from runtime.wire import millstream_pb2 as pb
from worker.followerlink import Acks, FollowerLink

if TYPE_CHECKING:
    from worker.tablet import Tablet

log = logging.getLogger(__name__)
R = pb.ReplicateResponse


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


@dataclass(slots=True)
class Sending:
    """What a commit's replication waits for: (follower, its link, its acknowledgement, whether
    it was in the in-sync set when the commit was sent), and when all of them are in."""

    waits: list[tuple[str, FollowerLink | None, asyncio.Future[bool], bool]]  # (None: an addressless follower, being dropped)
    acks: Acks


class ReplicationError(MillstreamError):
    """A commit could not be made durable on the in-sync set (the primary is stale, or
    lost its lease while the leader was unreachable): nothing of it is acknowledged."""


class Replicator:
    """The followers of one primary tablet (created with the tablet, closed with it)."""

    def __init__(self, tablet: Tablet, channel: ReplicaChannel, checkpoints: str, timeout_s: float,
                 blocked: Callable[[str], bool] = lambda address: False, added: set[str] | None = None) -> None:
        self.tablet = tablet
        self.channel = channel
        self.checkpoints = checkpoints
        self.timeout_s = timeout_s
        self.blocked = blocked      # a test's fault hook: the network to this address is cut
        self.links: dict[str, FollowerLink] = {}
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
                self.links[w] = FollowerLink(self, w, address)
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
        sending = Sending([], Acks())
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
                await acks  # (in the turn the last answer is read in: Acks)
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

    async def caught_up(self, link: FollowerLink) -> None:
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
