"""``millstream run``: a flow (or topology) run once over files, in this process, with no
cluster, its outputs printed. Bytewax's ``python -m bytewax.run`` and Quix's ``app.run()``
for trying a job on a sample before submitting it::

    millstream run jobs:flow --input clicks=clicks.jsonl --timestamp-field ts

It is the test kit's run (runtime/testing.py): the real worker, its exactly-once batches,
typed state and timers, on RocksDB in a temporary directory; no etcd, no network. Every line
of an input file is one record, its value the line's bytes (the flow's input codec decodes
them). Once every file is read, every input stream is finished, so every window fires; then
each output stream's records are written as JSON lines, decoded by the flow's output codec.
Wall-clock time is the run's start and does not move: processing-time timers do not fire.
"""

from __future__ import annotations

import base64
import datetime
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from typing import IO, Any

from runtime.errors import ConfigError

BATCH = 1_000  # lines injected between two runs of the worker


def parse_inputs(given: list[str], streams: list[str]) -> dict[str, str]:
    """``STREAM=PATH`` arguments as {stream: path}, each stream an input of the job."""
    out: dict[str, str] = {}
    for arg in given:
        stream, sep, path = arg.partition("=")
        if not sep or not stream or not path:
            raise ConfigError(f"--input {arg!r}: write STREAM=PATH, e.g. --input clicks=clicks.jsonl")
        if stream not in streams:
            raise ConfigError(f"--input {arg!r}: {stream!r} is not an input stream of the job; its inputs are "
                              f"{', '.join(streams) or '(none)'}")
        if stream in out:
            raise ConfigError(f"--input {arg!r}: stream {stream!r} is given twice; give it one file")
        if path != "-" and not os.path.isfile(path):
            raise ConfigError(f"--input {arg!r}: {path!r} is not a file ('-' reads standard input)")
        out[stream] = path
    return out


def records(lines: Iterator[bytes], name: str, start_us: int, key_field: str | None,
            time_field: str | None) -> Iterator[tuple[bytes, bytes, int]]:
    """(key, value, timestamp) of each line: the key from ``key_field`` (else empty), the time
    from ``time_field`` (else ``start_us``, a microsecond later each line, in file order)."""
    from injectors.files import line_fields

    for n, line in enumerate(lines):
        value = line.rstrip(b"\r\n")
        key, ts = b"", start_us + n
        if key_field is not None or time_field is not None:
            k, t = line_fields(value, f"{name}, line {n + 1}", key_field, time_field, ConfigError)
            key, ts = k if k is not None else key, t if t is not None else ts
        yield key, value, ts


def plain(v: Any) -> Any:
    """A decoded value as JSON can write it: named tuples (``WindowResult``) as objects, bytes
    as text (base64 if they are not UTF-8), anything else JSON lacks as its ``repr``."""
    if isinstance(v, tuple) and hasattr(v, "_asdict"):
        return {k: plain(x) for k, x in v._asdict().items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, dict):
        return {k if isinstance(k, str) else json.dumps(plain(k)): plain(x) for k, x in v.items()}
    if isinstance(v, (bytes, bytearray, memoryview)):
        try:
            return bytes(v).decode()
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(bytes(v)).decode()}
    if v is None or isinstance(v, (str, int, float, bool)):
        return v
    if isinstance(v, (datetime.datetime, datetime.date)):
        return v.isoformat()
    return repr(v)


def _outputs(job: Any) -> dict[str, Any]:
    """The streams to write, with the codec that decodes each: a flow's ``output`` steps, or
    the streams a topology produces and none of its computations reads (bytes)."""
    from runtime import codecs
    from runtime.dataflow import Dataflow
    from runtime.flows.refs import load_codec
    from runtime.imports import load

    if isinstance(job, Dataflow):
        outs = [job._steps[s].args for s in job.steps if job._steps[s].kind == "output"]
        return {a["stream"]: load_codec(a["codec"], lambda ref, what: load(ref, what)) for a in outs}
    comps = job.computations.values()
    read = {s for c in comps for s in c.inputs}
    return {s: codecs.BYTES for c in comps for s in c.outputs if s not in read}


def run_job(path: str, inputs: list[str], *, key_field: str | None = None, time_field: str | None = None,
            out_dir: str | None = None, stdin: IO[bytes] | None = None, stdout: IO[str] | None = None) -> int:
    """``millstream run``: the exit code (0; 1 if records went to dead letters)."""
    from cli.lifecycle import job_at
    from runtime.client import as_topology
    from runtime.testing import TestRun

    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        for name in ("master", "worker"):  # the in-process cluster's comings and goings are not news here
            logging.getLogger(name).setLevel(logging.WARNING)
    job = job_at(path)
    topo = as_topology(job)
    comps = topo.computations.values()
    produced = {s for c in comps for s in c.all_outputs}
    streams = sorted({s for c in comps for s in c.inputs} - produced)
    given = parse_inputs(inputs, streams)
    outputs = _outputs(job)
    stdout = stdout or sys.stdout
    start_us = time.time_ns() // 1000
    with TestRun(job, start_us=start_us) as run:
        for stream, file in given.items():
            f = (stdin or sys.stdin.buffer) if file == "-" else open(file, "rb")
            try:
                batch: list[tuple[bytes, bytes, int]] = []
                for rec in records(iter(f), "<stdin>" if file == "-" else file, start_us, key_field, time_field):
                    batch.append(rec)
                    if len(batch) >= BATCH:
                        run.inject_batch(stream, batch)  # type: ignore[arg-type]
                        run.run_until_idle()
                        batch = []
                if batch:
                    run.inject_batch(stream, batch)  # type: ignore[arg-type]
            finally:
                if f is not stdin and f is not sys.stdin.buffer:
                    f.close()
            run.run_until_idle()
        for stream in streams:
            run.finish(stream)
        run.run_until_idle(max_rounds=10 ** 7)
        dead = [s for s in run.streams if s.endswith(".dead_letter") and run.output(s)]
        for stream, codec in outputs.items():
            _write(stream, [_line(stream, r, codec.decode) for r in run.output(stream)], out_dir, stdout)
        for stream in dead:
            print(f"millstream run: {len(run.output(stream))} record(s) went to {stream}: the error of each is in "
                  f"its value (--out DIR writes them to {stream}.jsonl)", file=sys.stderr)
            if out_dir is not None:
                _write(stream, [_line(stream, r, bytes) for r in run.output(stream)], out_dir, stdout)
    return 1 if dead else 0


def _line(stream: str, record: Any, decode: Any) -> str:
    return json.dumps({"stream": stream, "key": plain(record.key), "timestamp": record.timestamp,
                       "value": plain(decode(record.value))})


def _write(stream: str, lines: list[str], out_dir: str | None, stdout: IO[str]) -> None:
    text = "".join(line + "\n" for line in lines)
    if out_dir is None:
        stdout.write(text)
        return
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"{stream}.jsonl"), "w") as out:
        out.write(text)
