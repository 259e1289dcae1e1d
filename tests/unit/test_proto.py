"""The generated protocol code is what proto/millstream.proto generates."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ["millstream_pb2.py", "millstream_pb2.pyi", "millstream_pb2_grpc.py"]


def test_generated_code_is_up_to_date(tmp_path: Path) -> None:
    # Same command as the Makefile's `proto` target, writing under tmp_path instead.
    cmd = [
        sys.executable, "-m", "grpc_tools.protoc", "-Iruntime/wire=proto",
        f"--python_out={tmp_path}", f"--grpc_python_out={tmp_path}", f"--pyi_out={tmp_path}",
        "proto/millstream.proto",
    ]
    proc = subprocess.run(cmd, check=False, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"protoc failed: {proc.stderr}"
    stale = []
    for name in GENERATED:
        fresh = tmp_path / "runtime" / "wire" / name
        committed = ROOT / "runtime" / "wire" / name
        assert fresh.exists(), f"protoc did not write {fresh}"
        if not committed.exists() or fresh.read_bytes() != committed.read_bytes():
            stale.append(name)
    if stale:
        pytest.fail(f"runtime/wire/{', '.join(stale)} differ from proto/millstream.proto: "
                    "run `make proto` and commit")


def test_proto_package_is_millstream_v1() -> None:
    text = (ROOT / "proto" / "millstream.proto").read_text()
    assert "package millstream.v1;" in text
    assert os.path.exists(ROOT / "runtime" / "wire" / "millstream_pb2.py")


def test_every_rpc_is_named_in_the_architecture_page() -> None:
    """docs/architecture.md, "RPCs": a reader finds every call of the protocol there."""
    import re

    rpcs = re.findall(r"^\s*rpc (\w+)\(", (ROOT / "proto" / "millstream.proto").read_text(), re.M)
    page = (ROOT / "docs" / "architecture.md").read_text()
    section = page[page.index("\n## RPCs\n"):]
    section = section[:section.index("\n## ", 1)]
    assert len(rpcs) >= 27
    assert [r for r in rpcs if f"| `{r}` |" not in section] == []
