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
through a stateless stage of the input instead. A stateless chain from an input straight to
an ``output`` or ``sink`` is one stateless stage keyed by the records' own keys. Joins
merge the stages of their two sides into one.

Values inside a stage are Python objects; between stages and in operators' state they are
packed by :data:`runtime.flows.values.VALUES`; at the edges by the codecs you give
(``input``/``output``). Functions and classes are passed as objects and loaded by the
workers from their module paths: a lambda or a closure is refused when the step is added.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, overload

from runtime import codecs
from runtime.codecs import Codec
from runtime.errors import TopologyError, UsageError
from runtime.flows import FLOW_CODE, FLOW_KEY, PLAN_PARAM, SINK_FLOW_CODE
from runtime.flows.refs import aggregator_doc, code_path, codec_ref, windows_doc
from runtime.topology import DEFAULT_KEY_RANGES, Topology, _check_name, late_stream

_MICROSECOND = datetime.timedelta(microseconds=1)

_STATELESS = ("map", "flat_map", "filter")


@dataclass(eq=False)
class _Step:
    name: str
    kind: str
    ups: tuple[_Step, ...] = ()
    args: dict[str, Any] = field(default_factory=dict)
    downs: list[tuple[_Step, int]] = field(default_factory=list)  # (step, which input of it)
    keyed: bool = False


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
        anything else as JSON). ``params`` go to the sink's ``setup`` as strings."""
        from runtime.sinks import Sink, absolute_paths

        if not (isinstance(cls, type) and issubclass(cls, Sink)):
            raise UsageError(f"sink: {cls!r} is not a runtime.Sink subclass (e.g. runtime.sinks.FileSink)")
        bad = sorted(k for k, v in params.items() if not isinstance(v, str))
        if bad:
            raise UsageError(f"sink: params {bad} must be strings (they reach the sink's setup as text)")
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
        bad = sorted(k for k, v in params.items() if not isinstance(v, str))
        if bad:
            raise UsageError(f"process: params {bad} must be strings (they reach the computation's setup as text)")
        return KeyedStream(self._flow, self._then("process", name, {"cls": code_path(cls, "process"),
                                                                     "params": params}, True))

    def join(self, other: KeyedStream, windows: Any, *, name: str | None = None) -> KeyedStream:
        """Values ``(left, right)`` for every pair of a left and a right value of the same key
        in the same window, emitted when the window fires (stamped then). Records too late for
        every window go to ``<step name>.late``."""
        self._check_other(other, "join")
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
        return _Compiler(self).topology()

    def __repr__(self) -> str:
        return f"Dataflow({self.name!r}, steps={self.steps})"


# ------------------------------------------------------------------------ compiling

_STATEFUL = ("reduce", "window", "process", "join", "interval_join", "lookup_join")


@dataclass
class _Entry:
    stream: str
    codec: str
    prefix: list[_Step]             # stateless steps re-run on arrival (they ran in the key extractor)
    nexts: list[tuple[_Step, int]]  # where its records go
    extractor: bool                 # keyed on the producing side by the flow's key extractor
    key: _Step | None = None        # ... with this key_by's function


@dataclass(eq=False)
class _Stage:
    name: str                                               # its entry step's (renamed at the end)
    members: list[_Step] = field(default_factory=list)      # steps it runs, in flow order
    emitters: list[_Step] = field(default_factory=list)     # output / sink / key_by steps it writes for
    entries: dict[str, _Entry] = field(default_factory=dict)  # by stream


class _Compiler:
    """Cuts a flow into stages (module doc): a keyed stage per entry (``key_by``, keyed
    input) holding the keyed steps after it, joins merging their sides' stages; a stateless
    stage per raw input that needs one."""

    def __init__(self, flow: Dataflow) -> None:
        self.flow = flow
        self.steps = list(flow._steps.values())
        self.stage_of: dict[str, _Stage] = {}
        self.input_stages: dict[str, _Stage] = {}
        self.order = {s.name: i for i, s in enumerate(self.steps)}
        self.fused: set[str] = set()    # sink steps that run in the stage before them

    def topology(self) -> Topology:
        if not any(s.kind == "input" for s in self.steps):
            raise TopologyError(f"dataflow {self.flow.name!r} has no input; start it with flow.input('stream')")
        for step in self.steps:
            self._assign(step)
        for step in self.steps:
            if step.kind == "key_by":
                self._enter(step)
            elif step.kind == "input" and step.keyed:
                self.stage_of[step.name].entries[step.args["stream"]] = _Entry(
                    step.args["stream"], step.args["codec"], [], list(step.downs), False)
        for step in self.steps:
            if step.kind in ("output", "sink") and not step.ups[0].keyed:
                self._raw_to_edge(step)
        return self._emit()

    # -- keyed stages

    def _assign(self, step: _Step) -> None:
        if step.kind == "key_by" or (step.kind == "input" and step.keyed):
            stage = _Stage(step.name, [step])
            self.stage_of[step.name] = stage
            return
        if not step.keyed or step.kind in ("output", "sink"):
            if step.kind in ("output", "sink") and step.ups[0].keyed:
                self.stage_of[step.ups[0].name].emitters.append(step)
            return
        stage = self.stage_of[step.ups[0].name]
        if len(step.ups) == 2:  # a join: one stage for both sides
            other = self.stage_of[step.ups[1].name]
            if other is not stage:
                for name, st in list(self.stage_of.items()):
                    if st is other:
                        self.stage_of[name] = stage
                stage.members = sorted([*stage.members, *other.members], key=lambda s: self.order[s.name])
                stage.emitters += other.emitters
        stage.members.append(step)
        self.stage_of[step.name] = stage

    def _enter(self, key_by: _Step) -> None:
        """How records reach the stage ``key_by`` starts: from a keyed stage (which runs the key
        function and writes to the stream named after ``key_by``), or from a raw input."""
        stage = self.stage_of[key_by.name]
        up = key_by.ups[0]
        if up.keyed:
            source = self.stage_of[up.name]
            if source is stage:
                raise TopologyError(f"dataflow {self.flow.name!r}: step {key_by.name!r} re-keys records of the stage "
                                    "it leads back into (through a join); join two separately keyed streams instead")
            source.emitters.append(key_by)
            stage.entries[key_by.name] = _Entry(key_by.name, "flow", [], list(key_by.downs), False)
            return
        inp, path = self._raw_path(up)
        stream = inp.args["stream"]
        if not any(s.kind == "flat_map" for s in path) and stream not in stage.entries:
            stage.entries[stream] = _Entry(stream, inp.args["codec"], path, list(key_by.downs), True, key_by)
            return
        # One hop through the input's stateless stage: a flat_map cannot be a key extractor
        # (one record, several keys), nor can one reader read a stream by two extractors.
        istage = self._input_stage(inp)
        for s in path:
            if s not in istage.members:
                istage.members.append(s)
        istage.emitters.append(key_by)
        stage.entries[key_by.name] = _Entry(key_by.name, "flow", [], list(key_by.downs), False)

    def _raw_path(self, step: _Step) -> tuple[_Step, list[_Step]]:
        """The raw input ``step`` hangs off, and the stateless steps from it to ``step``."""
        path: list[_Step] = []
        while step.kind != "input":
            path.append(step)
            step = step.ups[0]
        return step, path[::-1]

    def _input_stage(self, inp: _Step) -> _Stage:
        stage = self.input_stages.get(inp.name)
        if stage is None:
            stage = self.input_stages[inp.name] = _Stage(inp.name)
            stage.entries[inp.args["stream"]] = _Entry(inp.args["stream"], inp.args["codec"], [], list(inp.downs),
                                                       False)
        return stage

    def _raw_to_edge(self, edge: _Step) -> None:
        """An output or sink of a raw chain: the input's stateless stage runs the chain."""
        inp, path = self._raw_path(edge.ups[0])
        istage = self._input_stage(inp)
        for s in path:
            if s not in istage.members:
                istage.members.append(s)
        istage.emitters.append(edge)

    # -- the topology

    def _emit(self) -> Topology:
        flow = self.flow
        internal = {s.name for s in self.steps if s.kind in ("key_by", "sink")}
        for s in self.steps:
            stream = s.args.get("stream") if s.kind in ("input", "output") else None
            if stream in internal:
                raise TopologyError(f"dataflow {flow.name!r}: stream {stream!r} of step {s.name!r} is also the name of "
                                    "a key_by or sink step (those name the flow's own streams); rename one")
        topo = Topology(flow.name)
        stages = [*self.input_stages.values(),
                  *sorted({id(s): s for s in self.stage_of.values()}.values(),
                          key=lambda st: self.order[st.members[0].name])]
        for stage in stages:
            if not stage.entries:
                continue
            name = self._stage_name(stage)
            outputs = []
            for e in stage.emitters:
                outputs.append(e.args["stream"] if e.kind == "output" else e.name)
            for m in stage.members:
                if m.kind in ("window", "join", "interval_join") and late_stream(m.name) != late_stream(name):
                    outputs.append(late_stream(m.name))
            inputs = {e.stream: (FLOW_KEY if e.extractor else None) for e in stage.entries.values()}
            fused = self._fused_sink(stage)
            if fused is not None:
                outputs.remove(fused.name)
                self.fused.add(fused.name)
            plan = self._plan(stage, name)
            topo.add_computation(name, FLOW_CODE if fused is None else SINK_FLOW_CODE, inputs=inputs,
                                 outputs=list(dict.fromkeys(outputs)), key_ranges=flow.key_ranges,
                                 exactly_once=flow.exactly_once, replication=flow.replication,
                                 params={PLAN_PARAM: json.dumps(plan, sort_keys=True, separators=(",", ":"))})
        for sink in (s for s in self.steps if s.kind == "sink" and s.name not in self.fused):
            topo.add_computation(sink.name, sink.args["cls"], inputs={sink.name: None}, outputs=[],
                                 key_ranges=flow.key_ranges, exactly_once=flow.exactly_once,
                                 replication=flow.replication, params=dict(sink.args["params"]))
        return topo

    @staticmethod
    def _fused_sink(stage: _Stage) -> _Step | None:
        """The sink that runs inside ``stage`` (Flink's chaining of a sink): its only sink.
        A stage writing to two sinks keeps each in a computation of its own (a tablet
        commits one sink meta per batch)."""
        sinks = [e for e in stage.emitters if e.kind == "sink"]
        return sinks[0] if len(sinks) == 1 else None

    @staticmethod
    def _stage_name(stage: _Stage) -> str:
        """A stage's computation is named after its first stateful step (so that step's
        ``.late`` stream is the computation's), else after its entry step."""
        for step in stage.members:
            if step.kind in _STATEFUL:
                return step.name
        return stage.name

    def _plan(self, stage: _Stage, name: str) -> dict[str, Any]:
        runs = {s.name for s in stage.members if s.kind not in ("key_by", "input")} | {s.name for s in stage.emitters}

        def nexts(downs: list[tuple[_Step, int]]) -> list[list[Any]]:
            return [[d.name, side] for d, side in downs if d.name in runs]

        steps: dict[str, Any] = {}
        for s in stage.members:
            if s.kind in ("key_by", "input"):
                continue  # entries: their records arrive keyed (or raw, at the entry)
            doc = {"kind": s.kind, **s.args, "next": nexts(s.downs)}
            if s.kind in ("window", "join", "interval_join"):
                doc["late"] = late_stream(s.name)
            steps[s.name] = doc
        for e in stage.emitters:
            if e.kind == "output":
                steps[e.name] = {"kind": "emit", "stream": e.args["stream"], "codec": e.args["codec"], "next": []}
            elif e.kind == "sink" and e.name in self.fused:
                steps[e.name] = {"kind": "sink", "cls": e.args["cls"], "params": e.args["params"],
                                 "codec": e.args["codec"], "next": []}
            elif e.kind == "sink":
                steps[e.name] = {"kind": "emit", "stream": e.name, "codec": e.args["codec"], "next": []}
            else:  # key_by: the next stage's key, computed here
                steps[e.name] = {"kind": "emit", "stream": e.name, "codec": "flow", "key": e.args["fn"], "next": []}
        entries = {e.stream: {"codec": e.codec, "prefix": [[s.kind, s.args["fn"]] for s in e.prefix],
                              "next": nexts(e.nexts)}
                   for e in stage.entries.values()}
        keys = {e.stream: [e.key.name, e.key.args["fn"]] for e in stage.entries.values() if e.key is not None}
        return {"flow": self.flow.name, "stage": name, "entries": entries, "steps": steps, "keys": keys}

