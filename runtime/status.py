"""Rendering the master's status document for people."""

from __future__ import annotations

from typing import Any


def render(doc: dict[str, Any]) -> str:
    masters = doc.get("masters", {})
    lines = ["masters:"]
    for a in masters.get("all", [masters.get("leader", "?")]):
        lines.append(f"  {a}{'  (leader)' if a == masters.get('leader') else ''}")
    lines += ["", "workers:"]
    for w in doc["workers"]:
        lines.append(f"  {w['id']}  {w['address']:<22} tablets={w['tablets']:<4} "
                     f"heartbeat {w['last_heartbeat_ms_ago']} ms ago")
    lines += ["", "topologies:"]
    for name, t in doc["topologies"].items():
        lines.append(f"  {name}")
        for c, spec in t["computations"].items():
            ins = ", ".join(spec["inputs"])
            outs = ", ".join(spec["outputs"]) or "-"
            lines.append(f"    {c:<20} {ins} -> {outs}  ({spec['key_ranges']} key ranges)")
    lines += ["", "tablets:"]
    for t in doc["tablets"]:
        lines.append(f"  {t['computation']}/{t['key_range']:<4} worker={t['worker'] or '-':<12} "
                     f"{t['address'] or '-':<22} token={t['token']}")
    return "\n".join(lines)
