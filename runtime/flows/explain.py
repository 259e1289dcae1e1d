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
    comps = {c.name: c for c in topo.computations.values()}
    writers = {out: c.name for c in comps.values() for out in c.outputs}
    readers: dict[str, list[str]] = {}
    for c in comps.values():
        for stream in c.inputs:
            readers.setdefault(stream, []).append(c.name)
    stages = [c for c in comps.values() if c.code in (FLOW_CODE, SINK_FLOW_CODE)]
    sinks = len(comps) - len(stages)
    hops = sum(1 for c in comps.values() for s in c.inputs if s in writers)
    first = next(iter(comps.values()), None)
    lines = [f"dataflow {topo.name!r}: {_count(len(stages), 'stage')}"
             + (f" and {_count(sinks, 'sink computation')}" if sinks else "")
             + f", {_count(hops, 'hop')} between them"
             + ("" if first is None else
                f"; each a computation of {_count(first.key_ranges, 'key range')}, "
                f"{'exactly once' if first.exactly_once else 'at least once'}")]
    for c in comps.values():
        lines.append("")
        lines += _stage(c, rank, comps, writers, readers, c.name in raw)
    lines += ["", "Records a stage's code fails on go to <stage>.dead_letter after its retries; a key extractor's "
                  "(the steps before a key_by) at once."]
    return "\n".join(lines)


def _stage(c: ComputationSpec, rank: dict[str, int], comps: dict[str, ComputationSpec], writers: dict[str, str],
           readers: dict[str, list[str]], raw: bool) -> list[str]:
    if c.code not in (FLOW_CODE, SINK_FLOW_CODE):  # a sink the stage before could not take in
        return [f"sink computation {c.name!r}: {c.code}, on its own (the stage before it writes to more than one "
                "sink, and a tablet commits one sink's progress per batch)",
                *_rows([("reads", s, f"from stage {writers.get(s, '?')!r} (a hop)") for s in c.inputs])]
    plan = json.loads(c.params[PLAN_PARAM])
    ups: dict[str, list[tuple[int, str]]] = {}  # what feeds each step of the plan: (side, stream or step)
    for source, doc in [*plan["entries"].items(), *plan["steps"].items()]:
        for name, side in doc["next"]:
            ups.setdefault(name, []).append((side, source))
    # (a join's left side first: the plan's entries are in name order)
    entries = sorted(plan["entries"].items(), key=lambda kv: min((side for _, side in kv[1]["next"]), default=0))
    rows = [("reads", stream, _entry(stream, entry, c, plan, writers, raw)) for stream, entry in entries]
    steps = sorted(plan["steps"].items(), key=lambda kv: rank.get(kv[0], len(rank)))
    ran = [(n, d) for n, d in steps if d["kind"] != "emit"]
    last = entries[0][0] if len(entries) == 1 else None
    for name, doc in ran:
        rows.append(("runs", name, _step(doc) + _after(doc["kind"], sorted(ups.get(name, [])), last)))
        last = name
    for name, doc in steps:
        if doc["kind"] == "emit":
            rows.append(("writes", doc["stream"], _emit(doc, comps, readers) + _after("emit", ups.get(name, []), last)))
    rows += [("writes", doc["late"], f"records too late for {name}") for name, doc in steps if "late" in doc]
    fused = [f"  fused: {len(ran)} steps in one tablet per key range, one commit per batch, no hop between them"]
    return [f"stage {c.name!r}:", *_rows(rows), *(fused if len(ran) > 1 else [])]


def _after(kind: str, ups: list[tuple[int, str]], last: str | None) -> str:
    """Where a row's records come from, when it is not the row before: the steps of a stage
    are a graph (branches, two sides of a join), printed as a list."""
    if len(ups) == 2:
        left, right = (u for _, u in sorted(ups))
        return f" (stream {left}, table {right})" if kind == "lookup_join" else f" (left {left}, right {right})"
    froms = [u for _, u in ups if u != last]
    return f" (from {', '.join(froms)})" if froms else ""


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
    made = f", written by stage {writers[stream]!r}" if stream in writers else ""
    if c.inputs.get(stream) == FLOW_KEY:
        key_step, fn = plan["keys"][stream]
        before = ", ".join(f"{kind} {f}" for kind, f in entry["prefix"])
        return (f"keyed by its producer with {key_step} ({fn})"
                + (f", after {before}, which run there and again here" if before else "")
                + f"{made}; codec {entry['codec']}")
    if stream in writers:
        return f"from stage {writers[stream]!r}, keyed there (a hop)"
    if raw:
        return f"by the records' own keys, as sent (no key_by: a stateless stage); codec {entry['codec']}"
    return f"keyed as sent (input keyed=True); codec {entry['codec']}"


def _emit(doc: dict[str, Any], comps: dict[str, ComputationSpec], readers: dict[str, list[str]]) -> str:
    to = readers.get(doc["stream"], [])
    names = ", ".join(map(repr, to))
    if "key" in doc:
        return f"to stage {names or '?'}, keyed here by {doc['key']} (a hop)"
    if to and doc["codec"] == "flow":
        return f"to stage {names} (a hop)"
    if to and all(comps[r].code not in (FLOW_CODE, SINK_FLOW_CODE) for r in to):
        return f"to the sink computation {names} (a hop); codec {doc['codec']}"
    return f"an output; codec {doc['codec']}" + (f"; read again by stage {names}" if to else "")


def _step(doc: dict[str, Any]) -> str:
    kind = doc["kind"]
    if kind in ("map", "filter", "flat_map", "reduce"):
        return f"{kind} {doc['fn']}"
    if kind == "process":
        return f"process {doc['cls']}"
    if kind == "window":
        return f"window {_windows(doc['windows'])}, {_aggregator(doc['agg'])}" + (
            ", each update emitted, then the final result" if doc.get("emit") == "updates" else "")
    if kind == "interval_join":
        return f"interval_join, right - left within [{_span(doc['lower'])}, {_span(doc['upper'])}]"
    if kind == "lookup_join":
        return f"lookup_join, how={doc['how']}"
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
