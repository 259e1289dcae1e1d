"""The word count end to end on real processes: exact counts, under crashes too."""

from __future__ import annotations

import glob
import os

from cli.demo import sample_lines
from examples import wordcount
from runtime.sinks import read_file_sink
from tests.e2e.wordcount_run import inject_lines, run_wordcount
from tests.harness import Cluster, wait_until


def test_wordcount_equals_oracle_with_repeated_ids(cluster: Cluster) -> None:
    run_wordcount(cluster, n_lines=2000, repeat_every=3)


def test_reinjecting_the_same_source_counts_nothing_twice(cluster: Cluster) -> None:
    """A whole injection re-run under the same name (a crashed source restarting) is a no-op."""
    got = run_wordcount(cluster, n_lines=500, name="again")
    inject_lines(cluster.masters_arg, "test-again", sample_lines(500, seed=11), repeat_every=7)
    # Let the duplicates reach every stage (a marker line injected last must arrive) ...
    inject_lines(cluster.masters_arg, "marker", ["zzmarker"], repeat_every=7)
    out = os.path.join(cluster.data_dir, "out-again")
    wait_until(lambda: any(r["key"] == "zzmarker" for r in read_file_sink(out)), 60, "the marker")
    # ... and nothing but the marker was added.
    rows = [r for r in read_file_sink(out) if r["key"] != "zzmarker"]
    assert wordcount.final_counts(rows) == got
    assert len(rows) == sum(got.values())


def test_worker_sigkill_mid_run_then_restart_on_its_own_disk(cluster: Cluster) -> None:
    victim = cluster.workers[0]

    def crash_and_restart() -> None:
        cluster.kill_worker(victim, graceful=False)
        cluster.restart_worker(victim)  # same address, same state directory: the same worker

    run_wordcount(cluster, n_lines=4000, midway=crash_and_restart, name="crash")
    assert not victim.alive()


def test_weak_productions_are_exact_under_a_worker_sigkill(cluster: Cluster) -> None:
    """Weak productions are sent before the commit with ids derived from their input, so the
    retry after a crash re-sends the same ids and the receivers drop what they have."""
    victim = cluster.workers[1]

    def crash_and_restart() -> None:
        cluster.kill_worker(victim, graceful=False)
        cluster.add_worker()

    run_wordcount(cluster, n_lines=4000, midway=crash_and_restart, name="weak", productions="weak")


def test_dedup_data_stays_bounded(cluster: Cluster) -> None:
    """Producers tell receivers which ids they will never resend; receivers forget those."""
    from rocksdict import AccessType, Options, Rdict

    got = run_wordcount(cluster, n_lines=3000, name="gc")
    words = sum(got.values())
    kept = copies = 0
    # Every copy (primaries and followers) of the counter's tablets, read without their lock.
    for path in glob.glob(os.path.join(cluster.state_dir, "*", "counter", "*")):
        db = Rdict(path, options=Options(raw_mode=True), access_type=AccessType.read_only())
        kept += sum(1 for k in db.keys() if k[:1] in (b"H", b"O"))
        copies += 1
        db.close()
    assert copies >= 4
    # Sequenced ids: one mark per producer, not one id per word.
    assert kept < words / 10, (kept, words)
