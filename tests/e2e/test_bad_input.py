"""Bad input at the command line and against a running cluster (docs/bad-input.md): one clear
line that says what was wrong and how to fix it, no traceback, no hang, nothing lost."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

from injectors import Injector
from runtime import Topology
from runtime.errors import InjectionError, TopologyError
from runtime.sinks import read_file_sink
from tests.harness import Cluster, wait_until

BASE_TS = 1_700_000_000_000_000

CLI = [
    # (argv, extra environment, text the one-line error must contain)       review finding
    (["master", "--etcd", "http://127.0.0.1:1"], {"MILLSTREAM_LEASE_MS": "abc"},
     "'abc' is not a whole number (--lease-ms or MILLSTREAM_LEASE_MS"),       # B1
    (["master", "--etcd", "http://127.0.0.1:1", "--lease-ms", "10"], {}, "out of range 500"),
    (["master", "--etcd", "http://127.0.0.1:1", "--http-listen", "localhost"], {},
     "'localhost' is not HOST:PORT"),                                           # B2
    (["worker", "--masters", "127.0.0.1:1", "--state-dir", "/tmp/x", "--metrics-listen", "9464"], {},
     "'9464' is not HOST:PORT"),                                                # B3
    (["master", "--etcd", "http://127.0.0.1:1", "--http-listen", ":8080"], {}, "':8080' is not HOST:PORT"),  # B3
    (["--log-level", "bogus", "status"], {}, "invalid choice: 'bogus'"),        # B4
    (["up", "--masters", "0"], {}, "out of range 1..7"),                        # B8
    (["worker", "--masters", "127.0.0.1:1"], {}, "--state-dir is required"),
    (["worker", "--masters", "127.0.0.1:1", "--state-dir", "/tmp/x", "--allow-code", "my jobs"], {},
     "is not a module prefix"),
    (["status", "--masters", "not an address"], {}, "not an address"),        # B46
    (["worker", "--masters", "127.0.0.1:1", "--state-dir", "/tmp/x", "--tls-cert", "/nonexistent.pem"], {},
     "tls"),                                                                    # B46
    (["submit", "no_such_module_for_millstream:topo", "--masters", "127.0.0.1:1"], {},
     "cannot import module"),
    (["move", "counter", "w1", "--masters", "127.0.0.1:1"], {}, "is not COMPUTATION/RANGE"),
    (["status", "--masters", "127.0.0.1:1", "--token-file", "/nonexistent-token"], {},
     "--token-file '/nonexistent-token': cannot read it"),                      # S9
    (["status", "--masters", "127.0.0.1:1", "--token", "t", "--token-file", "/dev/null"], {},
     "--token and --token-file are both given"),                                # S9
    (["up", "--etcd-binary", "/nonexistent/etcd"], {}, "does not exist or is not executable"),
    (["worker", "--masters", "127.0.0.1:1", "--state-dir", "/tmp/x", "--require-injector-credentials"], {},
     "--require-injector-credentials needs --worker-token"),                    # B64
    (["credential", "team-a"], {"MILLSTREAM_WORKER_TOKEN": ""}, "--worker-token-file is required"),   # B64
    (["inject-files", "/tmp", "--stream", "s", "--masters", "127.0.0.1:1", "--injector-credential-file",
      "/dev/null"], {}, "--injector-credential-file '/dev/null' is empty"),     # B64
]


@pytest.mark.parametrize(("argv", "env", "error"), CLI, ids=[" ".join(c[0])[:60] for c in CLI])
def test_a_bad_command_line_gets_one_clear_line(argv: list[str], env: dict[str, str], error: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "cli", *argv], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **env}, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert error.lower() in proc.stderr.lower(), proc.stderr[-2000:]


# ------------------------------------------------------------- a running cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(str(tmp_path_factory.mktemp("bad-input")), workers=2).running() as c:
        yield c


def _submit_unchecked(cluster: Cluster, topo: Topology) -> None:
    """Submit as a raw RPC would: without the client's own import checks, so what the
    workers do with such code is what is tested."""
    from runtime.wire import millstream_pb2 as pb

    cluster.client.call(lambda s: s.Submit(pb.SubmitRequest(topology_json=topo.to_json()), timeout=30))


def test_code_the_workers_cannot_import_is_shown_in_status_and_others_run(cluster: Cluster) -> None:
    """B10: it used to stall silently (an INFO line every 200 ms)."""
    topo = Topology("unimportable")
    topo.add_computation("ghost", "tests.jobs:NoSuchComputation", inputs={"ghost-in": None})
    _submit_unchecked(cluster, topo)

    def reported() -> bool:
        return bool(cluster.client.status()["computations"]["ghost"]["problems"])

    wait_until(reported, 30, "status to report the ghost computation's tablets")
    problem = cluster.client.status()["computations"]["ghost"]["problems"][0]
    assert "has no attribute 'NoSuchComputation'" in problem["error"]
    # The cluster still does real work.
    out = os.path.join(cluster.data_dir, "still-fine")
    ok = Topology("still-fine")
    ok.add_computation("fine", "runtime.sinks:FileSink", inputs={"fine-in": None}, params={"path": out})
    cluster.client.submit(ok)
    with Injector(cluster.masters_arg, "fine-in", "fine-source") as inj:
        inj.send(b"k", b"v", BASE_TS)
    wait_until(lambda: len(list(read_file_sink(out))) == 1, 30, "the other topology's output")


def test_code_outside_the_allowed_modules_is_refused_before_it_runs(cluster: Cluster) -> None:
    """S2: a topology naming os:getcwd (or sys:exit) is refused by every worker: at submit,
    by the leader, which knows every worker's --allow-code."""
    topo = Topology("not-allowed")
    topo.add_computation("exit", "sys:exit", inputs={"exit-in": None})
    with pytest.raises(TopologyError, match=r"computation 'exit': code 'sys:exit' is from module 'sys', which "
                       r"workers .* do not allow; start them with --allow-code sys"):
        _submit_unchecked(cluster, topo)
    assert all(w.alive() for w in cluster.workers)
    status = cluster.client.status()
    assert "exit" not in status["computations"] and not [t for t in status["tablets"] if t["computation"] == "exit"]


def test_code_a_worker_may_not_load_is_refused_at_submit_and_named_in_jobs_at_once(cluster: Cluster) -> None:
    """Issue 28: with workers started without --allow-code for the user's module, submit
    succeeded and the tablets retried opening for ever (`cannot open (attempt 1000)`)."""
    topo = Topology("loadable-before")
    topo.add_computation("counted", "tests.jobs:CountTo", inputs={"counted-in": None}, key_ranges=2)
    cluster.client.submit(topo)
    allow, cluster.allow_code = cluster.allow_code, ""  # this worker allows only the built-in code
    try:
        narrow = cluster.add_worker()
    finally:
        cluster.allow_code = allow
    try:
        cluster.wait_ready(workers=3)
        # Named at once, from the policy it registered with (no tablet had to fail first).
        refused = cluster.client.status()["computations"]["counted"]["code_refused"]
        assert len(refused) == 1 and narrow.address in refused[0] and "--allow-code tests" in refused[0], refused
        jobs = subprocess.run([sys.executable, "-m", "cli", "jobs", "--masters", cluster.masters_arg],
                              capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert "CANNOT LOAD: computation 'counted': code 'tests.jobs:CountTo'" in jobs.stdout, jobs.stdout
        late = Topology("refused-now")
        late.add_computation("refused", "tests.jobs:CountTo", inputs={"refused-in": None})
        with pytest.raises(TopologyError, match=(
                rf"computation 'refused': code 'tests.jobs:CountTo' is from module 'tests.jobs', which worker "
                rf"\w+ \({re.escape(narrow.address)}\) does not allow; start it with --allow-code tests")):
            cluster.client.submit(late)
        assert "refused-now" not in [j["name"] for j in cluster.client.jobs()]
    finally:
        cluster.kill(narrow)
        cluster.workers.remove(narrow)
    wait_until(lambda: not cluster.client.status()["computations"]["counted"]["code_refused"], 15,
               "the narrow worker to be gone from status")
    assert cluster.client.cancel("loadable-before") == "cancelled"


def test_large_values_in_large_batches_are_delivered(cluster: Cluster) -> None:
    """B18: 1,000 values of 64 KiB in one producer batch (64 MiB) used to exceed the message
    limit between workers and be retried forever; deliveries are now cut by bytes."""
    out = os.path.join(cluster.data_dir, "large")
    topo = Topology("large")
    topo.add_computation("fan", "tests.jobs:FanOut", inputs={"large-in": None}, outputs=["large-out"],
                         params={"copies": "100", "size": str(64 << 10)})
    topo.add_computation("large-sink", "tests.jobs:CountingSink", inputs={"large-out": None},
                         params={"path": out}, key_ranges=2)
    cluster.client.submit(topo)
    with Injector(cluster.masters_arg, "large-in", "large-source", batch_size=10) as inj:
        for i in range(10):
            inj.send(b"k%d" % i, b"", BASE_TS + i)
    wait_until(lambda: len(list(read_file_sink(out))) == 1000, 120, "1,000 large values")
    assert {r["value"] for r in read_file_sink(out)} == {str(64 << 10)}


def test_an_injector_refuses_bad_records_at_the_call(cluster: Cluster) -> None:
    """B23, B27: the error names the value and the fix; nothing half-sent."""
    topo = Topology("bad-records")
    topo.add_computation("bad-records-sink", "runtime.sinks:FileSink", inputs={"bad-records-in": None},
                         params={"path": os.path.join(cluster.data_dir, "bad-records")})
    cluster.client.submit(topo)
    with Injector(cluster.masters_arg, "bad-records-in", "bad-records") as inj:
        with pytest.raises(InjectionError, match="bytes"):
            inj.send("text-key", b"v", BASE_TS)  # type: ignore[arg-type]
        with pytest.raises(InjectionError, match="bytes"):
            inj.send(b"k", "text-value", BASE_TS)  # type: ignore[arg-type]
    with pytest.raises(InjectionError, match="no running computation reads it"):
        with Injector(cluster.masters_arg, "no-such-stream-anyone-reads", "typo") as inj:
            inj.send(b"k", b"v", BASE_TS)


def test_an_injector_refuses_out_of_range_input_and_keeps_what_it_had(cluster: Cluster) -> None:
    """B21, B22, B20: a bad record used to stay in the buffer and fail every later flush."""
    out = os.path.join(cluster.data_dir, "range-checks")
    topo = Topology("range-checks")
    topo.add_computation("range-sink", "runtime.sinks:FileSink", inputs={"range-in": None}, params={"path": out})
    cluster.client.submit(topo)
    with Injector(cluster.masters_arg, "range-in", "range-checks") as inj:
        with pytest.raises(InjectionError, match=r"timestamp 1180591620717411303424 must be an int .* 64 bits"):
            inj.send(b"k", b"v", 2**70)
        with pytest.raises(InjectionError, match="watermark 18446744073709551616 must be"):
            inj.advance_watermark(2**64)
        with pytest.raises(InjectionError, match="id must be 16 bytes"):
            inj.send(b"k", b"v", BASE_TS, id=b"short")
        with pytest.raises(InjectionError, match="over the limits"):
            inj.send(b"k", b"x" * (17 << 20), BASE_TS)
        assert inj.position == 0 and inj.queued == 0  # nothing of them was taken
        inj.send(b"k", b"good", BASE_TS + 1)
        inj.flush()
    wait_until(lambda: [r["value"] for r in read_file_sink(out)] == ["good"], 30, "the good record")
