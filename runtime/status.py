"""Rendering the master's status document for people."""

from __future__ import annotations

import datetime
from typing import Any

from runtime.record import END_OF_TIME, MIN_TIME

_MIN, _END = MIN_TIME, END_OF_TIME


def show_key(key: bytes, limit: int = 64) -> str:
    """A key for people: text where it is text, escapes elsewhere, cut at ``limit`` chars."""
    text = key.decode("utf-8", "backslashreplace")
    return text if len(text) <= limit else text[:limit] + "…"


def _lag(ms: int | None) -> str:
    if ms is None:
        return "-"
    for limit, unit, div in ((10_000, "ms", 1), (3_600_000, "s", 1000), (86_400_000, "h", 3_600_000)):
        if abs(ms) < limit:
            return f"{ms} ms" if unit == "ms" else f"{ms / div:.1f} {unit}"
    return f"{ms / 86_400_000:.1f} days"


def _time(us: int) -> str:
    if us == _MIN:
        return "(start of time)"
    if us == _END:
        return "(end of time)"
    try:
        return datetime.datetime.fromtimestamp(us / 1e6, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    except (OverflowError, ValueError, OSError):
        return str(us)


def render(doc: dict[str, Any]) -> str:
    masters = doc.get("masters", {})
    lines = ["masters:"]
    for a in masters.get("all", [masters.get("leader", "?")]):
        lines.append(f"  {a}{'  (leader)' if a == masters.get('leader') else ''}")
    lines += ["", "workers:"]
    for w in doc["workers"]:
        lines.append(f"  {w['id']}  {w['address']:<22} tablets={w['tablets']:<4} "
                     f"heartbeat {w['last_heartbeat_ms_ago']} ms ago")
    live = doc.get("liveness")
    if live:
        lines.append(f"  since this leader: {live['registrations']} registrations, "
                     f"{live['lease_expiries']} lease expiries, {live['tablet_moves']} tablet moves")
    lines += ["", "topologies:"]
    for name, t in doc["topologies"].items():
        state = t.get("state", "running")
        lines.append(f"  {name}" + ("" if state == "running" else f"  ({state.upper()})"))
        for c, spec in t["computations"].items():
            ins = ", ".join(spec["inputs"])
            outs = ", ".join(spec["outputs"]) or "-"
            lines.append(f"    {c:<20} {ins} -> {outs}  ({spec['key_ranges']} key ranges)")
    comps = doc.get("computations", {})
    if comps:
        lines += ["", "computations:  (low watermark, lag behind the wall clock, what holds it)"]
        for name, c in comps.items():
            lag = _lag(c["lag_ms"])
            lines.append(f"  {name:<20} wm={_time(c['low_watermark']):<26} lag={lag:<10} "
                         f"held by {c['held_by'] or '-'}")
            lines.append(f"  {'':<20} processed={c['processed']} late={c['late']} "
                         f"dead-lettered={c['dead_lettered']} backlog={c['backlog']}")
            lines += _problem_lines(c, f"  {'':<20} ")
            for k in c.get("slow_keys", []):
                what = "RUNNING for" if k["running"] else "took"
                lines.append(f"  {'':<20} slow key {k['key']!r} (range {k['key_range']}): "
                             f"{what} {k['seconds']:.3f} s")
    if doc.get("injectors"):
        lines += ["", "injectors:"]
        for i in doc["injectors"]:
            flag = (f"  STALE: silent for {_lag(i['last_report_ms_ago'])}; it still holds its stream"
                    if i.get("stale") else "  idle" if i.get("idle") else
                    "  retired: holds its stream here until a next run under the name" if i.get("retired") else "")
            lines.append(f"  {i['name']:<24} -> {i['stream']:<16} wm={_time(i['watermark'])}{flag}")
    for i in doc.get("expired_injectors") or []:
        lines.append(f"  EXPIRED {i['name']} -> {i['stream']} at wm={_time(i['watermark'])}, "
                     f"{_lag(i['expired_ms_ago'])} ago: silent too long, its hold was released")
    rep = doc.get("replication")
    if rep and (rep["under_replicated"] or rep["unavailable"]):
        lines += ["", f"REPLICATION: {rep['under_replicated']} tablets under-replicated, "
                      f"{rep['unavailable']} UNAVAILABLE (no live in-sync copy; they wait for one to return)"]
    reshards = doc.get("reshards") or []
    if reshards:
        lines += ["", "recent splits and merges:"]
        lines += [f"  {r['ago_s']:>8.1f} s ago  {r['what']}" for r in reshards[-5:]]
    lines += ["", "tablets (hash range in units of 2^48):"]
    for t in doc["tablets"]:
        followers = ",".join(f + ("" if f in t.get("in_sync", []) else "(catching up)")
                             for f in t.get("followers", [])) or "-"
        health = t.get("health", "ok")
        lines.append(f"  {t['computation']}/{t['key_range']:<4} [{t.get('start', 0) >> 48:04x}, "
                     f"{t.get('end', 1 << 64) >> 48:04x}) primary={t['worker'] or '-':<12} "
                     f"{t['address'] or '-':<22} token={t['token']:<4} followers={followers}"
                     + ("" if health == "ok" else f"  {health.upper()}"))
    return "\n".join(lines)


def _problem_lines(c: dict[str, Any], indent: str) -> list[str]:
    """A computation's code that workers may not load, and its tablets that do not run."""
    lines = [f"{indent}CANNOT LOAD: {text}" for text in c.get("code_refused", [])]
    for p in c.get("problems", []):
        lines.append(f"{indent}PROBLEM range {p['key_range']} on worker {p['worker']}: "
                     f"{p['error']} ({p['attempts']} attempts, {p['seconds']:.0f} s)")
    return lines


def render_jobs(jobs: list[dict[str, Any]]) -> str:
    """`millstream jobs`: one block per job, its computations with ranges and watermarks."""
    if not jobs:
        return "no jobs; `millstream submit MODULE:ATTR` starts one"
    lines = []
    for j in jobs:
        extra = ""
        if j["state"] == "cancelled":
            extra = "  (state kept: submit it again to resume)" if j.get("state_kept") else "  (state deleted)"
        lines.append(f"{j['name']:<24} {j['state'].upper():<10}{extra}")
        if j.get("input_streams"):
            lines.append(f"  input streams: {', '.join(j['input_streams'])}")
        for c in j["computations"]:
            wm = "-" if c["low_watermark"] is None else _time(c["low_watermark"])
            lines.append(f"  {c['name']:<22} ranges {','.join(map(str, c['ranges'])) or '-':<16} wm={wm}")
            lines += _problem_lines(c, "    ")
    return "\n".join(lines)
