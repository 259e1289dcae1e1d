"""Unit-testing user code: :class:`TestRun` runs a topology in-process (DESIGN.md §3a).

The way to test a computation without a cluster, like Beam's TestStream or ``bytewax.testing``::

    run = TestRun(topology)
    run.inject("words", b"apple", b"1", timestamp=1_000_000)
    run.advance_watermark("words", 2_000_000)
    run.run_until_idle()
    assert [r.value for r in run.output("counts")] == [b"1"]
    assert run.state("counter", b"apple") == b"1"
    run.close()

It is the real worker (its batches, exactly-once dedup, timers, typed state and RocksDB, in a
temporary directory) with every tablet on one in-process worker, no etcd, no network and no
threads of its own: nothing runs between calls. Time is virtual: the wall clock
(``ctx.now()``, wall-clock timers) moves only with :meth:`advance_wall_time`, and each input
stream's watermark only with :meth:`advance_watermark` and :meth:`finish` (a stream never
advanced holds its readers at the start of time); computations' low watermarks follow from
them as on a cluster. Every stream any computation produces (dead letters included) is
collected for :meth:`output`. :meth:`restart` closes a computation's tablets and opens them
again from what they committed, as a crash and failover would.

(The test kit is the one part of ``runtime`` that runs the worker and the master, so it
imports them: tests/unit/test_layering.py states the exception. Its routing and watermarks
are the real leader's: a :class:`~master.core.MasterCore` in this process, with nothing to
store, gets the worker's progress reports as heartbeats and runs its watermark tick.)
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import os
import shutil
import tempfile
from typing import TYPE_CHECKING, Any

from runtime.computation import Computation, Context
from runtime.errors import MillstreamError
from runtime.record import (
    END_OF_TIME,
    MIN_TIME,
    Record,
    Timestamp,
    check_time,
    derived_id,
    producer_prefix,
    sequence_id,
)
from runtime.topology import Topology, dead_letter, dead_letter_stream

if TYPE_CHECKING:
    from runtime.dataflow import Dataflow

MIN, END = MIN_TIME, END_OF_TIME
log = logging.getLogger(__name__)
_COLLECTED: dict[str, dict[str, list[Record]]] = {}  # run id -> stream -> records
_RUNS = itertools.count()


def _lost_dead_letter(reader: str, error: BaseException) -> None:
    log.error("TestRun: a dead letter is lost: the key extractor of %r, a reader of dead letters, failed: %s: %s",
              reader, type(error).__name__, error)


class _NoEtcd:
    """The store of a TestRun's leader: nothing to keep, the run lives in this process."""

    term = None

    def apply(self, change: object, term: int | None = None) -> None:
        pass


class _Collect(Computation):
    """Subscribed to every produced stream of a :class:`TestRun`: keeps what arrives."""

    def process_record(self, ctx: Context, record: Record) -> None:
        _COLLECTED[self.params["run"]].setdefault(self.params["stream"], []).append(record)


class TestRun:
    """A topology running in this process, on virtual time (see the module doc)."""

    __test__ = False  # not a pytest test class

    def __init__(self, topology: Topology | Dataflow, *, start_us: int = 1_700_000_000_000_000,
                 max_attempts: int = 3) -> None:
        """``max_attempts``: how often the worker tries a call of user code that raises before
        it dead-letters what the call held (a worker's ``WorkerLimits.max_attempts``)."""
        from master.config import MasterConfig
        from master.core import MasterCore
        from runtime.client import as_topology, check_importable
        from runtime.imports import CodePolicy
        from worker.core import WorkerCore, WorkerLimits

        topology = as_topology(topology)
        topology.validate()
        check_importable(topology)
        self.topology = topology
        self.now_us = start_us
        self.run_id = f"testrun-{os.getpid()}-{next(_RUNS)}"
        _COLLECTED[self.run_id] = {}
        self._dir = tempfile.mkdtemp(prefix="millstream-testrun-")
        self._loop = asyncio.new_event_loop()
        self._injected: dict[str, int] = {}    # stream -> its watermark (MIN until advanced)
        self._reported: dict[str, int] = {}    # stream -> the watermark its injector last reported
        self._position = 0
        self._sent: dict[tuple[str, int], int] = {}  # tablet -> last sequence delivered to it
        self._prefix = producer_prefix("testrun/" + self.run_id)

        async def nowhere(*args: object) -> tuple[int, None]:
            raise AssertionError("a TestRun has one worker: every delivery is local")

        self._specs = dict(topology.computations)
        produced = sorted({o for s in self._specs.values() for o in s.all_outputs})
        self._collectors = {f"__collect.{n}": s for n, s in enumerate(produced)}
        # The leader: one copy per tablet, no injector expires, one clock tick for everything.
        self._master = MasterCore(_NoEtcd(), MasterConfig(replication=1, injector_expiry_s=0),  # type: ignore[arg-type]
                                  lambda: 0.0)
        self._core = WorkerCore(self._dir, "local", nowhere, WorkerLimits(max_attempts=max_attempts),
                                wall_us=lambda: self.now_us, code_policy=CodePolicy(("*",)))
        self._run(self._start())

    # ------------------------------------------------------------------ setup

    async def _start(self) -> None:
        """Register the worker with the leader and submit the topology (a test's tmp dir: no
        fsync, durability buys nothing here), and every produced stream's collector."""
        from master import lifecycle, membership

        self._core.worker_id, _ = await membership.register(self._master, "local", allowed_code=("*",))
        run = Topology(self.topology.name)
        run.computations = {n: dataclasses.replace(s, fsync=False) for n, s in self._specs.items()}
        collect = Topology("__testrun")
        for name, stream in self._collectors.items():
            collect.add_computation(name, "runtime.testing:_Collect", inputs={stream: None}, key_ranges=1,
                                    params={"run": self.run_id, "stream": stream}, fsync=False)
        for topo in (run, collect):
            await lifecycle.submit(self._master, topo.to_json())
        await self._apply()

    async def _apply(self) -> None:
        self._core.renewed(self._core.now_ms(), 10 ** 12)  # a lease that never runs out
        await self._core.apply_routing(self._master.routing())
        failures = self._core.open_failures()
        if failures:
            raise MillstreamError(f"TestRun: tablets cannot open: {failures}")

    def _token(self, computation: str, key_range: int) -> int:
        t = self._master.image.tablets.get((computation, key_range))
        return t.own.token if t is not None else 0

    def _run(self, coro: Any) -> Any:
        return self._loop.run_until_complete(coro)

    # ------------------------------------------------------------------ input

    def inject(self, stream: str, key: bytes, value: bytes, timestamp: Timestamp, id: bytes | None = None) -> None:
        """Deliver one record on ``stream`` to every computation that reads it (committed when
        this returns). ``id`` (16 bytes) makes a re-injection of the same record a duplicate;
        without it each call is a new record."""
        self._deliver(stream, [(key, value, timestamp)], id)

    def inject_batch(self, stream: str, records: list[tuple[bytes, bytes, Timestamp]]) -> None:
        """Deliver ``(key, value, timestamp)`` records on ``stream`` together: each tablet that
        reads them gets its share as one delivery, taken in one batch (as an injector's round
        arrives), so user code sees them in one call. Committed when this returns."""
        self._deliver(stream, records, None)

    def _deliver(self, stream: str, records: list[tuple[bytes, bytes, Timestamp]], id: bytes | None) -> None:
        if not self._core.routing.has_subscribers(stream):
            raise MillstreamError(f"TestRun: no computation reads stream {stream!r}")
        shares: dict[tuple[str, int], list[Record]] = {}
        letters: dict[tuple[str, int], list[Record]] = {}  # what readers' key extractors failed on
        last: dict[tuple[str, int], int] = {}  # the highest sequence each tablet gets of these
        routing = self._core.routing
        failed: list[tuple[str, BaseException]] = []  # (reader, error) of the record being routed
        for key, value, when in records:
            timestamp = check_time(when, "TestRun: timestamp")  # (an int, or a datetime with a time zone)
            if id is None:
                self._position += 1
                rid = sequence_id(self._prefix, self._position)
            else:
                rid = id
            failed.clear()
            for comp, r, k in routing.route_fields(stream, key, value, timestamp, Record(key, value, timestamp, rid),
                                                   lambda reader, e: failed.append((reader, e))):
                shares.setdefault((comp, r), []).append(Record(k, value, timestamp, rid, stream))
                last[(comp, r)] = self._position
            for reader, error in failed:  # to that reader's dead letters, as an injector sends them
                to, lid = dead_letter_stream(reader), derived_id(b"dead-letter", reader.encode(), rid)
                letter = dead_letter(error, reader, value, stream=stream, producer="testrun")
                for comp, r, k in routing.route_fields(to, key, letter, timestamp, None, _lost_dead_letter):
                    letters.setdefault((comp, r), []).append(Record(k, letter, timestamp, lid, to))

        async def deliver() -> None:
            for (comp, r), share in shares.items():
                # Sequenced ids: each tablet learns where these records stand in what it got.
                orders = {self._prefix: (self._sent.get((comp, r), 0), 0)} if id is None else None
                while True:
                    status = await self._core.deliver(comp, r, self._token(comp, r), share, orders)
                    if status == 0:
                        break
                    await asyncio.sleep(0.001)  # BUSY or a tablet reopening: yield and retry
                if id is None:  # not the batch's last: that may have gone to another tablet
                    self._sent[(comp, r)] = last[(comp, r)]
            for (comp, r), share in letters.items():  # (opaque ids: deduplicated one by one)
                while await self._core.deliver(comp, r, self._token(comp, r), share, None) != 0:
                    await asyncio.sleep(0.001)
        if records:
            self._run(deliver())
        self._injected.setdefault(stream, MIN)

    def advance_watermark(self, stream: str, ts: Timestamp) -> None:
        """Promise that nothing older than ``ts`` will be injected on ``stream``."""
        self._injected[stream] = max(self._injected.get(stream, MIN), check_time(ts, "TestRun: watermark"))

    def finish(self, stream: str) -> None:
        """``stream`` has ended: its watermark goes to the end of time."""
        self._injected[stream] = END

    def advance_wall_time(self, us: int) -> None:
        """Move the virtual wall clock forward by ``us`` microseconds (wall-clock timers fire
        on the next :meth:`run_until_idle`)."""
        if us < 0:
            raise MillstreamError("TestRun: the wall clock does not go back")
        self.now_us += us

    # ------------------------------------------------------------------ running

    def run_until_idle(self, max_rounds: int = 10_000) -> None:
        """Run until nothing is queued, unacknowledged or due: every timer whose time the
        watermarks or the wall clock reached has fired, and its effects are committed."""
        self._run(self._settle(max_rounds))

    async def _settle(self, max_rounds: int) -> None:
        idle_rounds = 0
        for _ in range(max_rounds):
            before = dict(self._master.image.published)
            await self._publish()
            self._core.clock_moved()  # wall-clock timers: the virtual clock may have moved
            await asyncio.sleep(0.001)
            # Idle: nothing to do, and publishing the watermarks again moved none of them (a
            # fired timer lets its computation's watermark rise to the next one).
            idle_rounds = idle_rounds + 1 if self._idle() and self._master.image.published == before else 0
            if idle_rounds >= 2:
                return
        raise MillstreamError(f"TestRun: still busy after {max_rounds} rounds (a timer that sets itself "
                              "again at its own time forever?)")

    def _idle(self) -> bool:
        return self._core.quiet()

    async def _publish(self) -> None:
        """One round of the leader's loop: the worker's heartbeat with its tablets' progress,
        each stream's injector watermark, the watermark tick, and its answer to the worker."""
        from master import progress

        # On a cluster a sender's report holds what it sent until the leader has the receiver's
        # report reflecting it: here both are this step's report, which reflects every commit
        # acknowledged so far (each receipt names this report or an earlier one).
        self._core.release({self._core.worker_id: self._core.report_seq})
        seq, held = self._core.next_report()
        self._master.heartbeat(self._core.worker_id, held, seq, self._core.problems(), self._core.routing.version)
        for stream, wm in self._injected.items():
            # A stream never advanced holds its readers at the start of time.
            if wm != MIN and self._reported.get(stream) != wm:
                self._master.report_injector(f"testrun/{stream}", stream, wm)
                self._reported[stream] = wm
        await progress.advance(self._master)
        self._core.set_watermarks(self._master.image.inputs)

    # ------------------------------------------------------------------ reading

    def output(self, stream: str) -> list[Record]:
        """Every record produced to ``stream`` so far, in arrival order."""
        if stream not in set(self._collectors.values()):
            raise MillstreamError(f"TestRun: no computation produces stream {stream!r} (it produces "
                                  f"{', '.join(sorted(self._collectors.values()))})")
        return list(_COLLECTED[self.run_id].get(stream, []))

    @property
    def streams(self) -> list[str]:
        """Every stream the run's computations produce (and :meth:`output` collects)."""
        return sorted(set(self._collectors.values()))

    def low_watermark(self, computation: str) -> int:
        return self._master.image.published.get(computation, MIN)

    def late(self, computation: str | None = None) -> int:
        """How many records arrived behind the watermark at ``computation`` (every
        computation's, the output collectors' included, when None): records a test of
        event-time code usually wants to be 0."""
        if computation is not None and computation not in self._specs:
            raise MillstreamError(f"TestRun: no computation {computation!r}")
        return sum(t.late for (c, _), t in self._core.tablets.items() if computation in (None, c))

    def state(self, computation: str, key: bytes) -> bytes | None:
        """``computation``'s committed ``ctx.state`` of ``key``."""
        return self._tablet(computation, key).store.get_state(key)

    def typed_state(self, computation: str, key: bytes, spec: Any) -> Any:
        """The committed value of typed state ``spec`` for ``key``: the value of a
        ``ValueState``, a list for a ``ListState``, a dict for a ``MapState``. ``spec`` may be
        the name ``millstream state get --state`` takes (in a flow's stage: ``"<reduce step>"``,
        ``"<process step>/<state>"``)."""
        from runtime.flows.stage import readable_spec
        from runtime.state import ListHandle, MapHandle, bind
        from worker.context import KeyContext

        tablet = self._tablet(computation, key)
        store = tablet.store
        if isinstance(spec, str):
            spec = readable_spec(tablet.proc.comp, spec)
        ctx = KeyContext(frozenset(), store.get_state, lambda: self._core.watermark(computation),
                         lambda: self.now_us, store.get_cell, store.scan)
        ctx.begin(key, self._core.watermark(computation))  # TTL judged at the watermark
        handle = bind(spec, ctx)
        if isinstance(handle, ListHandle):
            return list(handle)
        if isinstance(handle, MapHandle):
            return dict(handle.items())
        return handle.get()

    def _tablet(self, computation: str, key: bytes) -> Any:
        if computation not in self._specs:
            raise MillstreamError(f"TestRun: no computation {computation!r}")
        r = self._core.routing.range_for(computation, key)
        return self._core.tablets[(computation, r)]

    # ------------------------------------------------------------------ faults

    def restart(self, computation: str) -> None:
        """Close ``computation``'s tablets and open them again from what they committed (as a
        crash and a failover would: user code's objects are new, uncommitted work is redone)."""
        if computation not in self._specs:
            raise MillstreamError(f"TestRun: no computation {computation!r}")
        self._run(self._reopen(computation))

    async def _reopen(self, computation: str) -> None:
        from master.change import Change
        from master.scheduler import Ownership

        image = self._master.image
        await self._master.commit(Change(tablets={
            k: Ownership(t.own.worker, t.own.token + 1, t.own.followers, t.own.in_sync)
            for k, t in image.tablets.items() if k[0] == computation}))
        await self._master.bump()
        await self._apply()

    def close(self) -> None:
        """Stop everything and delete the temporary storage."""
        try:
            self._run(self._core.close_all())
        finally:
            self._loop.close()
            _COLLECTED.pop(self.run_id, None)
            shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> TestRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
