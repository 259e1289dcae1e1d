"""Issue 30's figures in the report: W2 on a flow next to the classic W2, Spark, Flink and
Bytewax from the same run (rec/s, records per CPU-second, exactness, load average, and the
ratio of W2 on a flow to each), the window-firing stall of the flow's window step, W1 on flows
(three fused stages against one), and the issue's targets as verdicts.

Pure functions of the report document (:mod:`bench.report` renders them).
"""

from __future__ import annotations

import os
from typing import Any

# Issue 30's targets: ratios within one run on this machine.
W2_FLOW_OVER_SPARK = 1.0       # W2 on flows ≥ Spark Structured Streaming's
W2_FLOW_OVER_BYTEWAX = 2.0     # W2 on flows ≥ 2× Bytewax with recovery off (its faster configuration)
W1_FUSED_P50_OVER_ONE = 1.5    # W1 three fused stages p50 within 1.5× of one stage's, at 10,000 rec/s
STALL_MS = 20.0                # no tablet stalled more than 20 ms by window firings
W1_RATE = 10_000
FLOW_ROW = "millstream, W2 on a flow"


def _load(x: Any) -> float | None:
    load = x[0] if isinstance(x, list | tuple) and x else None
    return None if load is None else float(load)


def w2_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per W2 run of this report: who, how, rec/s, records per CPU-s, exact, the
    1-minute load average when it started. Runs that did not happen are left out; runs that
    failed keep their error."""
    rows: list[dict[str, Any]] = []

    def add(system: str, how: str, run: dict[str, Any] | None, load: Any = None) -> None:
        if not run:
            return
        cpu = run.get("cpu") or {}
        rows.append({"system": system, "how": how, "rps": run.get("throughput_rps"),
                     "per_cpu_s": run.get("records_per_cpu_s"), "exact": run.get("oracle_equal"),
                     "load": _load(load if load is not None else cpu.get("loadavg_start")),
                     "stolen": cpu.get("stolen_cpu_s"), "wall": cpu.get("wall_s"),
                     "error": run.get("error") or (None if run.get("available", True) else run.get("why"))})

    flow, classic = r.get("w2_flow"), r.get("w2")
    add(FLOW_ROW, (flow or {}).get("sender", ""), flow)
    add("millstream, classic W2", "three computations, " + (classic or {}).get("sender", ""), classic)
    sp = r.get("spark") or {}
    # A peer that could not start gets a row with its error (not silently no row).
    add("Spark Structured Streaming", (sp.get("config") or {}).get("w2", ""),
        sp.get("w2") or ({"error": sp["error"]} if sp.get("error") else None), sp.get("loadavg_start"))
    fl = r.get("flink") or {}
    add("Flink", "Flink SQL, rec/s over the job's net runtime",
        fl.get("w2") or ({"error": fl["error"]} if fl.get("error") else None), fl.get("loadavg_start"))
    bw = r.get("bytewax") or {}
    for run in bw.get("runs", []):
        add(bytewax_row(run), (bw.get("config") or {}).get("w2", ""), run)
    return rows


def bytewax_row(run: dict[str, Any]) -> str:
    """A Bytewax run's row: its recovery, and its processes when more than one."""
    n = run.get("processes") or 1
    return f"Bytewax, recovery {run.get('recovery')}" + (f", {n} processes" if n > 1 else "")


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def _peer_rps(r: dict[str, Any], which: str) -> tuple[float | None, bool]:
    """(rec/s, exact) of Spark's W2, or of Bytewax's fastest with recovery off (of one worker
    and one per core: an exact run before one that is not), from this report."""
    if which == "spark":
        run = (r.get("spark") or {}).get("w2") or {}
    else:
        off = [x for x in (r.get("bytewax") or {}).get("runs", []) if x.get("recovery") == "off"]
        run = max(off, key=lambda x: (bool(x.get("oracle_equal")), x.get("throughput_rps") or 0), default={})
    return run.get("throughput_rps"), bool(run.get("oracle_equal"))


def _w1_p50(r: dict[str, Any], variant: str) -> float | None:
    x = next((x for x in r.get("w1") or [] if x["variant"] == variant and x["rate"] == W1_RATE), None)
    return ((x or {}).get("latency_ms") or {}).get("p50")


def worst_stall(r: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The window step of W2 on a flow with the slowest firing (by its max bucket), or None."""
    steps = ((r.get("w2_flow") or {}).get("window_fire") or {}).get("steps") or {}
    if not steps:
        return None

    def key(kv: tuple[str, dict[str, Any]]) -> float:
        m = kv[1].get("max_le_ms")
        return float("inf") if m is None and kv[1].get("firings") else (m or 0.0)

    return max(steps.items(), key=key)


def targets(r: dict[str, Any]) -> list[tuple[str, bool | None, str]]:
    """Issue 30's targets: (name, met or None when not run, what was measured)."""
    out: list[tuple[str, bool | None, str]] = []
    flow = r.get("w2_flow") or {}
    mine, exact = flow.get("throughput_rps"), bool(flow.get("oracle_equal"))
    for which, label, factor in (("spark", "Spark's W2", W2_FLOW_OVER_SPARK),
                                 ("bytewax", "Bytewax's fastest (recovery off)", W2_FLOW_OVER_BYTEWAX)):
        name = f"W2 on a flow ≥ {'' if factor == 1 else f'{factor:g}× '}{label}, same run"
        theirs, their_exact = _peer_rps(r, which)
        if not mine or not theirs:
            out.append((name, None, "not run" if not theirs else "W2 on a flow not run"))
            continue
        x = mine / theirs
        out.append((name, x >= factor and exact and their_exact,
                    f"{mine:,} against {theirs:,} rec/s: {x:.2f}×"
                    + ("" if exact else ", W2 on a flow NOT exact") + ("" if their_exact else ", peer NOT exact")))
    one, three = _w1_p50(r, "flow-1-stage"), _w1_p50(r, "flow-3-stages")
    name = f"W1 on a flow, 3 fused stages p50 ≤ {W1_FUSED_P50_OVER_ONE:g}× 1 stage's ({W1_RATE:,} rec/s)"
    if one is None or three is None:
        out.append((name, None, "not run"))
    else:
        x = three / one if one else float("inf")
        out.append((name, x <= W1_FUSED_P50_OVER_ONE, f"{three:.2f} against {one:.2f} ms: {x:.2f}×"))
    worst = worst_stall(r)
    name = f"no tablet stalled > {STALL_MS:g} ms by window firings (W2 on a flow)"
    if worst is None:
        out.append((name, None, "no window firings measured"))
    else:
        step, s = worst
        mx = s.get("max_le_ms")
        text = (f"{step}: {s.get('firings', 0):,} firings, p99 ≤ {s.get('p99_le_ms')} ms, slowest "
                + (f"≤ {mx} ms" if mx is not None else f"> {s.get('last_bound_ms')} ms")
                + f", {s.get('over_limit', 0):,} over {STALL_MS:g} ms")
        c = ((((r.get("w2_flow") or {}).get("window_fire") or {}).get("cpu_steps") or {}).get(step)) or {}
        if c:  # the firings' own work: how much of the wall time was the firing
            cmx = c.get("max_le_ms")
            text += (" (their CPU: slowest " + (f"≤ {cmx} ms" if cmx is not None else f"> {c.get('last_bound_ms')} ms")
                     + f", {c.get('over_limit', 0):,} over {STALL_MS:g} ms)")
        out.append((name, mx is not None and mx <= STALL_MS, text))
    return out


def _stall_row(what: str, s: dict[str, Any]) -> str:
    mx = s.get("max_le_ms")
    slowest = f"{mx} ms" if mx is not None else f"> {s.get('last_bound_ms')} ms"
    return (f"| {what} | {s['firings']:,} | {s.get('p50_le_ms')} ms | {s.get('p99_le_ms')} ms | "
            f"{slowest} | {s.get('over_limit', 0):,} |")


def _stolen(row: dict[str, Any]) -> str:
    """``"3.1 s (4 %)"``: stolen CPU-seconds and their share of the run's cores (– if unknown)."""
    stolen, wall = row.get("stolen"), row.get("wall")
    if stolen is None:
        return "–"
    share = f" ({stolen / (wall * (os.cpu_count() or 1)) * 100:.0f} %)" if wall else ""
    return f"{stolen:g} s{share}"


def _num(v: Any) -> str:
    return "–" if v is None else f"{v:,}"


def markdown_lines(r: dict[str, Any]) -> list[str]:
    """The report's "W2 on flows, side by side" section (empty when W2 on a flow did not run
    and no Bytewax run happened)."""
    rows = w2_rows(r)
    if not r.get("w2_flow") and not r.get("bytewax"):
        return []
    mine = (r.get("w2_flow") or {}).get("throughput_rps")
    lines = ["## W2 on flows, side by side (issue 30: same data and oracle, one run)", "",
             "| system | how | rec/s | records per CPU-s | exact | load (1 min) at start | CPU stolen by the host "
             "| W2 on a flow better by (×) |",
             "|---|---|---:|---:|:---:|---:|---:|---:|"]
    for x in rows:
        rps = _num(x["rps"]) if not x["error"] or x["rps"] else f"error: {x['error'][:120]}"
        exact = "–" if x["exact"] is None else ("yes" if x["exact"] else "NO")
        rat = None if x["system"] == FLOW_ROW else ratio(mine, x["rps"])
        load = "–" if x["load"] is None else f"{x['load']:.2f}"
        lines.append(f"| {x['system']} | {x['how']} | {rps} | {_num(x['per_cpu_s'])} | {exact} | {load} | "
                     f"{_stolen(x)} | {'–' if rat is None else f'{rat}×'} |")
    lines += ["", "CPU stolen by the host: CPU-seconds the hypervisor ran other guests while this "
              "machine's CPUs wanted to run (`steal` in /proc/stat), and their share of the run's two "
              "cores; a run that lost much had less machine than its neighbours in the table."]
    bw = r.get("bytewax") or {}
    if bw.get("error"):
        lines += ["", f"Bytewax: {bw['error']}"]
    fire = (r.get("w2_flow") or {}).get("window_fire") or {}
    steps = fire.get("steps") or {}
    if steps:
        lines += ["", "Window firing stalls of W2 on a flow (`millstream_window_fire_seconds`, every worker's "
                  "/metrics at the end of the run; a firing is one watermark advance's due windows on one "
                  "tablet; figures are the histogram's bucket bounds):", "",
                  "| step | firings | p50 ≤ | p99 ≤ | slowest ≤ | over 20 ms |", "|---|---:|---:|---:|---:|---:|"]
        cpu, queued = fire.get("cpu_steps") or {}, fire.get("queued_steps") or {}
        for step, s in sorted(steps.items()):
            lines.append(_stall_row(step, s))
            if step in cpu:  # the same firings' own work: the wall time over it was waiting
                lines.append(_stall_row(f"{step}, its CPU (`millstream_window_fire_cpu_seconds`)", cpu[step]))
            if step in queued:  # ... for a core; the rest of the wait, for the interpreter lock
                lines.append(_stall_row(f"{step}, its wait for a core (`millstream_window_fire_queued_seconds`; "
                                        "the rest of its wall time over its CPU, blocked: on the interpreter "
                                        "lock, mostly)", queued[step]))
        pauses = fire.get("gc_pauses") or {}
        for gen, s in sorted(pauses.items()):  # every thread waits for them, a firing included
            lines.append(_stall_row(f"garbage collector, {gen} (`millstream_gc_pause_seconds`)", s))
    for err in fire.get("errors", []):
        lines.append(f"\nmetrics not read: {err}")
    lines.append("")
    return lines
