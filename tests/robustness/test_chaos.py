"""A seeded mix of failures during one pipeline, checked against an exact model.

In the spirit of etcd's robustness suite: the word count's input is known, so its output
is known exactly (every count 1..n of every word, once), and so is its order (DESIGN.md §2,
see :func:`_check_key_order`); a schedule drawn from a seed kills
and restarts workers on their disks, loses hosts with their disks (every worker has its own
state directory), pauses one past its lease (a zombie), kills the leader, adds workers,
moves tablets, and splits and merges key ranges between chunks of input. Each bug this finds becomes a named scenario in
tests/e2e. Seeds run in CI are fixed; MILLSTREAM_CHAOS_SEEDS=1,2,3 (and
MILLSTREAM_CHAOS_RESHARD_SEEDS for the test that also splits and merges) run others.
"""

from __future__ import annotations

import dataclasses
import os
import random
import time
from collections.abc import Callable, Iterator

import pytest

from cli.demo import oracle, sample_lines
from examples import wordcount
from injectors import Injector
from runtime.cluster import Process
from runtime.errors import MillstreamError
from runtime.record import derived_id
from runtime.sinks import read_file_sink
from tests.harness import Cluster, settled_word_counts, wait_until

BASE_TS = 1_700_000_000_000_000  # line i has timestamp BASE_TS + i
SEEDS = [int(s) for s in os.environ.get("MILLSTREAM_CHAOS_SEEDS", "7").split(",")]


@pytest.fixture
def chaos_cluster(tmp_path: object) -> Iterator[Cluster]:
    with Cluster(str(tmp_path), masters=2, workers=3).running() as c:
        yield c


def _live_workers(c: Cluster) -> list:  # type: ignore[type-arg]
    return [w for w in c.workers if w.alive()]


def _running_ids(c: Cluster) -> set[str] | None:
    """The worker ids of the running worker processes (None while one has not written its
    id yet)."""
    ids = set()
    for w in _live_workers(c):
        try:
            with open(os.path.join(w.state_dir, "worker.id")) as f:
                ids.add(f.read().strip())
        except FileNotFoundError:
            return None
    return ids


def _registered(doc: dict) -> set[str]:  # type: ignore[type-arg]
    return {w["id"] for w in doc["workers"]}


QUIET_S = 1.5
_seen_registered: dict[str, float] = {}  # a worker process's log -> when it was first seen registered


def _quiet_since_registration(w: Process) -> bool:
    """This worker *process* (not an earlier one on its disk, which had the same id: each has
    a log of its own) has registered, at least :data:`QUIET_S` ago as far as this test has seen
    (its "registered as worker" line, logged at INFO, the default, once the leader took it).

    A primary drops a restarted follower from the in-sync set at its first commit that the
    follower cannot take (down, not routed yet, or its copy not open: a snapshot follows);
    waiting out the replica timeout (1 s) after the registration lets the drops of commits
    made meanwhile, the chunk just injected going down the pipeline among them, show in the
    tablets' health. A primary that first commits later than that drops it later: a kill of
    that primary right after such a drop would still take the last in-sync copy (a window
    this wait narrows, as the system cannot tell the harness when every copy is open)."""
    at = _seen_registered.get(w.log_path)
    if at is None:
        with open(w.log_path, errors="replace") as f:
            if "registered as worker" not in f.read():
                return False
        at = _seen_registered[w.log_path] = time.monotonic()
    return time.monotonic() - at >= QUIET_S


def _worker_id(c: Cluster, address: str) -> str | None:
    return next((w["id"] for w in c.client.status()["workers"] if w["address"] == address), None)


def _replicated(c: Cluster) -> None:
    """Before a loss: every tablet has its in-sync follower again (with replication 2, two
    losses closer together than re-replication may lose both copies of a tablet; that is
    what replication 3 is for, docs/replication.md)."""
    def settled() -> bool:
        doc = c.client.status()
        # A worker killed a moment ago still counts as alive (and its copies as in sync)
        # until its lease runs out, and one just started is not registered yet: wait until
        # the registered workers are exactly the running ones. Counting them was not enough
        # (seed 217): a lost host not yet expired and its replacement not yet registered
        # made the same count, its copies still looked in sync, and the next kill took the
        # last copy of every tablet. Nor was it for a worker restarted on its disk (seed
        # 312): it keeps its id, so it counted as registered before it was, and its copies
        # as in sync until a primary that could not reach it meanwhile dropped it (here the
        # next kill took that primary right after such a drop: the last in-sync copy of two
        # tablets, before the restarted worker had even registered).
        # So each running process must also have registered, long enough ago for such a
        # drop to show (see _quiet_since_registration for the window this leaves).
        # A job cancelled with its state kept has its tablets closed: a follower the leader
        # drops meanwhile (its worker lost) is caught up only once the job resumes. (A closing
        # primary can no longer drop one: lifecycle seed 507 found that, master/core.py.)
        closed = {comp["name"] for j in doc["jobs"] if j["state"] == "cancelled" for comp in j["computations"]}
        return (_registered(doc) == _running_ids(c)
                and all(_quiet_since_registration(w) for w in _live_workers(c))
                and all(t["health"] == "ok" for t in doc["tablets"] if t["computation"] not in closed))

    try:
        wait_until(settled, 60, "every lost worker to expire and every tablet to be replicated again")
    except TimeoutError as e:
        doc = c.client.status()
        unhealthy = [(t["computation"], t["key_range"], t["primary"], t["followers"], t["in_sync"], t["health"])
                     for t in doc["tablets"] if t["health"] != "ok"]
        quiet = {w.address: _quiet_since_registration(w) for w in _live_workers(c)}
        dumped = c.dump_workers()  # (what each link waits on, for the next time this happens)
        raise TimeoutError(f"{e}: workers {sorted(_registered(doc))} (running: {_running_ids(c)}; "
                           f"their tasks dumped to {dumped}; "
                           f"registered {QUIET_S:g} s ago: {quiet}), "
                           f"unhealthy {unhealthy}, problems "
                           f"{ {c: v['problems'] for c, v in doc['computations'].items() if v['problems']} }") from None


def _kill_and_restart_worker(c: Cluster, rng: random.Random) -> str:
    _replicated(c)
    victim = rng.choice(_live_workers(c))
    c.kill_worker(victim, graceful=False)
    c.restart_worker(victim)
    return f"SIGKILL worker {victim.address}, restart it on its disk"


def _lose_host(c: Cluster, rng: random.Random) -> str:
    _replicated(c)
    victim = rng.choice(_live_workers(c))
    c.kill_worker(victim, graceful=False)
    c.restart_worker(victim, wipe=True)
    return f"lose host {victim.address} with its disk, a new one at its address"


def _kill_worker_for_good(c: Cluster, rng: random.Random) -> str:
    if len(_live_workers(c)) <= 2:
        return _add_worker(c, rng)
    _replicated(c)
    victim = rng.choice(_live_workers(c))
    c.kill_worker(victim, graceful=False)
    return f"SIGKILL worker {victim.address}"


def _zombie(c: Cluster, rng: random.Random) -> str:
    _replicated(c)
    victim = rng.choice(_live_workers(c))
    wid = _worker_id(c, victim.address)
    c.pause(victim)
    try:
        wait_until(lambda: all(t["worker"] != wid for t in c.client.status()["tablets"]), 30,
                   "the paused worker's tablets to move")
    finally:
        c.resume(victim)
    return f"SIGSTOP worker {victim.address} past its lease, then SIGCONT"


def _kill_leader(c: Cluster, rng: random.Random) -> str:
    leader = c.client.status()["masters"]["leader"]
    victim = next(m for m in c.masters if m.address == leader)
    c.kill(victim, graceful=False)
    wait_until(lambda: c.client.status()["masters"]["leader"] != leader, 30, "a new leader")
    c.restart_master(victim)  # at the same address: clients were given every master address
    return f"SIGKILL leader {leader}, restart it"


def _add_worker(c: Cluster, rng: random.Random) -> str:
    new = c.add_worker()
    return f"add worker {new.address}"


def _move(c: Cluster, rng: random.Random) -> str:
    doc = c.client.status()
    t = rng.choice(doc["tablets"])
    others = [w for w in doc["workers"] if w["id"] != t["worker"]]
    if not others:
        return "move: no other worker"
    to = rng.choice(others)
    c.client.move(t["computation"], t["key_range"], to["id"])
    return f"move {t['computation']}/{t['key_range']} to {to['address']}"


def _split(c: Cluster, rng: random.Random) -> str:
    t = rng.choice([t for t in c.client.status()["tablets"] if t["computation"] != "counts_sink"])
    try:
        halves = c.client.split(t["computation"], t["key_range"])
    except MillstreamError as e:  # moving, or its primary is not back yet: a clear refusal
        return f"split {t['computation']}/{t['key_range']} refused: {e}"
    return f"split {t['computation']}/{t['key_range']} into {[h['key_range'] for h in halves]}"


def _merge(c: Cluster, rng: random.Random) -> str:
    comp = rng.choice(["splitter", "counter"])
    ranges = sorted((t for t in c.client.status()["tablets"] if t["computation"] == comp), key=lambda t: t["start"])
    if len(ranges) < 2:
        return _split(c, rng)
    i = rng.randrange(len(ranges) - 1)
    try:
        merged = c.client.merge(comp, ranges[i]["key_range"], ranges[i + 1]["key_range"])
    except MillstreamError as e:
        return f"merge {comp}/{ranges[i]['key_range']}+{ranges[i + 1]['key_range']} refused: {e}"
    return f"merge {comp}/{ranges[i]['key_range']}+{ranges[i + 1]['key_range']} into {merged[0]['key_range']}"


FAULTS: list[Callable[[Cluster, random.Random], str]] = [
    _kill_and_restart_worker, _lose_host, _kill_worker_for_good, _zombie, _kill_leader, _add_worker, _move,
]
# The same failures plus live splits and merges of key ranges (issue 13): a test of its own, so
# the seeds of the tests above keep the schedules they always had.
RESHARD_FAULTS = [*FAULTS, _split, _merge]
RESHARD_SEEDS = [int(s) for s in os.environ.get("MILLSTREAM_CHAOS_RESHARD_SEEDS", "107").split(",")]


def _run_chaos(c: Cluster, seed: int, *, productions: str = "strong", counter: str | None = None,
               extra_words: str = "", replay: bool = False,
               faults: list[Callable[[Cluster, random.Random], str]] = FAULTS) -> None:
    rng = random.Random(seed)
    out = os.path.join(c.data_dir, "out")
    topo = wordcount.topology(out, name="chaos", productions=productions)
    if counter is not None:
        topo.computations["counter"] = dataclasses.replace(topo.computations["counter"], code=counter)
    c.client.submit(topo)
    c.wait_assigned()
    lines = [line + extra_words if i % 97 == 0 else line
             for i, line in enumerate(sample_lines(4000, seed=seed))]
    expected = oracle(lines)
    history: list[str] = []
    chunk = 500
    inj = Injector(c.masters_arg, "lines", "chaos-source", batch_size=100)
    try:
        for start in range(0, len(lines), chunk):
            if replay and start == len(lines) // 2:
                # The source crashes and is run again from the beginning under its name:
                # sequenced ids, so every line already committed is dropped by one mark.
                inj.close()
                inj = Injector(c.masters_arg, "lines", "chaos-source", batch_size=100)
                for i, line in enumerate(lines[:start]):
                    inj.send(b"", line.encode(), BASE_TS + i)
                inj.flush()
                history.append("replay the source from the start")
            for i, line in enumerate(lines[start:start + chunk], start):
                if replay:
                    inj.send(b"", line.encode(), BASE_TS + i)
                    continue
                rid = derived_id(b"chaos", str(i).encode())
                for _ in range(2 if i % 11 == 0 else 1):  # some ids are sent twice
                    inj.send(b"", line.encode(), BASE_TS + i, id=rid)
            inj.flush()
            try:
                history.append(rng.choice(faults)(c, rng))
            except TimeoutError as e:
                raise TimeoutError(f"seed {seed}, after: {history}: {e}") from None
        inj.finish()
    finally:
        inj.close()
    total = sum(expected.values())
    try:
        got = settled_word_counts(out, expected, 120)
    except AssertionError as e:
        dumped = c.dump_workers()  # what each worker still waits on, in its log
        raise AssertionError(f"seed {seed}, after: {history}: {e} (task dumps in {dumped})") from None
    if got != expected:
        dumped = c.dump_workers()
        assert got == expected, f"seed {seed}, after: {history} (task dumps in {dumped})"
    rows = list(read_file_sink(out))
    assert len(rows) == total, f"seed {seed}, after: {history}"
    if faults is not RESHARD_FAULTS:  # a split or merge changes a key's producer: no order across
        problem = _check_key_order(rows)
        assert problem is None, f"seed {seed}, after: {history}: {problem}"


def _check_key_order(rows: list[dict[str, object]]) -> str | None:
    """What breaks per-producer key order in the sink's rows (None: nothing). Every line has
    key b"", so one splitter tablet splits them all, in send order; one counter tablet per
    word counts its occurrences, in the splitter's order; one sink tablet per word writes its
    counts, in the counter's order. So per word, the sink's file holds the counts rising, and
    the n-th count carries the timestamp of the line of the word's n-th occurrence: rising
    with n too (equal for a word twice in a line). Failover keeps a tablet one producer (its
    replays are dropped): this is the order of first processing."""
    last: dict[str, tuple[int, int]] = {}
    for row in rows:  # file by file (a word's counts are all in one), each in write order
        word, n, ts = str(row["key"]), int(str(row["value"])), int(str(row["timestamp"]))
        before = last.get(word, (0, 0))
        if n <= before[0]:
            return f"count {n} of {word!r} written after count {before[0]}"
        if ts < before[1]:
            return (f"count {n} of {word!r} is of line {ts - BASE_TS}, count {before[0]} of the later "
                    f"line {before[1] - BASE_TS}")
        last[word] = (n, ts)
    return None


@pytest.mark.parametrize("seed", RESHARD_SEEDS)
def test_word_count_stays_exact_while_ranges_split_and_merge_among_failures(chaos_cluster: Cluster,
                                                                          seed: int) -> None:
    _run_chaos(chaos_cluster, seed, faults=RESHARD_FAULTS)


@pytest.mark.parametrize("seed", SEEDS)
def test_word_count_stays_exact_under_a_seeded_mix_of_failures(chaos_cluster: Cluster, seed: int) -> None:
    _run_chaos(chaos_cluster, seed)


@pytest.mark.parametrize("seed", [s + 100 for s in SEEDS])
def test_weak_productions_stay_exact_under_a_seeded_mix_of_failures(chaos_cluster: Cluster, seed: int) -> None:
    """Weak productions: sent before the commit, with ids that a retry must repeat."""
    _run_chaos(chaos_cluster, seed, productions="weak")


@pytest.mark.parametrize("seed", [s + 200 for s in SEEDS])
def test_tablets_restarted_after_failed_batches_stay_exact(chaos_cluster: Cluster, seed: int) -> None:
    """Some counter batches fail at commit (once per tablet and process): the tablet reopens
    from disk with smaller batches while the seeded faults go on."""
    _run_chaos(chaos_cluster, seed, counter="tests.jobs:FlakyCommitCounter", extra_words=" failcommit")


@pytest.mark.parametrize("seed", [s + 300 for s in SEEDS])
def test_a_source_replayed_from_the_start_mid_run_counts_once(chaos_cluster: Cluster, seed: int) -> None:
    """Issue 11: default (sequenced) ids, the source re-run from its first line half-way
    through, under the seeded faults: receivers drop the replay from per-producer marks."""
    _run_chaos(chaos_cluster, seed, replay=True)


def test_busy_workers_are_never_taken_for_dead(tmp_path: object) -> None:
    """Regression for issue 9: user code that sleeps past the lease (1.5 s here) on some
    records, with tablets moved and workers added meanwhile. Nothing is lethal, so no lease
    may expire and no worker may register twice; the counts stay exact."""
    with Cluster(str(tmp_path), workers=2).running() as c:
        out = os.path.join(c.data_dir, "out")
        topo = wordcount.topology(out, name="busy")
        topo.computations["counter"] = dataclasses.replace(
            topo.computations["counter"], code="tests.jobs:SlowCounter", params={"every": "500", "sleep": "2"})
        c.client.submit(topo)
        c.wait_assigned()
        rng = random.Random(9)
        lines = sample_lines(3000, seed=9)
        expected = oracle(lines)
        history: list[str] = []
        with Injector(c.masters_arg, "lines", "busy-source", batch_size=100) as inj:
            for start in range(0, len(lines), 500):
                for i, line in enumerate(lines[start:start + 500], start):
                    inj.send(b"", line.encode(), BASE_TS + i)
                inj.flush()
                history.append(rng.choice([_move, _move, _add_worker])(c, rng))
        assert settled_word_counts(out, expected, 180) == expected, history
        live = c.client.status()["liveness"]
        assert live["lease_expiries"] == 0 and live["registrations"] == len(c.workers), (live, history)
