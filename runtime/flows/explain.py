"""What a :class:`~runtime.Dataflow` runs as, in words: ``flow.explain()`` and ``millstream
explain MODULE:ATTR`` (Spark's ``explain()``, Flink's execution plan).

It reads the :class:`~runtime.Topology` the flow compiles to (the computations and their
plans, runtime/flows/compile.py), so it says what will run, not what was meant: one
paragraph per stage, with the streams it reads and how they are keyed, the steps it runs
(fused: one commit per batch for all of them), and the streams it writes, a hop to another
stage among them. The rules behind the cut are in docs/dataflows.md, "What a flow compiles
to (fusion)".
"""

from __future__ import annotations

import json
from typing import Any

from runtime.flows import FLOW_CODE, FLOW_KEY, PLAN_PARAM, SINK_FLOW_CODE
from runtime.flows.compile import Step
from runtime.topology import ComputationSpec, Topology


def explain(topo: Topology, steps: list[Step]) -> str:
    """``topo`` (a flow's, compiled) in words; ``steps``: the flow's, in the order they were
    added (each stage lists its steps in it)."""
    rank = {s.name: i for i, s in enumerate(steps)}
    raw = {s.name for s in steps if s.kind == "input" and not s.keyed}  # their stages: stateless
    comps = list(topo.computations.values())
    writers = {out: c.name for c in comps for out in c.outputs}
    readers: dict[str, list[str]] = {}
    for c in comps:
        for stream in c.inputs:
            readers.setdefault(stream, []).append(c.name)
    first = comps[0] if comps else None
    hops = sum(1 for c in comps for s in c.inputs if s in writers)
    lines = [f"dataflow {topo.name!r}: {_count(len(comps), 'stage')}, {_count(hops, 'hop')} between them"
             + ("" if first is None else
                f"; each stage a computation of {first.key_ranges} key range{'s' * (first.key_ranges != 1)}, "
                f"{'exactly once' if first.exactly_once else 'at least once'}")]
    for c in comps:
        lines.append("")
        lines += _stage(c, rank, writers, readers, c.name in raw)
    lines += ["", "Each stage's records that its code fails on, after retries, go to <stage>.dead_letter."]
    return "\n".join(lines)


def _stage(c: ComputationSpec, rank: dict[str, int], writers: dict[str, str],
           readers: dict[str, list[str]], raw: bool) -> list[str]:
    if c.code not in (FLOW_CODE, SINK_FLOW_CODE):  # a sink the stage before could not take in
        return [f"stage {c.name!r}: the sink {c.code}, a computation of its own (the stage before it writes to "
                "more than one sink, and a tablet commits one sink's progress per batch)",
                *_rows([("reads", s, f"from stage {writers.get(s, '?')!r} (a hop)") for s in c.inputs])]
    plan = json.loads(c.params[PLAN_PARAM])
    rows = [("reads", stream, _entry(stream, entry, c, plan, writers, raw))
            for stream, entry in plan["entries"].items()]
    steps = sorted(plan["steps"].items(), key=lambda kv: rank.get(kv[0], len(rank)))
    ran = [(n, d) for n, d in steps if d["kind"] != "emit"]
    rows += [("runs", name, _step(doc)) for name, doc in ran]
    rows += [("writes", doc["stream"], _emit(doc, readers)) for _, doc in steps if doc["kind"] == "emit"]
    rows += [("writes", doc["late"], f"records too late for {name}") for name, doc in steps if "late" in doc]
    fused = [f"  fused: {len(ran)} steps in one tablet per key range, one commit per batch, no hop between them"]
    return [f"stage {c.name!r}:", *_rows(rows), *(fused if len(ran) > 1 else [])]


def _rows(rows: list[tuple[str, str, str]]) -> list[str]:
    """Rows of (what, stream or step, words) in columns, ``what`` said once per run of it."""
    width = max((len(r[1]) for r in rows), default=0)
    out, last = [], ""
    for what, name, words in rows:
        out.append(f"  {what if what != last else '':<6}  {name:<{width}}  {words}")
        last = what
    return out


def _entry(stream: str, entry: dict[str, Any], c: ComputationSpec, plan: dict[str, Any],
           writers: dict[str, str], raw: bool) -> str:
    if stream in writers:
        return f"from stage {writers[stream]!r}, keyed there (a hop)"
    if c.inputs.get(stream) == FLOW_KEY:
        key_step, fn = plan["keys"][stream]
        before = ", ".join(f"{kind} {f}" for kind, f in entry["prefix"])
        return (f"keyed by its producer with {key_step} ({fn})"
                + (f", after {before}, which run there and again here" if before else "")
                + f"; codec {entry['codec']}")
    if raw:
        return f"as sent, not keyed (a stateless stage of the input); codec {entry['codec']}"
    return f"keyed as sent (input keyed=True); codec {entry['codec']}"


def _emit(doc: dict[str, Any], readers: dict[str, list[str]]) -> str:
    to = readers.get(doc["stream"], [])
    if "key" in doc:
        return f"to stage {', '.join(map(repr, to)) or '?'}, keyed here by {doc['key']} (a hop)"
    if to and doc["codec"] == "flow":
        return f"to stage {', '.join(map(repr, to))} (a hop)"
    if to:
        return f"to the sink stage {', '.join(map(repr, to))} (a hop); codec {doc['codec']}"
    return f"an output; codec {doc['codec']}"


def _step(doc: dict[str, Any]) -> str:
    kind = doc["kind"]
    if kind in ("map", "filter", "flat_map", "reduce"):
        return f"{kind} {doc['fn']}"
    if kind == "process":
        return f"process {doc['cls']}"
    if kind == "window":
        return f"window {_windows(doc['windows'])}, {_aggregator(doc['agg'])}" + (
            ", emitting updates" if doc.get("emit") == "updates" else "")
    if kind == "interval_join":
        return f"interval_join from {_span(doc['lower'])} to {_span(doc['upper'])}"
    if kind == "lookup_join":
        return f"lookup_join ({doc['how']})"
    if kind == "join":
        return f"join {_windows(doc['windows'])}" if "windows" in doc else "join"
    if kind == "sink":
        return f"sink {doc['cls']}, written in this stage's commit (fused)"
    return kind


def _windows(doc: dict[str, Any]) -> str:
    kind = doc["kind"]
    text = {"tumbling": lambda: f"tumbling {_span(doc['size'])}",
            "sliding": lambda: f"sliding {_span(doc['size'])} every {_span(doc['period'])}",
            "session": lambda: f"session, gap {_span(doc['gap'])}"}.get(kind, lambda: kind)()
    return text + (f", lateness {_span(doc['lateness'])}" if doc.get("lateness") else "")


def _aggregator(doc: dict[str, Any]) -> str:
    return doc["builtin"] if "builtin" in doc else doc.get("class", "an aggregator")


def _span(us: int) -> str:
    """Microseconds as a person writes them: 1 s, 250 ms, -5 min."""
    sign, us = ("-", -us) if us < 0 else ("", us)
    for unit, size in (("h", 3_600_000_000), ("min", 60_000_000), ("s", 1_000_000), ("ms", 1_000)):
        if us and us % size == 0:
            return f"{sign}{us // size} {unit}"
    return f"{sign}{us} µs"


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'s' * (n != 1)}"
