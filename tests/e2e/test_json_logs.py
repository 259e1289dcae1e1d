"""`--log-format json` on real daemons (issue 32): a master and workers started with it write one
JSON object per line; a worker's line about a poisoned record names its tablet, computation and
key."""

from __future__ import annotations

import json

from injectors import Injector
from runtime.topology import Topology
from tests.harness import Cluster, wait_until


def _records(path: str) -> list[dict[str, object]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.startswith("{")]


def test_daemons_log_json_lines_with_tablet_computation_and_key(tmp_path: object) -> None:
    with Cluster(str(tmp_path), workers=2, daemon_args=["--log-format", "json"]).running() as c:
        topo = Topology("poisoned").add_computation("poisoned", "tests.jobs:Poison", inputs={"in": None},
                                                     outputs=["out"])
        c.client.submit(topo)
        c.wait_assigned()
        with Injector(c.masters_arg, "in", "logs") as inj:
            inj.send(b"apple", b"ok", 1_700_000_000_000_000)
            inj.send(b"bad-key", b"poison", 1_700_000_000_000_001)
        wait_until(lambda: c.client.status()["computations"]["poisoned"]["dead_lettered"] == 1, 60,
                   "the poisoned record dead-lettered")

        def dead_letter_line() -> dict[str, object] | None:
            for w in c.workers:
                for r in _records(w.log_path):
                    if "dead-lettering" in str(r["message"]):
                        return r
            return None

        wait_until(lambda: dead_letter_line() is not None, 30, "the worker's dead-letter log line")
        line = dead_letter_line()
        assert line is not None
        assert line["level"] == "WARNING" and line["computation"] == "poisoned", line
        assert str(line["tablet"]).startswith("poisoned/") and line["key"] == "bad-key", line
        for p in [*c.masters, *c.workers]:
            with open(p.log_path) as f:
                text = [ln for ln in f.read().splitlines() if ln.strip()]
            parsed = _records(p.log_path)
            assert parsed, f"{p.name} logged no JSON"
            assert all({"time", "level", "logger", "message"} <= set(r) for r in parsed)
            # Anything else on stderr did not come through logging (a C library's own output).
            assert not [ln for ln in text if not ln.startswith("{") and (" INFO " in ln or " WARNING " in ln)], text
