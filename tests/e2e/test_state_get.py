"""`millstream state get COMPUTATION KEY --state NAME` (issue 32): a running job's typed state
(ValueState, ListState, MapState declared on the class), read from the worker that holds the
key's tablet and printed as JSON; the bad uses say what to do."""

from __future__ import annotations

import json
import subprocess
import sys

from injectors import Injector
from runtime.topology import Topology
from tests.harness import Cluster, wait_until

VALUES = [b"red", b"green", b"red", b"blue", b"red"]


def _cli(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli", *args, "--masters", cluster.masters_arg],
                          capture_output=True, text=True, timeout=120, check=False)


def test_state_get_reads_typed_state_of_every_kind(cluster: Cluster) -> None:
    topo = Topology("profiles")
    topo.add_computation("profile", "tests.jobs:Profile", inputs={"colours": None}, outputs=["profiled"],
                         key_ranges=2)
    cluster.client.submit(topo)
    cluster.wait_assigned()
    with Injector(cluster.masters_arg, "colours", "colours-1") as inj:
        for i, v in enumerate(VALUES):
            inj.send(b"ann", v, 1_700_000_000_000_000 + i)
        inj.send(b"bob", b"\xff\x00", 1_700_000_000_000_100)
    wait_until(lambda: cluster.client.status()["computations"]["profile"]["processed"] == len(VALUES) + 1, 60,
               "every record processed")

    assert cluster.client.typed_state("profile", b"ann", "count") == 5
    assert cluster.client.typed_state("profile", b"ann", "values") == ["red", "green", "red", "blue", "red"]
    assert cluster.client.typed_state("profile", b"ann", "tally") == {"red": {"n": 3}, "green": {"n": 1},
                                                                       "blue": {"n": 1}}
    assert cluster.client.typed_state("profile", b"bob", "last") == "0xff00"  # bytes that are not text
    assert cluster.client.typed_state("profile", b"nobody", "count") is None

    done = _cli(cluster, "state", "get", "profile", "ann", "--state", "count")
    assert (done.returncode, done.stdout.strip()) == (0, "5"), done.stderr
    done = _cli(cluster, "state", "get", "profile", "ann", "--state", "tally", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"computation": "profile", "key": "ann", "state": "tally", "found": True,
                                       "value": {"red": {"n": 3}, "green": {"n": 1}, "blue": {"n": 1}}}
    done = _cli(cluster, "state", "get", "profile", "ann", "--state", "values")
    assert json.loads(done.stdout) == ["red", "green", "red", "blue", "red"], done.stderr

    done = _cli(cluster, "state", "get", "profile", "nobody", "--state", "count")
    assert done.returncode == 1 and "no state 'count' for key 'nobody'" in done.stdout, (done.stdout, done.stderr)
    done = _cli(cluster, "state", "get", "profile", "ann", "--state", "colour")
    assert done.returncode == 2, done.stdout
    assert "declares no typed state 'colour'" in done.stderr and "'tally' (MapState)" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    # Without --state: ctx.state, which this computation never sets.
    done = _cli(cluster, "state", "get", "profile", "ann")
    assert done.returncode == 1 and "no state for key 'ann'" in done.stdout, (done.stdout, done.stderr)
