"""Functions and classes the dataflow tests pass to their flows (flows load them by module
path, like any user code: so they live here, at module level)."""

from __future__ import annotations

import collections
import datetime
import time
from collections.abc import Mapping, Sequence
from typing import Any

from runtime import Computation, Context, ListState, Record, ValueState, codecs
from runtime.sinks import CommittedFile, FileSink, Sink


def words(line: str) -> list[str]:
    return line.split()


def shout(word: str) -> str:
    if word == "boom":
        raise ValueError("shout refuses boom")
    return word.upper()


def word_key(word: str) -> str:
    return word


def one(_: Any) -> int:
    return 1


def add(a: int, b: int) -> int:
    return a + b


def is_long(word: str) -> bool:
    return len(word) > 2


def key_of(event: dict[str, Any]) -> str:
    return str(event["k"])


def value_of(event: dict[str, Any]) -> Any:
    return event["v"]


def is_even(event: dict[str, Any]) -> bool:
    return int(event["v"]) % 2 == 0


def fragile(word: str) -> str:
    if word == "boom":
        raise ValueError("boom is not a word")
    return word


def int_key(word: str) -> int:
    return 7


def to_list(value: Any) -> list[Any]:
    return [value]


class Rising(Computation):
    """Per key: passes on a window's result when its value is above the key's last one, with
    a wall... event-time timer of its own to show timers work inside a flow step."""

    last = ValueState("last", codecs.INT, default=0)

    def process_record(self, ctx: Context, record: Record) -> None:
        state = ctx.state_of(self.last)
        value = record.value.value
        if value > state.get():
            ctx.produce("up", {"start": record.value.start, "value": value})
        state.set(value)
        ctx.set_timer("seen", record.timestamp + 1)

    def process_timer(self, ctx: Context, tag: str, time: int) -> None:
        ctx.produce("up", {"timer": tag, "at": time})


class RawCounter(Computation):
    """Counts per key in ``ctx.state`` (bytes), as a classic computation would."""

    def process_record(self, ctx: Context, record: Record) -> None:
        n = int(ctx.state.get() or b"0") + 1
        ctx.state.set(b"%d" % n)
        ctx.produce("n", n)


class Tally(Computation):
    """Counts per key in ``ctx.state`` and passes each value on as ``value:count``."""

    def process_record(self, ctx: Context, record: Record) -> None:
        n = int(ctx.state.get() or b"0") + 1
        ctx.state.set(b"%d" % n)
        ctx.produce("tallied", f"{record.value}:{n}")


class Doubler(Computation):
    """Keeps each value twice over in ``ctx.state``; passes on the length it held before."""

    def process_record(self, ctx: Context, record: Record) -> None:
        held = ctx.state.get()
        ctx.state.set(record.value * 2)
        ctx.produce("held", 0 if held is None else len(held))


def fragile_tally(tallied: str) -> str:
    return fragile(tallied.split(":")[0]) and tallied


class RawState(Computation):
    """Keeps whatever the record says in ``ctx.state``: ``b"clear"`` clears it, ``b"int"``
    stores an int (refused), anything else is stored as a bytearray; passes on what it held."""

    def process_record(self, ctx: Context, record: Record) -> None:
        held = ctx.state.get()
        if record.value == b"clear":
            ctx.state.clear()
        elif record.value == b"int":
            ctx.state.set(7)  # type: ignore[arg-type]
        else:
            ctx.state.set(bytearray(record.value))
        ctx.produce("held", None if held is None else held.decode())


class Rekeys(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.produce("x", record.value, key=b"another")


class BySource(Computation):
    """A classic computation with two inputs: says which stream each record came from."""

    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.produce("out", f"{record.stream}:{record.value.decode()}".encode())


class CountByValue:
    """A user aggregator whose result is a ``collections.Counter`` (not a value the flow's
    codec stores: only its accumulator, a dict, is)."""

    def create(self) -> dict[str, int]:
        return {}

    def add(self, acc: dict[str, int], value: Any) -> dict[str, int]:
        acc[str(value)] = acc.get(str(value), 0) + 1
        return acc

    def merge(self, a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
        return dict(collections.Counter(a) + collections.Counter(b))

    def result(self, acc: dict[str, int]) -> collections.Counter[str]:
        return collections.Counter(acc)


class SumAgg:
    """A user aggregator with a field (rebuilt on workers from its class and fields)."""

    def __init__(self, scale: int) -> None:
        self.scale = scale

    def create(self) -> int:
        return 0

    def add(self, acc: int, value: Any) -> int:
        return acc + self.scale * int(value)

    def merge(self, a: int, b: int) -> int:
        return a + b


def one_key(_: Any) -> str:
    return "all"


def poison(word: str) -> Any:
    """``refuse`` becomes a value no state can hold: a reduce's running value of it fails
    when the stage writes it, at the end of the call."""
    return object() if word == "refuse" else word


def last(_: Any, b: Any) -> Any:
    return b


def type_name(value: Any) -> str:
    return type(value).__name__


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("this exception cannot say what it is")


class PickySink(FileSink):
    """A FileSink that refuses any value containing ``bad``, raises an exception that cannot
    be shown on ``odd``, and fails its first try of each ``flaky`` value after counting it in
    its state; it writes each value with how many times its key's state counted it."""

    seen = ValueState("seen", codecs.INT, default=0)
    failed: set[bytes] = set()  # the flaky values that failed once (TestRun: one process)

    def process_record(self, ctx: Context, record: Record) -> None:
        if b"bad" in record.value:
            raise ValueError("the sink refuses bad values")
        if b"odd" in record.value:
            raise Unprintable()
        seen = ctx.state_of(self.seen)
        seen.set(seen.get() + 1)
        if b"flaky" in record.value and record.value not in self.failed:
            self.failed.add(record.value)
            ctx.set_timer("never", 2**62)
            raise ValueError("a flaky first try")
        super().process_record(ctx, Record(record.key, b"%s:%d" % (record.value, seen.get()), record.timestamp,
                                           record.id))


class BatchSink(Sink):
    """A sink with ``process_batch`` only (no ``process_record``), as a sink writing batches
    is written: it refuses a batch holding a ``bad`` value, and writes ``<value>\\n`` lines
    through a CommittedFile. ``calls`` holds each call's size (TestRun: one process)."""

    calls: list[int] = []

    def setup(self, params: Mapping[str, str]) -> None:
        super().setup(params)
        self._pending: list[bytes] = []

    def restore(self, tablet: str, meta: bytes | None, token: int = 0, absorbed: Sequence[bytes] = ()) -> None:
        self.file = CommittedFile(self.params["path"], tablet, ".txt", meta, token=token)

    def process_batch(self, ctx: Context, records: Sequence[Record]) -> None:
        BatchSink.calls.append(len(records))
        if any(b"bad" in r.value for r in records):
            raise ValueError("the sink refuses bad values")
        self._pending += [r.value + b"\n" for r in records]

    def prepare_commit(self) -> bytes:
        data, self._pending = b"".join(self._pending), []
        return self.file.append(data)


class TimerPerValue(Computation):
    """Sets an event-time timer tagged with each record's value (text), a second later, and
    produces ``fired <tag>`` when it fires."""

    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.set_timer(record.value, record.timestamp + 1_000_000)

    def process_timer(self, ctx: Context, tag: str, time: int) -> None:
        ctx.produce("out", "fired " + tag)


class FlushingSink(FileSink):
    """A FileSink that sets a timer per record and, on it, tries to produce (refused: a sink
    writes out of millstream) or, for ``quiet``, writes a line."""

    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.set_timer(record.value.decode(), record.timestamp + 1)
        super().process_record(ctx, record)

    def process_timer(self, ctx: Context, tag: str, time: int) -> None:
        if tag != "quiet":
            ctx.produce("anything", b"x")
        super().process_record(ctx, Record(ctx.key, b"flushed " + tag.encode(), time, b""))


class Ticking:
    """A clock the test moves by hand (it stands in for ``perf_counter``)."""

    now = 0.0

    def __call__(self) -> float:
        return self.now


CLOCK = Ticking()


class TickingSink(FileSink):
    """A FileSink that takes one second of :data:`CLOCK` per record."""

    def process_record(self, ctx: Context, record: Record) -> None:
        CLOCK.now += 1.0
        super().process_record(ctx, record)


class WaitingSink(FileSink):
    """A FileSink that waits 0.1 s per record (a slow system downstream): time, not CPU."""

    def process_record(self, ctx: Context, record: Record) -> None:
        time.sleep(0.1)  # the simulated system's answer, not a test waiting for a condition
        super().process_record(ctx, record)


class Shrinker(Computation):
    """Sets its state to 17 MiB for ``big`` and clears it for anything else; passes the value on."""

    def process_record(self, ctx: Context, record: Record) -> None:
        if record.value == b"big":
            ctx.state.set(b"x" * (17 << 20))
        else:
            ctx.state.clear()
        ctx.produce("out", record.value)


class _Stringy:
    """A codec whose encode returns ``str`` for the word ``str`` (not bytes: refused)."""

    def encode(self, value: str) -> Any:
        return value if value == "str" else value.encode()

    def decode(self, data: bytes) -> str:
        return data.decode()


STRINGY = _Stringy()


class NamedState(Computation):
    """A typed state named ``state``: ctx.state's own name in a flow (refused)."""

    spec = ValueState("state", codecs.STR)

    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.state_of(self.spec).set("x")
        ctx.produce("out", record.value)


class StepNamedState(Computation):
    """A typed state named like the step's own (``state.holds``: its timers' holds; refused)."""

    spec = ValueState("state.holds", codecs.STR)

    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.produce("out", record.value)


class InlineSpecs(Computation):
    """Typed state specs made in each call, not declared: a list appended to, then a value read
    (the second spec is often made where the first, freed, lived)."""

    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.state_of(ListState("seen", codecs.INT)).append(1)
        ctx.produce("out", repr(ctx.state_of(ValueState("last", codecs.STR)).get()).encode())


class CachedHandle(Computation):
    """Keeps the first state handle it got and uses it for every record: wrong, since a handle
    is bound to its record's key (a flow's step runs a batch of keys in one call)."""

    count = ValueState("count", codecs.INT, default=0)

    def __init__(self) -> None:
        self.handle: Any = None

    def process_record(self, ctx: Context, record: Record) -> None:
        if self.handle is None:
            self.handle = ctx.state_of(self.count)
        self.handle.set(self.handle.get() + 1)
        ctx.produce("out", record.value)


class WithNamedAttribute(Computation):
    """A class attribute with ``name`` and ``kind`` fields that is no typed state."""

    label = collections.namedtuple("Label", "name kind")("x", "y")

    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.produce("out", record.value)


class LongNamedState(Computation):
    """A typed state whose name, with a long step's name before it, is over 255 bytes."""

    spec = ValueState("s" * 150, codecs.STR)

    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.state_of(self.spec).set("x")


class RaiseOnZero(Computation):
    """Fed WindowResults: raises on a window whose value is 0; passes ``[start, value]`` on."""

    def process_record(self, ctx: Context, record: Record) -> None:
        if record.value.value == 0:
            raise ValueError("a window of zero")
        ctx.produce("out", [record.value.start, record.value.value])


class PreviousWindow(Computation):
    """Fed WindowResults: passes on the start of the key's window before (kept 10 s in a TTL'd
    value, or None) and keeps this one's."""

    last = ValueState("last", codecs.INT, ttl=10_000_000)

    def process_record(self, ctx: Context, record: Record) -> None:
        last = ctx.state_of(self.last)
        ctx.produce("out", [last.get(), record.value.start])
        last.set(record.value.start)


class Remember(Computation):
    """Keeps every value of its key in a typed list, and the last one in ``ctx.state``."""

    seen = ListState("seen", codecs.INT)

    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.state_of(self.seen).append(record.value)
        ctx.state.set(str(record.value).encode())
        ctx.produce("out", record.value)


class InAMinute(Computation):
    """Sets a timer a minute after each record, by ``datetime``; produces at the timer's time."""

    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.set_timer("later", record.datetime + datetime.timedelta(minutes=1))

    def process_timer(self, ctx: Context, tag: str, time: int) -> None:
        at = datetime.datetime.fromtimestamp(time / 1e6, datetime.UTC)
        ctx.produce("out", at.isoformat().encode(), timestamp=at)


class Unmakeable(Remember):
    """A step that cannot be made where it would need what only the workers have (a client of
    some service, say): reading a savepoint's state must not make it."""

    def __init__(self) -> None:
        raise RuntimeError("made outside a worker")


class UndoneTrySink(FileSink):
    """The first try of each value sets a timer, clears and appends to its list, writes its raw
    state, then raises; later tries only append. Its timer writes a line if it ever fires."""

    items = ListState("items", codecs.STR)
    failed: set[str] = set()

    def process_record(self, ctx: Context, record: Record) -> None:
        items = ctx.state_of(self.items)
        if record.value not in self.failed:
            self.failed.add(record.value)
            ctx.set_timer("boom", record.timestamp + 1)
            items.clear()
            items.append("ghost")
            ctx.state.set(b"ghost")
            raise ValueError("first try")
        items.append(record.value.decode())
        line = b"%s:%s:%s" % (record.value, ",".join(items).encode(), ctx.state.get() or b"-")
        super().process_record(ctx, Record(record.key, line, record.timestamp, record.id))

    def process_timer(self, ctx: Context, tag: str, time: int) -> None:
        super().process_record(ctx, Record(ctx.key, b"fired " + tag.encode(), time, b""))


class SumOrRaise(SumAgg):
    """SumAgg whose result raises for a window that summed to zero (user code with a bug)."""

    def result(self, acc: int) -> int:
        if acc == 0:
            raise ValueError("a sum of zero has no result")
        return acc


def window_key(result: Any) -> str:
    """A window result keyed by its start."""
    return str(result.start)


def result_of(result: Any) -> Any:
    """A WindowResult's value."""
    return result.value


class Delay(Computation):
    """Holds each record back for 100 ms of event time (an event-time timer), then passes a 1
    on, stamped at the timer's time."""

    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.set_timer(f"due {record.timestamp}", record.timestamp + 100_000)  # (a timer per tag and key)

    def process_timer(self, ctx: Context, tag: str, time: int) -> None:
        ctx.produce("out", 1)


class CountResults(Computation):
    """Counts the window results of each key; a second after the first, an event-time timer
    passes the count on."""

    seen = ValueState("seen", codecs.INT, default=0)

    def process_record(self, ctx: Context, record: Record) -> None:
        state = ctx.state_of(self.seen)
        if state.get() == 0:
            ctx.set_timer("report", record.timestamp + 1_000_001)
        state.set(state.get() + 1)

    def process_timer(self, ctx: Context, tag: str, time: int) -> None:
        ctx.produce("out", ctx.state_of(self.seen).get())


TICKED = ValueState("ticked", codecs.INT, default=0)


class Ticks(Computation):
    """Passes a 1 on at each of four ticks a second apart, the first a second after the record:
    each tick's timer sets the next one (from process_timer)."""

    ticked = TICKED

    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.set_timer("tick", record.timestamp + 1_000_000)

    def process_timer(self, ctx: Context, tag: str, time: int) -> None:
        ctx.produce("out", 1)
        n = ctx.state_of(TICKED)
        n.set(n.get() + 1)
        if n.get() < 4:
            ctx.set_timer("tick", time + 1_000_000)
