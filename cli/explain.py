"""``millstream explain MODULE:ATTR``: what a job runs as, printed: a Dataflow's stages and
what each fuses (``Dataflow.explain``, runtime/flows/explain.py), or a Topology's
computations with the streams they read and write."""

from __future__ import annotations

from cli.lifecycle import job_at
from runtime.dataflow import Dataflow
from runtime.topology import Topology


def explain_job(path: str) -> str:
    job = job_at(path)
    return job.explain() if isinstance(job, Dataflow) else topology_text(job)


def topology_text(topo: Topology) -> str:
    """Each computation of ``topo``: its code, key ranges and guarantee, the streams it reads
    (keyed by which extractor, on the producing side) and writes (read by which computation)."""
    comps = list(topo.computations.values())
    readers: dict[str, list[str]] = {}
    for c in comps:
        for stream in c.inputs:
            readers.setdefault(stream, []).append(c.name)
    lines = [f"topology {topo.name!r}: {len(comps)} computation{'s' * (len(comps) != 1)}"]
    for c in comps:
        lines += ["", f"computation {c.name!r}: {c.code}, {c.key_ranges} key range{'s' * (c.key_ranges != 1)}, "
                      f"{'exactly once' if c.exactly_once else 'at least once'}"]
        for stream, extractor in c.inputs.items():
            lines.append(f"  reads   {stream}  " + (f"keyed by {extractor} on the producing side" if extractor
                                                    else "keyed as sent"))
        for stream in c.outputs:
            to = readers.get(stream)
            lines.append(f"  writes  {stream}  " + (f"read by {', '.join(map(repr, to))}" if to else "an output"))
    return "\n".join(lines)
