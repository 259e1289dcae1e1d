"""The command line on a real cluster (issue 32): `state get COMPUTATION KEY --state NAME` reads a
running job's typed state (ValueState, ListState, MapState declared on the class) from the
worker that holds the key's tablet, as JSON; `status --computation` and `status --watch`;
`millstream up` prints the console's address, which serves the console."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request

from injectors import Injector
from runtime.topology import Topology
from tests.harness import Cluster, wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

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
    # Without --state: ctx.state, which this computation never sets; the answer names the
    # typed states it has instead, which --state reads.
    assert cluster.client.state_names("profile") == ["count", "last", "tally", "values"]
    done = _cli(cluster, "state", "get", "profile", "ann")
    assert done.returncode == 1 and "no state for key 'ann' (ctx.state)" in done.stdout, (done.stdout, done.stderr)
    assert "its typed states, read with --state NAME: count, last, tally, values" in done.stdout, done.stdout


def _lines_of(proc: subprocess.Popen[str]) -> list[str]:
    """The process's stdout lines as they come (read by a thread; the list grows)."""
    lines: list[str] = []
    out = proc.stdout
    assert out is not None
    threading.Thread(target=lambda: lines.extend(iter(out.readline, "")), daemon=True).start()
    return lines


def test_status_narrows_to_one_computation_and_watches(cluster: Cluster) -> None:
    from examples import wordcount

    cluster.client.submit(wordcount.topology(os.path.join(cluster.data_dir, "out"), name="wc"))
    cluster.wait_assigned()
    done = _cli(cluster, "status", "--computation", "counter", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert list(doc["computations"]) == ["counter"]
    assert doc["tablets"] and {t["computation"] for t in doc["tablets"]} == {"counter"}
    done = _cli(cluster, "status", "--computation", "counte")
    assert done.returncode == 2 and "no computation 'counte' in the cluster (it has: counter, counts_sink, " \
        "splitter)" in done.stderr, done.stderr

    proc = subprocess.Popen([sys.executable, "-m", "cli", "status", "--masters", cluster.masters_arg, "--watch",
                             "0.2", "--computation", "counter"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        lines = _lines_of(proc)
        wait_until(lambda: sum(line.startswith("millstream status at") for line in lines) >= 2, 60,
                   "two reports of `status --watch`")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
    report = "".join(lines)
    assert "counter/0" in report and "splitter/0" not in report, report[-3000:]


def test_up_prints_the_console_address_and_the_console_answers(tmp_path: object) -> None:
    """... and the code its workers load: the directory's modules, and those of --allow-code
    (a module written after `up` started: a new user's walkthrough had no way to add it).
    Ctrl-C, as a terminal sends it (to the whole process group), stops the workers while the
    master still answers: they used to get it with the master and wait out their calls to it."""
    data = os.path.join(str(tmp_path), "data")
    proc = subprocess.Popen([sys.executable, "-m", "cli", "--log-level", "WARNING", "up", "--workers", "1",
                             "--port", "0", "--data-dir", data, "--allow-code", "written_later, acme.jobs"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=ROOT), cwd=ROOT, start_new_session=True)
    try:
        lines = _lines_of(proc)
        wait_until(lambda: any(line.startswith("ready:") for line in lines), 90, "`millstream up` to be ready")
        console = next((line.split()[1] for line in lines if line.startswith("console ")), None)
        assert console is not None and console.startswith("http://127.0.0.1:"), lines
        with urllib.request.urlopen(console, timeout=30) as r:
            assert b"<title>millstream</title>" in r.read()
        with urllib.request.urlopen(console.rstrip("/") + "/status.json", timeout=30) as r:
            assert "error" not in json.loads(r.read()), "the console printed is the leader's"
        [code] = [line for line in lines if line.startswith("code ")]
        assert "tests" in code and "written_later, acme.jobs" in code, code  # (the repository's own, then those)
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # (a terminal's Ctrl-C: the foreground process group)
        proc.wait(60)
    assert proc.returncode == 0
    with open(os.path.join(data, "logs", "worker-1.log")) as f:
        log = f.read()
    assert "could not tell the master we leave" not in log and "drain did not finish" not in log, log[-2000:]
