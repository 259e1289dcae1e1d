"""The injector's CPU per record, without a cluster (the performance study's injector_side.py,
on the injector's own round path): ``Injector.send`` and ``Injector.send_many`` (the real
methods, on an injector whose master and network are stubbed), then its rounds (the real
``_take_round`` and ``Tablets.deliver``: the hand-off to the delivery loop, routing, cutting,
the delivery core's queues and chains, building the requests, each serialized as gRPC would)
for one exactly-once reader of 4 ranges. (Trees before the delivery core: ``_prepare`` and
``Tablets.attempt``.)

    python -m bench.injector_cpu                 # ~2 CPU-s
    python -m bench.injector_cpu --n 200000      # a quiet machine

Runs against older trees too (``send_many`` is then reported as absent), so the same file
measures before and after: ``PYTHONPATH=<old tree> python <this file>``.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from injectors.buffer import Buffer
from injectors.injector import Injector
from injectors.tablets import Tablets
from runtime.keyspace import first_cut, wire_end
from runtime.record import producer_prefix
from runtime.wire import millstream_pb2 as pb

TS0 = 1_700_000_000_000_000


class _Master:
    def __init__(self, ranges: int) -> None:
        r = pb.Routing(version=1)
        c = r.computations.add(name="window", topology="w2", code="x:Y", outputs=["windows"], key_ranges=ranges,
                               exactly_once=True, productions="strong")
        c.inputs.add(stream="events", key_extractor="")
        for i, (lo, hi) in first_cut(ranges).items():
            c.assignments.add(key_range=i, worker_id=f"w{i % 2}", address=f"a{i % 2}", token=1, start=lo,
                              end=wire_end(hi))
        self.table = r

    def routing(self) -> pb.Routing:
        return self.table


class _Answering:
    """The delivery core's transport: each request serialized (its size kept), answered OK."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes

    def post(self, address: str, request: pb.DeliverRequest) -> asyncio.Future[Any]:
        from runtime.delivery import Outcome, Status
        self.sizes.append(len(request.SerializeToString()))
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        fut.set_result(Outcome(Status.OK, ("w", 1)))
        return fut

    async def close(self) -> None:
        pass


CORE = "links" in inspect.signature(Tablets.__init__).parameters  # the delivery core's shell


def injector(ranges: int, batch_size: int) -> tuple[Injector, list[int]]:
    """An injector with no master and no network; its rounds' requests are serialized (their
    sizes land in the list) and answered OK."""
    inj = Injector.__new__(Injector)
    inj.name, inj.stream, inj.batch_size, inj.finished, inj.timeout = "bench", "events", batch_size, False, 60.0
    inj.position, inj._buffer, inj._queued, inj._first_at = 0, Buffer(), 0, 0.0
    inj._mutex = threading.RLock()
    inj._cond = threading.Condition(inj._mutex)
    inj.max_queued, inj._error, inj._flight, inj._returned = 1 << 40, None, deque(), []
    inj._rounds_taken, inj._places, inj.peak_in_flight, inj.max_in_flight = 0, 0, 0, 1
    inj.__dict__["_tails"] = {}  # (trees before the delivery core)
    inj._start_rounds = lambda: None  # type: ignore[method-assign]
    inj._closed = threading.Event()
    inj._prefix = producer_prefix("injector/bench")
    inj._sequenced = {inj._prefix: 0}
    inj._last_producer = (None, b"")
    sizes: list[int] = []
    if CORE:
        tablets = Tablets("bench", "events", _Master(ranges), None, inj._sequenced,  # type: ignore[arg-type]
                          threading.Event(), committed=lambda *a: None, links=lambda: _Answering(sizes))
    else:
        tablets = Tablets("bench", "events", _Master(ranges), None, inj._sequenced,  # type: ignore[arg-type]
                          threading.Event(), committed=lambda *a: None)

        def answer(calls: list[Any]) -> list[pb.DeliverResponse]:
            sizes.extend(len(req.SerializeToString()) for _, req, _ in calls)
            return [pb.DeliverResponse(status=pb.DeliverResponse.OK, worker_id="w", report_seq=1) for _ in calls]

        tablets._call_all = answer  # type: ignore[attr-defined]
    inj._tablets = tablets
    return inj, sizes


def rounds(inj: Injector) -> None:
    """Deliver everything queued, round by round, as the round thread would (one in flight)."""
    while inj._buffer:
        rnd = inj._take_round()
        assert rnd is not None
        if CORE:
            inj._tablets.deliver(rnd, 60)
        else:
            inj._prepare(rnd)  # type: ignore[attr-defined]
            left, _ = inj._tablets.attempt(rnd.pending, rnd.orders, rnd.routing)  # type: ignore[attr-defined]
            assert not left
        inj._flight.popleft()


def best(runs: int, fn: Callable[[], float]) -> float:
    return min(fn() for _ in range(runs))


def main(n: int, ranges: int, batch_size: int, chunk: int, runs: int) -> None:
    keys = [b"k%05d" % (i * 7919 % 10000) for i in range(n)]
    values = [b"v" * 20] * n
    stamps = [TS0 + i * 50 for i in range(n)]

    def by_send() -> float:
        inj, _ = injector(ranges, batch_size)
        send = inj.send
        t0 = time.perf_counter()
        for k, v, t in zip(keys, values, stamps, strict=True):
            send(k, v, t)
        took = (time.perf_counter() - t0) / n * 1e6
        inj._tablets.close()
        return took

    def by_send_many() -> float:
        inj, _ = injector(ranges, batch_size)
        t0 = time.perf_counter()
        for i in range(0, n, chunk):
            inj.send_many(keys[i:i + chunk], values[i:i + chunk], stamps[i:i + chunk])
        took = (time.perf_counter() - t0) / n * 1e6
        inj._tablets.close()
        return took

    sizes: list[int] = []

    def by_round() -> float:
        inj, out = injector(ranges, batch_size)
        for k, v, t in zip(keys, values, stamps, strict=True):
            inj.send(k, v, t)
        t0 = time.perf_counter()
        rounds(inj)
        took = (time.perf_counter() - t0) / n * 1e6
        sizes[:] = out
        if CORE:
            inj._tablets.close()
        return took

    cpu0 = time.process_time()
    send_us = best(runs, by_send)
    many_us = best(runs, by_send_many) if hasattr(Injector, "send_many") else None
    round_us = best(runs, by_round)
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}; {n:,} records, {ranges} ranges, "
          f"rounds of {batch_size}, best of {runs}")
    print(f"Injector.send: {send_us:.2f} us/record")
    print("Injector.send_many: " + (f"{many_us:.2f} us/record (lists of {chunk:,})" if many_us is not None
                                    else "absent in this tree"))
    print(f"round (take, route, cut, order, build + serialize requests{', the core and its loop' if CORE else ''}): "
          f"{round_us:.2f} us/record")
    print(f"total with send: {send_us + round_us:.2f} us/record"
          + (f"; with send_many: {many_us + round_us:.2f}" if many_us is not None else "")
          + f"; {sum(sizes) / n:.1f} wire bytes/record; CPU used {time.process_time() - cpu0:.2f} s")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--ranges", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--chunk", type=int, default=1000, help="records per send_many call")
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    main(a.n, a.ranges, a.batch_size, a.chunk, a.runs)
