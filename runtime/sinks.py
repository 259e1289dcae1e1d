"""Built-in sink computations that write a stream out of millstream, exactly once.

:class:`FileSink` appends one JSON line per record to one file per tablet and
records the file's length in the same atomic commit as the batch's dedup ids.
On reopening, the file is cut back to the committed length, so a batch that
crashed after writing but before committing leaves no trace; its redelivery
writes it again. Subscribe it with ``params={"path": "/some/dir"}``.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterator, Mapping

from runtime.computation import Computation, Context
from runtime.errors import TopologyError
from runtime.record import Record


class CommittedFile:
    """An append-only file whose committed length travels in the tablet's atomic commit.

    :meth:`open` cuts the file back to the committed length (what a crashed batch wrote
    after it is gone, and its redelivery writes it again); :meth:`append` writes a batch
    and returns the new length to commit with it.
    """

    def __init__(self, directory: str, tablet: str, suffix: str, meta: bytes | None) -> None:
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, tablet.replace("/", "-") + suffix)
        self.size = int(meta or b"0")
        with open(self.path, "a+b") as f:
            f.truncate(self.size)

    def append(self, data: bytes, fsync: bool = True) -> bytes:
        if data:
            with open(self.path, "ab") as f:
                f.write(data)
                if fsync:
                    f.flush()
                    os.fsync(f.fileno())
            self.size += len(data)
        return b"%d" % self.size


class FileSink(Computation):
    """Writes ``{"key", "value", "timestamp"}`` JSON lines to ``<path>/<tablet>.jsonl``."""

    def setup(self, params: Mapping[str, str]) -> None:
        super().setup(params)
        if "path" not in params:
            raise TopologyError("FileSink needs params={'path': DIRECTORY}")
        self.dir = params["path"]
        self._pending: list[str] = []

    def restore(self, tablet: str, meta: bytes | None) -> None:
        """Called when the tablet opens: cut the file back to its committed length."""
        self.file = CommittedFile(self.dir, tablet, ".jsonl", meta)

    def process_record(self, ctx: Context, record: Record) -> None:
        self._pending.append(json.dumps({
            "key": record.key.decode("utf-8", "backslashreplace"),
            "value": record.value.decode("utf-8", "backslashreplace"),
            "timestamp": record.timestamp,
        }) + "\n")

    def prepare_commit(self) -> bytes:
        """Make the batch's lines durable; returns the length to commit."""
        data = "".join(self._pending).encode()
        self._pending.clear()
        return self.file.append(data)


def read_file_sink(path: str) -> Iterator[dict[str, object]]:
    """Every record a :class:`FileSink` committed under ``path``."""
    for name in sorted(glob.glob(os.path.join(path, "*.jsonl"))):
        with open(name) as f:
            for line in f:
                yield json.loads(line)
