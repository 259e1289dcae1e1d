"""A sink's output through a handover whose new primary never gets a commit acknowledged
(docs/replication.md): two workers in process, real RocksDB and a real FileSink, the
network between them and the leader's in-sync set played by the test.

The old primary's last batch was fenced: its output and its commit are written on its side,
acknowledged nowhere, and it stays in the in-sync set until the new primary commits. The
new primary must not cut that output before its own history has won: if it is lost first,
the old primary gets the tablet back with that commit, and its output must still be there.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Any

from runtime import Record
from runtime.errors import StaleTokenError
from runtime.sinks import read_file_sink
from runtime.wire import millstream_pb2 as pb
from tests.core.corekit import Posting, WriteFails, engine_options, nowhere
from worker.core import WorkerCore
from worker.sender import OK

KEY = ("out", 0)


def _routing(version: int, token: int, primary: str, in_sync: list[str], path: str) -> pb.Routing:
    r = pb.Routing(version=version)
    c = r.computations.add(name="out", code="runtime.sinks:FileSink", outputs=[], key_ranges=1, exactly_once=True,
                           productions="strong", late_records="process", options=engine_options(replication=2))
    c.params["path"] = path
    c.inputs.add(stream="in")
    a = c.assignments.add(key_range=0, worker_id=primary, address=f"{primary}:1", token=token)
    follower = "f" if primary == "w" else "w"
    a.followers.add(worker_id=follower, address=f"{follower}:1")
    a.in_sync.extend(in_sync)
    return r


def _rec(i: int) -> Record:
    return Record(b"k", b"v%d" % i, 1_700_000_000_000_000 + i, i.to_bytes(16, "big"))


class _Wire(Posting):
    """One worker's network to the other, and the leader as that worker's primaries see it.

    ``cut``: its replication gets no answer (unreachable). ``leader``: how the leader answers
    an in-sync change (None: as asked), or an exception it raises, or an event it waits for."""

    def __init__(self) -> None:
        self.peer: WorkerCore | None = None
        self.cut = False
        self.asked: list[tuple[str, bool]] = []
        self.refuse: BaseException | None = None
        self.hold: asyncio.Event | None = None

    async def replicate(self, address: str, req: pb.ReplicateRequest) -> pb.ReplicateResponse | None:
        assert self.peer is not None
        return None if self.cut else await self.peer.replicas.replicate(req)

    async def snapshot(self, address: str, chunk: pb.SnapshotChunk) -> pb.ReplicateResponse | None:
        assert self.peer is not None
        return None if self.cut else await self.peer.replicas.install(chunk)

    async def update_in_sync(self, req: pb.InSyncRequest) -> tuple[str, ...]:
        self.asked.append((req.follower, req.add))
        if self.hold is not None:
            await self.hold.wait()
        if self.refuse is not None:
            raise self.refuse
        return (req.primary, req.follower) if req.add else (req.primary,)


def _pair(tmp: str) -> tuple[dict[str, _Wire], WorkerCore, WorkerCore]:
    """Workers "w" and "f" in process, each with a long lease, wired to each other."""
    wires = {"w": _Wire(), "f": _Wire()}
    cores = {}
    for name in ("f", "w"):
        core = WorkerCore(os.path.join(tmp, name), f"{name}:1", nowhere,  # type: ignore[arg-type]
                          channel=wires[name])
        core.worker_id = name
        core.renewed(core.now_ms(), 600_000)
        cores[name] = core
    wires["w"].peer, wires["f"].peer = cores["f"], cores["w"]
    return wires, cores["w"], cores["f"]


async def _until(cond: Callable[[], bool], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)  # poll interval of this deadline-bounded wait


def _values(path: str) -> list[str]:
    return [str(r["value"]) for r in read_file_sink(path)]


async def _one_record_in(tmp: str) -> tuple[str, dict[str, _Wire], WorkerCore, WorkerCore]:
    """The sink's output directory and the pair: w its primary, f its follower (token 1),
    one record committed and written."""
    out = os.path.join(tmp, "out")
    wires, w, f = _pair(tmp)
    for core in (f, w):
        await core.apply_routing(_routing(1, 1, "w", ["w", "f"], out))
    await _until(lambda: KEY in w.tablets and KEY in f.replicas.copies, "the sink and its copy")
    assert await w.deliver("out", 0, 1, [_rec(1)]) == OK
    return out, wires, w, f


def test_a_new_primary_lost_before_its_first_commit_leaves_the_old_primarys_output_whole(tmp_path: Any) -> None:
    async def run() -> None:
        out, wires, w, f = await _one_record_in(str(tmp_path))

        # w's next batch is fenced: its follower is out of reach, and the leader refuses to
        # drop it (the token moved on). Written on w, output included; acknowledged nowhere.
        wires["w"].cut = True
        wires["w"].refuse = StaleTokenError("token 1 is not current")
        assert await w.deliver("out", 0, 1, [_rec(2)]) != OK
        assert _values(out) == ["v1", "v2"]

        # f is promoted (token 2); w, the old primary, stays in the in-sync set. f's first
        # commit does not reach w, and the leader has not answered f's request to drop it.
        wires["f"].cut = True
        wires["f"].hold = asyncio.Event()
        for core in (w, f):
            await core.apply_routing(_routing(2, 2, "f", ["f", "w"], out))
        await _until(lambda: ("w", False) in wires["f"].asked, "f to ask the leader to drop w")
        assert _values(out) == ["v1", "v2"], "f cut the output before its history had won"

        # f is lost before the leader answers (its token is stale by then): w gets the tablet
        # back with its commit, and its output is whole.
        wires["f"].refuse = StaleTokenError("token 2 is not current")
        wires["f"].hold.set()
        await f.close_all()
        assert KEY not in f.tablets
        wires["w"].cut = True
        wires["w"].refuse = None
        await w.apply_routing(_routing(3, 3, "w", ["w"], out))
        await _until(lambda: KEY in w.tablets, "w to open the tablet again")
        assert await w.deliver_counted("out", 0, 3, [_rec(2)]) == (OK, 1)  # the sender's retry: done
        assert await w.deliver("out", 0, 3, [_rec(3)]) == OK
        assert _values(out) == ["v1", "v2", "v3"]
        await w.close_all()
    asyncio.run(run())


def test_a_follower_a_reopened_primary_dropped_is_caught_up_with_no_commit_and_no_routing(tmp_path: Any) -> None:
    """An idle sink reopened (a new token) finds its follower's copy gone (the follower was
    restarted, its copy not loaded yet) and has the leader drop it. The follower is then
    caught up (a snapshot) and added again by the primary on its own: no commit comes (the
    tablet is idle) and no routing after the drop (the link waited for either before)."""
    async def run() -> None:
        out, wires, w, f = await _one_record_in(str(tmp_path))
        asked = wires["w"].asked
        # Caught up, f is added through the leader though w's routing lists it in sync already:
        # the leader's set is the one that counts (a stale routing must not keep it out).
        await _until(lambda: asked == [("f", True)], "w to have the leader add f")
        await f.replicas.close(KEY)  # (f restarted on its disk: its copy is not loaded)
        for core in (f, w):
            await core.apply_routing(_routing(2, 2, "w", ["w", "f"], out))
        await _until(lambda: ("f", False) in asked, "w to have the leader drop f")
        await _until(lambda: ("f", True) in asked[asked.index(("f", False)):], "w to catch f up and have it added")
        copy = f.replicas.copies.get(KEY)
        assert copy is not None and (copy.index, copy.token) == (w.tablets[KEY].store.index, 2)  # (a snapshot)
        assert asked[asked.index(("f", False)):] == [("f", False), ("f", True)]
        await w.close_all()
        await f.close_all()
    asyncio.run(run())


def test_a_sink_reopened_after_a_failed_write_has_its_follower_holding_that_commit_dropped_before_it_cuts(
        tmp_path: Any) -> None:
    """Review of the sinks: a sink that never moved (token 1) skipped ``confirm`` when it reopened
    after a failed write, and cut its output back while its follower held the failed batch's
    commit; promoted, that follower found the output shorter than its commit and lost the
    batch's lines (its records were duplicates by then)."""
    async def run() -> None:
        out, wires, w, f = await _one_record_in(str(tmp_path))
        await _until(lambda: ("f", True) in wires["w"].asked, "f in sync")
        first = w.tablets[KEY]
        first.store.db = WriteFails(first.store.db, lambda: (copy := f.replicas.copies.get(KEY)) is not None
                                     and copy.index >= 2)
        assert await w.deliver("out", 0, 1, [_rec(2)]) != OK  # written to the file, shipped, not committed here
        deadline = time.monotonic() + 10
        while not ((now := w.tablets.get(KEY)) is not None and now is not first and now.open):  # reopened, token 1
            assert time.monotonic() < deadline, "the sink never reopened"
            await w.reconcile()
        assert ("f", False) in wires["w"].asked, "the output was cut while the follower held another commit"
        await w.close_all()
        await f.close_all()
    asyncio.run(run())
