"""The command line a newcomer meets first (issue 32): `--version`, `status --computation`'s
narrowing, the Java check before Spark starts, and a missing extra named in one line."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version

import pytest

from cli.java import check_java, major_version
from cli.status import only
from runtime.errors import ConfigError, MissingExtraError
from runtime.extras import require


def _cli(*args: str, code: str = "") -> subprocess.CompletedProcess[str]:
    prog = f"import sys\n{code}\nfrom cli.main import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", prog, *args], capture_output=True, text=True, timeout=120,
                          check=False)


def test_version_prints_the_installed_version() -> None:
    done = _cli("--version")
    assert (done.returncode, done.stdout.strip()) == (0, f"millstream {version('millstream')}"), done.stderr


DOC = {
    "masters": {"leader": "m:1", "all": ["m:1"]},
    "workers": [{"id": "w1", "address": "a:1", "tablets": 3, "followed": 0, "last_heartbeat_ms_ago": 5}],
    "topologies": {"wc": {"state": "running", "computations": {
        "splitter": {"inputs": {"lines": None}, "outputs": ["words"], "key_ranges": 1},
        "counter": {"inputs": {"words": None}, "outputs": ["counts"], "key_ranges": 2}}}},
    "computations": {"splitter": {"processed": 1}, "counter": {"processed": 2}},
    "tablets": [{"computation": "splitter", "key_range": 0}, {"computation": "counter", "key_range": 0},
                {"computation": "counter", "key_range": 1}],
    "injectors": [{"name": "i", "stream": "lines"}, {"name": "j", "stream": "words"}],
    "expired_injectors": [],
}


def test_status_computation_keeps_only_that_computation() -> None:
    doc = only(DOC, "counter")
    assert list(doc["computations"]) == ["counter"]
    assert [t["key_range"] for t in doc["tablets"]] == [0, 1]
    assert list(doc["topologies"]["wc"]["computations"]) == ["counter"]
    assert [i["name"] for i in doc["injectors"]] == ["j"]  # the one feeding its input stream
    assert doc["workers"] == DOC["workers"] and doc["masters"] == DOC["masters"]
    assert list(DOC["computations"]) == ["splitter", "counter"], "the document given is left as it was"


def test_status_computation_names_what_exists_when_it_does_not() -> None:
    with pytest.raises(ConfigError, match=r"no computation 'count' in the cluster \(it has: counter, splitter\)"):
        only(DOC, "count")


@pytest.mark.parametrize("said, major", [
    ('openjdk version "17.0.15" 2025-04-15', 17),
    ('openjdk version "21" 2023-09-19', 21),
    ('java version "1.8.0_402"', 8),
    ("no version here", None),
])
def test_java_versions_are_read_as_spark_needs_them(said: str, major: int | None) -> None:
    assert major_version(said) == major


def test_a_java_home_without_java_is_one_line(tmp_path: object) -> None:
    with pytest.raises(ConfigError, match=r"needs Java 17 or later \(JAVA_HOME=.* has no bin/java\); install"):
        check_java("millstream demo", str(tmp_path))


def test_an_old_java_is_refused_in_one_line(tmp_path: object) -> None:
    import os

    java = os.path.join(str(tmp_path), "bin", "java")
    os.makedirs(os.path.dirname(java))
    with open(java, "w") as f:
        f.write('#!/bin/sh\necho \'openjdk version "11.0.2" 2019-01-15\' >&2\n')
    os.chmod(java, 0o755)
    with pytest.raises(ConfigError, match=r"needs Java 17 or later \(Java 11 at .*bin/java\)"):
        check_java("millstream demo", str(tmp_path))


def test_a_missing_extra_names_the_extra() -> None:
    with pytest.raises(MissingExtraError, match=r"needs no_such_module_x.*pip install 'millstream\[spark\]'"):
        require("no_such_module_x", "spark", "the thing")


def test_demo_without_pyspark_says_which_extra_to_install() -> None:
    done = _cli("demo", code="sys.modules['pyspark'] = None  # as if the spark extra were not installed")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "millstream: error: millstream demo needs pyspark, which is not installed here (import of pyspark "
        "halted; None in sys.modules); install millstream's 'spark' extra: pip install 'millstream[spark]'"]


def test_the_spark_bridge_without_pyarrow_says_which_extra_to_install() -> None:
    code = ("import sys\nsys.modules['pyarrow'] = None\n"
            "from runtime.errors import MissingExtraError\n"
            "try:\n    import spark_bridge\nexcept MissingExtraError as e:\n    print(e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert "the Spark bridge (spark_bridge) needs pyarrow" in done.stdout, done.stderr
    assert "pip install 'millstream[spark]'" in done.stdout


def test_the_core_commands_import_without_spark_arrow_or_pandas() -> None:
    # What a worker, a master, an injector and a client load: none of the spark extra.
    code = ("import sys\nfor m in ('pyspark', 'pyarrow', 'pandas'):\n    sys.modules[m] = None\n"
            "import cli.main, master.server, worker.server, injectors, runtime.client, millstream\n"
            "from cli.main import build_parser\n"
            "for cmd in (['master', '--etcd', 'http://x:1'], ['worker'], ['status'], ['inject-files', 'd', "
            "'--stream', 's']):\n    build_parser().parse_args(cmd)\nprint('ok')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.stdout.strip() == "ok", done.stderr[-2000:]


def test_a_port_the_last_up_left_in_time_wait_is_free_and_one_listened_on_is_not() -> None:
    """`millstream up` run again within a minute kept its master on 7070: the port's old
    connections in TIME-WAIT do not make it taken (the master binds as gRPC does)."""
    import socket

    from cli.up import _free

    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        assert not _free(port)
        client = socket.create_connection(("127.0.0.1", port))
        served, _ = listener.accept()
        served.close()  # the server's side closes first: its socket waits in TIME-WAIT
        assert client.recv(1) == b""
        client.close()
    assert _free(port)
