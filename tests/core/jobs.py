"""Computations the in-process worker-core tests run (imported by path, like any user code)."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Mapping

from runtime import Computation, Context, ListState, MapState, Record, Sink, TimeDomain, ValueState, codecs


class Echo(Computation):
    """Emits every value; b"boom" raises; b"later" sets a wall-clock timer 1 s ahead."""

    def process_record(self, ctx: Context, record: Record) -> None:
        if record.value == b"boom":
            raise RuntimeError("cannot digest boom")
        if record.value == b"later":
            ctx.set_timer("t", ctx.now() + 1_000_000, TimeDomain.WALL_TIME)
        ctx.produce("out", record.value)

    def process_timer(self, ctx: Context, tag: str, time: int) -> None:
        ctx.produce("out", f"timer {tag} at {time}".encode())


class Collector(Computation):
    seen: list[tuple[str, bytes, bytes]] = []

    def process_record(self, ctx: Context, record: Record) -> None:
        Collector.seen.append((self.params.get("name", ""), record.key, record.value))


class Count(Computation):
    """Counts the records it processes (class-wide), and keeps nothing else."""

    n = 0

    def process_record(self, ctx: Context, record: Record) -> None:
        Count.n += 1


class Tally(Computation):
    """Appends every value to its key's state: a record lost or applied twice shows there."""

    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.state.set((ctx.state.get() or b"") + record.value + b";")


class TimerJob(Computation):
    """b"set N" / b"move N" sets wall timer "t" at BASE + N; b"del" deletes it. A firing emits
    "fired <time>" and, with params repeat=1, sets itself again at the same time (3 firings)."""

    BASE = 1_700_000_000_000_000

    def process_record(self, ctx: Context, record: Record) -> None:
        op, _, n = record.value.decode().partition(" ")
        if op in ("set", "move"):
            ctx.set_timer("t", self.BASE + int(n), TimeDomain.WALL_TIME)
        elif op == "del":
            ctx.delete_timer("t")
        elif op == "mark":
            ctx.produce("out", record.value)

    def process_timer(self, ctx: Context, tag: str, time: int) -> None:
        ctx.produce("out", f"fired {time - self.BASE}".encode())
        n = int(ctx.state.get() or b"0") + 1
        ctx.state.set(str(n).encode())
        if self.params.get("repeat") and n < 3:
            ctx.set_timer(tag, time, TimeDomain.WALL_TIME)


class EventTimers(Computation):
    """b"at N" sets event-time timer "e" at BASE + N; a firing emits "event N"; anything else is
    echoed."""

    BASE = 1_700_000_000_000_000

    def process_record(self, ctx: Context, record: Record) -> None:
        op, _, n = record.value.decode().partition(" ")
        if op == "at":
            ctx.set_timer("e", self.BASE + int(n), TimeDomain.EVENT_TIME)
        else:
            ctx.produce("out", record.value)

    def process_timer(self, ctx: Context, tag: str, time: int) -> None:
        ctx.produce("out", f"event {time - self.BASE}".encode())


class Blocking(Computation):
    """b"block" waits until the test sets ``gate`` (user code that does not return until
    then); b"sleep <ms>" sleeps; b"exit" calls sys.exit(); anything else is echoed. Every
    value is echoed to "out" once its call returns."""

    gate = threading.Event()
    started = threading.Event()

    def process_record(self, ctx: Context, record: Record) -> None:
        if record.value == b"block":
            Blocking.started.set()
            Blocking.gate.wait()
        elif record.value.startswith(b"sleep "):
            time.sleep(int(record.value.split()[1]) / 1000)  # slow user code under test, not a wait
        elif record.value == b"exit":
            sys.exit(3)
        ctx.produce("out", record.value)


class EarlyThenBlock(Blocking):
    """b"early" produces an output 1 ms and sets an event-time timer 2 ms before its record's
    time (both allowed); the rest as :class:`Blocking`."""

    def process_record(self, ctx: Context, record: Record) -> None:
        if record.value == b"early":
            ctx.produce("out", b"early", timestamp=record.timestamp - 1000)
            ctx.set_timer("t", record.timestamp - 2000)
            return
        super().process_record(ctx, record)


class EarlyOutputThenBlock(Blocking):
    """b"early" produces an output 1 ms before its record's time, and nothing else; the rest
    as :class:`Blocking`."""

    def process_record(self, ctx: Context, record: Record) -> None:
        if record.value == b"early":
            ctx.produce("out", b"early", timestamp=record.timestamp - 1000)
            return
        super().process_record(ctx, record)


class UndeclaredSink(Computation):
    """Sink hooks on a plain Computation, as written before runtime.Sink: still called."""

    restored: list[tuple[str, bytes | None]] = []
    prepared = 0

    def restore(self, tablet: str, meta: bytes | None) -> None:
        UndeclaredSink.restored.append((tablet, meta))

    def prepare_commit(self) -> bytes | None:
        UndeclaredSink.prepared += 1
        return b"%d" % UndeclaredSink.prepared


class BigBatchFails(Sink):
    """Echoes to "out"; its commit hook fails for a batch of more than ``max`` records (a
    batch too large to commit), so only smaller batches get through."""

    max = 4

    def setup(self, params: Mapping[str, str]) -> None:
        super().setup(params)
        self.batch = 0

    def process_record(self, ctx: Context, record: Record) -> None:
        self.batch += 1
        ctx.produce("out", record.value)

    def prepare_commit(self) -> bytes | None:
        n, self.batch = self.batch, 0
        if n > self.max:
            raise RuntimeError(f"a batch of {n} records is too large to commit")
        return None


class SlowCollector(Collector):
    """A Collector whose every record takes ``sleep_ms`` (a receiver slower than a weak
    producer's ack wait)."""

    def process_record(self, ctx: Context, record: Record) -> None:
        time.sleep(int(self.params.get("sleep_ms", "100")) / 1000)  # a slow receiver, not a wait
        super().process_record(ctx, record)


class Misbehave(Computation):
    """Echoes b"ok..." values to "out"; other values name one way to misuse the API."""

    def process_record(self, ctx: Context, record: Record) -> None:
        v = record.value
        if v == b"surrogate-tag":
            ctx.set_timer("w\udc80", record.timestamp + 1)
        elif v == b"float-time":
            ctx.set_timer("t", 1.5)  # type: ignore[arg-type]
        elif v == b"huge-value":
            ctx.produce("out", b"x" * (17 << 20))
        elif v == b"huge-state":
            ctx.state.set(b"x" * (17 << 20))
        elif v == b"unknown-stream":
            ctx.produce("nope", b"")
        elif v == b"str-value":
            ctx.produce("out", "text")  # type: ignore[arg-type]
        elif v == b"str-state":
            ctx.state.set("text")  # type: ignore[arg-type]
        elif v == b"str-key":
            ctx.produce("out", b"", key="k")  # type: ignore[arg-type]
        elif v == b"time-2**70":
            ctx.produce("out", b"", timestamp=2**70)
        elif v == b"recursion":
            def down(n: int) -> int:
                return down(n + 1)
            down(0)
        elif v == b"keyboard-interrupt":
            raise KeyboardInterrupt
        elif v == b"exit":
            sys.exit(1)
        else:
            ctx.produce("out", v)


def not_a_class(record: Record) -> bytes:
    """A function where a Computation class is expected (and a key extractor returning bytes)."""
    return record.key


def extractor_returning_str(record: Record) -> str:
    return "not bytes"


def extractor_raising(record: Record) -> bytes:
    """A reader's key extractor with a bug: it cannot parse what its producer writes."""
    return json.loads(record.value)["user"].encode()


class CountEcho(Computation):
    """Counts each key's records in its state and emits every value to "out"."""

    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.state.set(str(int(ctx.state.get() or b"0") + 1).encode())
        ctx.produce("out", record.value)


class ExitsInSetup(Computation):
    def setup(self, params: Mapping[str, str]) -> None:
        sys.exit("setup gave up")


class Typed(Computation):
    """Typed state of every kind (runtime/state.py); emits, per record, what its key holds."""

    seen = ListState("seen", codecs.INT)
    total = ValueState("total", codecs.INT, default=0)
    by_value = MapState("by_value", codecs.STR, codecs.JSON)
    recent = ValueState("recent", codecs.STR, ttl=10_000_000)  # 10 s of event time

    def process_record(self, ctx: Context, record: Record) -> None:
        v = record.value.decode()
        seen, by_value = ctx.state_of(self.seen), ctx.state_of(self.by_value)
        if v == "clear":
            seen.clear()
            by_value.clear()
        elif v != "look":
            seen.append(int(v))
            total = ctx.state_of(self.total)
            total.set(total.get() + int(v))
            by_value.put(v, {"n": (by_value.get(v) or {"n": 0})["n"] + 1})
            by_value.remove("gone")
            ctx.state_of(self.recent).set(v)
        ctx.produce("out", json.dumps({
            "seen": list(seen), "total": ctx.state_of(self.total).get(), "map": dict(by_value.items()),
            "keys": list(by_value.keys()), "has1": by_value.contains("1"),
            "recent": ctx.state_of(self.recent).get()}).encode())


class WallTyped(Computation):
    """A count and a list per key that the wall clock forgets 10 s after each write (a
    wall-time TTL), whatever the records' times; emits what its key holds, per record."""

    count = ValueState("count", codecs.INT, default=0, ttl=10_000_000, ttl_domain=TimeDomain.WALL_TIME)
    seen = ListState("seen", codecs.STR, ttl=10_000_000, ttl_domain=TimeDomain.WALL_TIME)

    def process_record(self, ctx: Context, record: Record) -> None:
        count, seen = ctx.state_of(self.count), ctx.state_of(self.seen)
        count.set(count.get() + 1)
        seen.append(record.value.decode())
        ctx.produce("out", json.dumps({"count": count.get(), "seen": list(seen)}).encode())


class IdLog(Computation):
    """Logs the id of every record it processes (class-wide), in order."""

    ids: list[bytes] = []

    def process_record(self, ctx: Context, record: Record) -> None:
        IdLog.ids.append(record.id)


class BatchCounter(Computation):
    """Counts per key in ctx.state, a batch at a time (process_batch); b"boom" raises."""

    def process_batch(self, ctx: Context, records: list[Record]) -> None:
        for r in records:
            ctx.rebind(r.key, r.timestamp)  # type: ignore[attr-defined]
            self.process_record(ctx, r)

    def process_record(self, ctx: Context, record: Record) -> None:
        if record.value == b"boom":
            raise RuntimeError("boom")
        n = int(ctx.state.get() or b"0") + 1
        ctx.state.set(b"%d" % n)
        ctx.produce("out", b"%d" % n)


class SlowSetup(Computation):
    """Its ``setup`` waits until the test sets ``gate`` (30 s at most): a tablet still opening."""

    gate = threading.Event()

    def setup(self, params: Mapping[str, str]) -> None:
        SlowSetup.gate.wait(30)


class FailingSetup(Computation):
    """Its ``setup`` raises, every time (user code that cannot start); ``tries`` counts them."""

    tries = 0

    def setup(self, params: Mapping[str, str]) -> None:
        FailingSetup.tries += 1
        raise RuntimeError("no connection to the lookup table")


class HookedTimerSink(Sink):
    """A sink whose event-time timer ``t`` sets another, ``u``, a second later, and whose
    ``committed()`` waits for the test while ``block`` is set (class-level: the test's handle)."""

    block = False
    in_hook = threading.Event()
    release = threading.Event()

    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.set_timer("t", record.timestamp + 1_000_000, TimeDomain.EVENT_TIME)

    def process_timer(self, ctx: Context, tag: str, time: int) -> None:
        if tag == "t":
            ctx.set_timer("u", time + 1_000_000, TimeDomain.EVENT_TIME)

    def committed(self) -> None:
        if type(self).block:
            type(self).in_hook.set()
            type(self).release.wait(30)  # (bounded: the test releases it)
