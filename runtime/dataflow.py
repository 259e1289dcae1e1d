"""Dataflows (DESIGN.md §3b): ``map``, ``filter``, ``key_by``, ``reduce``, ``window``, ``join``
... in the vocabulary of Bytewax, Quix and Flink, compiled to a :class:`~runtime.Topology`.

::

    flow = Dataflow("clicks")
    clicks = flow.input("clicks", codec=codecs.JSON)        # values arrive decoded
    per_page = (clicks.filter(jobs.is_human)
                      .map(jobs.page_of)
                      .key_by(jobs.page_key)                 # a KeyedStream
                      .window(Tumbling(60 * SECOND), Count()))
    per_page.output("page_counts", codec=codecs.JSON)
    connect(masters).submit(flow)

**What it compiles to** (docs/dataflows.md says it with pictures): one computation per
*stage*. A stage starts where records are keyed (a ``key_by``, or an input read with
``keyed=True``) and holds every step on that key after it, stateful ones included (a
``window`` then a ``process`` run in the same tablet, one commit for both), until the next
``key_by`` (whose key function runs at the end of this stage: the records go to the next
stage already keyed). A ``sink`` runs in the stage before it (Flink chains sinks so): its
meta commits with that stage's batch; a stage with two sinks feeds each its own computation.
Stateless steps before the first
``key_by`` of an input run in the input's key extractor, on the producing side, so a
filtered record never crosses the network, and again in the stage (functions must be
deterministic); a ``flat_map`` there, or an input read twice by one stage, takes one hop
through a stateless stage of the input instead (two ``keyed=True`` reads of one stream in
one stage are refused). A stateless chain from an input straight to
an ``output`` or ``sink`` is one stateless stage keyed by the records' own keys. Joins
merge the stages of their two sides into one.

Values inside a stage are Python objects; between stages and in operators' state they are
packed by :data:`runtime.flows.values.VALUES`; at the edges by the codecs you give
(``input``/``output``). Functions and classes are passed as objects and loaded by the
workers from their module paths: a lambda or a closure is refused when the step is added.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable, Iterable
from typing import Any, Literal, overload

from runtime import codecs
from runtime.codecs import Codec
from runtime.errors import UsageError
from runtime.flows.assigners import MAX_SPAN
from runtime.flows.compile import Step as _Step
from runtime.flows.compile import compile_flow
from runtime.flows.refs import aggregator_doc, code_path, codec_ref, windows_doc
from runtime.topology import DEFAULT_KEY_RANGES, Topology, _check_name

_MICROSECOND = datetime.timedelta(microseconds=1)


def _as_text(what: str, params: dict[str, Any]) -> dict[str, str]:
    """A step's params as the text its class's ``setup`` gets: strings as they are, paths
    (``pathlib.Path``) as their text, numbers and booleans as they print (``"100"``,
    ``"true"``); anything else refused, with what to do."""
    out = {}
    for k, v in params.items():
        if isinstance(v, bool):
            out[k] = "true" if v else "false"
        elif isinstance(v, str | int | float):
            out[k] = str(v)
        elif isinstance(v, os.PathLike):
            out[k] = os.fspath(v)  # type: ignore[assignment]
        else:
            raise UsageError(f"{what}: param {k}={v!r:.60} is a {type(v).__name__}; params reach the step's setup as "
                             "text: pass a string, a number or a path (json.dumps a structure, and json.loads it "
                             "in setup)")
    return out


def _inputs_of(step: _Step, tables: bool = True) -> set[str]:
    """The input streams whose records (or values) can reach ``step`` as soon as they are
    taken: through every step before it but a ``join`` or a ``window`` that emits when it
    fires, in its own stage (one in a stage before it sends its results on as records, taken as
    they come). ``tables=False``: not through a ``lookup_join``'s table either, as for the
    records that reach a join's stream side (a table's records update it and go no further;
    their values go on inside the joined records, which is why a table side walks through)."""
    seen, todo, out = set(), [(step, False)], set()
    while todo:
        s, hopped = todo.pop()
        timed = s.kind == "join" or (s.kind == "window" and s.args.get("emit") != "updates")
        if (s, hopped) in seen or (timed and not hopped):
            continue
        seen.add((s, hopped))
        if s.kind == "input":
            out.add(s.args["stream"])
        ups = s.ups[:1] if s.kind == "lookup_join" and not tables else s.ups
        todo.extend((u, hopped or s.kind == "key_by") for u in ups)
    return out


class Stream:
    """A stream of values in a flow. Every step takes ``name=`` (stable across ``update``, so
    state survives a redeploy; the default is ``<flow>.<step>``, numbered if repeated)."""

    def __init__(self, flow: Dataflow, step: _Step) -> None:
        self._flow = flow
        self._step = step

    def _then(self, kind: str, name: str | None, args: dict[str, Any], keyed: bool,
              others: tuple[Stream, ...] = ()) -> _Step:
        return self._flow._add(kind, name, (self._step, *(o._step for o in others)), args, keyed)

    def _wrap(self, step: _Step) -> Stream:
        return KeyedStream(self._flow, step) if step.keyed else Stream(self._flow, step)

    def map(self, fn: Callable[[Any], Any], *, name: str | None = None) -> Stream:
        """``fn(value) -> value`` for every value."""
        return self._wrap(self._then("map", name, {"fn": code_path(fn, "map")}, self._step.keyed))

    def flat_map(self, fn: Callable[[Any], Iterable[Any]], *, name: str | None = None) -> Stream:
        """``fn(value) -> iterable``: each of its items goes on as a value of its own."""
        return self._wrap(self._then("flat_map", name, {"fn": code_path(fn, "flat_map")}, self._step.keyed))

    def filter(self, fn: Callable[[Any], object], *, name: str | None = None) -> Stream:
        """Keep the values for which ``fn(value)`` is true."""
        return self._wrap(self._then("filter", name, {"fn": code_path(fn, "filter")}, self._step.keyed))

    def key_by(self, fn: Callable[[Any], str | bytes], *, name: str | None = None) -> KeyedStream:
        """Partition by ``fn(value)`` (``str`` or ``bytes``): a :class:`KeyedStream`, whose
        stateful steps keep state per key."""
        step = self._then("key_by", name, {"fn": code_path(fn, "key_by")}, True)
        return KeyedStream(self._flow, step)

    def output(self, stream: str, *, codec: Codec = codecs.BYTES, name: str | None = None) -> Stream:
        """Write the values to the named ``stream`` (readable by anything: other jobs,
        injectors' readers, ``TestRun.output``), encoded by ``codec``; the record key is the
        stream's key (a keyed stream's key, else the input record's)."""
        _check_name("output stream", stream)
        self._then("output", name, {"stream": stream, "codec": codec_ref(codec, f"output {stream!r}")}, False)
        return self

    def sink(self, cls: type, *, name: str | None = None, codec: Codec | None = None, **params: str) -> Stream:
        """Write the values out through a :class:`~runtime.Sink` subclass (e.g.
        ``runtime.sinks.FileSink``, ``path="/data/out"``; a relative path the sink names in its
        ``local_paths`` is made absolute here, against this process's working directory), run in the stage before it (its
        output commits with that stage's batch: docs/dataflows.md, "What a flow compiles
        to"), values encoded by ``codec`` (default: bytes as they are, text as UTF-8,
        anything else as JSON). ``params`` go to the sink's ``setup`` as text (paths and numbers
        too: :func:`_as_text`)."""
        from runtime.sinks import Sink, absolute_paths

        if not (isinstance(cls, type) and issubclass(cls, Sink)):
            raise UsageError(f"sink: {cls!r} is not a runtime.Sink subclass (e.g. runtime.sinks.FileSink)")
        params = _as_text("sink", params)
        from runtime.flows.values import AUTO

        params = absolute_paths(cls, params)  # here, not against each worker's own directory
        self._then("sink", name, {"cls": code_path(cls, "sink"), "params": params,
                                  "codec": codec_ref(codec if codec is not None else AUTO, "sink codec")}, False)
        return self


class KeyedStream(Stream):
    """A stream partitioned by key: ``map``, ``flat_map`` and ``filter`` keep the key; the
    steps below keep state per key, committed with each batch, replicated, and split and
    merged with the key ranges."""

    def map(self, fn: Callable[[Any], Any], *, name: str | None = None) -> KeyedStream:
        return super().map(fn, name=name)  # type: ignore[return-value]

    def flat_map(self, fn: Callable[[Any], Iterable[Any]], *, name: str | None = None) -> KeyedStream:
        return super().flat_map(fn, name=name)  # type: ignore[return-value]

    def filter(self, fn: Callable[[Any], object], *, name: str | None = None) -> KeyedStream:
        return super().filter(fn, name=name)  # type: ignore[return-value]

    def reduce(self, fn: Callable[[Any, Any], Any], *, name: str | None = None) -> KeyedStream:
        """A running value per key: ``fn(acc, value) -> acc`` (a key's first value is its own
        acc); emits the new running value for every record."""
        return KeyedStream(self._flow, self._then("reduce", name, {"fn": code_path(fn, "reduce")}, True))

    def window(self, windows: Any, aggregator: Any, *, name: str | None = None,
               emit: Literal["final", "updates"] = "final") -> KeyedStream:
        """Aggregate each key's values per event-time window (``Tumbling``, ``Sliding``,
        ``Session`` of runtime.windows, with ``allowed_lateness``); when the watermark passes a
        window's end plus the lateness it emits one :class:`~runtime.windows.WindowResult`
        ``(start, end, value)``, stamped at that moment. Records too late for every window go
        to the stream ``<step name>.late``. ``emit="updates"``: early results too (Kafka
        Streams' emit on update, Quix's ``current()``, Beam's early firings): each batch emits
        every window it changed with its value so far, stamped at the window's last instant
        (``end - 1``, or the watermark if later), a session merged away with the value None;
        then the window's result when it closes, as without it."""
        what = f"window {name or ''}".strip()
        if emit not in ("final", "updates"):
            raise UsageError(f"{what}: emit={emit!r}; pass \"final\" (one result when the window closes) or "
                             "\"updates\" (its value so far, each batch that changes it)")
        args: dict[str, Any] = {"windows": windows_doc(windows, what), "agg": aggregator_doc(aggregator, what)}
        if emit == "updates":
            args["emit"] = emit  # (plans without it: final)
        return KeyedStream(self._flow, self._then("window", name, args, True))

    def process(self, cls: type, *, name: str | None = None, **params: str) -> KeyedStream:
        """Run a :class:`~runtime.Computation` subclass per key, with its own state and timers
        (``ctx.state``, ``ctx.state_of``, ``ctx.set_timer``: private to this step). Its
        ``process_record`` gets each value as ``record.value`` (a Python object); whatever it
        ``ctx.produce(...)``s, to any stream name, flows on as the next step's values, on the
        same key (a ``key=`` other than the current key is refused: re-key with ``key_by``)."""
        from runtime.computation import Computation

        if not (isinstance(cls, type) and issubclass(cls, Computation)):
            raise UsageError(f"process: {cls!r} is not a runtime.Computation subclass")
        params = _as_text("process", params)
        return KeyedStream(self._flow, self._then("process", name, {"cls": code_path(cls, "process"),
                                                                     "params": params}, True))

    def join(self, other: KeyedStream, windows: Any, *, name: str | None = None) -> KeyedStream:
        """Values ``(left, right)`` for every pair of a left and a right value of the same key
        in the same window, emitted when the window fires (stamped then). Records too late for
        every window go to ``<step name>.late``. Tumbling or sliding windows (a session join is
        not supported: for pairs within a time distance, ``interval_join``)."""
        from runtime.windows import Session

        self._check_other(other, "join")
        if isinstance(windows, Session):  # (said here, where the step is added, not at submit)
            raise UsageError(f"join {name or ''!r}: joins take Tumbling or Sliding windows (a session join is not "
                             "supported); for pairs within a time distance use interval_join")
        args = {"windows": windows_doc(windows, "join")}
        return KeyedStream(self._flow, self._then("join", name, args, True, (other,)))

    def lookup_join(self, table: KeyedStream, *, how: Literal["inner", "left"] = "inner",
                    name: str | None = None) -> KeyedStream:
        """Values ``(value, latest)`` for every value of this stream: ``latest`` is the last
        value ``table`` carried for the same key before it (Kafka Streams' stream-table join,
        Quix's lookup join, a join with the latest version in Flink): processing order, not
        event time. A value whose key has no table value yet is dropped (``how="inner"``) or
        goes on as ``(value, None)`` (``how="left"``). The table's values are the step's
        state: read by the step's name (``state get``, Spark, ``TestRun.typed_state``)."""
        self._check_other(table, "lookup_join")
        stream_inputs = _inputs_of(self._step, tables=False)
        shared = stream_inputs & _inputs_of(table._step)
        if shared:
            direct = shared & _inputs_of(table._step, tables=False)
            first = sorted(direct or shared)[0]
            how_ = "comes from" if direct else "carries, through an earlier lookup_join's table,"
            raise UsageError(f"lookup_join: the table {how_} input {first!r}, as the stream does; a record would meet "
                             "itself or a later one, depending on the batching. Join a table from another input (or "
                             "from a window's results); for a key's previous value, use reduce")
        if how not in ("inner", "left"):
            raise UsageError(f"lookup_join: how={how!r}; pass \"inner\" (drop values with no table value yet) "
                             "or \"left\" (pass them on with None)")
        return KeyedStream(self._flow, self._then("lookup_join", name, {"how": how}, True, (table,)))

    def interval_join(self, other: KeyedStream, lower: int | datetime.timedelta, upper: int | datetime.timedelta, *,
                      name: str | None = None) -> KeyedStream:
        """Values ``(left, right)`` for every pair of the same key where ``right.timestamp -
        left.timestamp`` is within ``[lower, upper]`` (microseconds, or ``timedelta``s), emitted as soon as both are
        in (stamped at the later of the two). A record behind the watermark by more than the
        second its timestamp falls in (a partner of it may have been dropped) goes to
        ``<step name>.late``, unpaired."""
        self._check_other(other, "interval_join")
        lower, upper = (v // _MICROSECOND if isinstance(v, datetime.timedelta) else v for v in (lower, upper))
        for what, v in (("lower", lower), ("upper", upper)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise UsageError(f"interval_join: {what}={v!r} must be an int of microseconds or a timedelta")
            if abs(v) > MAX_SPAN:
                raise UsageError(f"interval_join: {what}={v!r} is further than the {MAX_SPAN:,} µs (~73,000 years) "
                                 "a bound may be; is it in nanoseconds (microseconds are time.time_ns() // 1000)?")
        if lower > upper:
            raise UsageError(f"interval_join: lower={lower} is above upper={upper}")
        return KeyedStream(self._flow, self._then("interval_join", name, {"lower": lower, "upper": upper}, True,
                                                  (other,)))

    def _check_other(self, other: object, what: str) -> None:
        if not isinstance(other, KeyedStream):
            raise UsageError(f"{what}: the other side must be a KeyedStream (call key_by on it first)")
        if other._flow is not self._flow:
            raise UsageError(f"{what}: the other stream belongs to another Dataflow")


class Dataflow:
    """A flow of steps from named input streams to named output streams and sinks
    (module doc). ``key_ranges``, ``replication`` and ``exactly_once`` apply to each of the
    computations it compiles to, as in ``Topology.add_computation``."""

    def __init__(self, name: str, *, key_ranges: int = DEFAULT_KEY_RANGES, replication: int | None = None,
                 exactly_once: bool = True) -> None:
        _check_name("dataflow", name)
        self.name = name
        self.key_ranges = key_ranges
        self.replication = replication
        self.exactly_once = exactly_once
        self._steps: dict[str, _Step] = {}
        self._counts: dict[str, int] = {}

    @overload
    def input(self, stream: str, *, codec: Codec = ..., name: str | None = ...,
              keyed: Literal[False] = ...) -> Stream: ...

    @overload
    def input(self, stream: str, *, codec: Codec = ..., name: str | None = ...,
              keyed: Literal[True]) -> KeyedStream: ...

    def input(self, stream: str, *, codec: Codec = codecs.BYTES, name: str | None = None,
              keyed: bool = False) -> Stream:
        """The values of the named ``stream`` (from injectors, Spark, other jobs), decoded by
        ``codec``. ``keyed=True``: a :class:`KeyedStream` on the records' own keys (as their
        producers keyed them), with no ``key_by`` and no code on the producing side."""
        _check_name("input stream", stream)
        step = self._add("input", name, (), {"stream": stream, "codec": codec_ref(codec, f"input {stream!r}")},
                         bool(keyed))
        return KeyedStream(self, step) if keyed else Stream(self, step)

    @property
    def steps(self) -> list[str]:
        """Every step's name, in the order they were added."""
        return list(self._steps)

    def _add(self, kind: str, name: str | None, ups: tuple[_Step, ...], args: dict[str, Any], keyed: bool) -> _Step:
        if name is None:
            n = self._counts[kind] = self._counts.get(kind, 0) + 1
            name = f"{self.name}.{kind}" if n == 1 else f"{self.name}.{kind}_{n}"
            while name in self._steps:
                n = self._counts[kind] = n + 1
                name = f"{self.name}.{kind}_{n}"
        else:
            _check_name("step", name)
            if name in self._steps:
                raise UsageError(f"dataflow {self.name!r} already has a step named {name!r}; give each step its own "
                                 "name")
        step = _Step(name, kind, ups, args, keyed=keyed)
        for i, up in enumerate(ups):
            up.downs.append((step, i))
        self._steps[name] = step
        return step

    def topology(self) -> Topology:
        """The :class:`Topology` this flow compiles to (one computation per stage; module doc)."""
        return compile_flow(self)

    def explain(self) -> str:
        """What this flow runs as, in words: its stages, the streams each reads and how they
        are keyed, the steps it runs fused, and what it writes (hops to other stages among
        them). ``millstream explain MODULE:ATTR`` prints it."""
        from runtime.flows.explain import explain

        return explain(self.topology(), list(self._steps.values()))

    def __repr__(self) -> str:
        return f"Dataflow({self.name!r}, steps={self.steps})"
