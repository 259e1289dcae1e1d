"""A batch's record loop: user code for each new record of a delivery's columns.

The common path of every classic stage, per record: a late check, a ``Record`` for user
code, the call (timed for the slow-call watch and the user-code histogram), and what it made
merged into the batch. :func:`run_records_py` is the reference, in Python;
``worker/_loop.c`` is the same loop compiled, which ``pip install -e .`` builds where it can
(``setup.py``: optional) and :func:`run_records` uses unless ``MILLSTREAM_PURE_PYTHON=1``
(read at import, as runtime/kernels.py does). ``tests/unit/test_recordloop.py`` runs both on
the same batches, records that raise, come late or hit the batch's bounds among them.

What is rare goes back into Python from either loop: a late record's counter, a call that
raised (undone, then retried and perhaps dead-lettered by ``BatchProcessor._run_user``), a
slow call, and a call with timers, typed state or weak productions (``_after_call``).
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from runtime.columns import Columns
from runtime.record import Record
from worker.context import _UNSAVED

if TYPE_CHECKING:
    from worker.batch import Batch, BatchProcessor


def run_records_py(proc: BatchProcessor, batch: Batch, cols: Columns, i: int, producer: bytes | None,
                   stop: int | None = None, source: tuple[bytes, int] | None = None) -> int:
    """User code for records ``i:`` of ``cols`` (new ones: dedup is done) until the batch is
    full, or for records ``i:stop`` whatever the batch holds; returns the index it reached.
    ``producer``: the records are its sequences; ``source``: else, the one record's place in
    its producer's order. A call that raises is undone and retried, then dead-lettered
    (``BatchProcessor._run_user``)."""
    n = len(cols) if stop is None else stop
    keys, values, tss = cols.keys, cols.values, cols.timestamps
    seqs, ids, prefix = cols.seqs, cols.ids, cols.producer
    streams = cols.streams
    stream = streams if type(streams) is str else ""  # one stream for all (or not known)
    per_record = streams if type(streams) is list else None
    commit = batch.commit
    ctx = proc.ctx
    out = ctx.out
    fn = proc._one  # (process_batch with one record, for a class with only that)
    calls = proc.calls
    clock = calls.clock
    slow = calls.record_above
    durations = proc._durations
    weak = proc.weak
    wm = proc._wm
    drop_late = proc.late_records == "drop"
    perf = time.perf_counter
    deadline = proc._started + proc._budget
    while i < n:
        if stop is None and (proc._work >= proc._limit or (
                proc._taken and not proc._taken & 7 and perf() >= deadline)):
            proc._stop = True
            break
        key, value, ts = keys[i], values[i], tss[i]
        if per_record is not None:
            stream = per_record[i]
        if seqs is not None:
            seq = seqs[i]
            rid = prefix + seq.to_bytes(8, "big")  # type: ignore[operator]
            if weak and producer is not None:
                source = (producer, seq)
        else:
            rid = ids[i]  # type: ignore[index]
        i += 1
        proc._taken += 1
        if ts < wm:
            proc.late += 1
            proc.metrics.late.inc()
            if drop_late:
                continue
        batch.new += 1
        proc._work += 1
        mark = len(out)
        ctx._key = key  # KeyContext.begin, inline
        ctx._timestamp = ts
        ctx.eff = None
        ctx._saved = _UNSAVED
        t0 = clock()
        calls.running_call = (key, t0)
        try:
            fn(ctx, Record(key, value, ts, rid, stream))
        except BaseException as e:  # user code: anything may happen, sys.exit() included
            ctx.undo(mark)
            calls.ended(clock())
            proc._run_user(commit, key, ts, value, rid, proc._record_fn, Record(key, value, ts, rid, stream),
                           source, failed=e)
            continue
        t1 = clock()
        calls.running_call = None
        durations.append(t1 - t0)
        if t1 - t0 >= slow:
            calls.slow(key, t1 - t0, t1)
        # A production earlier than the call holds the watermark (KeyContext.produce makes
        # the call's Effects for one); strong ones are routed when the batch is done.
        if ctx.eff is not None or (weak and len(out) > mark):
            proc._after_call(commit, ctx.eff, mark, ts, rid, source, len(out))
    return i


_compiled: Any = None
if os.environ.get("MILLSTREAM_PURE_PYTHON", "") in ("", "0"):
    try:
        import worker._loop as _compiled  # type: ignore[import-not-found, no-redef]
        _compiled.init(Record, _UNSAVED)
    except (ImportError, AttributeError, TypeError):  # not built (or built from an older _loop.c), or a
        # Record whose fields are not plain slots
        _compiled = None

COMPILED: bool = _compiled is not None
"""Whether the compiled loop is in use."""


def run_records(proc: BatchProcessor, batch: Batch, cols: Columns, i: int, producer: bytes | None,
                stop: int | None = None, source: tuple[bytes, int] | None = None) -> int:
    """:func:`run_records_py`, compiled where it was built (columns of another shape than
    lists run in Python)."""
    if _compiled is not None:
        reached = _compiled.run_records(proc, batch, cols, i, producer, stop, source)
        if reached is not NotImplemented:
            return int(reached)
    return run_records_py(proc, batch, cols, i, producer, stop, source)
