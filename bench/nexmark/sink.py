"""Where the Nexmark bench's queries write (bench/nexmark/run.py): :class:`OutputSink`, the
sink at the end of every query (fused into the query's last stage on a flow, a computation of
its own for the classic queries), and :func:`read_outputs`, what it committed."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence

from runtime import Context, Record, Sink
from runtime.errors import TopologyError
from runtime.sinks import CommittedFile


class OutputSink(Sink):
    """Appends ``key value timestamp arrival_ns`` lines (key and value in hex) to
    ``<path>/<tablet>.txt``, exactly once (the committed length is in the tablet's commit).
    The arrival is stamped when the batch's lines are written (``prepare_commit``), right
    before that commit, as :class:`bench.jobs.ArrivalSink` stamps its own."""

    def setup(self, params: Mapping[str, str]) -> None:
        super().setup(params)
        if "path" not in params:
            raise TopologyError("OutputSink needs params={'path': DIRECTORY}")
        self.dir = params["path"]
        self._pending: list[bytes] = []

    def restore(self, tablet: str, meta: bytes | None, token: int = 0, absorbed: Sequence[bytes] = ()) -> None:
        self.file = CommittedFile(self.dir, tablet, ".txt", meta, token=token)

    def process_record(self, ctx: Context, record: Record) -> None:
        self.process_batch(ctx, (record,))

    def process_batch(self, ctx: Context, records: Sequence[Record]) -> None:
        """A batch's lines in one call (runtime.Sink: what a sink writing batches defines)."""
        self._pending += [b"%s %s %d " % (r.key.hex().encode(), r.value.hex().encode(), r.timestamp)
                          for r in records]

    def prepare_commit(self) -> bytes:
        stamp = b"%d\n" % time.time_ns()
        data = stamp.join(self._pending) + stamp if self._pending else b""
        self._pending.clear()
        return self.file.append(data, fsync=False)


def read_outputs(path: str) -> list[tuple[bytes, bytes, int, int]]:
    """(key, value, timestamp, arrival_ns) of every committed output line under ``path``."""
    out: list[tuple[bytes, bytes, int, int]] = []
    if not os.path.isdir(path):
        return out
    for name in sorted(os.listdir(path)):
        with open(os.path.join(path, name), "rb") as f:
            for line in f:
                if line.endswith(b"\n"):
                    k, v, ts, arrival = line.split()
                    out.append((bytes.fromhex(k.decode()), bytes.fromhex(v.decode()), int(ts), int(arrival)))
    return out
