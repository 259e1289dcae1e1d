"""A savepoint's manifest lists every file of every tablet (name, size, SHA-256), and a restore
checks them before it changes anything, and the worker again before it installs a tablet: a
savepoint that lost files never restores as empty state (review N8)."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from runtime import savepoint
from runtime.errors import MillstreamError
from runtime.wire import millstream_pb2 as pb
from worker.server import _differs

TOPOLOGY = json.dumps({"name": "job", "computations": {}})


def _saved(directory: str, files: dict[str, bytes], fmt: int = savepoint.FORMAT) -> str:
    where = savepoint.tablet_dir(directory, "a", 0)
    os.makedirs(where)
    for name, data in files.items():
        with open(os.path.join(where, name), "wb") as f:
            f.write(data)
    tablet: dict[str, Any] = {"computation": "a", "key_range": 0, "start": 0, "end": 1 << 64, "token": 1}
    if fmt >= 2:
        tablet["files"] = savepoint.digests(where)
    with open(os.path.join(directory, savepoint.MANIFEST), "w") as f:
        json.dump({"format": fmt, "job": "job", "topology": TOPOLOGY, "tablets": [tablet], "watermarks": {}}, f)
    return where


class NoCluster:
    """A client whose leader must not be called: the check comes first."""

    timeout = 1.0

    def call(self, fn: Any) -> Any:
        raise AssertionError("the restore reached the leader with a damaged savepoint")


def test_the_manifest_lists_each_file_and_a_lost_one_fails_the_restore(tmp_path: Any) -> None:
    where = _saved(str(tmp_path), {"CURRENT": b"MANIFEST-000001\n", "000007.sst": b"x" * 100})
    listed = savepoint.read_manifest(str(tmp_path))["tablets"][0]["files"]
    assert [(f["name"], f["size"]) for f in listed] == [("000007.sst", 100), ("CURRENT", 16)]
    os.remove(os.path.join(where, "000007.sst"))
    with pytest.raises(MillstreamError, match="tablet a/0 lacks its file '000007.sst'.*damaged"):
        savepoint.restore(NoCluster(), str(tmp_path))  # type: ignore[arg-type]


def test_a_file_changed_in_place_fails_the_restore_before_the_leader_hears_of_it(tmp_path: Any) -> None:
    where = _saved(str(tmp_path), {"CURRENT": b"MANIFEST-000001\n", "000007.sst": b"x" * 100})
    with open(os.path.join(where, "000007.sst"), "r+b") as f:
        f.write(b"y")  # same size, other bytes
    savepoint.read_manifest(str(tmp_path))  # sizes match: only the checksum tells
    with pytest.raises(MillstreamError, match="'000007.sst' differs from what the manifest says"):
        savepoint.restore(NoCluster(), str(tmp_path))  # type: ignore[arg-type]


def test_an_empty_tablet_directory_of_an_older_savepoint_is_refused(tmp_path: Any) -> None:
    _saved(str(tmp_path), {}, fmt=1)
    with pytest.raises(MillstreamError, match="tablet a/0 lacks its file 'CURRENT'.*empty state"):
        savepoint.read_manifest(str(tmp_path))


def test_the_worker_installs_only_the_files_the_manifest_lists(tmp_path: Any) -> None:
    where = _saved(str(tmp_path), {"CURRENT": b"MANIFEST-000001\n", "000007.sst": b"x" * 100})
    listed = [pb.FileDigest(name=f["name"], size=f["size"], sha256=f["sha256"]) for f in savepoint.digests(where)]
    assert _differs(where, listed) == ""
    assert _differs(where, []) == ""  # an older client sends no list
    os.truncate(os.path.join(where, "000007.sst"), 50)
    assert _differs(where, listed) == "its file '000007.sst' has 50 bytes, the savepoint's manifest says 100"
    os.remove(os.path.join(where, "000007.sst"))
    assert _differs(where, listed) == "its file '000007.sst' did not arrive"


def test_the_worker_refuses_a_manifest_naming_files_outside_the_copy_or_missing_one_that_came(
        tmp_path: Any) -> None:
    """A manifest is looked at only within the loaded copy (a name reaching outside it would
    tell a caller another file's size), and names every file that came."""
    where = _saved(str(tmp_path), {"CURRENT": b"MANIFEST-000001\n", "000007.sst": b"x" * 100})
    listed = [pb.FileDigest(name=f["name"], size=f["size"], sha256=f["sha256"]) for f in savepoint.digests(where)]
    outside = pb.FileDigest(name="/etc/hostname", size=1, sha256="0" * 64)
    for name in ("/etc/hostname", "../000007.sst", ".hidden", ""):
        outside.name = name
        assert _differs(where, [*listed, outside]) == (f"its manifest names {name!r}, which is not the name of "
                                                        "a file of a tablet")
    assert _differs(where, listed[1:]) == "its file '000007.sst' is not in the savepoint's manifest"
