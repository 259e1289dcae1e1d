"""How millstream's own processes (worker, master) run Python's cyclic garbage collector.

A full collection (generation 2) visits every container object the process holds, and every
thread waits for it. Most of a worker's are made at start-up and live until it stops:
modules, classes, functions, protobuf descriptors, gRPC's objects. Under W2 a worker made a
full collection every second or two, and its median pause was in the (20, 50] ms bucket of
``millstream_gc_pause_seconds``: a stall of a tablet, of a window firing, of every record
then in flight.

:func:`settle` observes the pauses of generations 1 and 2 (``millstream_gc_pause_seconds``),
and with ``MILLSTREAM_GC_FREEZE=1`` freezes what exists once the daemon's modules are
imported, before it serves (``gc.freeze``: it moves to a permanent generation the collector
never visits; reference counting still frees it), so a full collection visits only what the
process made since. Measured (docs/performance.md, "Garbage collector pauses"): the median
full-collection pause under W2 fell from the (20, 50] ms bucket to (5, 10] or (10, 20] ms,
W2's throughput did not move beyond its noise, and Nexmark q0 (classic) made 6 % fewer
events per CPU-second at the medians of seven interleaved pairs: more than the collector's
own time in q0 (a few percent of its CPU, which the freeze can only shorten) can explain, so
most likely the machine, but not settled. Until a longer run decides, it is off by default:
a knob for a job that cares more for its tail latency than for its CPU. A cycle of garbage
among frozen objects would never be collected; start-up objects do not become garbage while
the process runs.
"""

from __future__ import annotations

import gc
import os

from runtime import metrics


def settle() -> None:
    """Observe the pauses of the older generations (``millstream_gc_pause_seconds``); with
    ``MILLSTREAM_GC_FREEZE=1``, first collect once and freeze what is left out of every
    later collection."""
    if os.environ.get("MILLSTREAM_GC_FREEZE", "0") == "1":
        gc.collect()
        gc.freeze()
    metrics.watch_gc()
