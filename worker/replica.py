"""A worker's follower copies: commits and snapshots from primaries, fenced by token.

A copy holds the commits of one primary (``source``: the token it was built under, from
that primary's snapshot) in order. It refuses anything under a token older than one it
has seen (from a primary or from the routing), and answers NEED_SNAPSHOT to a primary it
cannot continue from: a new primary (token), a gap in the commit numbers, or a commit it
holds that may not be the primary's. A commit is named by its number and its term (the
primary's opening that made it, worker/storage.py): a primary that reopened after its own
write of commit N failed (its followers may already hold that N) makes a different N
under a higher term. So a copy never mixes the commits of two primaries or of two
openings of one, and a deposed primary can make nothing durable here once its successor
exists (DESIGN.md §5, docs/replication.md). No gRPC here.

A new primary's commits continue a copy built from its predecessor's when the commit
before them is the copy's last one, by number and term (terms name the token they were
made under: worker/storage.py :func:`next_term`). So the followers of a primary that moves
stay in sync without a snapshot, and so does the old primary itself: its files, closed as
primary (:meth:`Replicas.demoted`), become its follower copy. A primary handed to its only
in-sync follower (a rebalance) used to leave that follower as the one in-sync copy until the
old primary had taken a snapshot of it; a host lost then made the tablet unavailable.

Peers authenticate with the shared worker token only, so a primary's token is believed
only as far as this worker's routing confirms it: commits and snapshots come in only for
a tablet the routing says this worker follows, under a token no newer than the routing's
(NOT_YET otherwise: the sender retries once this worker's routing caught up). One forged
call under a huge token used to raise the fence for ever, and the real primary's every
commit then failed (review N14).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import os
import re
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, NamedTuple

from runtime import metrics
from runtime.durable import sync_dir
from runtime.routing import TabletKey
from runtime.wire import millstream_pb2 as pb
from worker.replicastore import ReplicaStore
from worker.runner import TabletThread
from worker.storage import TERM_TOKEN_BITS

log = logging.getLogger(__name__)
_SESSION = re.compile(r"[A-Za-z0-9_-]{1,64}")  # a snapshot's session (worker/replication.py): a directory's name
R = pb.ReplicateResponse
SYNC_THREADS = 4      # a frame's copies synced side by side
SYNC_WAIT_S = 0.002   # how long the loop waits for them (while they take less) before going on


def _refuse(status: int, why: str, detail: str, index: int = 0) -> pb.ReplicateResponse:
    metrics.FOLLOWER_REFUSALS.labels(why).inc()
    return pb.ReplicateResponse(status=status, detail=detail, index=index)  # type: ignore[arg-type]


class Replicas:
    """The follower copies on one worker."""

    def __init__(self, state_dir: str, path_of: Callable[[TabletKey], str],
                 primary_token: Callable[[TabletKey], int | None], worker_id: Callable[[], str] = lambda: "",
                 remember: Callable[[TabletKey], Awaitable[None]] | None = None, *,
                 routed_token: Callable[[TabletKey], int]) -> None:
        self.worker_id = worker_id
        self.remember = remember  # records a tablet held here before its copy is made (worker/seen.py)
        self.incoming_dir = os.path.join(state_dir, ".incoming")
        self.path_of = path_of
        self.primary_token = primary_token  # token of a tablet open (or opening) here as primary
        self.routed_token = routed_token    # the routing's token of a tablet followed here (else 0)
        self.copies: dict[TabletKey, ReplicaStore] = {}
        self.fence: dict[TabletKey, int] = {}      # newest token seen per tablet
        self._incoming: dict[TabletKey, tuple[str, str]] = {}  # key -> (session, directory)
        self._locks: dict[TabletKey, tuple[asyncio.Lock, list[int]]] = {}  # with how many hold or wait
        self._threads: dict[TabletKey, TabletThread] = {}
        self._syncs: concurrent.futures.ThreadPoolExecutor | None = None  # (see _apply)
        self.sync_s = 0.0  # moving average of the syncs' times: the loop waits for them if short
        self._demoted: set[TabletKey] = set()  # closed here as primary: its files may continue as a copy

    @contextlib.asynccontextmanager
    async def _lock(self, key: TabletKey) -> AsyncIterator[None]:
        """Hold the copy's lock; it is forgotten once nobody holds or waits for it (one per
        range ever would stay otherwise)."""
        entry = self._locks.get(key)
        if entry is None:
            entry = self._locks[key] = (asyncio.Lock(), [0])
        lock, users = entry
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if not users[0]:
                del self._locks[key]

    def _thread(self, key: TabletKey) -> TabletThread:
        """The copy's own thread for its long writes and its opening and closing (a short
        write is made on the event loop: :meth:`_apply`)."""
        thread = self._threads.get(key)
        if thread is None:
            thread = self._threads[key] = TabletThread(f"{key[0]}/{key[1]} follower")
        return thread

    def forget(self, gone: Callable[[TabletKey], bool]) -> None:
        """Forget the fences of ranges ``gone`` for good that have no copy here (a split's or
        merge's parents, a deleted job's ranges): nothing replicates to them any more."""
        for key in [k for k in self.fence if k not in self.copies and k not in self._incoming and gone(k)]:
            del self.fence[key]
        self._demoted = {k for k in self._demoted if not gone(k)}

    def demoted(self, key: TabletKey) -> None:
        """This worker closed ``key`` as primary: if its successor's commits continue the
        files it left, they become this worker's follower copy (:meth:`replicate`)."""
        self._demoted.add(key)

    async def _adopt(self, key: TabletKey) -> ReplicaStore | None:
        """The follower copy made of the files ``key``'s primary left here, or None."""
        self._demoted.discard(key)
        path = self.path_of(key)
        if not os.path.exists(os.path.join(path, "CURRENT")):
            return None
        try:
            copy = await self._thread(key).run(functools.partial(ReplicaStore, path))
        except Exception as e:  # its RocksDB still locked, say: it catches up from a snapshot
            log.warning("tablet %s/%d: the files it left as primary do not open as a copy: %s", key[0], key[1], e)
            return None
        self.copies[key] = copy
        return copy

    def raise_fence(self, key: TabletKey, token: int) -> None:
        if token > self.fence.get(key, 0):
            self.fence[key] = token

    def _check(self, key: TabletKey, token: int, follower: str = "") -> pb.ReplicateResponse | None:
        """A refusal for a primary under ``token``, or None."""
        me = self.worker_id()
        if follower and me and follower != me:
            return _refuse(R.WRONG_WORKER, "wrong worker", f"this is worker {me}, not {follower} (a new "
                           "worker at its address)")
        mine = self.primary_token(key)
        if mine is not None and mine >= token:
            return _refuse(R.STALE_TOKEN, "primary here", f"this worker is the primary of "
                           f"{key[0]}/{key[1]} under token {mine}, not older than {token}")
        if token < self.fence.get(key, 0):
            return _refuse(R.STALE_TOKEN, "stale token", f"{key[0]}/{key[1]}: token {token} is older than "
                           f"token {self.fence[key]}, already seen here")
        routed = self.routed_token(key)
        if token > routed or token < 1:  # (token 0 is no primary's: a tablet not routed here has 0)
            # Not confirmed: the fence stays where the routing put it (review N14).
            return _refuse(R.NOT_YET, "not routed", f"{key[0]}/{key[1]}: this worker's routing has no copy "
                           f"of it here under token {token} (its token here: {routed or 'none'}); "
                           "retry once the routing has reached this worker")
        if mine is not None:  # closing as primary: its files may continue as a copy once closed
            return _refuse(R.NOT_YET, "busy", f"{key[0]}/{key[1]} is still open here as primary under "
                           f"token {mine}; retry once it has closed")
        return None

    async def replicate(self, req: pb.ReplicateRequest) -> pb.ReplicateResponse:
        return (await self.replicate_many([req]))[0]

    async def replicate_many(self, reqs: Sequence[pb.ReplicateRequest]) -> list[pb.ReplicateResponse]:
        """One primary worker's commits for several copies (a frame), each checked under its
        copy's lock and then applied (:meth:`_apply`). A write that raises fails them all, as a
        gRPC error; the others are held (a retry finds them so)."""
        keys = [(r.computation, r.key_range) for r in reqs]
        if len(set(keys)) < len(keys):  # one copy twice: the second continues the first's apply
            return [await self.replicate(r) for r in reqs]
        async with contextlib.AsyncExitStack() as locked:
            for key in sorted(keys):
                await locked.enter_async_context(self._lock(key))
            answers = [await self._prepare(key, r) for key, r in zip(keys, reqs, strict=True)]
            writes = [a for a in answers if isinstance(a, _Write)]
            if writes:
                await self._apply(writes)
            return [pb.ReplicateResponse(status=R.OK, index=a.copy.index, term=a.copy.term)
                    if isinstance(a, _Write) else a for a in answers]

    async def _prepare(self, key: TabletKey, req: pb.ReplicateRequest) -> pb.ReplicateResponse | _Write:
        """The answer to ``req`` (under its copy's lock), or the write that makes it."""
        refused = self._check(key, req.token, req.follower)
        if refused is not None:
            return refused
        self.raise_fence(key, req.token)
        copy = self.copies.get(key)
        if copy is None and key in self._demoted:
            copy = await self._adopt(key)
        if copy is not None and copy.token != req.token and not req.entries:
            # A new primary asks which commit is here (Replicator.confirm): say, change nothing.
            return pb.ReplicateResponse(status=R.OK, index=copy.index, term=copy.term)
        if copy is None or (copy.token != req.token and not _succeeds(copy, req)):
            return _refuse(R.NEED_SNAPSHOT, "new primary", "no copy of this primary's commits here",
                           copy.index if copy else 0)
        if copy.token != req.token:
            log.info("follower copy of %s/%d (commit %d, token %d) continues under the primary of token %d",
                     key[0], key[1], copy.index, copy.token, req.token)
        refused = _continues(copy, req)
        if refused is not None:
            return refused
        entries = [(e.index, e.ops) for e in req.entries if e.index > copy.index]
        if not entries:  # a retry (or a question: which commit is here?)
            return pb.ReplicateResponse(status=R.OK, index=copy.index, term=copy.term)
        return _Write(key, copy, req.token, req.term, entries, req.sync)

    async def _apply(self, writes: list[_Write]) -> None:
        """Make ``writes`` (each under its copy's lock). Short ones are written here, on the
        event loop, and synced side by side on the sync threads while the loop waits (for at
        most :data:`SYNC_WAIT_S`, and not while syncs typically take longer): traced on W1,
        handing each to its copy's thread cost the loop's turn and a thread's start, 0.3 ms of
        a round's 1 ms on the follower, the fsync 0.3 ms. Others (a range deleted, the log applied, a large catch-up) are made on
        the copy's thread, as is any whose thread still runs a write (its caller cancelled)."""
        errors: list[Exception] = []
        synced: list[tuple[ReplicaStore, tuple[int, int, int]]] = []
        slow: list[_Write] = []
        for w in writes:
            thread = self._threads.get(w.key)
            held = w.copy.held
            try:
                if (thread is not None and not thread.idle) or not w.copy.apply(
                        w.token, w.term, w.entries, sync=False, quick=True):
                    slow.append(w)
                elif w.sync:
                    synced.append((w.copy, held))
            except Exception as e:
                errors.append(e)
        running = [self._thread(w.key).run(functools.partial(w.copy.apply, w.token, w.term, w.entries, sync=w.sync))
                   for w in slow]
        try:  # (awaited, not gathered: a task would cost two turns of the loop)
            await self._sync(synced)
        except Exception as e:
            errors.append(e)
        if running:
            outcomes = await asyncio.gather(*running, return_exceptions=True)
            errors += [e for e in outcomes if isinstance(e, Exception)]
        if errors:
            raise errors[0]

    async def _sync(self, synced: list[tuple[ReplicaStore, tuple[int, int, int]]]) -> None:
        if not synced:
            return
        if self._syncs is None:
            self._syncs = concurrent.futures.ThreadPoolExecutor(SYNC_THREADS, thread_name_prefix="follower sync")
        futures = [self._syncs.submit(_timed, copy.sync, held) for copy, held in synced]
        if self.sync_s < SYNC_WAIT_S:  # (a disk whose syncs take longer does not hold the loop)
            concurrent.futures.wait(futures, SYNC_WAIT_S)  # (the interpreter lock released)
        try:  # every sync ends before the locks go, one that raises included
            pending = [asyncio.wrap_future(f) for f in futures if not f.done()]  # (none: no turn of the loop)
            if pending:
                await asyncio.wait(pending)
        except asyncio.CancelledError:
            # The copies' locks stay until their syncs end: a retry must not find commits held
            # that are not on disk yet, nor a close close a copy being synced.
            while not all(f.done() for f in futures):
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait([asyncio.wrap_future(f) for f in futures if not f.done()])
            for (copy, held), f in zip(synced, futures, strict=True):
                if f.cancelled():  # never ran
                    copy.unhold(held)
            raise
        failed = [e for e in (f.exception() for f in futures) if e is not None]
        if failed:
            raise failed[0]
        self.sync_s = 0.8 * self.sync_s + 0.2 * max(f.result() for f in futures)

    async def install(self, chunk: pb.SnapshotChunk) -> pb.ReplicateResponse:
        """One piece of a snapshot; the last one replaces the copy with it."""
        key = (chunk.computation, chunk.key_range)
        async with self._lock(key):
            refused = self._check(key, chunk.token, chunk.follower)
            if refused is None and not _SESSION.fullmatch(chunk.session):  # (it names a directory)
                refused = _refuse(R.NEED_SNAPSHOT, "bad session", f"snapshot session {chunk.session[:40]!r} is "
                                  "not a primary's (letters, digits, _ and -)")
            if refused is not None:
                self._discard_incoming(key)
                return refused
            self.raise_fence(key, chunk.token)
            session, directory = self._incoming.get(key, ("", ""))
            if session != chunk.session:
                self._discard_incoming(key)
                if self.remember is not None:
                    await self.remember(key)
                directory = os.path.join(self.incoming_dir, f"{key[0]}-{key[1]}-{chunk.session}")
                await asyncio.to_thread(os.makedirs, directory, exist_ok=True)
                self._incoming[key] = (chunk.session, directory)
            if not chunk.done:
                await asyncio.to_thread(write_at, os.path.join(directory, os.path.basename(chunk.file)),
                                        chunk.offset, chunk.data)
                return pb.ReplicateResponse(status=R.OK)
            del self._incoming[key]
            old = self.copies.pop(key, None)
            if old is not None:  # on its own thread: after a write still running there (its caller cancelled)
                await self._thread(key).run(old.close)
            path = self.path_of(key)
            copy = await asyncio.to_thread(_install, path, directory)
            if copy.index != chunk.index:
                copy.close()
                return _refuse(R.NEED_SNAPSHOT, "bad snapshot", f"snapshot holds commit {copy.index}, "
                               f"not {chunk.index}")
            copy.token = chunk.token
            self.copies[key] = copy
            log.info("follower copy of %s/%d installed from a snapshot at commit %d (token %d)",
                     key[0], key[1], copy.index, chunk.token)
            return pb.ReplicateResponse(status=R.OK, index=copy.index)

    async def create_empty(self, key: TabletKey, token: int) -> None:
        """The copy of a new tablet, in its in-sync set from the start: empty, like the
        primary's (which then needs no snapshot to send its first commits)."""
        async with self._lock(key):
            path = self.path_of(key)
            if key in self.copies or self.primary_token(key) is not None or os.path.exists(path):
                return
            copy = await asyncio.to_thread(ReplicaStore, path, token)
            self.copies[key] = copy
            self.raise_fence(key, token)

    def _discard_incoming(self, key: TabletKey) -> None:
        _, directory = self._incoming.pop(key, ("", ""))
        if directory:
            shutil.rmtree(directory, ignore_errors=True)

    async def close(self, key: TabletKey, *, delete: bool = False) -> None:
        """Close the copy of ``key`` (before this worker opens it as primary, or when it no
        longer follows it; ``delete`` also removes its files)."""
        async with self._lock(key):
            self._discard_incoming(key)
            self._demoted.discard(key)
            copy = self.copies.pop(key, None)
            if copy is not None:
                await self._thread(key).run(copy.close)
            thread = self._threads.pop(key, None)
            if thread is not None:
                thread.stop()
            if delete:
                await asyncio.to_thread(shutil.rmtree, self.path_of(key), True)
                log.info("follower copy of %s/%d deleted (no longer a copy here)", key[0], key[1])

    async def close_all(self) -> None:
        for key in list(self.copies):
            await self.close(key)
        if self._syncs is not None:
            self._syncs.shutdown(wait=False)
            self._syncs = None


def _timed(fn: Callable[..., None], *args: Any) -> float:
    started = time.monotonic()
    fn(*args)
    return time.monotonic() - started


class _Write(NamedTuple):
    """Commits to apply to a follower copy (:meth:`ReplicaStore.apply`)."""

    key: TabletKey
    copy: ReplicaStore
    token: int
    term: int
    entries: list[tuple[int, bytes]]
    sync: bool


def _succeeds(copy: ReplicaStore, req: pb.ReplicateRequest) -> bool:
    """Whether a new primary's commits ``req`` continue ``copy``, built from an older
    primary's: they follow its last commit, of the same term. A term made before terms named
    their token (high bits 0) may be another primary's too: such a copy takes a snapshot."""
    return (bool(req.entries) and req.entries[0].index == copy.index + 1 and req.prev_term == copy.term
            and copy.term >> TERM_TOKEN_BITS > 0)


def _continues(copy: ReplicaStore, req: pb.ReplicateRequest) -> pb.ReplicateResponse | None:
    """A refusal (NEED_SNAPSHOT) unless ``req``'s commits continue ``copy`` (same token).

    Commits this copy holds are the primary's only if they are of its current term (a
    retry); the next one continues it only if the commit before it, held here, is of the
    term the primary says (Raft's rule on the previous entry's term)."""
    if req.term < copy.term:
        return _refuse(R.NEED_SNAPSHOT, "old term", f"term {req.term} is older than the term {copy.term} of "
                       f"commit {copy.index} held here (an earlier opening of this primary)", copy.index)
    if not req.entries:
        return None
    first = req.entries[0].index
    if first <= copy.index and req.term != copy.term:
        return _refuse(R.NEED_SNAPSHOT, "other term", f"commit {copy.index} held here is of term {copy.term}, "
                       f"not the primary's term {req.term}: it may differ from the primary's", copy.index)
    if first == copy.index + 1 and req.prev_term != copy.term:
        return _refuse(R.NEED_SNAPSHOT, "other term", f"commit {copy.index} held here is of term {copy.term}, "
                       f"the primary's is of term {req.prev_term}", copy.index)
    indexes = [e.index for e in req.entries]
    if first > copy.index + 1 or indexes != list(range(first, first + len(indexes))):
        return _refuse(R.NEED_SNAPSHOT, "gap", f"commits from {first} do not follow commit {copy.index} held "
                       "here", copy.index)
    return None


def write_at(path: str, offset: int, data: bytes) -> None:
    """Write one chunk of a received file, durably."""
    with open(path, "r+b" if os.path.exists(path) else "wb") as f:
        f.seek(offset)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _install(path: str, directory: str) -> ReplicaStore:
    sync_dir(directory)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return ReplicaStore.install(path, directory)
