"""``millstream run``: a flow (or topology) run once over files, in this process, with no
cluster, its outputs printed. Bytewax's ``python -m bytewax.run`` and Quix's ``app.run()``
for trying a job on a sample before submitting it::

    millstream run jobs:flow --input clicks=clicks.jsonl --timestamp-field ts

It is the test kit's run (runtime/testing.py): the real worker, its exactly-once batches,
typed state and timers, on RocksDB in a temporary directory; no etcd, no network. Every line
of an input file is one record (with a key or timestamp field, every non-blank line), its
value the line's bytes (the flow's input codec decodes them). With a timestamp field the
records of all inputs are fed in timestamp order, else input after input; then every input
is finished, so every window fires; then each output stream's records are written as JSON
lines, decoded by the flow's output codec. Wall-clock time is the run's start and does not
move: processing-time timers do not fire.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
import logging
import os
import stat
import sys
import time
from collections.abc import Iterator, Sequence
from typing import IO, Any

from runtime.errors import ConfigError, MillstreamError

BATCH = 1_000  # records injected between two runs of the worker
QUIET = ("master", "worker", "runtime")  # the in-process cluster's comings and goings are not news here

Item = tuple[int, int, int, str, bytes, bytes]  # timestamp, input, line, stream, key, value


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
        if path == "-" and "-" in out.values():
            raise ConfigError(f"--input {arg!r}: standard input ('-') is already another stream's; give one a file")
        if path != "-" and not _readable(path):
            raise ConfigError(f"--input {arg!r}: {path!r} is not a file ('-' reads standard input)")
        out[stream] = path
    return out


def _readable(path: str) -> bool:
    """A file, a pipe or a device (``<(zcat f.gz)``): anything but a directory or nothing."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISREG(mode) or stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)


def records(lines: Iterator[bytes], name: str, start_us: int, key_field: str | None,
            time_field: str | None, unit: str = "us") -> Iterator[tuple[int, bytes, bytes, int, bool]]:
    """(line number, key, value, timestamp, whether the time was a number) of each line: the
    key from ``key_field`` (else empty), the time from ``time_field`` (else ``start_us``, a
    microsecond later each line, in file order). With a field, blank lines are no records (as
    for ``inject-files``)."""
    from injectors.files import line_fields

    fields = key_field is not None or time_field is not None
    for n, line in enumerate(lines, start=1):
        value = line.rstrip(b"\r\n")
        key, ts, numeric = b"", start_us + n, False
        if fields:
            if not value.strip():
                continue
            k, t, numeric = line_fields(value, f"{name}, line {n}", key_field, time_field, ConfigError, unit)
            key, ts = k if k is not None else key, t if t is not None else ts
        yield n, key, value, ts, numeric


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


def _by_own_key(job: Any, topo: Any) -> dict[str, str]:
    """Input streams some reader takes by the records' own keys, with who: a flow's keyed
    input, or a classic computation reading it with no key extractor."""
    from runtime.dataflow import Dataflow

    if isinstance(job, Dataflow):
        return {job._steps[s].args["stream"]: f"the keyed input step {s!r}" for s in job.steps
                if job._steps[s].kind == "input" and job._steps[s].keyed}
    return {stream: f"computation {name!r}" for name, c in topo.computations.items()
            for stream, extractor in c.inputs.items() if extractor is None}


def _out_dir(out_dir: str, clear: Sequence[str] = ()) -> None:
    """Make ``out_dir`` and check it takes files (before the run), or clear the files of
    ``clear``'s streams an earlier run left there (once this run's are ready to be written)."""
    try:
        os.makedirs(out_dir, exist_ok=True)
        for name in clear:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(out_dir, f"{name}.jsonl"))
        probe = os.path.join(out_dir, ".millstream-run")
        open(probe, "w").close()
        os.remove(probe)
    except OSError as e:
        raise ConfigError(f"--out {out_dir!r}: cannot write there ({e.strerror}); give a directory") from None


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    loggers = [logging.getLogger(n) for n in QUIET]
    levels = [lg.level for lg in loggers]
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        for lg in loggers:
            lg.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _read(given: dict[str, str], start_us: int, key_field: str | None, time_field: str | None,
          unit: str | None, stdin: IO[bytes] | None) -> list[Item]:
    """Every record of every input, in the order they are fed: with ``time_field``, by
    timestamp, then input, then line; without, input after input (their stamps are made up)."""
    from injectors.files import check_unit

    items: list[Item] = []
    for i, (stream, path) in enumerate(given.items()):
        f = (stdin or sys.stdin.buffer) if path == "-" else open(path, "rb")
        biggest = 0  # (each input on its own: one in seconds beside one in microseconds is refused too)
        try:
            name = "<stdin>" if path == "-" else path
            for n, key, value, ts, numeric in records(iter(f), name, start_us, key_field, time_field, unit or "us"):
                items.append((ts, i, n, stream, key, value))
                if numeric:
                    biggest = max(biggest, abs(ts))
        finally:
            if path != "-":
                f.close()
        if time_field is not None and unit is None:
            check_unit(biggest, time_field, repr(name), "nothing was run, and --timestamp-unit is for every input",
                       ConfigError)
    items.sort(key=(lambda item: item[:3]) if time_field is not None else (lambda item: item[1:3]))
    return items


def _work(run: Any) -> float:
    """What the run has done so far: records produced, taken in and windows fired."""
    from runtime import metrics

    done: float = sum(len(run.output(s)) for s in run.streams)
    for counter in (metrics.RECORDS, metrics.WINDOWS_FIRED):
        done += sum(sample.value for family in counter.collect() for sample in family.samples
                    if sample.name.endswith("_total"))
    return done


def _settle(run: Any, attempts: int) -> None:
    """:meth:`TestRun.run_until_idle` (10,000 rounds of the worker, 10 s or more), again while
    the run makes progress (a large run's windows fire in slices over many rounds), at most
    ``attempts`` times: a run busy without progress, or for that long, never settles."""
    for _ in range(attempts):
        before = _work(run)
        try:
            run.run_until_idle()
            return
        except MillstreamError as e:
            if _work(run) == before:
                raise ConfigError(f"the job does not settle: {e}") from None
    raise ConfigError(f"the job does not settle: still busy after {attempts} x 10,000 rounds of the worker, making "
                      "output all along (a timer that sets itself again for ever?)")


def run_job(path: str, inputs: list[str], *, key_field: str | None = None, time_field: str | None = None,
            unit: str | None = None, out_dir: str | None = None, stdin: IO[bytes] | None = None,
            stdout: IO[str] | None = None) -> int:
    """``millstream run``: the exit code (0; 1 if records went to dead letters)."""
    from cli.lifecycle import job_at
    from runtime.client import as_topology
    from runtime.dataflow import Dataflow
    from runtime.testing import TestRun
    from runtime.topology import dead_letter_stream

    job = job_at(path)
    topo = as_topology(job)
    comps = topo.computations.values()
    produced = {s for c in comps for s in c.all_outputs}
    streams = sorted({s for c in comps for s in c.inputs} - produced)
    given = parse_inputs(inputs, streams)
    if key_field is None:
        for stream, who in _by_own_key(job, topo).items():
            if stream in given and isinstance(job, Dataflow):
                raise ConfigError(f"{who} reads {stream!r} by its records' own keys: give --key-field FIELD (without "
                                  "it every record has the empty key), or key it in the flow with key_by")
            if stream in given:
                print(f"millstream run: {who} reads {stream!r} by its records' own keys, and without --key-field "
                      "every record has the empty key", file=sys.stderr)
    if unit is not None and time_field is None:
        raise ConfigError(f"--timestamp-unit {unit} says the unit of --timestamp-field's numbers; give the field too")
    outputs = _outputs(job)
    stdout = stdout or sys.stdout
    start_us = time.time_ns() // 1000
    if out_dir is not None:
        _out_dir(out_dir)
    items = _read(given, start_us, key_field, time_field, unit, stdin)
    attempts = 10 + len(items) // 10_000
    with _quiet(), TestRun(job, start_us=start_us) as run:
        for lo in range(0, len(items), BATCH):
            # Each run of one stream's records is committed by the stage reading it before the
            # next is injected: that stage takes them in the order they are fed.
            chunk, at = items[lo:lo + BATCH], 0
            while at < len(chunk):
                stream, end = chunk[at][3], at + 1
                while end < len(chunk) and chunk[end][3] == stream:
                    end += 1
                run.inject_batch(stream, [(key, value, ts) for ts, _, _, _, key, value in chunk[at:end]])
                at = end
            _settle(run, attempts)
        for stream in streams:
            run.finish(stream)
        _settle(run, attempts)
        dead = [s for s in run.streams if s.endswith(".dead_letter") and run.output(s)]
        texts = {stream: [_line(stream, r, codec.decode) for r in run.output(stream)] for stream, codec in outputs.items()}
        letters = {stream: [_line(stream, r, bytes) for r in run.output(stream)] for stream in dead}
    if out_dir is not None:  # (only now, every file made: a run that failed left the last one's files)
        _out_dir(out_dir, [*outputs, *(dead_letter_stream(c) for c in topo.computations)])
    for stream, lines in texts.items():
        _write(stream, lines, out_dir, stdout)
    for stream, lines in letters.items():
        print(f"millstream run: {len(lines)} record(s) went to {stream}: the error of each is in its value (--out DIR "
              f"writes them to {stream}.jsonl)", file=sys.stderr)
        if out_dir is not None:
            _write(stream, lines, out_dir, stdout)
    if isinstance(job, Dataflow):
        for s in job.steps:
            if job._steps[s].kind == "sink":
                print(f"millstream run: step {s!r} is a sink: it wrote its records where it writes, as on a cluster "
                      "(not here)", file=sys.stderr)
    return 1 if dead else 0


def _line(stream: str, record: Any, decode: Any) -> str:
    try:
        value = decode(record.value)
    except Exception as e:  # the output codec's own code
        raise ConfigError(f"output {stream!r}: its codec cannot read back a record it wrote ({type(e).__name__}: "
                          f"{e}); nothing was written") from None
    return json.dumps({"stream": stream, "key": plain(record.key), "timestamp": record.timestamp,
                       "value": plain(value)})


def _write(stream: str, lines: list[str], out_dir: str | None, stdout: IO[str]) -> None:
    text = "".join(line + "\n" for line in lines)
    if out_dir is None:
        stdout.write(text)
        return
    with open(os.path.join(out_dir, f"{stream}.jsonl"), "w") as out:
        out.write(text)
