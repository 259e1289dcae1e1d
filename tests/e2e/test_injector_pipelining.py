"""Several injector rounds in flight (injectors/rounds.py) on real processes.

Records sent under the injector's own sequence are deduplicated by one mark per tablet, so
each tablet must commit them in order however the rounds overtake each other on the wire.
These tests keep rounds in flight through a split and a killed receiver, then re-run the
source under its name, and check the counts against the oracle.
"""

from __future__ import annotations

import os
import threading

from cli.demo import oracle, sample_lines
from examples import wordcount
from injectors import Injector
from runtime.sinks import read_file_sink
from tests.harness import Cluster, wait_until

BASE_TS = 1_700_000_000_000_000


def _send(c: Cluster, lines: list[str], name: str, midway: threading.Thread | None = None) -> int:
    """Send ``lines`` keyed over many splitter ranges, in full rounds of 25 (so rounds join
    others in flight), starting ``midway`` a third of the way in; returns the peak of rounds
    in flight."""
    with Injector(c.masters_arg, "lines", name, batch_size=25, max_in_flight=4, timeout=120) as inj:
        for i, line in enumerate(lines):
            inj.send(str(i % 97).encode(), line.encode(), BASE_TS + i)
            if midway is not None and i == len(lines) // 3:
                midway.start()
    # Read once the injector has finished (flushed every round): under CI's load the loop
    # above once queued all 3,000 records while the first round was still connecting, and a
    # peak read there said 1 although the rounds then went four at a time.
    peak = inj.peak_in_flight
    if midway is not None:
        midway.join(120)
    return peak


def test_rounds_in_flight_stay_exact_through_a_split_a_killed_worker_and_a_rerun(tmp_path: object) -> None:
    with Cluster(str(tmp_path), workers=0).running() as c:
        # An injector's delivery waits 30 ms at the worker (a slow network's round trip), so
        # the next rounds fill and join it in flight however fast the machine is right now:
        # under the whole suite's load, 5 ms let one CI run's rounds each finish before 25
        # more records came (the sender descheduled), and nothing overlapped.
        c.add_faulty_workers(3, "delay-injector 30")
        out = os.path.join(c.data_dir, "out")
        c.client.submit(wordcount.topology(out, name="pipelined"))
        c.wait_assigned()
        lines = sample_lines(3000, seed=5)
        expected = oracle(lines)
        total = sum(expected.values())
        errors: list[BaseException] = []

        def split_and_kill() -> None:
            try:
                t = min((t for t in c.client.status()["tablets"] if t["computation"] == "splitter"),
                        key=lambda t: t["start"])
                c.client.split("splitter", t["key_range"])
                victim = next(w for w in c.workers if w.address == t["address"])
                c.kill_worker(victim, graceful=False)
                c.restart_worker(victim)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        peak = _send(c, lines, "pipelined-source", threading.Thread(target=split_and_kill))
        assert not errors, errors
        assert peak >= 2, "the rounds never overlapped: nothing here tested several in flight"
        wait_until(lambda: len(list(read_file_sink(out))) >= total, 120, f"{total} counts")
        assert wordcount.final_counts(list(read_file_sink(out))) == expected

        # The source runs again under its name: the same sequence, all of it dropped, by the
        # one mark each tablet keeps, although its rounds overlap again.
        _send(c, lines, "pipelined-source")
        rows = list(read_file_sink(out))
        assert wordcount.final_counts(rows) == expected
        assert len(rows) == total
