"""What a delivery's records cost to build and parse, as rows (one ``pb.Record`` each, the wire
form before issue 29) and as columns (``DeliverRequest.columns``), per record.

    python -m bench.columns_cost            # 1,000 records a delivery, 300 repetitions
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable

from runtime.columns import Columns, of_request
from runtime.wire import from_proto, to_proto
from runtime.wire import millstream_pb2 as pb


def measure(n: int = 1000, reps: int = 300) -> dict[str, object]:
    keys = [os.urandom(8).hex().encode() for _ in range(n)]
    values = [b"%d" % time.time_ns() for _ in range(n)]
    stamps = list(range(1_700_000_000_000_000, 1_700_000_000_000_000 + n))
    prefix = b"producer"
    cols = Columns(keys, values, stamps, prefix, list(range(1, n + 1)))
    records = cols.records()

    def per_record_us(fn: Callable[[], object]) -> float:
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        return round((time.perf_counter() - t) / reps / n * 1e6, 3)

    def build_columns() -> bytes:
        return pb.DeliverRequest(computation="c", columns=cols.to_proto()).SerializeToString()

    def build_rows() -> bytes:
        return pb.DeliverRequest(computation="c", records=[to_proto(r) for r in records]).SerializeToString()

    col_wire, row_wire = build_columns(), build_rows()
    return {
        "records": n, "loadavg": os.getloadavg(),
        "columns_us": {"build": per_record_us(build_columns),
                       "parse": per_record_us(lambda: of_request(pb.DeliverRequest.FromString(col_wire)))},
        "rows_us": {"build": per_record_us(build_rows),
                    "parse": per_record_us(lambda: [from_proto(r) for r in pb.DeliverRequest.FromString(row_wire).records])},
        "bytes_per_record": {"columns": round(len(col_wire) / n, 1), "rows": round(len(row_wire) / n, 1)},
    }


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.columns_cost")
    p.add_argument("--records", type=int, default=1000)
    p.add_argument("--reps", type=int, default=300)
    a = p.parse_args()
    print(json.dumps(measure(a.records, a.reps)))


if __name__ == "__main__":
    main()
