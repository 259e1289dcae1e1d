"""Spark's read of a savepoint's typed state (spark_bridge/state.py), on a RocksDB written by
hand in the tablet's layout: which entries count as expired."""

from __future__ import annotations

import os
from typing import Any

from rocksdict import Options, Rdict

from runtime import codecs
from runtime.record import END_OF_TIME
from runtime.state import _EXPIRY, VALUE, cell, kept
from spark_bridge.state import _typed_rows


def test_state_without_a_ttl_is_read_at_a_watermark_at_the_end_of_time(tmp_path: Any) -> None:
    """Review of typed state (2): an entry's expiry was compared with the savepoint's watermark
    as is, and state without a TTL is stored with the end of time as its expiry: a savepoint
    of a drained job (or of a computation whose input finished) read as holding none."""
    path = os.path.join(str(tmp_path), "tablet")
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    db = Rdict(path, options=opts)
    db[cell(b"kept", "count") + VALUE] = kept(codecs.INT.encode(5))
    db[cell(b"gone", "count") + VALUE] = _EXPIRY.pack(1_000) + codecs.INT.encode(7)  # a TTL'd value
    db.close()
    for wm in (END_OF_TIME, 2_000):
        rows = _typed_rows((0, path, "tests.jobs:TypedCounter", {}, "count", wm, 0))
        assert [(r[0], r[3]) for r in rows] == [("kept", "5")], wm
    assert {r[0] for r in _typed_rows((0, path, "tests.jobs:TypedCounter", {}, "count", 500, 0))} == {"kept", "gone"}


def test_a_flows_state_is_read_by_its_steps_names(tmp_path: Any) -> None:
    """A flow's stage declares no typed state of its own: Spark read none of a flow's. It names
    its steps' now (runtime/flows/stage.py readable_states), stored under the step's names."""
    from runtime import Dataflow
    from runtime.flows.values import VALUES
    from runtime.state import _INDEX, ELEMENT
    from tests import flowjobs as j

    flow = Dataflow("rs", key_ranges=1)
    flow.input("w", codec=codecs.STR).key_by(j.word_key).map(j.one) \
        .reduce(j.add, name="counts").process(j.Unmakeable, name="remember").output("out", codec=codecs.INT)
    [spec] = [c for c in flow.topology().computations.values() if c.name != "rs.input"]
    path = os.path.join(str(tmp_path), "tablet")
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    db = Rdict(path, options=opts)
    db[cell(b"a", "flow/counts") + VALUE] = kept(VALUES.encode(3))
    db[cell(b"a", "flow/remember/state") + VALUE] = kept(b"3")  # the step's ctx.state: bytes
    for i, n in enumerate([1, 2, 3]):
        db[cell(b"a", "flow/remember/seen") + ELEMENT + _INDEX.pack(i)] = kept(codecs.INT.encode(n))
    db.close()
    code, params = spec.code, dict(spec.params)
    assert [(r[0], r[2], r[3]) for r in _typed_rows((0, path, code, params, "counts", END_OF_TIME, 0))] == [("a", None, "3")]
    rows = _typed_rows((0, path, code, params, "remember/seen", END_OF_TIME, 0))
    assert [(r[0], r[2], r[3]) for r in rows] == [("a", "0", "1"), ("a", "1", "2"), ("a", "2", "3")]
    # bytes as the CLI prints them (text, or 0x... hex), not their repr
    assert [r[3] for r in _typed_rows((0, path, code, params, "remember", END_OF_TIME, 0))] == ['"3"']


def test_a_wall_clock_ttl_is_judged_by_when_the_savepoint_was_taken(tmp_path: Any) -> None:
    """A wall-clock TTL (tests.core.jobs:WallTyped, 10 s) is read as it stood when the
    savepoint was taken, whatever its watermark and whatever the clock says now."""
    path = os.path.join(str(tmp_path), "tablet")
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    db = Rdict(path, options=opts)
    taken = 1_800_000_000_000_000
    db[cell(b"live", "count") + VALUE] = _EXPIRY.pack(taken + 5_000_000) + codecs.INT.encode(1)
    db[cell(b"gone", "count") + VALUE] = _EXPIRY.pack(taken - 1) + codecs.INT.encode(2)
    db.close()
    for wm in (0, END_OF_TIME):  # (the watermark plays no part)
        rows = _typed_rows((0, path, "tests.core.jobs:WallTyped", {}, "count", wm, taken))
        assert [(r[0], r[3]) for r in rows] == [("live", "1")], wm


def test_a_bytes_keyed_maps_keys_read_as_the_cli_shows_them(tmp_path: Any) -> None:
    """After review: a map's bytes keys came out as their Python repr (``b'abc'``, quotes
    included); they read as text, as ``millstream state get`` shows bytes: UTF-8, else ``0x`` hex."""
    from runtime.state import ENTRY

    path = os.path.join(str(tmp_path), "tablet")
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    db = Rdict(path, options=opts)
    for k, n in ((b"abc", 2), (b"\xff\x00", 1)):
        db[cell(b"key", "seen") + ENTRY + codecs.BYTES.encode(k)] = kept(codecs.INT.encode(n))
    db.close()
    rows = _typed_rows((0, path, "tests.jobs:BytesTally", {}, "seen", END_OF_TIME, 0))
    assert sorted((r[2], r[3]) for r in rows) == [("0xff00", "1"), ("abc", "2")]


def test_reading_a_flow_stages_ctx_state_says_to_name_a_typed_state(tmp_path: Any) -> None:
    """After review: without ``state=``, a flow's stage (which keeps no ctx.state) read as an
    empty DataFrame, silently; it now says so and names the states to read."""
    import json

    import pytest

    from runtime import Dataflow
    from runtime.errors import MillstreamError
    from runtime.savepoint import FORMATS, MANIFEST, tablet_dir
    from spark_bridge import read_state
    from tests import flowjobs as j

    flow = Dataflow("rs", key_ranges=1)
    flow.input("w", codec=codecs.STR).key_by(j.word_key).map(j.one).reduce(j.add, name="counts").output("out")
    topo = flow.topology()
    [stage] = [c for c in topo.computations if c != "rs.input"]
    d = str(tmp_path)
    os.makedirs(tablet_dir(d, stage, 0))
    with open(os.path.join(tablet_dir(d, stage, 0), "CURRENT"), "w") as f:
        f.write("x")
    with open(os.path.join(d, MANIFEST), "w") as f:
        json.dump({"format": max(FORMATS), "job": "rs", "topology": topo.to_json(),
                   "tablets": [{"computation": stage, "key_range": 0}]}, f)
    with pytest.raises(MillstreamError, match=r"is a stage of a flow, which keeps no ctx.state: read one of "
                                              r"its typed states with state=NAME \(counts\)"):
        read_state(None, d, stage)
