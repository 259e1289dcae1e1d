"""Bad input from user code and topologies, in-process (docs/bad-input.md): each case gets a
clear error where the user will look for it, and nothing else is lost or stopped.

- A record whose code misuses the API goes to ``<computation>.dead_letter`` with the
  error text; the records around it are processed.
- Code that cannot be loaded shows up as a tablet problem (status), naming what is wrong;
  other computations of the same worker keep running.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math

import pytest

from runtime import Record
from runtime.imports import CodePolicy
from tests.core.corekit import make_core
from tests.core.jobs import Collector
from tests.core.test_worker_core import BASE, _until, routing
from worker.core import WorkerCore
from worker.sender import OK


async def _core(tmp: str, *comps: tuple[str, str, list[str], list[str], dict[str, str]],
                policy: CodePolicy = CodePolicy(("*",))) -> WorkerCore:
    return await make_core(tmp, routing(*comps), policy=policy)


MISUSES = [
    # (value that makes Misbehave misuse the API, text the dead letter's error must contain)
    ("surrogate-tag", "cannot be stored as UTF-8"),              # B17
    ("float-time", "must be an int of microseconds"),            # B26
    ("huge-value", "over the limit"),                            # B19
    ("huge-state", "over the limit"),
    ("unknown-stream", "unknown stream 'nope'"),                 # B25
    ("str-value", "value must be bytes"),                        # B25
    ("str-state", "state must be bytes"),
    ("str-key", "key must be bytes"),
    ("time-2**70", "within signed 64 bits"),
    ("recursion", "RecursionError"),
    ("keyboard-interrupt", "KeyboardInterrupt"),
    ("exit", "SystemExit"),                                      # B15
]


@pytest.mark.parametrize(("value", "error"), MISUSES, ids=[m[0] for m in MISUSES])
def test_a_misuse_in_user_code_is_dead_lettered_and_the_rest_goes_on(tmp_path: object, value: str,
                                                                     error: str) -> None:
    async def main() -> None:
        core = await _core(str(tmp_path), ("bad", "tests.core.jobs:Misbehave", ["in"], ["out"], {}),
                           ("collect", "tests.core.jobs:Collector", ["out"], [], {"name": "out"}),
                           ("dead", "tests.core.jobs:Collector", ["bad.dead_letter"], [], {"name": "dead"}))
        recs = [Record(b"k", v, BASE + i, i.to_bytes(16, "big"))
                for i, v in enumerate([b"ok-1", value.encode(), b"ok-2"])]
        assert await core.deliver("bad", 0, 1, recs) == OK
        await _until(lambda: len(Collector.seen) == 3, "two outputs and one dead letter")
        assert [v for n, _, v in Collector.seen if n == "out"] == [b"ok-1", b"ok-2"]
        dead = [json.loads(v) for n, _, v in Collector.seen if n == "dead"]
        assert error in dead[0]["error"], dead[0]["error"]
        assert not core.tablets[("bad", 0)].closing  # the tablet never failed a batch
        await core.close_all()

    asyncio.run(main())


LOAD_FAILURES = [
    # (code path, policy, text the tablet problem must contain)
    ("os:getcwd", CodePolicy(), "is not allowed on this worker"),                     # S2, B13
    ("sys:exit", CodePolicy(), "is not allowed on this worker"),                      # S2, B14
    ("tests.core.jobs:not_a_class", CodePolicy(), "is not a Computation subclass"),  # B13
    ("tests.core.jobs:ExitsInSetup", CodePolicy(), "SystemExit"),                     # B14
    ("tests.core.exits_on_import:X", CodePolicy(), "raised SystemExit"),              # B14
    ("no_such_module_anywhere:X", CodePolicy(("*",)), "cannot import module"),       # B10
    ("tests.core.jobs:NoSuchClass", CodePolicy(), "has no attribute"),
]


@pytest.mark.parametrize(("code", "policy", "error"), LOAD_FAILURES, ids=[f[0] for f in LOAD_FAILURES])
def test_code_that_cannot_load_is_reported_and_the_worker_goes_on(tmp_path: object, code: str,
                                                                 policy: CodePolicy, error: str) -> None:
    async def main() -> None:
        core = await _core(str(tmp_path), ("broken", code, ["in"], ["broken-out"], {}),
                           ("echo", "tests.core.jobs:Echo", ["other"], ["out"], {}),
                           ("collect", "tests.core.jobs:Collector", ["out"], [], {"name": "out"}),
                           policy=CodePolicy((*policy.allowed, "tests")))
        for _ in range(3):  # tried again on every reconcile; reported from the third attempt
            await core.reconcile()
        problems = {(p.computation, p.key_range): p for p in core.problems()}
        assert ("broken", 0) in problems and error in problems[("broken", 0)].error, problems
        assert ("echo", 0) in core.tablets  # the rest of the worker runs
        assert await core.deliver("echo", 0, 1, [Record(b"k", b"fine", BASE, b"1".ljust(16))]) == OK
        await _until(lambda: [v for _, _, v in Collector.seen] == [b"fine"], "the other computation's output")
        await core.close_all()

    asyncio.run(main())


def test_one_unloadable_key_extractor_stops_only_the_records_routed_through_it(tmp_path: object) -> None:
    """B11: it used to freeze every routing update of the worker; and (review N5) a reader of
    ``out`` whose extractor cannot load used to dead-letter the producer's record, so the
    other reader of ``out`` lost it too."""
    async def main() -> None:
        r = routing(("up", "tests.core.jobs:Echo", ["in"], ["out"], {}),
                    ("good", "tests.core.jobs:Collector", ["out"], [], {"name": "out"}),
                    ("other", "tests.core.jobs:Collector", ["out"], [], {"name": "other"}),
                    ("dead", "tests.core.jobs:Collector", ["up.dead_letter"], [], {"name": "dead"}),
                    ("other_dead", "tests.core.jobs:Collector", ["other.dead_letter"], [], {"name": "other-dead"}))
        r.computations[2].inputs[0].key_extractor = "no_such_module_anywhere:key"
        core = await make_core(str(tmp_path), r)
        assert set(core.tablets) == {("up", 0), ("good", 0), ("other", 0), ("dead", 0), ("other_dead", 0)}
        assert await core.deliver("up", 0, 1, [Record(b"k", b"v", BASE, b"1".ljust(16))]) == OK
        await _until(lambda: {n for n, _, _ in Collector.seen} == {"out", "other-dead"}, "the output and a dead letter")
        assert [v for n, _, v in Collector.seen if n == "out"] == [b"v"]
        letter = json.loads(next(v for n, _, v in Collector.seen if n == "other-dead"))
        assert "cannot import module" in letter["error"] and letter["computation"] == "other", letter
        assert (letter["stream"], letter["producer"], base64.b64decode(letter["value"])) == ("out", "up", b"v")
        await core.close_all()

    asyncio.run(main())


def test_a_reader_s_failing_key_extractor_costs_only_that_reader_the_record(tmp_path: object) -> None:
    """Review N5: the producer's call keeps its state change and its outputs to every other
    reader; the failing reader's dead letters get the record, with the error."""
    async def main() -> None:
        r = routing(("up", "tests.core.jobs:CountEcho", ["in"], ["out"], {}),
                    ("good", "tests.core.jobs:Collector", ["out"], [], {"name": "out"}),
                    ("buggy", "tests.core.jobs:Collector", ["out"], [], {"name": "buggy"}),
                    ("dead", "tests.core.jobs:Collector", ["up.dead_letter"], [], {"name": "dead"}),
                    ("buggy_dead", "tests.core.jobs:Collector", ["buggy.dead_letter"], [], {"name": "buggy-dead"}))
        r.computations[2].inputs[0].key_extractor = "tests.core.jobs:extractor_raising"
        core = await make_core(str(tmp_path), r)
        recs = [Record(b"k", b'{"user": "ann"}', BASE, b"1".ljust(16)),
                Record(b"k", b"not json", BASE + 1, b"2".ljust(16))]
        assert await core.deliver("up", 0, 1, recs) == OK
        await _until(lambda: len(Collector.seen) == 4, "three outputs and a dead letter")
        seen = sorted((n, k, v) for n, k, v in Collector.seen if n != "buggy-dead")
        assert seen == sorted([("buggy", b"ann", b'{"user": "ann"}'), ("out", b"k", b'{"user": "ann"}'),
                               ("out", b"k", b"not json")])
        letter = json.loads(next(v for n, _, v in Collector.seen if n == "buggy-dead"))
        assert letter["error"].startswith("JSONDecodeError") and letter["computation"] == "buggy", letter
        assert base64.b64decode(letter["value"]) == b"not json"
        assert (await core.read_state("up", 0, 1, b"k"))[0] == b"2", "the producer's state change is kept"
        assert core.tablets[("up", 0)].dead_lettered == 0
        await core.close_all()

    asyncio.run(main())


def test_a_key_extractor_returning_str_dead_letters_the_record_for_its_reader(tmp_path: object) -> None:
    """B24 (to the reader's dead letters since review N5, not the producer's)."""
    async def main() -> None:
        r = routing(("up", "tests.core.jobs:Echo", ["in"], ["out"], {}),
                    ("down", "tests.core.jobs:Collector", ["out"], [], {"name": "out"}),
                    ("dead", "tests.core.jobs:Collector", ["down.dead_letter"], [], {"name": "dead"}))
        r.computations[1].inputs[0].key_extractor = "tests.core.jobs:extractor_returning_str"
        core = await make_core(str(tmp_path), r)
        assert await core.deliver("up", 0, 1, [Record(b"k", b"v", BASE, b"1".ljust(16))]) == OK
        await _until(lambda: len(Collector.seen) == 1, "a dead letter")
        name, _, value = Collector.seen[0]
        assert name == "dead" and "returned str, not bytes" in json.loads(value)["error"]
        await core.close_all()

    asyncio.run(main())



@pytest.mark.parametrize(("field", "value", "says"), [
    ("dedup_retention_s", -1.0, "dedup retention -1.0 s is not a positive number"),
    ("dedup_retention_s", math.nan, "is not a positive number of seconds"),
    ("replication", 0, "replication 0 is not a number of copies"),
    (None, None, "carries no engine options"),
])
def test_a_tablet_that_cannot_be_built_stops_neither_reconcile_nor_the_others(
        tmp_path: object, field: str | None, value: object, says: str) -> None:
    # review N7: Tablet.__init__ raised inside reconcile(): the worker's reconcile loop and
    # routing watch died, and no tablet of any job opened there any more. Engine options that
    # break the contract (runtime/engine.py) are refused the same way: reported, never guessed.
    r = routing(("broken", "tests.core.jobs:Echo", ["in"], ["broken-out"], {}),
                ("echo", "tests.core.jobs:Echo", ["other"], ["out"], {}),
                ("collect", "tests.core.jobs:Collector", ["out"], [], {"name": "out"}))
    broken = r.computations[0]
    if field is None:
        broken.ClearField("options")
    else:
        setattr(broken.options, field, value)

    async def main() -> None:
        core = await make_core(str(tmp_path), r)
        assert set(core.tablets) == {("echo", 0), ("collect", 0)}
        await core.reconcile()  # and again: still no exception
        problems = {(p.computation, p.key_range): p for p in core.problems()}
        assert says in problems[("broken", 0)].error
        assert await core.deliver("echo", 0, 1, [Record(b"k", b"fine", BASE, b"1".ljust(16))]) == OK
        await _until(lambda: [v for _, _, v in Collector.seen] == [b"fine"], "the other computation's output")
        await core.close_all()

    asyncio.run(main())


def test_code_the_worker_may_not_load_is_reported_from_the_first_failure(tmp_path: object) -> None:
    async def main() -> None:
        core = await _core(str(tmp_path), ("broken", "os:getcwd", ["in"], ["out"], {}), policy=CodePolicy())
        [problem] = core.problems()
        assert problem.attempts == 1  # reported from the first attempt
        assert "not allowed on this worker" in problem.error and "--allow-code os" in problem.error
        await core.close_all()

    asyncio.run(main())


def test_a_batch_call_that_raises_leaves_no_state_of_any_key_and_runs_its_records_one_by_one(
        tmp_path: object) -> None:
    """A computation taking whole batches (process_batch) writes ctx.state for several keys,
    then raises on one record: the call is undone for every key it touched (not only the
    last), then each record runs alone and only the bad one is dead-lettered."""
    async def main() -> None:
        core = await _core(str(tmp_path), ("counter", "tests.core.jobs:BatchCounter", ["in"], ["out"], {}),
                           ("collect", "tests.core.jobs:Collector", ["out"], [], {"name": "out"}),
                           ("dead", "tests.core.jobs:Collector", ["counter.dead_letter"], [], {"name": "dead"}))
        values = [(b"a", b"1"), (b"b", b"1"), (b"a", b"1"), (b"c", b"boom"), (b"b", b"1")]
        recs = [Record(k, v, BASE + i, i.to_bytes(16, "big")) for i, (k, v) in enumerate(values)]
        assert await core.deliver("counter", 0, 1, recs) == OK
        await _until(lambda: len(Collector.seen) == 5, "four counts and one dead letter")
        assert sorted((k, v) for n, k, v in Collector.seen if n == "out") == [
            (b"a", b"1"), (b"a", b"2"), (b"b", b"1"), (b"b", b"2")]
        tablet = core.tablets[("counter", 0)]
        assert tablet.store.get_state(b"a") == b"2" and tablet.store.get_state(b"b") == b"2"
        assert len([v for n, _, v in Collector.seen if n == "dead"]) == 1
        await core.close_all()

    asyncio.run(main())
