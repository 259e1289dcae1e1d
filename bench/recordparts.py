"""The record path with stages that each do one thing per record (``python -m bench.overhead
recordparts``; see bench/overhead.py's docstring): what each part of a per-record stage
costs, beside a stage that does nothing (``bench.overhead:Nothing``) and W1's own."""

from __future__ import annotations

import os
import tempfile
from typing import Any

from runtime import Computation, Context, Record


class StateRead(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.state.get()


class StateWrite(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.state.set(b"1")


class StateCount(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        state = ctx.state
        state.set(b"%d" % (int(state.get() or b"0") + 1))


class ProduceOne(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        ctx.produce("s1", record.value)


def record_parts(batch: int = 1_000, records: int = 20_000, runs: int = 3) -> dict[str, Any]:
    """CPU µs per record of the record path's driver with a stage of each of this module's
    one-part computations, and with W1's (see the module docstring)."""
    import statistics

    import uvloop

    from bench.profile import Timing, _drive, _routing

    here = "bench.recordparts"
    stages = {"nothing": "bench.overhead:Nothing", "state_read": f"{here}:StateRead", "state_write": f"{here}:StateWrite",
              "state_read_and_write": f"{here}:StateCount", "one_production": f"{here}:ProduceOne",
              "w1_counter": None}  # None: W1's ChainedCounter, as the driver's routing has it
    cpu: dict[str, list[float]] = {name: [] for name in stages}
    with tempfile.TemporaryDirectory(prefix="millstream-recordparts-") as tmp:
        for i in range(runs):
            for name, code in stages.items():
                routing = _routing()
                if code is not None:
                    routing.computations[0].code = code
                timing = Timing()
                uvloop.run(_drive(os.path.join(tmp, f"{name}-{i}"), records, batch, None, routing=routing,
                                  timing=timing))
                cpu[name].append(timing.cpu_us)
    return {"cpu_us_per_record": {name: round(statistics.median(xs), 2) for name, xs in cpu.items()},
            "runs": {name: [round(x, 2) for x in xs] for name, xs in cpu.items()},
            "batch": batch, "records": records, "loadavg": os.getloadavg()}
