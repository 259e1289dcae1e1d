"""One-second tumbling event-time windows counting records per key, on ``runtime.windows``.

Each window fires once, when the computation's low watermark passes its end (every record
of the window has arrived), and emits ``"<window start>,<count>"``. A record whose window has
already fired is late: it goes to ``window_counter.late`` (counted there), never into a
second, partial result.
"""

from __future__ import annotations

from runtime import Context, Topology
from runtime.topology import LateRecords
from runtime.windows import SECOND, Count, Tumbling, WindowedComputation

WINDOW_US = SECOND


class WindowCounter(WindowedComputation):
    windows = Tumbling(WINDOW_US)
    aggregator = Count()
    output = "window_counts"

    def on_window(self, ctx: Context, start: int, end: int, acc: int) -> None:
        ctx.produce(self.output, f"{start},{acc}".encode(), timestamp=self.fired_at(end))


def topology(output_dir: str, name: str = "windows", key_ranges: int = 4,
             late_records: LateRecords = "process") -> Topology:
    topo = Topology(name)
    topo.add_computation("window_counter", "examples.windows:WindowCounter", inputs={"events": None},
                         outputs=["window_counts"], key_ranges=key_ranges, late_records=late_records)
    topo.add_computation("window_sink", "runtime.sinks:FileSink", inputs={"window_counts": None},
                         params={"path": output_dir}, key_ranges=2)
    return topo
