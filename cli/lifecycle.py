"""The job lifecycle commands: ``jobs``, ``update``, ``drain``, ``cancel``, ``savepoint``,
``restore`` and ``state get`` (docs/lifecycle.md)."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from runtime.client import Client
from runtime.errors import ConfigError
from runtime.status import render_jobs, show_key


def job_at(path: str) -> Any:
    """The Dataflow or Topology at ``MODULE:ATTR``, imported like ``python -m`` would."""
    from runtime.dataflow import Dataflow
    from runtime.imports import load
    from runtime.topology import Topology

    job = load(path, "job")
    if not isinstance(job, (Topology, Dataflow)):
        raise ConfigError(f"{path!r} is {type(job).__name__}, not a Topology or a Dataflow")
    return job


def topology_at(path: str) -> Any:
    """The Topology at ``MODULE:ATTR``, or the one the Dataflow there compiles to (submit,
    update: as ``Client.submit`` takes either)."""
    from runtime.dataflow import Dataflow

    job = job_at(path)
    return job.topology() if isinstance(job, Dataflow) else job


def _key(text: str) -> bytes:
    """A key given on the command line: UTF-8 text, or ``0x`` and hex for bytes."""
    if text.startswith("0x"):
        try:
            return bytes.fromhex(text[2:])
        except ValueError:
            raise ConfigError(f"key {text!r} starts with 0x but is not hex; write the text key as is") from None
    return text.encode()


def run_lifecycle(c: Client, args: argparse.Namespace) -> int:
    """jobs, update, drain, cancel, savepoint, restore, release-injector, state get, through the
    connected ``c``."""
    cmd = args.command
    if cmd == "jobs":
        jobs = c.jobs()
        print(json.dumps(jobs, indent=2) if args.json else render_jobs(jobs))
    elif cmd == "update":
        topo = topology_at(args.topology)
        d = c.update(topo, drop_state=args.drop_state, reset_state=args.reset_state)
        what = "; ".join(f"{k} {', '.join(v)}" for k, v in d.items() if v and k not in ("same", "resumed"))
        print(f"{'resumed' if d['resumed'] else 'updated'} job {topo.name!r}: {what or 'nothing changed'}")
    elif cmd == "drain":
        print(f"job {args.job!r} is {c.drain(args.job, wait=not args.no_wait, timeout=args.wait_s)}")
    elif cmd == "savepoint":
        m = c.savepoint(args.job, os.path.abspath(args.directory), timeout=args.timeout_s)
        print(f"savepoint of job {args.job!r} in {args.directory}: {len(m['tablets'])} tablets")
    elif cmd == "restore":
        name = c.restore(os.path.abspath(args.directory), name=args.as_name)
        print(f"restored job {name!r} from {args.directory}")
    elif cmd == "cancel":
        state = c.cancel(args.job, keep_state=args.keep_state)
        print(f"job {args.job!r} is {state}; its state is {'kept' if args.keep_state else 'deleted'}")
    elif cmd == "release-injector":
        c.release_injector(args.name, args.stream)
        print(f"released injector {args.name!r} on {args.stream!r}: it no longer holds the stream's watermark "
              "(its records sent later may be late)")
    elif args.state:
        return _typed_state(c, args)
    else:
        return _raw_state(c, args)
    return 0


def _raw_state(c: Client, args: argparse.Namespace) -> int:
    """``state get COMPUTATION KEY``: ``ctx.state``'s bytes, as text; exit 1 when unset."""
    key = _key(args.key)
    value, names = c.state_and_names(args.computation, key)
    if args.json:
        print(json.dumps({"computation": args.computation, "key": show_key(key), "found": value is not None,
                          "value": None if value is None else value.decode("utf-8", "backslashreplace")}))
    elif value is None:
        more = f"; its typed states, read with --state NAME: {', '.join(names)}" if names else ""
        print(f"{args.computation}: no state for key {show_key(key)!r} (ctx.state){more}")
        return 1
    else:
        print(value.decode("utf-8", "backslashreplace"))
    return 0


def _typed_state(c: Client, args: argparse.Namespace) -> int:
    """``state get COMPUTATION KEY --state NAME``: one typed state as JSON; exit 1 when unset."""
    key = _key(args.key)
    value = c.typed_state(args.computation, key, args.state)
    if args.json:
        print(json.dumps({"computation": args.computation, "key": show_key(key), "state": args.state,
                          "found": value is not None, "value": value}))
    elif value is None:
        print(f"{args.computation}: no state {args.state!r} for key {show_key(key)!r}")
    else:
        print(json.dumps(value, indent=2 if isinstance(value, dict | list) and len(value) > 3 else None))
    return 0 if value is not None or args.json else 1
