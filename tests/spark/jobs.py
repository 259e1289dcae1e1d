"""Code the Spark bridge tests hand to workers and to Spark tasks (imported by path)."""

from __future__ import annotations

from runtime import Record

FAIL_AT = 750  # partition 0 holds ~1,250 of the test's 20,000 rows (16 content partitions)
_routed: dict[tuple[int, int, int], int] = {}


def flaky_key(record: Record) -> bytes:
    """A key extractor -- run by producers, here inside Spark tasks -- that fails once.

    On the first attempt of Spark partition 0 it raises at the :data:`FAIL_AT`-th record it
    routes, after the task has already sent the rows before it (in whatever order the
    partition holds them).
    """
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is not None and ctx.partitionId() == 0 and ctx.attemptNumber() == 0:
        task = (ctx.stageId(), ctx.partitionId(), ctx.attemptNumber())
        _routed[task] = _routed.get(task, 0) + 1
        if _routed[task] == FAIL_AT:
            raise RuntimeError("injected failure on the first attempt of partition 0")
    return record.key
