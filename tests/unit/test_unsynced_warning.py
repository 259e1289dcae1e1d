"""Review E6: ``exactly_once=True, fsync=False`` acknowledges commits before they are on disk.
Allowed (with replication on other hosts it is a sound trade), but submitting it says so in
one line (docs/guide.md#fsync)."""

from __future__ import annotations

import logging

import pytest

from runtime import Topology
from runtime.client import warn_unsynced


def test_only_exactly_once_without_fsync_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    topo = Topology("fast")
    for name, exactly_once, fsync in (("a", True, False), ("b", True, None), ("c", True, True),
                                      ("d", False, False), ("e", True, False)):
        topo.add_computation(name, "tests.jobs:Nothing", inputs={"in": None}, exactly_once=exactly_once, fsync=fsync)
    with caplog.at_level(logging.WARNING, logger="runtime.client"):
        assert warn_unsynced(topo) == ["a", "e"]
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("topology 'fast': a, e are exactly_once=True with fsync=False")
    assert "host crash" in line and "docs/guide.md#fsync" in line and "\n" not in line


def test_the_default_is_not_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    topo = Topology("safe").add_computation("a", "tests.jobs:Nothing", inputs={"in": None})
    with caplog.at_level(logging.WARNING, logger="runtime.client"):
        assert warn_unsynced(topo) == []
    assert not caplog.records
