"""One-second tumbling event-time windows counting records per key, on ``millstream.windows``.

Each window fires once, when the computation's low watermark passes its end (every record
of the window has arrived), and emits ``"<window start>,<count>"``. A record whose window has
already fired is late: it goes to ``window_counter.late`` (counted there), never into a
second, partial result.

Two versions of the same job: :func:`flow`, a :class:`~runtime.Dataflow` (the events keyed by
their own keys, a ``window`` step with a ``Count``, each result formatted), and
:func:`topology`, the classic one (a :class:`~runtime.windows.WindowedComputation` by hand and
a sink). Both emit the same ``"<window start>,<count>"`` records, stamped when the window fires;
in the flow a late record goes to ``<name>.counts.late``.
"""

from __future__ import annotations

from typing import Literal

from millstream import Context, Dataflow, Topology, codecs
from millstream.sinks import FileSink
from millstream.windows import SECOND, Count, Tumbling, WindowedComputation, WindowResult

WINDOW_US = SECOND


def window_line(result: WindowResult) -> str:
    """A fired window as the classic version writes it: ``"<window start>,<count>"``."""
    return f"{result.start},{result.value}"


def flow(output_dir: str, name: str = "windows", key_ranges: int = 4) -> Dataflow:
    """Records per key per one-second window, as a flow: each fired window's line on the
    stream ``window_counts`` and in ``output_dir``."""
    f = Dataflow(name, key_ranges=key_ranges)
    counts = (f.input("events", keyed=True)
              .window(Tumbling(WINDOW_US), Count(), name=f"{name}.counts")
              .map(window_line))
    counts.output("window_counts", codec=codecs.STR)
    counts.sink(FileSink, name=f"{name}.sink", path=output_dir)
    return f


class WindowCounter(WindowedComputation):
    windows = Tumbling(WINDOW_US)
    aggregator = Count()
    output = "window_counts"

    def on_window(self, ctx: Context, start: int, end: int, acc: int) -> None:
        ctx.produce(self.output, f"{start},{acc}".encode(), timestamp=self.fired_at(end))


def topology(output_dir: str, name: str = "windows", key_ranges: int = 4,
             late_records: Literal["process", "drop"] = "process") -> Topology:
    topo = Topology(name)
    topo.add_computation("window_counter", WindowCounter, inputs={"events": None},
                         outputs=["window_counts"], key_ranges=key_ranges, late_records=late_records)
    topo.add_computation("window_sink", FileSink, inputs={"window_counts": None},
                         params={"path": output_dir}, key_ranges=2)
    return topo
