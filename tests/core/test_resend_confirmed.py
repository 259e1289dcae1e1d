"""A primary reopened with checkpointed productions sends them again only once every in-sync
copy holds the commit that made them (docs/replication.md): two workers in process, real
RocksDB, the network between them and the leader's in-sync set played by the test.

A batch whose follower did not take it, and whose drop the leader refused (a job cancelled with
its state kept, say), is written on the primary, productions checkpointed, and acknowledged
nowhere: its follower, still in the in-sync set, lacks it. Sent on reopening, its productions
would reach downstream while a promotion of that follower would forget the commit that made
them (and make others from the same input, under other ids)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from runtime.errors import StaleTokenError
from runtime.wire import millstream_pb2 as pb
from tests.core.corekit import engine_options
from tests.core.jobs import Collector
from tests.core.test_sink_handover import _pair, _rec, _until
from worker.sender import OK

KEY = ("echo", 0)


def _routing(version: int) -> pb.Routing:
    """Echo (two copies: w primary, f its in-sync follower) produces to a Collector on w."""
    r = pb.Routing(version=version)
    echo = r.computations.add(name="echo", code="tests.core.jobs:Echo", outputs=["out"], key_ranges=1,
                              exactly_once=True, productions="strong", late_records="process",
                              options=engine_options(replication=2))
    echo.inputs.add(stream="in")
    a = echo.assignments.add(key_range=0, worker_id="w", address="w:1", token=1)
    a.followers.add(worker_id="f", address="f:1")
    a.in_sync.extend(["w", "f"])
    sink = r.computations.add(name="collect", code="tests.core.jobs:Collector", outputs=[], key_ranges=1,
                              exactly_once=True, productions="strong", late_records="process",
                              options=engine_options())
    sink.inputs.add(stream="out")
    sink.assignments.add(key_range=0, worker_id="w", address="w:1", token=1)
    return r


def _seen() -> list[bytes]:
    return [value for _, _, value in Collector.seen]


@pytest.mark.timeout(60)
def test_a_reopened_primary_resends_a_commits_productions_only_once_its_followers_hold_it(tmp_path: Any) -> None:
    async def run() -> None:
        Collector.seen.clear()
        wires, w, f = _pair(str(tmp_path))
        for core in (f, w):
            await core.apply_routing(_routing(1))
        await _until(lambda: KEY in w.tablets and KEY in f.replicas.copies, "echo and its copy")
        assert await w.deliver("echo", 0, 1, [_rec(1)]) == OK
        await _until(lambda: _seen() == [b"v1"], "v1 collected")

        # The next batch: its follower does not answer, and the leader refuses to drop it.
        # Written on w, its production checkpointed there; f, still in sync, lacks it.
        wires["w"].cut = True
        wires["w"].refuse = StaleTokenError("the job is cancelled (its state kept)")
        assert await w.deliver("echo", 0, 1, [_rec(2)]) != OK

        # The failed primary reopens under the same token (its routing unchanged): f still
        # cannot be asked, nor dropped, so the production of commit 2 stays where it is.
        await w.apply_routing(_routing(2))
        await _until(lambda: len(wires["w"].asked) >= 2 or b"v2" in _seen(),
                     "the reopening to ask the leader to drop f (or to send v2)")
        assert _seen() == [b"v1"], "sent while its in-sync follower lacks the commit that made it"

        # Once the leader drops f, the commit is on every in-sync copy (w's): it goes out.
        wires["w"].refuse = None
        await w.apply_routing(_routing(3))
        deadline = time.monotonic() + 30
        while _seen() != [b"v1", b"v2"]:  # reconciling again retries an opening that failed late
            assert time.monotonic() < deadline, f"v2 not sent once f could leave the in-sync set: {_seen()}"
            await w.reconcile()
            await asyncio.sleep(0.01)  # poll interval of this deadline-bounded wait
        assert wires["w"].asked[-1] == ("f", False)
        await w.close_all()
        await f.close_all()
    asyncio.run(run())
