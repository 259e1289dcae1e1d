"""A sink's relative ``path`` is made absolute where the job is defined (the client's working
directory), not resolved by each worker against its own: before, ``path="out"`` wrote each
worker's share of the output under that worker's working directory."""

from __future__ import annotations

import json
import os

import pytest

from runtime import Dataflow
from runtime.client import _checked_doc, with_absolute_paths
from runtime.flows import PLAN_PARAM
from runtime.sinks import FileSink, Sink
from runtime.topology import Topology


def _topology(path: str) -> Topology:
    topo = Topology("paths")
    topo.add_computation("count", "examples.wordcount:Counter", inputs={"words": None}, outputs=["counts"],
                         params={"path": "not/a/sink/param"})
    topo.add_computation("out", "runtime.sinks:FileSink", inputs={"counts": None}, params={"path": path})
    return topo


def test_a_classic_sinks_relative_path_reaches_the_leader_absolute(tmp_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    topo = _topology("out/counts")
    doc = json.loads(_checked_doc(topo))
    params = {c["name"]: c["params"] for c in doc["computations"]}
    assert params["out"]["path"] == os.path.join(str(tmp_path), "out", "counts")
    assert params["count"]["path"] == "not/a/sink/param"  # not a sink: its params are its own
    assert topo.computations["out"].params["path"] == "out/counts"  # the user's topology is unchanged


def test_an_absolute_path_stays_and_only_the_params_a_sink_names_as_local_paths_change(tmp_path: str) -> None:
    topo = _topology(str(tmp_path))
    assert with_absolute_paths(topo) is topo
    topo.add_computation("remote", "tests.unit.test_sink_paths:RemoteSink", inputs={"counts": None},
                         params={"path": "bucket/prefix"})
    assert with_absolute_paths(topo) is topo  # a sink that names no local path: its path is its own


class RemoteSink(Sink):
    """A sink whose ``path`` is not a local one (an object store's prefix, say)."""

    def process_record(self, ctx: object, record: object) -> None:
        pass


def test_a_flows_relative_sink_path_is_made_absolute_where_the_flow_is_defined(
        tmp_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    flow = Dataflow("paths", key_ranges=1)
    flow.input("lines").sink(FileSink, name="lines_out", path="out")
    plans = [json.loads(spec.params[PLAN_PARAM]) for spec in flow.topology().computations.values()
             if PLAN_PARAM in spec.params]
    assert os.path.join(str(tmp_path), "out") in json.dumps(plans)
    assert '"out"' not in json.dumps(plans)
