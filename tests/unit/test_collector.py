"""runtime/collector.py: a server process observes the older generations' pauses and, unless
asked not to, freezes its start-up objects out of the garbage collector's way. That workers and masters do
it (runtime/serving.run) is checked by tests/e2e/test_dashboards.py: the dashboard's panel of
these pauses must find them on a real /metrics page."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

PROBE = """
import gc, json
from runtime import collector, metrics
from prometheus_client import generate_latest
before = gc.get_freeze_count()
junk = [[i] for i in range(50_000)]  # made before settle: frozen with the rest
collector.settle()
frozen = gc.get_freeze_count()
gc.collect(0)
young = generate_latest().decode()
more = [[i] for i in range(1_000)]  # made after: a full collection visits only these
gc.collect(2)
gc.collect(1)
page = generate_latest().decode()
def count(text, g):
    line = next((l for l in text.splitlines() if l.startswith(f'millstream_gc_pause_seconds_count{{generation="{g}"}}')), None)
    return None if line is None else float(line.split()[-1])
print(json.dumps({"before": before, "frozen": frozen, "young": [count(young, 1), count(young, 2)],
                  "after": [count(page, 1), count(page, 2)]}))
"""


def _probe(**env: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True,
                         env={**os.environ, **env})
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_settling_freezes_what_start_up_made_and_observes_older_collections() -> None:
    env = {k: v for k, v in os.environ.items() if k != "MILLSTREAM_GC_FREEZE"}  # the default
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True, env=env)
    r = json.loads(out.stdout)
    assert r["before"] == 0 and r["frozen"] > 50_000  # the start-up objects and the 50,000 lists
    assert r["young"] == [0.0, 0.0]  # a young collection is not observed (too many, too short)
    assert r["after"] == [1.0, 1.0]  # one full and one generation-1 collection after settle



def test_asked_not_to_nothing_is_frozen_and_the_pauses_are_still_observed() -> None:
    r = _probe(MILLSTREAM_GC_FREEZE="0")
    assert r["frozen"] == 0 and r["after"] == [1.0, 1.0]  # CPython's collector, still observed


def test_the_young_generations_size_is_the_collectors_or_the_environments() -> None:
    code = "import gc; from runtime import collector; collector.settle(); print(*gc.get_threshold())"

    def threshold(**env: str) -> list[int]:
        base = {k: v for k, v in os.environ.items() if k != "MILLSTREAM_GC_YOUNG"}
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True,
                             env={**base, **env})
        return [int(x) for x in out.stdout.split()]

    from runtime import collector

    assert threshold() == [collector.YOUNG, 10, 10]
    assert threshold(MILLSTREAM_GC_YOUNG="25000") == [25_000, 10, 10]
    assert threshold(MILLSTREAM_GC_YOUNG="zero") == [collector.YOUNG, 10, 10]  # not a count: the default
