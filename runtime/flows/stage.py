"""One stage of a :class:`~runtime.Dataflow`, run by the workers as one computation
(``runtime.flows.stage:FlowStage``): its plan (made by runtime/flows/compile.py, in the
computation's params) names the stage's entries (input streams, with the codec and the
stateless steps a record goes through on arrival) and its steps; the operators of
runtime/flows/ops.py, runtime/flows/steps.py, runtime/flows/windowing.py and
runtime/flows/joins.py run them.

The worker calls it as any computation: ``process_record`` per record (or
``process_batch`` with a batch of them, worker/batch.py), ``process_timer`` for the timers
its operators set. A call either returns, and its operators' changes are written into the
batch, or raises, and they are forgotten (the worker undoes the call's effects and retries,
then dead-letters, as for any user code).
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from runtime.codecs import Codec
from runtime.computation import Computation, Context
from runtime.errors import TopologyError
from runtime.flows import PLAN_PARAM, refs
from runtime.flows.joins import IntervalJoin, Join, LookupJoin
from runtime.flows.ops import TIMER_PREFIX, Emit, Filter, FlatMap, Item, Map, Op, Reduce
from runtime.flows.sinkstep import SinkStep
from runtime.flows.steps import RAW, Process, renamed
from runtime.flows.values import VALUES
from runtime.flows.windowing import EventTimeOp, FiringClock, Window
from runtime.imports import load
from runtime.record import Record
from runtime.sinks import Sink, call_restore
from runtime.state import TYPED, StateSpec, ValueState, declared, pick, split_cell
from runtime.topology import dead_letter_stream

log = logging.getLogger(__name__)


class _Entry:
    """How records of one input stream enter the stage."""

    def __init__(self, codec: Codec, prefix: list[tuple[str, Callable[[Any], Any]]], nexts: list[tuple[Op, int]]):
        self.decode = codec.decode
        self.prefix = prefix
        self.nexts = nexts

    def values(self, record: Record) -> Any:
        """The record's value after the stateless steps it went through on the producing
        side (``_SKIP`` if one of them filtered it: a record sent before a job update)."""
        value = self.decode(record.value)
        for kind, fn in self.prefix:
            if kind == "map":
                value = fn(value)
            elif not fn(value):
                return _SKIP
        return value


_SKIP = object()
_IDENTITY = refs.load_codec("bytes", load).decode


class FlowStage(Computation):
    """The computation of one stage of a flow (module doc)."""

    #: How the stage loads the code its plan names. The worker sets one that checks its code
    #: policy (``--allow-code``) before the stage is set up; in process (TestRun) anything loads.
    load_code: Callable[[str, str], Any] = staticmethod(lambda path, what: load(path, what))
    #: How often a fused sink tries a record, and who counts and logs its dead letters: the
    #: worker sets its own (its ``max_attempts``, its tablet's metric and log).
    max_attempts = 3
    on_dead_letter: Callable[[bytes, BaseException, int], None] | None = None

    def setup(self, params: Mapping[str, str]) -> None:
        super().setup(params)
        if PLAN_PARAM not in params:
            raise TopologyError("FlowStage runs a stage of a Dataflow; submit the flow (it writes the plan), "
                                "not this class")
        self.plan = plan = json.loads(params[PLAN_PARAM])
        self.stage = plan["stage"]
        self.ops: dict[str, Op] = {}
        for name, doc in plan["steps"].items():
            op = self.ops[name] = self._op(name, doc)
            if isinstance(op, EventTimeOp):  # a firing that raises: retried, dead-lettered one window at a time
                op.attempts, op.dead_letters, op.on_dead_letter = (self.max_attempts, dead_letter_stream(self.stage),
                                                                   self.on_dead_letter)
        clock = FiringClock()  # one for the stage: a step after a firing one judges lateness by it
        for name, doc in plan["steps"].items():
            self.ops[name].nexts = [(self.ops[n], side) for n, side in doc["next"]]
            op = self.ops[name]
            if isinstance(op, (EventTimeOp, Process)):
                op.clock = clock
        for op in self.ops.values():  # an event-time step (or timer) fires once those before it fired what was due
            if isinstance(op, (Window, Join)):  # (an interval join's firings only clean up)
                for after in _after(op):
                    if isinstance(after, (EventTimeOp, Process)):
                        after.upstream.append(op)
            if isinstance(op, Process):  # what its event-time timers make is judged by a step after it
                op.judged_after = any(isinstance(after, EventTimeOp) for after in _after(op))
        self.entries: dict[str, _Entry] = {}
        for stream, e in plan["entries"].items():
            prefix = [(kind, self._fn(path, f"{kind} of stream {stream!r}")) for kind, path in e["prefix"]]
            self.entries[stream] = _Entry(refs.load_codec(e["codec"], self.load_code), prefix,
                                          [(self.ops[n], side) for n, side in e["next"]])
        self._only = next(iter(self.entries.values())) if len(self.entries) == 1 else None
        # A lookup_join pairs a value with the table's value before it: its inputs' records are
        # taken in the order they came, a run of each at a time, not one input's then the other's.
        self._in_order = any(isinstance(op, LookupJoin) for op in self.ops.values())
        # A fused sink's finish hands it the call's records: last, once nothing else can fail.
        self._stateful = sorted((op for op in self.ops.values() if type(op).finish is not Op.finish
                                 or type(op).abort is not Op.abort or type(op).commit is not Op.commit),
                                key=lambda op: isinstance(op, SinkStep))

    def _fn(self, path: str, what: str) -> Any:
        fn = self.load_code(path, what)
        if not callable(fn):
            raise TopologyError(f"{what}: {path!r} is not callable")
        return fn

    def _op(self, name: str, doc: dict[str, Any]) -> Op:
        kind = doc["kind"]
        what = f"step {name!r} ({kind})"
        if kind == "map":
            return Map(name, self._fn(doc["fn"], what))
        if kind == "flat_map":
            return FlatMap(name, self._fn(doc["fn"], what))
        if kind == "filter":
            return Filter(name, self._fn(doc["fn"], what))
        if kind == "reduce":
            return Reduce(name, self._fn(doc["fn"], what))
        if kind == "emit":
            key = self._fn(doc["key"], what) if doc.get("key") else None
            return Emit(name, doc["stream"], refs.load_codec(doc["codec"], self.load_code), key)
        if kind == "window":
            return Window(name, refs.windows_of(doc["windows"]), refs.aggregator_of(doc["agg"], self.load_code),
                          doc["late"], doc.get("emit", "final"))
        if kind == "join":
            return Join(name, refs.windows_of(doc["windows"]), doc["late"])
        if kind == "lookup_join":
            return LookupJoin(name, doc["how"])
        if kind == "interval_join":
            return IntervalJoin(name, doc["lower"], doc["upper"], doc.get("late", ""))  # (plans before it had none)
        if kind in ("process", "sink"):
            base = Sink if kind == "sink" else Computation
            cls = self.load_code(doc["cls"], what)
            if not (isinstance(cls, type) and issubclass(cls, base)):
                raise TopologyError(f"{what}: {doc['cls']!r} is not a {base.__name__} subclass")
            comp = cls()
            comp.setup(doc.get("params", {}))
            if kind == "sink":
                return SinkStep(name, comp, refs.load_codec(doc["codec"], self.load_code),
                                dead_letter_stream(self.stage), self.max_attempts, self.on_dead_letter)
            return Process(name, comp)
        raise TopologyError(f"{what}: unknown kind of step in the plan of stage {self.stage!r}")

    # ------------------------------------------------------------------ calls

    def _entry(self, record: Record) -> _Entry:
        return self._only or self._entry_of(record.stream)

    def process_record(self, ctx: Context, record: Record) -> None:
        entry = self._entry(record)
        try:
            value = entry.values(record)
            if value is not _SKIP:
                items = [(record.key, value, record.timestamp)]
                for op, side in entry.nexts:
                    op.push(ctx, items, side)
        except BaseException:
            self._abort()
            raise
        self._finish(ctx)

    def process_batch(self, ctx: Context, records: Sequence[Record]) -> None:
        """Every record of a batch at once: each step runs over all of them (per key in
        arrival order), and stateful steps read and write each key's state once."""
        try:
            runs: list[tuple[_Entry, list[Item]]] = []
            by_entry: dict[int, tuple[_Entry, list[Item]]] = {}
            for record in records:
                entry = self._entry(record)
                value = entry.values(record)
                if value is _SKIP:
                    continue
                if self._in_order:
                    if not runs or runs[-1][0] is not entry:
                        runs.append((entry, []))
                    runs[-1][1].append((record.key, value, record.timestamp))
                else:
                    by_entry.setdefault(id(entry), (entry, []))[1].append((record.key, value, record.timestamp))
            for entry, items in runs or by_entry.values():
                for op, side in entry.nexts:
                    op.push(ctx, items, side)
        except BaseException:
            self._abort()
            raise
        self._finish(ctx)

    def process_columns(self, ctx: Context, keys: list[bytes], values: list[bytes], timestamps: list[int],
                        streams: str | list[str]) -> None:
        """:meth:`process_batch` of records given as columns (worker/batch.py): each entry's
        values decoded and taken through its stateless steps list by list."""
        try:
            if isinstance(streams, str) or self._only is not None:
                entry = self._only if self._only is not None else self._entry_of(streams)  # type: ignore[arg-type]
                self._enter(ctx, entry, keys, values, timestamps)
            else:
                by: dict[str, list[int]] = {}
                runs: list[tuple[str, list[int]]] = []
                for i, stream in enumerate(streams):
                    if not self._in_order:
                        by.setdefault(stream, []).append(i)
                    elif runs and runs[-1][0] == stream:
                        runs[-1][1].append(i)
                    else:
                        runs.append((stream, [i]))
                for stream, ix in runs or by.items():
                    self._enter(ctx, self._entry_of(stream), [keys[i] for i in ix], [values[i] for i in ix],
                                [timestamps[i] for i in ix])
        except BaseException:
            self._abort()
            raise
        self._finish(ctx)

    def _entry_of(self, stream: str) -> _Entry:
        entry = self.entries.get(stream)
        if entry is None:
            raise TopologyError(f"stage {self.stage!r} got a record of stream {stream!r}, which it does "
                                f"not read (it reads {sorted(self.entries)})")
        return entry

    @staticmethod
    def _enter(ctx: Context, entry: _Entry, keys: list[bytes], values: list[Any], timestamps: list[int]) -> None:
        if entry.decode is not _IDENTITY:
            values = list(map(entry.decode, values))
        for kind, fn in entry.prefix:
            if kind == "map":
                values = list(map(fn, values))
            else:
                keep = [i for i, v in enumerate(values) if fn(v)]
                if len(keep) < len(values):
                    keys, values, timestamps = ([keys[i] for i in keep], [values[i] for i in keep],
                                                [timestamps[i] for i in keep])
        items = list(zip(keys, values, timestamps, strict=True))
        if items:
            for op, side in entry.nexts:
                op.push(ctx, items, side)

    def process_timer(self, ctx: Context, tag: str, time: int) -> None:
        found = self._timer_of(tag)
        if found is not None:
            op, what = found
            self._fire(ctx, op.on_timer, op, what, time)

    def dead_letter_timer(self, ctx: Context, tag: str, time: int, error: BaseException) -> bool:
        """The worker gave up on this timer's call (worker/batch.py): an event-time step sends
        what the call took to the dead letters itself, each window with its result, and cleans
        up its state (:meth:`EventTimeOp.give_up`). False: the worker dead-letters the call."""
        found = self._timer_of(tag)
        if found is None:
            return False
        op, what = found
        if not isinstance(op, EventTimeOp) or not op.took:
            return False  # (a call that failed before the step took anything: the worker's)
        try:
            self._fire(ctx, functools.partial(op.give_up, error=error), op, what, time)
        finally:
            op.given_up()
        return True

    def _timer_of(self, tag: str) -> tuple[Op, str] | None:
        if not tag.startswith(TIMER_PREFIX):
            return None
        step, _, what = tag[len(TIMER_PREFIX):].partition("/")  # a step's name has no "/"; a user's tag may
        op = self.ops.get(step)
        return None if op is None else (op, what)  # None: a step an update removed (nothing to do)

    def _fire(self, ctx: Context, fire: Callable[[Context, str, int], None], op: Op, what: str, time: int) -> None:
        try:
            fire(ctx, what, time)
            self._finish(ctx)
        except BaseException as e:
            self._abort()
            op.timer_failed(e)
            raise
        op.timer_done()

    def _finish(self, ctx: Context) -> None:
        try:
            for op in self._stateful:
                op.finish(ctx)
        except BaseException:  # one refused what it wrote: the worker undoes the whole call
            self._abort()
            raise
        for op in self._stateful:  # all wrote: memory follows (a window's index of what is due)
            op.commit()

    def _abort(self) -> None:
        for op in self._stateful:
            op.abort()

    # ------------------------------------------------------------------ opening

    def recover_timers(self, scan: Callable[[bytes], Iterator[tuple[bytes, bytes]]]) -> list[tuple[bytes, str, int]]:
        """At open (worker/tablet.py), from the tablet's stored cells: the operators rebuild
        what they keep in memory, and name the timers they need; the tablet adds those it
        does not have (a split's half whose timers went with the other half's keys)."""
        names = {op.state_name: op for op in self.ops.values()}
        by_op: dict[str, list[tuple[bytes, bytes, bytes]]] = {}
        for skey, stored in scan(TYPED):
            key, name, rest = split_cell(skey)
            if name in names:
                by_op.setdefault(name, []).append((key, rest, stored))
        timers = []
        for name, cells in by_op.items():
            timers += names[name].recover(iter(cells))
        return timers


class SinkStage(FlowStage, Sink):
    """A stage that ends in its flow's ``sink``, fused (``runtime.flows.stage:SinkStage``;
    runtime/dataflow.py says when): the worker treats it as the sink it holds, calling the
    user's sink's :meth:`~runtime.Sink.restore` when the tablet opens and its
    :meth:`~runtime.Sink.prepare_commit` before each commit, so the sink's meta commits in
    the stage's batch."""

    def setup(self, params: Mapping[str, str]) -> None:
        super().setup(params)
        sinks = [op for op in self.ops.values() if isinstance(op, SinkStep)]
        if len(sinks) != 1:
            raise TopologyError(f"stage {self.stage!r} runs as a sink but its plan has {len(sinks)} sink steps")
        self._sink = self.fused_sink = sinks[0].comp  # (its committed(): runtime.sinks.committed_hook)

    def restore(self, tablet: str, meta: bytes | None, token: int, absorbed: Sequence[bytes],
                uncommitted: Mapping[str, int] | None = None) -> None:
        call_restore(self._sink.restore, tablet, meta, token, absorbed, uncommitted)  # type: ignore[attr-defined]

    def prepare_commit(self) -> bytes | None:
        return self._sink.prepare_commit()  # type: ignore[attr-defined,no-any-return]


def _after(op: Op) -> list[Op]:
    """Every step after ``op`` in its stage."""
    seen: dict[int, Op] = {}
    todo = [n for n, _ in op.nexts]
    while todo:
        n = todo.pop()
        if id(n) not in seen:
            seen[id(n)] = n
            todo += [m for m, _ in n.nexts]
    return list(seen.values())


def readable_states(comp: object, params: Mapping[str, str] | None = None,
                    load_code: Callable[[str, str], Any] = load) -> dict[str, StateSpec]:
    """The typed states ``millstream state get --state``, Spark's ``read_state`` and
    ``TestRun.typed_state`` name on a computation (one set up, or its class with its
    ``params``), by the names they take: those its class declares; in a flow's stage, its
    steps' state: a ``reduce`` step's running value by the step's name, a ``process`` or
    ``sink`` step's ``ctx.state`` by its name, and each typed state its class declares as
    ``<step>/<state>``. Read from the plan: only those classes are imported, none is made."""
    cls = comp if isinstance(comp, type) else type(comp)
    if not issubclass(cls, FlowStage):
        return declared(cls)
    plan = json.loads(params[PLAN_PARAM]) if isinstance(comp, type) else comp.plan  # type: ignore[index,attr-defined]
    specs: dict[str, StateSpec] = {}
    for name, doc in plan["steps"].items():
        state_name = f"{TIMER_PREFIX}{name}"
        if doc["kind"] in ("reduce", "lookup_join"):
            specs[name] = ValueState(state_name, VALUES)
        elif doc["kind"] in ("process", "sink"):
            specs[name] = ValueState(f"{state_name}/state", RAW)
            for spec in declared(load_code(doc["cls"], f"step {name!r}")).values():
                specs[f"{name}/{spec.name}"] = renamed(spec, state_name)
    return specs


def state_names(comp: object) -> list[str]:
    """The names :func:`readable_states` gives ``comp`` (set up), sorted; none if its plan's
    classes cannot be loaded now (a plain ``state get`` reads ``ctx.state`` all the same)."""
    try:
        return sorted(readable_states(comp, load_code=getattr(comp, "load_code", load)))
    except Exception:  # (set up, they were loaded: not expected; the names are only a hint)
        log.warning("cannot list the typed states of %s", type(comp).__name__, exc_info=True)
        return []


def readable_spec(comp: object, name: str) -> StateSpec:
    """The spec :func:`readable_states` names ``name`` on ``comp`` (set up); a
    :class:`~runtime.errors.ConfigError` naming them all when none is."""
    flow = isinstance(comp, FlowStage)
    owner = f"the flow's stage {comp.stage!r}" if flow else f"computation class {type(comp).__name__}"  # type: ignore[attr-defined]
    return pick(readable_states(comp), name, owner, " (a step's name, or <process step>/<typed state>)" if flow else
                ", or leave out --state to read ctx.state")
