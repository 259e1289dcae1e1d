"""The computations the benchmarks submit (workers import them by ``bench.jobs:...``).

Values are short ASCII so that encoding costs stay out of the measurement:

- W1: the injector sends ``b"<scheduled ns>"``; each :class:`ChainedCounter` stage
  keeps a per-key running count and produces ``b"<scheduled ns>,<stamp ns>... <count>"``
  (the time the record reached each stage's user code, appended stage by stage, so a run
  says where its milliseconds go: :func:`bench.latency.hops`);
  :class:`ArrivalSink` appends ``key value arrival_ns`` lines.
- W2: :class:`WindowCounter` counts per key and one-second event-time window and
  emits ``b"<window start> <count>"`` on the window's event-time timer;
  :class:`SpikeDetector` feeds each key's windows, in window order, through
  :func:`bench.generator.spike_step` and emits the spikes to :class:`ArrivalSink`.
- W2 as a user writes it on a flow (:func:`w2_flow`): the injector's keyed records, one-second
  tumbling windows counting them, :class:`SpikeStep` per key (a window's results reach it in
  window order: they fire in that order, in the same tablet), the spikes to
  :class:`ArrivalSink`. One computation for windows and spikes, one commit per batch.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from bench.generator import SECOND_US, spike_step, window_of
from runtime import Computation, Context, Dataflow, Record, Sink, TimeDomain, ValueState, codecs
from runtime.errors import TopologyError
from runtime.sinks import CommittedFile
from runtime.windows import Count, Tumbling, WindowResult


class ChainedCounter(Computation):
    """A per-key running count; forwards the scheduled time it was given, and the times
    earlier stages saw the record, with its own appended. Param ``out``."""

    def setup(self, params: Mapping[str, str]) -> None:
        super().setup(params)
        self.out = params.get("out", "out")

    def process_record(self, ctx: Context, record: Record) -> None:
        state = ctx.state
        n = int(state.get() or b"0") + 1
        state.set(b"%d" % n)
        stamps = record.value.split(b" ", 1)[0]
        ctx.produce(self.out, b"%s,%d %d" % (stamps, time.time_ns(), n))


class ArrivalSink(Sink):
    """Appends ``key value arrival_ns`` lines to ``<path>/<tablet>.txt``, exactly once.

    The arrival time is read when the sink writes the batch's lines (``prepare_commit``),
    right before the commit that makes them final: that is when the output is *observed*
    (as Flink's and Bytewax's sinks are timed when they write). In a flow the sink runs in
    the stage before it (runtime/dataflow.py), so that commit is the stage's own: its fsync
    and replication come after the stamp. The file's committed length
    is stored in the tablet's atomic commit (like :class:`runtime.sinks.FileSink`),
    and a reopened tablet cuts the file back to it, so a redelivered batch is not
    written twice. Lines are not fsynced: a SIGKILLed process keeps its page cache.
    """

    def setup(self, params: Mapping[str, str]) -> None:
        super().setup(params)
        if "path" not in params:
            raise TopologyError("ArrivalSink needs params={'path': DIRECTORY}")
        self.dir = params["path"]
        self._pending: list[bytes] = []

    def restore(self, tablet: str, meta: bytes | None, token: int = 0, absorbed: Sequence[bytes] = ()) -> None:
        self.file = CommittedFile(self.dir, tablet, ".txt", meta, token=token)

    def process_record(self, ctx: Context, record: Record) -> None:
        self._pending.append(b"%s %s " % (record.key, record.value))

    def prepare_commit(self) -> bytes:
        stamp = b"%d\n" % time.time_ns()
        data = stamp.join(self._pending) + stamp if self._pending else b""
        self._pending.clear()
        return self.file.append(data, fsync=False)


class WindowCounter(Computation):
    """Counts per key in one-second event-time windows; emits each on its timer to
    param ``out`` (default ``windows``)."""

    def setup(self, params: Mapping[str, str]) -> None:
        super().setup(params)
        self.out = params.get("out", "windows")

    def process_record(self, ctx: Context, record: Record) -> None:
        w = window_of(record.timestamp)
        counts = _decode(ctx.state.get())
        if w not in counts:
            ctx.set_timer(str(w), w + SECOND_US, TimeDomain.EVENT_TIME)
        counts[w] = counts.get(w, 0) + 1
        ctx.state.set(_encode(counts))

    def process_timer(self, ctx: Context, tag: str, time: int) -> None:
        w = int(tag)
        counts = _decode(ctx.state.get())
        c = counts.pop(w, 0)
        ctx.state.set(_encode(counts)) if counts else ctx.state.clear()
        ctx.produce(self.out, b"%d %d" % (w, c))  # timestamp: the timer's (the window's end)


class SpikeDetector(Computation):
    """Flags a window whose count exceeds 3x the EWMA of the key's earlier windows + 5.

    Window counts may arrive in any order; each is buffered in state and released
    by an event-time timer at its window's end, so a key's windows are always
    scored in window order. Spikes go to param ``out`` (default ``spikes``).
    """

    def setup(self, params: Mapping[str, str]) -> None:
        super().setup(params)
        self.out = params.get("out", "spikes")

    def process_record(self, ctx: Context, record: Record) -> None:
        w, c = record.value.split(b" ")
        ewma, pending = _decode_spike(ctx.state.get())
        pending[int(w)] = int(c)
        ctx.state.set(_encode_spike(ewma, pending))
        ctx.set_timer(w.decode(), record.timestamp, TimeDomain.EVENT_TIME)

    def process_timer(self, ctx: Context, tag: str, time: int) -> None:
        ewma, pending = _decode_spike(ctx.state.get())
        for w in sorted(x for x in pending if x + SECOND_US <= time):
            c = pending.pop(w)
            spike, ewma = spike_step(ewma, c)
            if spike:
                ctx.produce(self.out, b"%d %d" % (w, c))
        ctx.state.set(_encode_spike(ewma, pending))


def _decode(raw: bytes | None) -> dict[int, int]:
    if not raw:
        return {}
    out = {}
    for item in raw.split(b","):
        w, c = item.split(b":")
        out[int(w)] = int(c)
    return out


def _encode(counts: dict[int, int]) -> bytes:
    return b",".join(b"%d:%d" % kv for kv in counts.items())


def _decode_spike(raw: bytes | None) -> tuple[float | None, dict[int, int]]:
    if not raw:
        return None, {}
    head, _, rest = raw.partition(b"|")
    return (None if head == b"-" else float(head)), _decode(rest)


def _encode_spike(ewma: float | None, pending: dict[int, int]) -> bytes:
    return (b"-" if ewma is None else repr(ewma).encode()) + b"|" + _encode(pending)


class SpikeStep(Computation):
    """W2's spike detection as a flow step: each window's count against the key's EWMA of
    the earlier ones (:func:`bench.generator.spike_step`); a spike goes on as
    ``b"<window start> <count>"``."""

    ewma = ValueState("ewma", codecs.FLOAT)

    def process_record(self, ctx: Context, record: Record) -> None:
        window: WindowResult = record.value  # type: ignore[assignment]  # in a flow, a WindowResult
        state = ctx.state_of(self.ewma)
        spike, ewma = spike_step(state.get(), window.value)
        state.set(ewma)
        if spike:
            ctx.produce("spikes", b"%d %d" % (window.start, window.value))


def w2_flow(sink_dir: str, *, name: str = "w2", key_ranges: int = 4, replication: int | None = None) -> Dataflow:
    """W2 on a flow, as a user writes it (module doc)."""
    flow = Dataflow(name, key_ranges=key_ranges, replication=replication)
    (flow.input("events", keyed=True)
     .window(Tumbling(SECOND_US), Count(), name=f"{name}.windows")
     .process(SpikeStep, name=f"{name}.spikes")
     .sink(ArrivalSink, name=f"{name}.sink", path=sink_dir))
    return flow
