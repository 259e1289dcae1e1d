"""State out: a computation's per-key state from a savepoint, as a Spark DataFrame."""

from __future__ import annotations

from typing import Any

from runtime.errors import MillstreamError
from runtime.savepoint import read_manifest, tablet_dir

SCHEMA = "key string, key_bytes binary, value binary, value_text string, key_range int"


def read_state(spark: Any, savepoint_dir: str, computation: str) -> Any:
    """The per-key state (``ctx.state``) of ``computation`` in the savepoint at ``savepoint_dir``
    (written by ``millstream savepoint``): one row per key with ``key`` (UTF-8 text, escapes where
    it is not), ``key_bytes``, ``value`` (the bytes), ``value_text`` (the bytes as UTF-8 text,
    null where they are not) and the ``key_range`` that held it.

    Each tablet's checkpoint is read by one Spark task, so the savepoint directory must be
    readable where the executors run (a local directory for ``local[*]``, else shared storage).
    """
    manifest = read_manifest(savepoint_dir)
    paths = [(int(t["key_range"]), tablet_dir(savepoint_dir, computation, int(t["key_range"])))
             for t in manifest["tablets"] if t["computation"] == computation]
    if not paths:
        have = sorted({str(t["computation"]) for t in manifest["tablets"]})
        raise MillstreamError(f"the savepoint of job {manifest['job']!r} has no computation {computation!r} "
                              f"(it has {', '.join(have)})")
    rdd = spark.sparkContext.parallelize(paths, len(paths)).flatMap(_rows)
    return spark.createDataFrame(rdd, SCHEMA)


def _rows(item: tuple[int, str]) -> list[tuple[str, bytes, bytes, str | None, int]]:
    from worker.storage import saved_states

    key_range, path = item
    out = []
    for key, value in saved_states(path):
        try:
            text: str | None = value.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        out.append((key.decode("utf-8", "backslashreplace"), key, value, text, key_range))
    return out
