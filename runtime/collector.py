"""How millstream's own processes (worker, master) run Python's cyclic garbage collector.

A full collection (generation 2) visits every container object the process holds, and every
thread waits for it. Most of a worker's are made at start-up and live until it stops:
modules, classes, functions, protobuf descriptors, gRPC's objects. Under W2 a worker made a
full collection every second or two, and its median pause was in the (20, 50] ms bucket of
``millstream_gc_pause_seconds``: a stall of a tablet, of a window firing, of every record
then in flight.

:func:`settle` freezes what exists once the daemon's modules are imported, before it
serves (``gc.freeze``: it moves to a permanent generation the collector never visits;
reference counting still frees it), so a full collection visits only what the process made
since: the median pause fell to the
(5, 10] or (10, 20] ms bucket in the same runs (``python -m bench.gc_pauses``;
docs/performance.md, "Garbage collector pauses"). A cycle of garbage among frozen objects
would never be collected; start-up objects do not become garbage while the process runs.
The young generations keep CPython's thresholds: a larger first threshold (50,000) made
fewer, longer young collections and a worse W1 median in scratch runs.

``MILLSTREAM_GC_FREEZE=0`` leaves the collector as CPython has it (the pauses are still
observed): for measuring the difference.
"""

from __future__ import annotations

import gc
import os

from runtime import metrics


def settle() -> None:
    """Collect once, freeze what is left out of every later collection, and observe the
    pauses of the older generations (``millstream_gc_pause_seconds``)."""
    if os.environ.get("MILLSTREAM_GC_FREEZE", "1") != "0":
        gc.collect()
        gc.freeze()
    metrics.watch_gc()
