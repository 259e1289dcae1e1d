"""Bad input gets a one-line error that says what to do: no traceback, no hang."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from injectors import Injector
from runtime import Topology
from runtime.cluster import free_port
from runtime.errors import InjectionError, TopologyError
from runtime.record import END_OF_TIME
from tests.flowjobs import word_key
from tests.harness import Cluster, wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def millstream(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "cli", "--log-level", "ERROR", *args],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("millstream: error: "), lines[0]
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def test_bad_import_path_in_topology_is_refused_client_side(cluster: Cluster) -> None:
    proc = millstream("submit", "tests.jobs:BAD_CODE", "--masters", cluster.masters_arg)
    one_line_error(proc, "no_such_module_for_millstream", "cannot import")


def test_topology_clashing_with_a_running_one_is_refused_by_the_master(cluster: Cluster) -> None:
    a = Topology("a").add_computation("same", "tests.jobs:Poison", inputs={"x": None}, outputs=["y"])
    b = Topology("b").add_computation("same", "tests.jobs:Poison", inputs={"y": None}, outputs=["z"])
    cluster.client.submit(a)
    with pytest.raises(TopologyError, match="'same' is already used by a running topology"):
        cluster.client.submit(b)


def test_cycle_across_topologies_is_refused_by_the_master(cluster: Cluster) -> None:
    a = Topology("a").add_computation("first", "tests.jobs:Poison", inputs={"x": None}, outputs=["y"])
    b = Topology("b").add_computation("second", "tests.jobs:Poison", inputs={"y": None}, outputs=["x"])
    cluster.client.submit(a)
    with pytest.raises(TopologyError, match="cycle: .*first.*second"):
        cluster.client.submit(b)


def test_injecting_into_a_stream_nobody_reads_is_refused(cluster: Cluster) -> None:
    with pytest.raises(InjectionError, match="stream 'nowhere' is unknown"):
        with Injector(cluster.masters_arg, "nowhere", "lost") as inj:
            inj.send(b"k", b"v", 1)


def test_wrong_master_address() -> None:
    port = free_port()
    proc = millstream("status", "--masters", f"127.0.0.1:{port}", "--timeout", "1")
    one_line_error(proc, f"127.0.0.1:{port}", "millstream up")


def test_malformed_master_address() -> None:
    proc = millstream("status", "--masters", "localhost")
    one_line_error(proc, "'localhost' is not HOST:PORT")


def test_unreachable_etcd(tmp_path: object) -> None:
    port = free_port()
    proc = millstream("master", "--etcd", f"http://127.0.0.1:{port}", "--listen", "127.0.0.1:0")
    one_line_error(proc, f"127.0.0.1:{port}", "cannot reach etcd")


def test_follow_flags_without_follow_are_one_line_each(tmp_path: object) -> None:
    """`inject-files`'s follower flags, refused on the command line before any master is asked."""
    d = str(tmp_path)
    unreachable = f"127.0.0.1:{free_port()}"
    for flags, needle in ((["--poll-s", "2"], "are for --follow"), (["--done-dir", d], "are for --follow"),
                          (["--follow", "--timestamp-field", "ts"], "needs --max-delay-s"),
                          (["--follow", "--done-dir", d], "is the followed directory itself")):
        one_line_error(millstream("inject-files", d, "--stream", "s", "--masters", unreachable, *flags), needle)


def _holding(cluster: Cluster) -> set[str]:
    """The injectors holding a stream's watermark (a released one is listed as finished; an
    idle one holds nothing while another feeds its stream)."""
    return {i["name"] for i in cluster.client.status()["injectors"] if not i["finished"] and not i["idle"]}


def test_an_injector_that_may_not_key_its_streams_records_is_refused_before_it_holds_the_stream(
        cluster: Cluster, tmp_path: object) -> None:
    """A flow's key_by runs in the injector: without its module allowed, every record went to
    the dead letters (counted nowhere) and `inject-files` said it injected them, then finished
    the stream (a new user's walkthrough). Now nothing is sent or registered."""
    from runtime import Dataflow
    from runtime.imports import CodeNotAllowedError
    from runtime.sinks import FileSink

    flow = Dataflow("keyed")
    flow.input("clicks").key_by(word_key).sink(FileSink, name="keyed_out", path=os.path.join(str(tmp_path), "out"))
    cluster.client.submit(flow)
    cluster.wait_assigned()
    with pytest.raises(CodeNotAllowedError, match=r"injector 'clicker' cannot key the records of 'clicks'.*"
                                                  r"module 'tests.flowjobs' is not allowed in this injector.*"
                                                  r"allow_code=\['tests'\].*\(nothing was sent\)"):
        Injector(cluster.masters_arg, "clicks", "clicker")
    data = os.path.join(str(tmp_path), "in")
    os.makedirs(data)
    with open(os.path.join(data, "a.txt"), "w") as f:
        f.write("one\ntwo\n")
    one_line_error(millstream("inject-files", data, "--stream", "clicks", "--name", "clicker-files",
                              "--masters", cluster.masters_arg), "--allow-code", "nothing was sent")
    assert not {"clicker", "clicker-files"} & _holding(cluster)  # neither holds the stream
    with Injector(cluster.masters_arg, "clicks", "clicker", allow_code=["tests"]) as inj:  # allowed: it runs
        inj.send(b"", b"three", 1)
    assert cluster.client.status()["computations"]  # (the job runs on)


def test_an_injector_refused_for_an_unknown_stream_leaves_no_hold_and_a_crashed_one_is_released_by_the_cli(
        cluster: Cluster) -> None:
    """Left registered, a refused injector held a job submitted later on the stream at the start
    of time for a day, even once another injector fed it; `millstream release-injector` is the
    operator's way out for a crashed one."""
    with pytest.raises(InjectionError, match="stream 'later' is unknown"):
        with Injector(cluster.masters_arg, "later", "early-bird") as inj:
            inj.send(b"k", b"v", 1)
    assert "early-bird" not in _holding(cluster)
    cluster.client.submit(Topology("t").add_computation("reader", "tests.jobs:CountTo", inputs={"later": None},
                                                        outputs=["y"], params={"out": "y"}))
    cluster.wait_assigned()
    with Injector(cluster.masters_arg, "later", "feeder") as feeder:
        feeder.send(b"k", b"v", 1_000)
        feeder.advance_watermark(5_000)
        feeder.flush()
        wait_until(lambda: cluster.client.status()["computations"]["reader"]["low_watermark"] >= 5_000, 60,
                   "the reader's watermark to follow the injector that feeds it, not the refused one")
    inj = Injector(cluster.masters_arg, "later", "crashed")
    inj.send(b"k", b"v", 1)
    inj.flush()
    inj.close()  # without finish(): it holds the stream, as a crashed one does
    assert "crashed" in _holding(cluster)
    proc = millstream("release-injector", "crashed", "--stream", "later", "--masters", cluster.masters_arg)
    assert proc.returncode == 0 and "released injector 'crashed' on 'later'" in proc.stdout, proc.stderr
    assert "crashed" not in _holding(cluster)


def test_a_second_inject_files_run_into_a_finished_stream_warns_that_its_records_are_late(
        cluster: Cluster, tmp_path: object) -> None:
    """A run without --follow finishes its stream; a second one's records were late, silently
    (it printed `injected 3 lines`): it says so now, before sending."""
    cluster.client.submit(Topology("once").add_computation("once_count", "tests.jobs:CountTo", inputs={"once-in": None},
                                                           outputs=["once-out"], params={"out": "once-out"}))
    cluster.wait_assigned()
    data = os.path.join(str(tmp_path), "in")
    os.makedirs(data)
    with open(os.path.join(data, "a.txt"), "w") as f:
        f.write("one\ntwo\n")

    def inject() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cli", "inject-files", data, "--stream", "once-in",
                               "--masters", cluster.masters_arg], capture_output=True, text=True, timeout=120,
                              env=dict(os.environ, PYTHONPATH=ROOT), cwd=ROOT)

    first = inject()
    assert first.returncode == 0 and "end of time" not in first.stderr, first.stderr
    wait_until(lambda: cluster.client.status()["computations"]["once_count"]["low_watermark"] == END_OF_TIME, 60,
               "the finished stream's reader at the end of time")
    second = inject()
    assert second.returncode == 0, second.stderr
    assert "the watermark of 'once_count', reading 'once-in', is at the end of time" in second.stderr, second.stderr
    assert "--follow" in second.stderr


def test_what_the_cli_review_found_gets_one_line_too(tmp_path: object) -> None:
    """Review of the CLI: each of these printed a Python traceback (or hung, for --timeout nan):
    a key that is not UTF-8, a key range past 32 bits, a savepoint into a file, a port past
    65535, a token a gRPC header cannot carry, a log format the environment names wrongly."""
    d = str(tmp_path)
    unreachable = f"127.0.0.1:{free_port()}"
    token = os.path.join(d, "token")
    with open(token, "w") as f:
        f.write("päss\n")
    for args, needle in (
            (["state", "get", "counts", os.fsdecode(b"\xff"), "--masters", unreachable], "is not UTF-8 text"),
            (["move", "counts/4294967296", "w1", "--masters", unreachable], "is not COMPUTATION/RANGE"),
            (["savepoint", "wc", os.path.join(ROOT, "README.md"), "--masters", unreachable], "Not a directory"),
            (["status", "--masters", "127.0.0.1:99999"], "is not HOST:PORT"),
            (["status", "--masters", unreachable, "--token-file", token], "printable ASCII without spaces")):
        one_line_error(millstream(*args, timeout=30), needle)
    nan = millstream("status", "--masters", unreachable, "--timeout", "nan", timeout=30)
    assert nan.returncode == 2 and "Traceback" not in nan.stderr and "--timeout" in nan.stderr, nan.stderr
    env = dict(os.environ, PYTHONPATH=ROOT, MILLSTREAM_LOG_FORMAT="xml")
    xml = subprocess.run([sys.executable, "-m", "cli", "up", "--data-dir", d], capture_output=True,
                         text=True, timeout=30, env=env, cwd=ROOT)  # (refused before anything starts)
    one_line_error(xml, "log format 'xml'")


def test_a_reader_that_stops_reading_ends_the_cli_quietly(tmp_path: object) -> None:
    """`millstream explain ... | head -1`: the reader closing the pipe gave a BrokenPipeError
    traceback (review of the CLI)."""
    with open(os.path.join(str(tmp_path), "pipeflow.py"), "w") as f:
        f.write("from runtime import Dataflow\nFLOW = Dataflow('pf')\nFLOW.input('in').output('out')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, str(tmp_path)]))
    proc = subprocess.Popen([sys.executable, "-m", "cli", "explain", "pipeflow:FLOW"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, cwd=str(tmp_path))
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the child writes a byte (its interpreter is still starting)
    err = proc.stderr.read().decode()
    assert proc.wait(30) == 0 and "Traceback" not in err, err
