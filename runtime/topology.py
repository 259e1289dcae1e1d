"""Topologies: named computations wired together by named streams."""

from __future__ import annotations

import base64
import datetime
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from runtime.errors import TopologyError
from runtime.imports import check_syntax, path_of

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")
DEAD_LETTER_SUFFIX = ".dead_letter"
MAX_KEY_RANGES = 1024
DEFAULT_KEY_RANGES = 4
Productions = Literal["strong", "weak"]
LateRecords = Literal["process", "drop"]
PRODUCTIONS: tuple[Productions, ...] = ("strong", "weak")
LATE_RECORDS: tuple[LateRecords, ...] = ("process", "drop")


def dead_letter_stream(computation: str) -> str:
    """The stream that receives ``computation``'s poison records."""
    return computation + DEAD_LETTER_SUFFIX


def dead_letter(error: BaseException, computation: str, value: bytes, *, stream: str | None = None,
                producer: str | None = None) -> bytes:
    """The value of the dead letter of a record ``value`` that ``computation`` failed on with
    ``error``: JSON ``{"error", "computation", "value"}`` (the value base64), with the
    ``stream`` it came on and its ``producer`` where the record failed before it reached the
    computation (its key extractor, where it was sent). Never raises, even for an exception
    whose ``str()`` does."""
    try:
        said = f"{type(error).__name__}: {error}"
    except BaseException:  # user code's exception: its __str__ may raise too
        said = f"{type(error).__name__} (its message could not be shown)"
    try:
        shown = base64.b64encode(value).decode()
    except BaseException:  # not bytes (a user codec's encode returned something else): its repr
        shown = base64.b64encode(repr(value).encode(errors="replace")).decode()
    doc = {"error": said, "computation": computation}
    if stream is not None:
        doc["stream"] = stream
    if producer is not None:
        doc["producer"] = producer
    doc["value"] = shown
    return json.dumps(doc).encode()


LATE_SUFFIX = ".late"


def late_stream(computation: str) -> str:
    """The stream that receives ``computation``'s records that came after their event-time
    windows fired (runtime/windows.py)."""
    return computation + LATE_SUFFIX


MAX_REPLICATION = 7

# Params under this prefix are reserved: the runtime's own options (fsync, dedup_retention,
# replication) are typed fields of the computation, sent to workers as such (runtime/engine.py),
# and a user's params named like them would only mislead (review N7).
RESERVED_PARAM_PREFIX = "millstream."


@dataclass(frozen=True)
class ComputationSpec:
    """One computation of a topology, as validated and stored by the master."""

    name: str
    code: str
    inputs: dict[str, str | None]
    outputs: list[str]
    key_ranges: int = DEFAULT_KEY_RANGES
    exactly_once: bool = True
    productions: Productions = "strong"
    late_records: LateRecords = "process"
    params: dict[str, str] = field(default_factory=dict)
    fsync: bool | None = None  # None: on for exactly-once computations
    dedup_retention: float | None = None  # seconds opaque ids are kept; None: 600 (worker/tablet.py)
    replication: int | None = None  # copies of each tablet; None: the master's --replication
    rebalance: bool | None = None  # split hot ranges, merge cold ones; None: the master's --rebalance

    @property
    def sync_commits(self) -> bool:
        return self.exactly_once if self.fsync is None else self.fsync

    @property
    def all_outputs(self) -> list[str]:
        return [*self.outputs, dead_letter_stream(self.name), late_stream(self.name)]


def _check_name(kind: str, name: object) -> None:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise TopologyError(
            f"{kind} name {name!r} is invalid; use 1-128 letters, digits, '_', '-' or '.', "
            "not starting with '-' or '.'"
        )


def check_productions(cls: type, productions: str, name: str) -> None:
    """Refuse weak productions for a class whose timer calls do not make the same records when
    they run again (``repeatable_timers = False``: a ``WindowedComputation`` fires a due time's
    windows in slices of wall-clock time). A weak production's id is made from the call's input
    and its place in the call: on a re-run it would name another window's result."""
    if productions == "weak" and not getattr(cls, "repeatable_timers", True):
        raise TopologyError(
            f"computation {name!r}: {cls.__name__} cannot take productions='weak': its timer calls do not "
            "make the same records when they run again, which weak productions need for exactly once; "
            "use productions='strong' (the default)")


def validate_spec(spec: ComputationSpec) -> None:
    """Check one computation's fields; raise :class:`TopologyError` on the first problem."""
    _check_name("computation", spec.name)
    if spec.name.endswith(DEAD_LETTER_SUFFIX):
        raise TopologyError(f"computation name {spec.name!r} may not end in {DEAD_LETTER_SUFFIX!r}")
    check_syntax(spec.code, f"computation {spec.name!r}: code")
    if not isinstance(spec.inputs, dict) or not spec.inputs:
        raise TopologyError(
            f"computation {spec.name!r} has no inputs; pass inputs={{'stream': None}} "
            "(a stream name mapped to a key extractor path, or None for record.key)"
        )
    for stream, extractor in spec.inputs.items():
        _check_name(f"computation {spec.name!r}: input stream", stream)
        if extractor is not None:
            check_syntax(extractor, f"computation {spec.name!r}: key extractor for {stream!r}")
    if isinstance(spec.outputs, str) or not isinstance(spec.outputs, list):
        raise TopologyError(
            f"computation {spec.name!r}: outputs must be a list of stream names, "
            f"got {spec.outputs!r}"
        )
    if len(set(spec.outputs)) != len(spec.outputs):
        raise TopologyError(f"computation {spec.name!r} lists an output stream twice: {spec.outputs}")
    for stream in spec.outputs:
        _check_name(f"computation {spec.name!r}: output stream", stream)
        if stream.endswith(DEAD_LETTER_SUFFIX):
            raise TopologyError(
                f"computation {spec.name!r}: output {stream!r} is a dead-letter stream; "
                "only the runtime writes those"
            )
    if isinstance(spec.key_ranges, bool) or not isinstance(spec.key_ranges, int) or not (
        1 <= spec.key_ranges <= MAX_KEY_RANGES
    ):
        raise TopologyError(
            f"computation {spec.name!r}: key_ranges={spec.key_ranges!r} is invalid; "
            f"use a whole number from 1 to {MAX_KEY_RANGES}"
        )
    if not isinstance(spec.exactly_once, bool):
        raise TopologyError(
            f"computation {spec.name!r}: exactly_once={spec.exactly_once!r} must be True or False"
        )
    if spec.productions not in PRODUCTIONS:
        raise TopologyError(
            f"computation {spec.name!r}: productions={spec.productions!r} is invalid; "
            "use 'strong' or 'weak'"
        )
    if spec.late_records not in LATE_RECORDS:
        raise TopologyError(
            f"computation {spec.name!r}: late_records={spec.late_records!r} is invalid; "
            "use 'process' or 'drop'"
        )
    if spec.fsync is not None and not isinstance(spec.fsync, bool):
        raise TopologyError(f"computation {spec.name!r}: fsync={spec.fsync!r} must be True, False or None")
    r = spec.dedup_retention
    if r is not None and (isinstance(r, bool) or not isinstance(r, (int, float)) or not 1 <= r <= 10 * 365 * 86400):
        raise TopologyError(
            f"computation {spec.name!r}: dedup_retention={r!r} must be a number of seconds from 1 "
            "to ten years (or a datetime.timedelta), e.g. dedup_retention=3600 to keep opaque "
            "record ids for an hour")
    n = spec.replication
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_REPLICATION):
        raise TopologyError(
            f"computation {spec.name!r}: replication={n!r} must be a whole number of copies from 1 "
            f"to {MAX_REPLICATION} (1: no replica; the master's --replication when left out)")
    if spec.rebalance is not None and not isinstance(spec.rebalance, bool):
        raise TopologyError(f"computation {spec.name!r}: rebalance={spec.rebalance!r} must be True, False or "
                            "None (None: the master's --rebalance)")
    if not isinstance(spec.params, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in spec.params.items()
    ):
        raise TopologyError(f"computation {spec.name!r}: params must map strings to strings")
    reserved = sorted(k for k in spec.params if k.startswith(RESERVED_PARAM_PREFIX))
    if reserved:
        raise TopologyError(
            f"computation {spec.name!r}: params {reserved} use the prefix {RESERVED_PARAM_PREFIX!r}, which is "
            "reserved for the runtime's own options; rename them, and set durability and dedup with "
            "add_computation's fsync=, dedup_retention= and replication= arguments instead")


def find_cycle(specs: Iterable[ComputationSpec]) -> list[str] | None:
    """A cycle of computation names through streams, or ``None`` if the graph is acyclic."""
    specs = list(specs)
    readers: dict[str, list[str]] = {}
    for s in specs:
        for stream in s.inputs:
            readers.setdefault(stream, []).append(s.name)
    edges = {s.name: sorted({r for out in s.all_outputs for r in readers.get(out, [])}) for s in specs}
    done: set[str] = set()
    for root in sorted(edges):
        if root in done:
            continue
        path = [root]
        on_path = {root}
        stack = [iter(edges[root])]
        while stack:  # iterative depth-first search: long chains must not hit the recursion limit
            nxt = next(stack[-1], None)
            if nxt is None:
                stack.pop()
                node = path.pop()
                on_path.discard(node)
                done.add(node)
                continue
            if nxt in on_path:
                return path[path.index(nxt):] + [nxt]
            if nxt not in done:
                path.append(nxt)
                on_path.add(nxt)
                stack.append(iter(edges.get(nxt, [])))
    return None


def validate_against(new: Iterable[ComputationSpec], existing: Iterable[ComputationSpec]) -> None:
    """Check a topology's computations together with those already running."""
    new = list(new)
    existing = list(existing)
    taken = {s.name for s in existing}
    for s in new:
        if s.name in taken:
            raise TopologyError(
                f"computation name {s.name!r} is already used by a running topology; "
                "computation names are cluster-wide, pick another"
            )
    cycle = find_cycle([*existing, *new])
    if cycle:
        raise TopologyError(
            "the topology has a cycle: " + " -> ".join(cycle)
            + "; streams must flow one way (break the loop with a new stream name)"
        )


class Topology:
    """A named set of computations, submitted to the master as a whole.

    >>> topo = Topology("wordcount")
    >>> topo.add_computation("counter", "my_pkg.jobs:Counter",
    ...                      inputs={"words": None}, outputs=["counts"])
    """

    def __init__(self, name: str) -> None:
        _check_name("topology", name)
        self.name = name
        self.computations: dict[str, ComputationSpec] = {}

    def add_computation(
        self,
        name: str,
        code: str | type,
        *,
        inputs: Mapping[str, str | Callable[..., Any] | None],
        outputs: Iterable[str] = (),
        key_ranges: int = DEFAULT_KEY_RANGES,
        exactly_once: bool = True,
        productions: Productions = "strong",
        late_records: LateRecords = "process",
        params: Mapping[str, str] | None = None,
        fsync: bool | None = None,
        dedup_retention: float | datetime.timedelta | None = None,
        replication: int | None = None,
        rebalance: bool | None = None,
    ) -> Topology:
        """Add a computation; returns the topology so calls can be chained.

        ``code`` is the computation's class, or its ``module:Class`` import path; key
        extractors are ``module:attr`` paths (or module-level functions). Workers import both
        by path (and producers and injectors the key extractors): define them at module level.
        ``inputs`` maps each input stream to a key extractor path, or ``None``
        to key by ``record.key``. ``params`` are strings handed to
        :meth:`Computation.setup`. ``fsync`` defaults to ``exactly_once``.
        ``dedup_retention`` (seconds or a ``timedelta``; default ten minutes) is how long
        opaque record ids are kept for dedup (docs/exactly-once.md); sequenced ids (the
        default injector's, files', Spark's without an id column, tablets') need none.
        ``replication`` is how many copies of each tablet are kept on different workers
        (docs/replication.md); it defaults to the master's ``--replication`` (2).
        ``rebalance`` lets the master split this computation's hot key ranges and merge cold
        ones while it runs (docs/rescaling.md); it defaults to the master's ``--rebalance``.
        """
        if name in self.computations:
            raise TopologyError(
                f"topology {self.name!r} already has a computation named {name!r}; "
                "each computation needs its own name"
            )
        if isinstance(outputs, str):
            raise TopologyError(
                f"computation {name!r}: outputs={outputs!r} is a string; pass a list, "
                f"e.g. outputs=[{outputs!r}]"
            )
        if not isinstance(inputs, Mapping):
            raise TopologyError(
                f"computation {name!r}: inputs={inputs!r} must be a dict of stream name -> "
                "key extractor path or None"
            )
        if isinstance(code, type):
            check_productions(code, productions, name)
        code = path_of(code, f"computation {name!r}: code")
        paths = {stream: (ex if ex is None else path_of(ex, f"computation {name!r}: key extractor for {stream!r}"))
                 for stream, ex in inputs.items()}
        spec = ComputationSpec(
            name=name, code=code, inputs=paths, outputs=list(outputs),
            key_ranges=key_ranges, exactly_once=exactly_once, productions=productions,
            late_records=late_records, params=dict(params or {}), fsync=fsync,
            dedup_retention=(dedup_retention.total_seconds()
                             if isinstance(dedup_retention, datetime.timedelta) else dedup_retention),
            replication=replication, rebalance=rebalance,
        )
        validate_spec(spec)
        self.computations[name] = spec
        cycle = find_cycle(self.computations.values())
        if cycle:
            del self.computations[name]
            raise TopologyError(
                "adding computation " + repr(name) + " makes a cycle: " + " -> ".join(cycle)
                + "; streams must flow one way"
            )
        return self

    def without(self, *names: str) -> Topology:
        """A copy of this topology without the computations ``names``; this one is unchanged.
        For a test that reads a stream from the run instead of from its sink::

            TestRun(wordcount.topology("/unused").without("counts_sink"))

        What the removed computations read stays produced; what they produced, nothing
        produces any more (an input, as far as the rest is concerned)."""
        unknown = [n for n in names if n not in self.computations]
        if unknown:
            raise TopologyError(f"without({', '.join(map(repr, unknown))}): no such computation in "
                                f"topology {self.name!r}; its computations are {sorted(self.computations)}")
        copy = Topology(self.name)
        copy.computations = {n: s for n, s in self.computations.items() if n not in names}
        return copy

    def validate(self) -> None:
        """Check the whole topology; raises :class:`TopologyError`."""
        if not self.computations:
            raise TopologyError(f"topology {self.name!r} has no computations; add one first")
        for spec in self.computations.values():
            validate_spec(spec)
        cycle = find_cycle(self.computations.values())
        if cycle:
            raise TopologyError("the topology has a cycle: " + " -> ".join(cycle))

    def to_json(self) -> str:
        return json.dumps(
            {"name": self.name, "computations": [asdict(s) for s in self.computations.values()]},
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str, stored: bool = False) -> Topology:
        """Parse and validate a topology sent over the wire. ``stored``: a document the master
        accepted earlier (in etcd), which may hold params under the now reserved prefix: they
        are dropped (they never reach a worker) rather than refused."""
        try:
            doc = json.loads(text)
            topo = cls(doc["name"])
            for c in doc["computations"]:
                if not isinstance(c, dict):
                    raise TopologyError(f"malformed topology document: computation {c!r} is not an object")
                if stored and isinstance(c.get("params"), dict):
                    c["params"] = {k: v for k, v in c["params"].items()
                                   if not (isinstance(k, str) and k.startswith(RESERVED_PARAM_PREFIX))}
                unknown = set(c) - set(ComputationSpec.__dataclass_fields__)
                if unknown:
                    raise TopologyError(f"unknown computation fields {sorted(unknown)}")
                name, code = c.pop("name"), c.pop("code")
                topo.add_computation(name, code, **c)
        except (KeyError, TypeError, ValueError) as e:
            raise TopologyError(f"malformed topology document: {e!r}") from None
        topo.validate()
        return topo

    def __repr__(self) -> str:
        return f"Topology({self.name!r}, computations={list(self.computations)})"
