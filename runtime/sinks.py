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
        os.makedirs(self.dir, exist_ok=True)
        self.file_path = os.path.join(self.dir, tablet.replace("/", "-") + ".jsonl")
        committed = int(meta or b"0")
        with open(self.file_path, "a+b") as f:
            f.truncate(committed)
        self._size = committed

    def process_record(self, ctx: Context, record: Record) -> None:
        self._pending.append(json.dumps({
            "key": record.key.decode("utf-8", "backslashreplace"),
            "value": record.value.decode("utf-8", "backslashreplace"),
            "timestamp": record.timestamp,
        }) + "\n")

    def prepare_commit(self) -> bytes:
        """Make the batch's lines durable; returns the length to commit."""
        if self._pending:
            data = "".join(self._pending).encode()
            self._pending.clear()
            with open(self.file_path, "ab") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            self._size += len(data)
        return str(self._size).encode()


def read_file_sink(path: str) -> Iterator[dict[str, object]]:
    """Every record a :class:`FileSink` committed under ``path``."""
    for name in sorted(glob.glob(os.path.join(path, "*.jsonl"))):
        with open(name) as f:
            for line in f:
                yield json.loads(line)
