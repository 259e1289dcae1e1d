"""Code the Spark bridge tests hand to workers and to Spark tasks (imported by path)."""

from __future__ import annotations

from runtime import Record

FAIL_VALUE = b"v7500"


def flaky_key(record: Record) -> bytes:
    """A key extractor -- run by producers, here inside Spark tasks -- that fails once.

    On the first attempt of Spark partition 0 it raises at the record whose value is
    :data:`FAIL_VALUE`, after the task has already sent the rows before it.
    """
    if record.value == FAIL_VALUE:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is not None and ctx.partitionId() == 0 and ctx.attemptNumber() == 0:
            raise RuntimeError("injected failure on the first attempt of partition 0")
    return record.key
