"""Secrets off the command line (review S9): every token and the etcd password can come from a
file (``--X-file``, ``MILLSTREAM_X_FILE``) or a variable; one given on argv, where any local
user reads it in /proc/PID/cmdline, still works but gets one warning line."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from cli.flags import read_secrets
from cli.main import build_parser
from runtime.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parsed(argv: list[str]) -> object:
    args = build_parser().parse_args(argv)
    read_secrets(args)
    return args


def secret_file(tmp_path: object, name: str, text: str) -> str:
    path = os.path.join(str(tmp_path), name)
    with open(path, "w") as f:
        f.write(text)
    return path


def test_every_secret_is_read_from_its_file(tmp_path: object, caplog: pytest.LogCaptureFixture) -> None:
    files = {n: secret_file(tmp_path, n, f"{n}-value\n") for n in
             ("token", "worker-token", "injector-token", "operator-token", "etcd-password")}
    argv = ["master", *[x for n, p in files.items() for x in (f"--{n}-file", p)]]
    with caplog.at_level(logging.WARNING, logger="millstream"):
        args = parsed(argv)
    assert [getattr(args, n.replace("-", "_")) for n in files] == [f"{n}-value" for n in files]
    assert not caplog.records  # nothing secret on the command line


def test_the_file_can_be_named_by_the_environment(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MILLSTREAM_TOKEN", "from-the-variable")
    monkeypatch.setenv("MILLSTREAM_TOKEN_FILE", secret_file(tmp_path, "t", "from-the-file"))
    assert parsed(["status"]).token == "from-the-file"  # type: ignore[attr-defined]
    # A flag wins over the environment, as everywhere.
    assert parsed(["status", "--token", "from-argv"]).token == "from-argv"  # type: ignore[attr-defined]


def test_a_secret_on_the_command_line_works_and_warns_in_one_line(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MILLSTREAM_OPERATOR_TOKEN", "in-the-environment-is-fine")
    with caplog.at_level(logging.WARNING, logger="millstream"):
        args = parsed(["master", "--token", "t", "--etcd-password", "p"])
    assert (args.token, args.etcd_password, args.operator_token) == ("t", "p", "in-the-environment-is-fine")  # type: ignore[attr-defined]
    [warning] = [r.getMessage() for r in caplog.records]
    assert "\n" not in warning
    assert warning.startswith("--token, --etcd-password on the command line can be read by any user")
    assert "--token-file FILE, --etcd-password-file FILE" in warning


def test_a_secret_and_its_file_together_or_a_bad_file_are_refused(tmp_path: object) -> None:
    path = secret_file(tmp_path, "t", "x")
    with pytest.raises(ConfigError, match="--token and --token-file are both given"):
        parsed(["status", "--token", "y", "--token-file", path])
    with pytest.raises(ConfigError, match=r"--worker-token-file '.*nowhere': cannot read it \(No such file"):
        parsed(["worker", "--worker-token-file", os.path.join(str(tmp_path), "nowhere")])
    with pytest.raises(ConfigError, match="--etcd-password-file '.*' is empty"):
        parsed(["master", "--etcd-password-file", secret_file(tmp_path, "empty", "\n")])


def test_the_command_prints_the_warning_once_on_stderr() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MILLSTREAM_")}
    env["PYTHONPATH"] = ROOT
    out = subprocess.run([sys.executable, "-m", "cli", "status", "--masters", "127.0.0.1:1", "--timeout", "0.2",
                          "--token", "s3cret"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    lines = [x for x in out.stderr.splitlines() if "on the command line can be read" in x]
    assert len(lines) == 1 and "s3cret" not in out.stderr, out.stderr
