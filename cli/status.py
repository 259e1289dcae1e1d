"""``millstream status``: the cluster once, or every few seconds with ``--watch``; narrowed to
one computation with ``--computation NAME``."""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime
from typing import Any

from runtime.client import Client
from runtime.errors import ConfigError, MillstreamError
from runtime.status import render

CLEAR = "\x1b[H\x1b[2J"  # cursor home, erase the screen (a terminal only)

def only(doc: dict[str, Any], computation: str) -> dict[str, Any]:
    """``doc`` narrowed to ``computation``: its entry, its topology's line for it, its tablets,
    the injectors of the streams it reads; masters and workers stay as they are."""
    comps = doc.get("computations", {})
    if computation not in comps:
        raise ConfigError(f"no computation {computation!r} in the cluster (it has: {', '.join(sorted(comps)) or 'none'})"
                          "; `millstream jobs` lists the jobs")
    topologies: dict[str, Any] = {}
    inputs: set[str] = set()
    for name, t in doc.get("topologies", {}).items():
        spec = t.get("computations", {}).get(computation)
        if spec is not None:
            topologies[name] = {**t, "computations": {computation: spec}}
            inputs |= set(spec.get("inputs", {}))
    return {**doc, "computations": {computation: comps[computation]}, "topologies": topologies,
            "tablets": [t for t in doc.get("tablets", []) if t.get("computation") == computation],
            "injectors": [i for i in doc.get("injectors", []) if i.get("stream") in inputs],
            "expired_injectors": [i for i in doc.get("expired_injectors", []) if i.get("stream") in inputs]}

def run_status(c: Client, args: argparse.Namespace) -> int:
    """Print the status once; with ``--watch S``, again every S seconds until Ctrl-C (a terminal
    gets a redrawn screen, a pipe a stream of reports; with ``--json``, one document per line).
    While watching, a cluster that does not answer (a leader change) or a computation that is not
    there (yet) is one line, not the end."""
    def view() -> dict[str, Any]:
        doc = c.status()
        return only(doc, args.computation) if args.computation else doc

    if args.watch is None:
        doc = view()
        print(json.dumps(doc, indent=2) if args.json else render(doc))
        return 0
    tty = sys.stdout.isatty()
    try:
        while True:
            try:
                doc = view()
                out = json.dumps(doc) if args.json else render(doc)
            except MillstreamError as e:  # also a computation not (or no longer, or not yet) there
                out = json.dumps({"error": str(e)}) if args.json else f"no answer: {e}"
            if not args.json:
                head = f"millstream status at {datetime.now():%H:%M:%S}, every {args.watch:g} s (Ctrl-C stops)"
                out = (CLEAR if tty else "") + head + "\n\n" + out + ("" if tty else "\n")
            print(out, flush=True)
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return 0
