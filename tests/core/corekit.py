"""Building an in-process WorkerCore for the core tests: real RocksDB, no network."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from runtime.imports import CodePolicy
from runtime.wire import millstream_pb2 as pb
from tests.core.jobs import Collector
from worker.core import WorkerCore, WorkerLimits


async def nowhere(*args: object) -> int:
    raise AssertionError("everything is local in these tests")


async def make_core(tmp: str, routing: pb.Routing, limits: WorkerLimits = WorkerLimits(),
                    clock: Callable[[], int] | None = None,
                    policy: CodePolicy = CodePolicy(("*",))) -> WorkerCore:
    """A core registered as worker "w" with a long lease, with ``routing`` applied and the
    Collector's record of outputs emptied."""
    kw = {} if clock is None else {"wall_us": clock}
    core = WorkerCore(tmp, "self:1", nowhere, limits, code_policy=policy, **kw)  # type: ignore[arg-type]
    core.worker_id = "w"
    core.renewed(core.now_ms(), 600_000)
    Collector.seen = []
    await core.apply_routing(routing)
    return core


def engine_options(exactly_once: bool = True, fsync: bool | None = None, dedup_retention_s: float = 600.0,
                   replication: int = 1) -> pb.EngineOptions:
    """A route's engine options as a leader resolves them (runtime/engine.py): fsync as
    ``exactly_once`` unless said, ten minutes of dedup retention, one copy."""
    return pb.EngineOptions(fsync=exactly_once if fsync is None else fsync, dedup_retention_s=dedup_retention_s,
                            replication=replication)


class WriteFails:
    """A tablet's RocksDB whose next commit waits until the follower holds it (it is shipped
    before the local write), then fails to write here (a full disk, say)."""

    def __init__(self, db: Any, follower_has_it: Callable[[], bool]) -> None:
        self._db = db
        self._follower_has_it = follower_has_it

    def write(self, *args: Any) -> None:
        deadline = time.monotonic() + 10
        while not self._follower_has_it():  # a deadline-bounded wait on the tablet's thread
            assert time.monotonic() < deadline, "the follower never got the commit while it was written"
            time.sleep(0.001)
        raise OSError("no space left on device (injected)")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


class Posting:
    """A replica channel's ``post`` (worker/replication.py's ``ReplicaChannel``) made from its
    ``replicate`` coroutine: a test's channel need write only that."""

    async def replicate(self, address: str, req: pb.ReplicateRequest) -> pb.ReplicateResponse | None:
        raise NotImplementedError

    def post(self, address: str, req: pb.ReplicateRequest,
             answered: Callable[[pb.ReplicateResponse | None], None]) -> None:
        def done(task: asyncio.Task[pb.ReplicateResponse | None]) -> None:
            answered(None if task.cancelled() or task.exception() is not None else task.result())
        asyncio.get_running_loop().create_task(self.replicate(address, req)).add_done_callback(done)
