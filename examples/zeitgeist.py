"""Zeitgeist (MillWheel paper, section 2): spikes and dips in search-query traffic.

    queries --> window_counter --> windows --> model --> alerts
                                      |                    |
                                      +--> windows_sink    +--> alerts_sink   (Parquet)

- The window stage is a :class:`~runtime.Dataflow` (:func:`window_counts`): keyed by
  query, a ``window`` step counts the queries of each second of event time in a
  one-second tumbling window and emits the count at the end of the second, once the
  low watermark says no more records of that second can come; a ``process`` step
  (:class:`WindowRow`, fused with it) writes it as a row with its query.
- :class:`ModelCalculator`, a classic computation (the escape hatch: its own typed
  state and timer), keyed by query, keeps a model of the query's
  expected traffic in state -- the median count of the previous
  :data:`HISTORY_SECONDS` seconds -- and, on an event-time timer that fires
  once every count of a second has arrived, classifies the second (see
  :func:`classify`) and emits an alert for a spike or a dip.

The alert rule is a pure function of the per-second counts
(:func:`reference_alerts`), so a batch job -- in plain Python here, in Spark in
``examples/zeitgeist_spark.py`` -- can compute the identical answer. Seconds
without queries count as zero. A query's second ``s`` is judged when
``first + HISTORY_SECONDS <= s <= last``: after a warm-up of one full history
after the query's first second, and up to the last second it was seen in
(a stream has no end; trailing silence is judged when traffic resumes).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from millstream import (
    Computation,
    Context,
    Dataflow,
    KeyedStream,
    Record,
    TimeDomain,
    Topology,
    ValueState,
    codecs,
)
from millstream.windows import Count, Tumbling, WindowResult
from spark_bridge import add_parquet_sink

SECOND = 1_000_000
HISTORY_SECONDS = 9        # the model: the median of the previous 9 seconds' counts
SPIKE_FACTOR = 3           # spike: count >= 3 * expected + 10
SPIKE_MIN = 10
DIP_MIN_EXPECTED = 20      # dip: expected >= 20 and count < expected / 4
DIP_DIVISOR = 4

WINDOW_FIELDS = "query:string,second:long,count:long"
ALERT_FIELDS = "query:string,second:long,kind:string,count:long,expected:long"


def second_of(timestamp_us: int) -> int:
    return timestamp_us // SECOND


def end_of(second: int) -> int:
    """The first microsecond after ``second``: its window can close when the watermark gets here."""
    return (second + 1) * SECOND


def judged_at(second: int) -> int:
    """When ``second`` is judged: just past :func:`end_of` (its window is produced *at* end_of)."""
    return end_of(second) + 1


def expected_count(history: list[int]) -> int:
    """The model: the median of the previous seconds' counts (an int: exact everywhere)."""
    return sorted(history)[len(history) // 2]


def classify(count: int, expected: int) -> str | None:
    """``"spike"``, ``"dip"`` or ``None`` for one second's count against the model."""
    if count >= SPIKE_FACTOR * expected + SPIKE_MIN:
        return "spike"
    if expected >= DIP_MIN_EXPECTED and DIP_DIVISOR * count < expected:
        return "dip"
    return None


@dataclass(frozen=True, order=True)
class Alert:
    query: str
    second: int
    kind: str
    count: int
    expected: int

    def to_json(self) -> bytes:
        return json.dumps({"query": self.query, "second": self.second, "kind": self.kind,
                           "count": self.count, "expected": self.expected}).encode()


def reference_alerts(counts: Mapping[str, Mapping[int, int]]) -> list[Alert]:
    """The alerts for per-query, per-second counts: the rule, written as a plain batch job."""
    out = []
    for query, by_second in counts.items():
        seconds = [s for s, c in by_second.items() if c > 0]
        if not seconds:
            continue
        first, last = min(seconds), max(seconds)
        for s in range(first + HISTORY_SECONDS, last + 1):
            history = [by_second.get(h, 0) for h in range(s - HISTORY_SECONDS, s)]
            c = by_second.get(s, 0)
            expected = expected_count(history)
            kind = classify(c, expected)
            if kind:
                out.append(Alert(query, s, kind, c, expected))
    return sorted(out)


def reference_counts(records: Iterable[tuple[str, int]]) -> dict[str, dict[int, int]]:
    """(query, timestamp) pairs -> per-query, per-second counts."""
    out: dict[str, dict[int, int]] = {}
    for query, ts in records:
        by = out.setdefault(query, {})
        s = second_of(ts)
        by[s] = by.get(s, 0) + 1
    return out


# ----------------------------------------------------------------- computations


def window_counts(flow: Dataflow, stream: str, name: str) -> KeyedStream:
    """The window stage, as a flow: each query's records per second of event time, counted in a
    one-second tumbling window that fires once the low watermark passes the second's end,
    then written as ``{"query", "second", "count"}`` (stamped at that end)."""
    return (flow.input(stream, keyed=True)
            .window(Tumbling(SECOND), Count(), name=f"{name}.window_counter")
            .process(WindowRow, name=f"{name}.window_rows"))


class WindowRow(Computation):
    """A fired window as the row the model and the Parquet sink read: the query is the key."""

    def process_record(self, ctx: Context, record: Record) -> None:
        w: WindowResult = record.value  # type: ignore[assignment]  # in a flow, values are objects
        row = {"query": ctx.key.decode("utf-8", "backslashreplace"), "second": second_of(w.start), "count": w.value}
        ctx.produce("windows", row)  # type: ignore[arg-type]


class ModelCalculator(Computation):
    """Keeps a query's traffic model in state and judges each second once all its counts are in.

    State (one JSON :class:`ValueState`, ``model``): ``first`` and ``last`` second seen, ``next`` second to judge, the
    counts of the :data:`HISTORY_SECONDS` seconds before it (``hist``) and
    counts received but not judged yet (``pending``). One event-time timer,
    ``judge``, at :func:`judged_at` of the next second that needs judging:
    when the watermark passes it, every window of that second has arrived
    (windows are produced at ``end_of(second)`` and hold the watermark until
    they are committed here).
    """

    model = ValueState("model", codecs.JSON)

    def setup(self, params: Mapping[str, str]) -> None:
        super().setup(params)
        self.out = params.get("alerts", "alerts")

    def process_record(self, ctx: Context, record: Record) -> None:
        w = json.loads(record.value)
        s, n = int(w["second"]), int(w["count"])
        model = ctx.state_of(self.model)
        st = model.get()
        if st is None:
            st = {"first": s, "last": s, "next": s, "judged": False,
                  "hist": [0] * HISTORY_SECONDS, "pending": {}}
        if s < st["next"]:
            if st["judged"]:
                return  # its second was judged already (a late window): nothing to revise
            st["next"] = s
        st["first"] = min(st["first"], s)
        st["last"] = max(st["last"], s)
        st["pending"][str(s)] = st["pending"].get(str(s), 0) + n
        self._schedule(ctx, st)
        model.set(st)

    def process_timer(self, ctx: Context, tag: str, time: int) -> None:
        model = ctx.state_of(self.model)
        st = model.get()
        if st is None:
            return
        query = ctx.key.decode("utf-8", "backslashreplace")
        wm = max(ctx.low_watermark, time)
        # Every second s with judged_at(s) <= wm has all its windows here.
        limit = min((wm - 1) // SECOND - 1, st["last"])
        pending = {int(k): v for k, v in st["pending"].items()}
        hist: list[int] = st["hist"]
        s = st["next"]
        while s <= limit:
            if not any(hist) and s not in pending:
                later = [p for p in pending if p > s]
                if not later:
                    break
                s = min(later)  # a silent stretch after a silent history changes nothing
                continue
            c = pending.pop(s, 0)
            if s >= st["first"] + HISTORY_SECONDS:
                expected = expected_count(hist)
                kind = classify(c, expected)
                if kind:
                    # Stamped when the second was judged; never below the watermark, so the
                    # alert is not late downstream (a second may be judged after a quiet spell).
                    ctx.produce(self.out, Alert(query, s, kind, c, expected).to_json(),
                                timestamp=max(judged_at(s), wm))
            hist = hist[1:] + [c]
            s += 1
            st["judged"] = True
        st["next"] = max(s, st["next"])
        st["hist"] = hist
        st["pending"] = {str(k): v for k, v in pending.items()}
        self._schedule(ctx, st)
        model.set(st)

    @staticmethod
    def _schedule(ctx: Context, st: dict) -> None:
        """Set the ``judge`` timer for the next second that needs judging (or none)."""
        pending = [int(k) for k in st["pending"]]
        nxt = st["next"]
        if any(st["hist"]) and nxt <= st["last"]:
            due: int | None = nxt
        else:
            later = [p for p in pending if p >= nxt]
            due = min(later) if later else None
        if due is None:
            ctx.delete_timer("judge")
        else:
            ctx.set_timer("judge", judged_at(due), TimeDomain.EVENT_TIME)


# --------------------------------------------------------------------- topology


def topology(output_dir: str, *, name: str = "zeitgeist", stream: str = "queries",
             key_ranges: int = 4) -> Topology:
    """The Zeitgeist pipeline reading ``stream``; Parquet output under ``output_dir``.

    Computation and stream names are prefixed with ``name`` so that several
    instances can share a cluster: ``<name>.window_counter``, ``<name>.windows``, ...
    """
    import os

    windows, alerts = f"{name}.windows", f"{name}.alerts"
    flow = Dataflow(name, key_ranges=key_ranges)
    window_counts(flow, stream, name).output(windows, codec=codecs.JSON)
    topo = flow.topology()  # the flow's steps, then the classic model and the sinks on its output
    topo.add_computation(f"{name}.model", ModelCalculator,
                         inputs={windows: None}, outputs=[alerts], key_ranges=key_ranges,
                         params={"alerts": alerts})
    add_parquet_sink(topo, f"{name}.windows_sink", stream=windows,
                     path=os.path.join(output_dir, "windows"), codec="json", fields=WINDOW_FIELDS)
    add_parquet_sink(topo, f"{name}.alerts_sink", stream=alerts,
                     path=os.path.join(output_dir, "alerts"), codec="json", fields=ALERT_FIELDS)
    return topo
