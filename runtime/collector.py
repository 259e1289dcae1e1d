"""How millstream's own processes (worker, master) run Python's cyclic garbage collector.

A full collection (generation 2) visits every container object the process holds, and every
thread waits for it. Most of a worker's are made at start-up and live until it stops:
modules, classes, functions, protobuf descriptors, gRPC's objects. Under W2 a worker made a
full collection every second or two, and its median pause was in the (20, 50] ms bucket of
``millstream_gc_pause_seconds``: a stall of a tablet, of a window firing, of every record
then in flight.

:func:`settle` observes the pauses of generations 1 and 2 (``millstream_gc_pause_seconds``),
and freezes what exists once the daemon's modules are imported, before it serves
(``gc.freeze``: it moves to a permanent generation the collector never visits; reference
counting still frees it), so a full collection visits only what the process made since.
``MILLSTREAM_GC_FREEZE=0`` leaves CPython's collector as it is. Measured (docs/performance.md,
"Garbage collector pauses"): under W2 the full collections' median pause fell from the
(20, 50] ms bucket to (5, 10] or (10, 20] ms, and W2's throughput did not suffer (ahead in
three rounds of five, level in one, behind in one); Nexmark q0's CPU per event did not move
beyond the machine's noise (ahead in one set of interleaved pairs, behind in another). A cycle of garbage among frozen objects
would never be collected; start-up objects do not become garbage while the process runs.

It also collects the youngest generation every :data:`YOUNG` container objects (50,000, not
CPython's 700; ``MILLSTREAM_GC_YOUNG`` sets another count), so that a batch's transient
objects die before a collection moves them into the older generations.
"""

from __future__ import annotations

import gc
import os

from runtime import metrics

# Container objects made (net) between two young collections: CPython's is 700. A batch of a
# flow's stage makes tens of thousands (a tuple per item per step, lists, records), nearly all
# dead by the batch's end; at 700 many were collected young, survived into the older
# generations while their batch ran and, dying there, set off full collections. At 50,000
# (docs/performance-history.md, "The young generation's size"): no full collection in a run of
# W2 on a flow against 26-27, and W2 ahead in both interleaved pairs (1.07x, 1.24x).
YOUNG = 50_000


def settle() -> None:
    """Collect once and freeze what is left out of every later collection (unless
    ``MILLSTREAM_GC_FREEZE=0``); set how many container objects the youngest generation takes
    before it is collected (:data:`YOUNG`, or ``MILLSTREAM_GC_YOUNG``); observe the pauses of
    the older generations (``millstream_gc_pause_seconds``)."""
    if os.environ.get("MILLSTREAM_GC_FREEZE", "1") != "0":
        gc.collect()
        gc.freeze()
    young = os.environ.get("MILLSTREAM_GC_YOUNG", "")
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(int(young) if young.isdigit() and int(young) > 0 else YOUNG, older, oldest)
    metrics.watch_gc()
