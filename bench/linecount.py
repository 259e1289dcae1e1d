"""Counting a sink's output lines while a benchmark waits for them, inside its CPU meter.

A copied driver (bench/ab.py's ``DRIVERS``): the A/B runs it in older trees too, so that
both sides wait for their outputs the same way.
"""

from __future__ import annotations

import glob
import os


class LineCounter:
    """Complete lines in the ``*.txt`` files under ``path``, read incrementally: each call reads
    only what was appended since the last one (a file that shrank, a sink cut back on reopen,
    is counted again from its start). For waits polled inside a CPU meter, where
    `bench.latency.count_lines` would read every output again on every poll: on 200,000 Nexmark
    outputs, ~25 ms of the benchmark's own CPU per poll, 20 polls a second."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._seen: dict[str, tuple[int, int]] = {}  # file: (bytes read, newlines in them)

    def __call__(self) -> int:
        total = 0
        for name in glob.glob(os.path.join(self.path, "*.txt")):
            offset, lines = self._seen.get(name, (0, 0))
            with open(name, "rb") as f:
                if os.fstat(f.fileno()).st_size < offset:
                    offset, lines = 0, 0
                f.seek(offset)
                while chunk := f.read(1 << 20):
                    offset += len(chunk)
                    lines += chunk.count(b"\n")
            self._seen[name] = (offset, lines)
            total += lines
        return total
