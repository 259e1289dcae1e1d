"""The Bytewax peer (bench/bytewax_peer.py): the input it writes, the check of its spikes
against W2's oracle, and a clear line when Bytewax cannot be installed. The Bytewax job itself
runs in ``millstream bench --peer bytewax`` (a virtualenv of its own, .venv-bytewax); the last
test here runs it (recovery off on one worker and on one per core, recovery on) on a small W2
when that virtualenv is made (or, with ``MILLSTREAM_BYTEWAX_TESTS=1``, makes it first)."""

from __future__ import annotations

import os
from collections import Counter

import pytest

from bench import bytewax_env, bytewax_peer, generator
from bench.workloads import BenchConfig

DATA = generator.w2_data(20_000, events_per_second=2_000, spikes=10, n_keys=200)
ORACLE = generator.w2_oracle(DATA)


def test_input_lines_hold_every_record_in_order(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "in.csv")
    bytewax_peer.write_input(DATA, path)
    with open(path, "rb") as f:
        rows = [line.split(b",") for line in f.read().splitlines()]
    assert [k for k, _ in rows] == DATA.keys and [int(t) for _, t in rows] == DATA.timestamps


def _spikes_file(tmp_path: object, lines: list[tuple[bytes, int, int]]) -> str:
    path = os.path.join(str(tmp_path), "out.txt")
    with open(path, "wb") as f:
        f.writelines(b"%s %d %d\n" % x for x in lines)
    return path


def test_the_check_is_millstreams_w2_check(tmp_path: object) -> None:
    assert ORACLE.spikes
    right = [(k, w, ORACLE.windows[(k, w)]) for k, w in sorted(ORACLE.spikes)]
    got = bytewax_peer.check(bytewax_peer.read_spikes(_spikes_file(tmp_path, right)), ORACLE)
    assert got == {"spikes_observed": len(right), "spikes_expected": len(right), "oracle_equal": True}
    doubled = bytewax_peer.read_spikes(_spikes_file(tmp_path, [*right, right[0]]))
    assert doubled[right[0]] == 2
    assert bytewax_peer.check(doubled, ORACLE)["oracle_equal"] is False
    assert bytewax_peer.check(Counter(right[1:]), ORACLE)["oracle_equal"] is False  # one lost
    k, w, c = right[0]
    wrong_count = Counter([(k, w, c + 1), *right[1:]])
    assert bytewax_peer.check(wrong_count, ORACLE)["oracle_equal"] is False


def test_bytewax_that_cannot_be_installed_is_one_line_not_a_failure(tmp_path: object, monkeypatch) -> None:
    req = os.path.join(str(tmp_path), "requirements.txt")
    with open(req, "w") as f:
        f.write("this-is-not-a-requirement-line ===\n")
    venv = os.path.join(str(tmp_path), "venv")
    with pytest.raises(bytewax_env.BytewaxUnavailableError, match="pip install"):
        bytewax_env.ensure_venv(venv, req)

    def unavailable() -> str:
        raise bytewax_env.BytewaxUnavailableError("no wheel for this platform")

    monkeypatch.setattr(bytewax_peer, "ensure_venv", unavailable)
    out = bytewax_peer.run(str(tmp_path), BenchConfig.make(True), DATA, ORACLE)
    assert out["runs"] == []
    assert out["error"] == ("cannot run Bytewax here, no Bytewax figures in this report: "
                            "no wheel for this platform")


@pytest.mark.skipif(os.environ.get("MILLSTREAM_BYTEWAX_TESTS") != "1" and not bytewax_env.venv_ready(),
                    reason="needs .venv-bytewax (made from PyPI by `millstream bench --peer bytewax`); "
                           "set MILLSTREAM_BYTEWAX_TESTS=1 to make it here")
@pytest.mark.timeout(600)
def test_w2_on_bytewax_is_exact_with_recovery_off_and_on(tmp_path: object) -> None:
    out = bytewax_peer.run(str(tmp_path), BenchConfig.make(True), DATA, ORACLE)
    assert "error" not in out, out.get("error")
    assert [(r["recovery"], r["processes"]) for r in out["runs"]] == (
        [("off", n) for n in bytewax_peer.PROCESSES] + [("1 s snapshots", 1)])
    for run in out["runs"]:
        assert "error" not in run, run["error"]
        assert run["oracle_equal"] is True and run["spikes_observed"] == len(ORACLE.spikes)
        assert run["throughput_rps"] > 0 and run["records_per_cpu_s"] > 0
    assert out["version"] == "0.21.1"
