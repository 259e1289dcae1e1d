"""Code the workers may not load (master/code.py): a submit naming it is refused at once,
naming the computation, the module, the workers and the flag; a worker joining later with a
narrower policy is named in status and jobs; a flow's plan is read for the code of its
steps, and a plan that cannot be read refuses nothing."""

from __future__ import annotations

import asyncio

import pytest

from master import lifecycle, membership
from runtime import Topology
from runtime.errors import ConfigError
from runtime.imports import BUILT_IN_CODE, CodeNotAllowedError
from runtime.status import render, render_jobs
from tests.masterkit import leader


def test_a_flow_whose_steps_a_worker_may_not_load_is_refused_at_submit_naming_each_step() -> None:
    """A flow's stage is millstream's own code; its steps are the user's, named in its plan: a
    submit only checked the former, so it was taken and its tablets failed to open for ever
    (a new user's `millstream up`, then a module written after it started)."""
    from runtime import Dataflow
    from runtime.windows import SECOND, Tumbling
    from tests import flowjobs

    flow = Dataflow("wf")
    (flow.input("lines").flat_map(flowjobs.words).key_by(flowjobs.word_key).map(flowjobs.shout)
     .window(Tumbling(SECOND), flowjobs.SumAgg(1), name="wf.counts").output("wf_out"))
    core = leader()

    async def main() -> None:
        narrow, _ = await membership.register(core, "127.0.0.1:2", allowed_code=list(BUILT_IN_CODE))
        with pytest.raises(CodeNotAllowedError) as refused:
            await lifecycle.submit(core, flow.topology().to_json())
        said = str(refused.value)
        for what in ("step 'wf.flat_map' (flat_map) 'tests.flowjobs:words'", "key_by 'wf.key_by' 'tests.flowjobs:word_key'",
                     "step 'wf.map' (map) 'tests.flowjobs:shout'",
                     "aggregator of step 'wf.counts' (window) 'tests.flowjobs:SumAgg'"):
            assert what in said, (what, said)
        assert "--allow-code tests" in said and "runtime.flows" not in said and "wf" not in core.image.topologies
        await membership.leave(core, narrow)
        await membership.register(core, "127.0.0.1:3", allowed_code=[*BUILT_IN_CODE, "tests"])
        assert (await lifecycle.submit(core, flow.topology().to_json()))[0] == "wf"
    asyncio.run(main())


def test_a_submit_of_code_a_worker_may_not_load_is_refused_naming_the_fix() -> None:
    core = leader()
    topo = Topology("wc")
    topo.add_computation("count", "tests.jobs:Counter", inputs={"words": "tests.jobs:first_byte"})

    async def main() -> None:
        wide, _ = await membership.register(core, "127.0.0.1:1", allowed_code=["runtime.sinks", "tests"])
        old, _ = await membership.register(core, "127.0.0.1:3")  # reports no policy (an older worker)
        narrow, _ = await membership.register(core, "127.0.0.1:2", allowed_code=["runtime.sinks", "examples"])
        with pytest.raises(CodeNotAllowedError, match=(
                rf"computation 'count': code 'tests.jobs:Counter' is from module 'tests.jobs', which worker "
                rf"{narrow} \(127.0.0.1:2\) does not allow; start it with --allow-code tests .*"
                r"computation 'count': key extractor of 'words' 'tests.jobs:first_byte'.*Nothing was changed")):
            await lifecycle.submit(core, topo.to_json())
        assert "wc" not in core.image.topologies and not core.image.tablets
        await membership.leave(core, narrow)
        assert (await lifecycle.submit(core, topo.to_json()))[0] == "wc"
        # A worker joining later that may not load it: named in status and jobs at once.
        narrow, _ = await membership.register(core, "127.0.0.1:4", allowed_code=["runtime.sinks"])
        doc = core.status()
        [code, extractor] = doc["computations"]["count"]["code_refused"]
        assert narrow in code and "--allow-code tests" in code and wide not in code and old not in code
        assert doc["jobs"][0]["computations"][0]["code_refused"] == [code, extractor]
        assert "CANNOT LOAD: computation 'count': code 'tests.jobs:Counter'" in render(doc)
        assert "--allow-code tests" in render_jobs(doc["jobs"])

    asyncio.run(main())


def test_a_worker_policy_that_is_not_module_prefixes_is_refused() -> None:
    core = leader()
    with pytest.raises(ConfigError, match="is not a list of at most 256 module prefixes"):
        asyncio.run(membership.register(core, "127.0.0.1:1", allowed_code=["os; rm"]))


def test_a_plan_that_cannot_be_read_or_names_a_legacy_builtin_refuses_nothing() -> None:
    """The submit check and every status call read stored plans: one from an older version, or
    not a plan at all, must neither fail them nor refuse millstream's own code."""
    from master.code import _plan_paths

    for plan in ("not json", "[1]", '{"entries": {"s": {"prefix": [["map"]]}}}', '{"steps": {"x": 3}}'):
        assert _plan_paths(plan) == [], plan
    legacy = '{"steps": {"w": {"kind": "window", "agg": {"class": "runtime.windows:Collect"}}}}'
    assert _plan_paths(legacy) == []
