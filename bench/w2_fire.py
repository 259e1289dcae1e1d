"""One run of W2 on a flow in this checkout, as one JSON line: rec/s, exactness and the
window firings' histograms (wall and CPU) read from the workers::

    python -m bench.w2_fire

Run it from two checkouts alternately to compare a change to the firings (the runtime is
imported from the checkout it runs in: workers and masters get it first on their path).
``millstream bench --only w2`` reports the same figures with the peers beside them.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile


def main() -> int:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    from bench import workloads
    from runtime.flows import windowing

    root = tempfile.mkdtemp(prefix="millstream-w2-fire-")
    load = os.getloadavg()[0]
    try:
        r = workloads.run_w2(root, workloads.BenchConfig.make(False), flow=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps({"checkout": here, "fire_slice_s": windowing.FIRE_SLICE_S, "records_per_s": r.get("throughput_rps"),
                      "exact": r.get("oracle_equal"), "window_fire": r.get("window_fire"), "loadavg_before": load}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
