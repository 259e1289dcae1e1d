"""One-second tumbling event-time windows counting records per key.

Each record adds one to its window's count in the key's state and sets an
event-time timer at the window's end; the timer fires once the computation's
low watermark passes the end (every record of the window has arrived), emits
``"<window start>,<count>"`` and forgets the window.
"""

from __future__ import annotations

import json

from runtime import Computation, Context, Record, TimeDomain, Topology
from runtime.topology import LateRecords

WINDOW_US = 1_000_000


class WindowCounter(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        start = record.timestamp - record.timestamp % WINDOW_US
        windows = json.loads(ctx.state.get() or b"{}")
        windows[str(start)] = windows.get(str(start), 0) + 1
        ctx.state.set(json.dumps(windows).encode())
        ctx.set_timer(f"w{start}", start + WINDOW_US, TimeDomain.EVENT_TIME)

    def process_timer(self, ctx: Context, tag: str, time: int) -> None:
        start = time - WINDOW_US
        windows = json.loads(ctx.state.get() or b"{}")
        count = windows.pop(str(start), 0)
        if windows:
            ctx.state.set(json.dumps(windows).encode())
        else:
            ctx.state.clear()
        # Stamped at the window's end, the timer's time: a pending timer holds the watermark
        # there, so anything older would already be late downstream.
        ctx.produce("window_counts", f"{start},{count}".encode())


def topology(output_dir: str, name: str = "windows", key_ranges: int = 4,
             late_records: LateRecords = "process") -> Topology:
    topo = Topology(name)
    topo.add_computation("window_counter", "examples.windows:WindowCounter", inputs={"events": None},
                         outputs=["window_counts"], key_ranges=key_ranges, late_records=late_records)
    topo.add_computation("window_sink", "runtime.sinks:FileSink", inputs={"window_counts": None},
                         params={"path": output_dir}, key_ranges=2)
    return topo
