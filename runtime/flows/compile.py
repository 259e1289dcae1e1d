"""Compiling a :class:`~runtime.Dataflow` into a :class:`~runtime.Topology` (what
runtime/dataflow.py's module doc says it compiles to): the graph of steps the API builds
(:class:`Step`), cut into stages, each stage's plan (the JSON its ``FlowStage`` runs,
runtime/flows/stage.py) and the computations that run them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from runtime.errors import TopologyError
from runtime.flows import FLOW_CODE, FLOW_KEY, PLAN_PARAM, SINK_FLOW_CODE
from runtime.topology import Topology, late_stream


@dataclass(eq=False)
class Step:
    """One step of a flow as the API adds it: its kind, the steps it reads (``ups``) and
    those that read it (``downs``), and its arguments."""

    name: str
    kind: str
    ups: tuple[Step, ...] = ()
    args: dict[str, Any] = field(default_factory=dict)
    downs: list[tuple[Step, int]] = field(default_factory=list)  # (step, which input of it)
    keyed: bool = False


class Flow(Protocol):
    """What compiling reads of a :class:`~runtime.Dataflow`."""

    name: str
    key_ranges: int
    replication: int | None
    exactly_once: bool
    _steps: dict[str, Step]


def compile_flow(flow: Flow) -> Topology:
    """The :class:`Topology` ``flow`` compiles to (one computation per stage)."""
    return _Compiler(flow).topology()


_STATEFUL = ("reduce", "window", "process", "join", "interval_join", "lookup_join")


@dataclass
class _Entry:
    stream: str
    codec: str
    prefix: list[Step]             # stateless steps re-run on arrival (they ran in the key extractor)
    nexts: list[tuple[Step, int]]  # where its records go
    extractor: bool                 # keyed on the producing side by the flow's key extractor
    key: Step | None = None        # ... with this key_by's function


@dataclass(eq=False)
class _Stage:
    name: str                                               # its entry step's (renamed at the end)
    members: list[Step] = field(default_factory=list)      # steps it runs, in flow order
    emitters: list[Step] = field(default_factory=list)     # output / sink / key_by steps it writes for
    entries: dict[str, _Entry] = field(default_factory=dict)  # by stream


class _Compiler:
    """Cuts a flow into stages (module doc): a keyed stage per entry (``key_by``, keyed
    input) holding the keyed steps after it, joins merging their sides' stages; a stateless
    stage per raw input that needs one."""

    def __init__(self, flow: Flow) -> None:
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
        for step in self.steps:  # keyed inputs first: a key_by of the same stream into their stage hops
            if step.kind == "input" and step.keyed:
                entries = self.stage_of[step.name].entries
                if step.args["stream"] in entries:  # (its records would have gone one way only)
                    raise TopologyError(f"dataflow {self.flow.name!r}: stream {step.args['stream']!r} is read twice, "
                                        "keyed as it comes, by one stage; read it once and branch from there")
                entries[step.args["stream"]] = _Entry(step.args["stream"], step.args["codec"], [], list(step.downs),
                                                      False)
        for step in self.steps:
            if step.kind == "key_by":
                self._enter(step)
        for step in self.steps:
            if step.kind in ("output", "sink") and not step.ups[0].keyed:
                self._raw_to_edge(step)
        return self._emit()

    # -- keyed stages

    def _assign(self, step: Step) -> None:
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

    def _enter(self, key_by: Step) -> None:
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

    def _raw_path(self, step: Step) -> tuple[Step, list[Step]]:
        """The raw input ``step`` hangs off, and the stateless steps from it to ``step``."""
        path: list[Step] = []
        while step.kind != "input":
            path.append(step)
            step = step.ups[0]
        return step, path[::-1]

    def _input_stage(self, inp: Step) -> _Stage:
        stage = self.input_stages.get(inp.name)
        if stage is None:
            stage = self.input_stages[inp.name] = _Stage(inp.name)
            stage.entries[inp.args["stream"]] = _Entry(inp.args["stream"], inp.args["codec"], [], list(inp.downs),
                                                       False)
        return stage

    def _raw_to_edge(self, edge: Step) -> None:
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
    def _fused_sink(stage: _Stage) -> Step | None:
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

        def nexts(downs: list[tuple[Step, int]]) -> list[list[Any]]:
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

