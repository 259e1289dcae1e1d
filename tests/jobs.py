"""Computations and topologies used by the end-to-end tests (workers import them)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence

from prometheus_client import Counter

from runtime import (
    Computation,
    Context,
    ListState,
    MapState,
    Record,
    Sink,
    TimeDomain,
    Topology,
    ValueState,
    codecs,
)


class Poison(Computation):
    """Counts per key like the word counter, but raises on the value b"poison"."""

    def process_record(self, ctx: Context, record: Record) -> None:
        if record.value == b"poison":
            raise ValueError("poisoned record")
        n = int(ctx.state.get() or b"0") + 1
        ctx.state.set(str(n).encode())
        ctx.produce("out", str(n).encode())


def bad_code() -> Topology:
    t = Topology("bad-code")
    t.add_computation("c", "no_such_module_for_millstream:Thing", inputs={"in": None})
    return t


BAD_CODE = bad_code()


class NaiveCollector(Computation):
    """Keeps, per key, the JSON list of every value it received and re-writes it on every
    record (a common, if naive, pattern: its cost per record grows with the key's state).
    Emits ``b"<list length> <sum>"``."""

    def process_record(self, ctx: Context, record: Record) -> None:
        seen = json.loads(ctx.state.get() or b"[]")
        seen.append(int(record.value))
        ctx.state.set(json.dumps(seen).encode())
        ctx.produce("collected", b"%d %d" % (len(seen), sum(seen)))


class Sleepy(Computation):
    """Echoes every value to "echoed"; a value b"sleep <seconds>" sleeps that long first (an
    external call that takes long)."""

    def process_record(self, ctx: Context, record: Record) -> None:
        if record.value.startswith(b"sleep "):
            time.sleep(float(record.value.split()[1]))  # the slow user code under test, not a wait
        ctx.produce("echoed", record.value)


class SlowCounter(Computation):
    """The word counter, but every ``every``-th count of a word sleeps ``sleep`` seconds first
    (an external call slower than the lease); it emits to "counts", or the stream "out" names."""

    def process_record(self, ctx: Context, record: Record) -> None:
        n = int(ctx.state.get() or b"0") + 1
        if n % int(self.params.get("every", "500")) == 0:
            time.sleep(float(self.params.get("sleep", "2")))  # slow user code under test, not a wait
        ctx.state.set(str(n).encode())
        ctx.produce(self.params.get("out", "counts"), str(n).encode())


class FanOut(Computation):
    """Emits ``copies`` values of ``size`` bytes for every record (to "large-out")."""

    def process_record(self, ctx: Context, record: Record) -> None:
        size = int(self.params.get("size", "1024"))
        for i in range(int(self.params.get("copies", "10"))):
            ctx.produce("large-out", b"x" * size, key=record.key + b"/%d" % i)


class CountingSink(Sink):
    """A FileSink that writes each value's length instead of the value (large values)."""

    def setup(self, params: Mapping[str, str]) -> None:
        from runtime.sinks import FileSink

        super().setup(params)
        self.sink = FileSink()
        self.sink.setup(params)

    def restore(self, tablet: str, meta: bytes | None, token: int, absorbed: Sequence[bytes],
                uncommitted: Mapping[str, int] | None = None) -> None:
        self.sink.restore(tablet, meta, token, absorbed, uncommitted)

    def process_record(self, ctx: Context, record: Record) -> None:
        self.sink.process_record(ctx, Record(record.key, str(len(record.value)).encode(),
                                             record.timestamp, record.id))

    def prepare_commit(self) -> bytes:
        return self.sink.prepare_commit()


class FlakyCommitCounter(Sink):
    """The word counter, but a batch holding the word "failcommit" fails at commit time, once
    per tablet and process (a storage error, say): the tablet reopens from disk, smaller."""

    failed: set[str] = set()

    def setup(self, params: Mapping[str, str]) -> None:
        super().setup(params)
        self.tablet = ""
        self.poisoned = False

    def restore(self, tablet: str, meta: bytes | None, token: int, absorbed: Sequence[bytes]) -> None:
        self.tablet = tablet

    def process_record(self, ctx: Context, record: Record) -> None:
        if ctx.key == b"failcommit" and self.tablet not in FlakyCommitCounter.failed:
            self.poisoned = True
        n = int(ctx.state.get() or b"0") + 1
        ctx.state.set(str(n).encode())
        ctx.produce("counts", str(n).encode())

    def prepare_commit(self) -> bytes | None:
        if self.poisoned:
            self.poisoned = False
            FlakyCommitCounter.failed.add(self.tablet)
            raise OSError(f"injected commit failure in {self.tablet}")
        return None


class CountTo(Computation):
    """The word counter, emitting every new count to the stream its "out" param names."""

    def process_record(self, ctx: Context, record: Record) -> None:
        n = int(ctx.state.get() or b"0") + 1
        ctx.state.set(str(n).encode())
        ctx.produce(self.params["out"], str(n).encode())


class TypedCounter(Computation):
    """The word counter on typed state: a ValueState count and a ListState of every count
    (checked against each other every 10th record, so state torn by a split or failover
    shows as a dead-lettered record and a missing count)."""

    count = ValueState("count", codecs.INT, default=0)
    history = ListState("history", codecs.INT)

    def process_record(self, ctx: Context, record: Record) -> None:
        count, history = ctx.state_of(self.count), ctx.state_of(self.history)
        n = count.get() + 1
        count.set(n)
        history.append(n)
        if n % 10 == 0 and list(history) != list(range(1, n + 1)):
            raise AssertionError(f"typed state of {ctx.key!r} is torn at {n}")
        ctx.produce("counts", str(n).encode())


class Ticker(Computation):
    """Emits ``r <value>`` for every record and arms a wall-clock timer ``ms`` ahead (param,
    default 20) unless one is armed; a firing emits ``t <n>``, n counting firings from 1 (a
    job whose timers produce downstream while its input runs: review N1's savepoint case)."""

    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.produce(self.params["out"], b"r " + record.value)
        n, armed = (ctx.state.get() or b"0 0").split()
        if armed == b"0":
            ctx.set_timer("tick", ctx.now() + int(self.params.get("ms", "20")) * 1000, TimeDomain.WALL_TIME)
            ctx.state.set(n + b" 1")

    def process_timer(self, ctx: Context, tag: str, time: int) -> None:
        n = int((ctx.state.get() or b"0 0").split()[0]) + 1
        ctx.state.set(b"%d 0" % n)
        ctx.produce(self.params["out"], b"t %d" % n)


class InOrder(Computation):
    """Checks per-producer key order (DESIGN.md §2): values are a key's send indexes, in
    the order one producer sent them. Keeps each key's last index; an index at or below it
    goes to "disorder" as ``b"<computation> <index> after <last>"``. Forwards every value
    to param ``out`` (if any), so the next stage sees this one's processing order."""

    def process_record(self, ctx: Context, record: Record) -> None:
        i = int(record.value)
        last = ctx.state.get()
        if last is not None and int(last) >= i:
            ctx.produce("disorder", b"%s %d after %s" % (self.params.get("name", "?").encode(), i, last))
        ctx.state.set(b"%d" % i)
        if "out" in self.params:
            ctx.produce(self.params["out"], record.value)


class Profile(Computation):
    """Per key, every kind of typed state (`millstream state get --state`): a ValueState count,
    a ListState of the values seen, a MapState of how often each value came, a BYTES value."""

    count = ValueState("count", codecs.INT, default=0)
    values = ListState("values", codecs.STR)
    tally = MapState("tally", codecs.STR, codecs.JSON)
    last = ValueState("last", codecs.BYTES)

    def process_record(self, ctx: Context, record: Record) -> None:
        count = ctx.state_of(self.count)
        count.set(count.get() + 1)
        text = record.value.decode(errors="replace")
        ctx.state_of(self.values).append(text)
        tally = ctx.state_of(self.tally)
        tally.put(text, {"n": tally.get(text, {"n": 0})["n"] + 1})
        ctx.state_of(self.last).set(record.value)
        ctx.produce("profiled", str(count.get()).encode())


# A user's own metric, as docs/guide.md ("Your own metrics") shows: a prometheus_client
# metric at module level in the job's module is on every worker's /metrics page.
WORDS_SEEN = Counter("tests_words_seen", "Words a MeteredCounter got, by length", ["length"])


class MeteredCounter(Computation):
    """Counts each word in a user-defined Prometheus counter, labelled by its length."""

    def process_record(self, ctx: Context, record: Record) -> None:
        WORDS_SEEN.labels(str(len(record.key))).inc()
        ctx.produce("out", record.key)


class BytesTally(Computation):
    """Counts each value (bytes, not necessarily UTF-8) in a map per key: ``seen[value] += 1``."""

    seen = MapState("seen", codecs.BYTES, codecs.INT)

    def process_record(self, ctx: Context, record: Record) -> None:
        seen = ctx.state_of(self.seen)
        seen.put(record.value, seen.get(record.value, 0) + 1)
