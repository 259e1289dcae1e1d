"""The pure parts of the job lifecycle: what an update changes and refuses, closed streams,
range ids of a name used again (master/jobs.py, master/ranges.py)."""

from __future__ import annotations

import dataclasses

import pytest

from master.jobs import CANCELLED, DRAINED, DRAINING, Job, closed_streams, diff, input_streams
from master.ranges import Ranges
from runtime.errors import TopologyError
from runtime.topology import Topology


def _topo(*extra: str, counter_ranges: int = 4) -> Topology:
    t = Topology("wc")
    t.add_computation("splitter", "examples.wordcount:Splitter", inputs={"lines": None}, outputs=["words"])
    t.add_computation("counter", "examples.wordcount:Counter", inputs={"words": None}, outputs=["counts"],
                      key_ranges=counter_ranges)
    for name in extra:
        t.add_computation(name, "tests.jobs:CountTo", inputs={"words": None}, outputs=[name + "_out"],
                          params={"out": name + "_out"})
    return t


def test_an_update_sorts_computations_into_added_removed_changed_and_same() -> None:
    new = _topo("fresh")
    new.computations["counter"] = dataclasses.replace(new.computations["counter"], params={"v": "2"})
    d = diff(_topo("old"), new, drop_state=True)
    assert (d.added, d.removed, d.changed, d.same) == (("fresh",), ("old",), ("counter",), ("splitter",))
    assert diff(_topo(), _topo(), reset=["counter"]).reset == ("counter",)


def test_an_update_refuses_what_would_lose_state_silently_or_cannot_change_in_place() -> None:
    with pytest.raises(TopologyError, match="removes old, which would delete their state; pass --drop-state"):
        diff(_topo("old"), _topo())
    with pytest.raises(TopologyError, match="key_ranges cannot change in place.*--reset-state counter"):
        diff(_topo(), _topo(counter_ranges=8))
    assert diff(_topo(), _topo(counter_ranges=8), reset=["counter"]).reset == ("counter",)
    changed = _topo()
    changed.computations["counter"] = dataclasses.replace(changed.computations["counter"], productions="weak")
    with pytest.raises(TopologyError, match="productions cannot change in place"):
        diff(_topo(), changed)
    with pytest.raises(TopologyError, match="--reset-state nope"):
        diff(_topo(), _topo(), reset=["nope"])


def test_input_streams_and_the_streams_a_drain_or_cancel_closes() -> None:
    t = _topo("side")
    assert input_streams(t) == ["lines"]
    draining = {"wc": Job(DRAINING, 0.0, streams=("lines",))}
    assert "drained" in closed_streams({"wc": t}, draining)["lines"]
    assert "drained" in closed_streams({"wc": t}, {"wc": Job(DRAINED, 0.0, streams=("lines",))})["lines"]
    gone = {"wc": Job(CANCELLED, 0.0, streams=("lines",), computations=("splitter",))}
    assert "cancelled" in closed_streams({}, gone)["lines"]
    other = Topology("other")
    other.add_computation("reader", "examples.wordcount:Splitter", inputs={"lines": None}, outputs=["w2"])
    assert closed_streams({"other": other}, gone) == {}, "another job still reads it"
    assert Job.from_doc(draining["wc"].to_doc()) == draining["wc"]


def test_a_name_used_again_starts_above_the_range_ids_it_had() -> None:
    r = Ranges.first(4, base=6)
    assert sorted(r.ranges) == [6, 7, 8, 9] and r.next_id == 10
    assert [(k.start, k.end) for k in r.ranges.values()] == [(k.start, k.end) for k in Ranges.first(4).ranges.values()]
