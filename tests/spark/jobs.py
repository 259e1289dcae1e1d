"""Code the Spark bridge tests hand to workers and to Spark tasks (imported by path)."""

from __future__ import annotations

import os

from runtime import Record

FAIL_AT = 750  # partition 0 holds ~1,250 of the test's 20,000 rows (16 content partitions)
_routed: dict[tuple[int, int, int], int] = {}


def flaky_key(record: Record) -> bytes:
    """A key extractor -- run by producers, here inside Spark tasks -- that crashes once.

    On the first attempt of Spark partition 0 it ends the task's Python worker at the
    :data:`FAIL_AT`-th record it routes, after the task has sent rows before it (in whatever
    order the partition holds them): an executor lost mid-partition. (Raising would not do:
    an injector sends a record whose reader's extractor raises to that reader's dead-letter
    stream and goes on, review N5.)
    """
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is not None and ctx.partitionId() == 0 and ctx.attemptNumber() == 0:
        task = (ctx.stageId(), ctx.partitionId(), ctx.attemptNumber())
        _routed[task] = _routed.get(task, 0) + 1
        if _routed[task] == FAIL_AT:
            os._exit(17)
    return record.key
