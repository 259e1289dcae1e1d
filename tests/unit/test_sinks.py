"""CommittedFile (FileSink's file) on reopen: never fill a gap, never cut what it did not
write, and still cut its own uncommitted output (review E4)."""

from __future__ import annotations

import os

from runtime.record import Record
from runtime.sinks import CommittedFile, read_file_sink


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_reopening_cuts_uncommitted_output_back(tmp_path: object) -> None:
    d = str(tmp_path)
    f = CommittedFile(d, "sink/0", ".jsonl", None)
    meta = f.append(b"one\n")
    f.append(b"two\n")  # written, never committed: the tablet crashed
    again = CommittedFile(d, "sink/0", ".jsonl", meta)
    assert _read(again.path) == b"one\n" and again.path == f.path


def test_a_file_moved_away_is_not_filled_with_nul_bytes(tmp_path: object) -> None:
    """The review's experiment: append, delete the file, reopen with the committed meta. It
    used to recreate the file as 43 NUL bytes."""
    d = str(tmp_path)
    f = CommittedFile(d, "sink/0", ".jsonl", None)
    meta = f.append(b'{"key": "k", "value": "v", "timestamp": 1}\\n')
    os.rename(f.path, f.path + ".rotated")
    again = CommittedFile(d, "sink/0", ".jsonl", meta)  # like logrotate: a fresh file
    assert _read(again.path) == b""
    again.append(b"next\n")
    assert _read(again.path) == b"next\n"
    assert _read(f.path + ".rotated") == b'{"key": "k", "value": "v", "timestamp": 1}\\n'
    # ... and if the fresh one is rotated too after a commit, the next open goes on again.
    meta = again.append(b"more\n")
    os.rename(again.path, again.path + ".2")
    third = CommittedFile(d, "sink/0", ".jsonl", meta)
    assert _read(third.path) == b"" and _read(again.path + ".2") == b"next\nmore\n"


def test_output_of_an_earlier_cluster_is_left_alone(tmp_path: object) -> None:
    """No committed meta (a new cluster, a lost state directory) and a file with content:
    it used to be truncated to nothing."""
    d = str(tmp_path)
    old = os.path.join(d, "sink-0.jsonl")
    with open(old, "wb") as out:
        out.write(b"yesterday's output\n")
    f = CommittedFile(d, "sink/0", ".jsonl", None)
    assert f.path != old and _read(old) == b"yesterday's output\n"


def test_a_crash_before_the_first_commit_leaves_no_duplicate(tmp_path: object) -> None:
    d = str(tmp_path)
    f = CommittedFile(d, "sink/0", ".jsonl", None)
    f.append(b"first batch, never committed\n")
    again = CommittedFile(d, "sink/0", ".jsonl", None)  # reopened: still nothing committed
    assert again.path == f.path and _read(again.path) == b""
    meta = again.append(b"first batch\n")
    again.append(b"second batch\n")  # the first commit was durable: the marker goes
    assert not os.path.exists(os.path.join(d, ".sink-0.uncommitted"))
    assert CommittedFile(d, "sink/0", ".jsonl", meta).path == f.path


def test_a_meta_from_before_file_names_were_committed_still_opens(tmp_path: object) -> None:
    d = str(tmp_path)
    with open(os.path.join(d, "sink-0.jsonl"), "wb") as out:
        out.write(b"abc\nxyz")
    f = CommittedFile(d, "sink/0", ".jsonl", b"4")  # old meta: the length only
    assert _read(f.path) == b"abc\n"


def test_a_reader_never_sees_a_line_still_being_written(tmp_path: object) -> None:
    """The CI failure of session 2: a test polled the sink while a batch was half written."""
    d = str(tmp_path)
    with open(os.path.join(d, "sink-0.jsonl"), "w") as f:
        f.write('{"key": "a", "value": "1", "timestamp": 5}\n{"key": "b", "value": "2", "timest')
    assert list(read_file_sink(d)) == [{"key": "a", "value": "1", "timestamp": 5}]


def test_a_full_file_is_closed_and_the_next_batch_starts_the_next(tmp_path: object) -> None:
    d = str(tmp_path)
    f = CommittedFile(d, "sink/0", ".jsonl", None, roll_bytes=5)
    first = f.path
    metas = [f.append(b'{"n": %d}\n' % i) for i in range(5)]
    names = sorted(os.listdir(d))
    assert [n for n in names if n.endswith(".jsonl")] == ["sink-0.1.jsonl", "sink-0.2.jsonl", "sink-0.3.jsonl",
                                                          "sink-0.4.jsonl", "sink-0.jsonl"]
    assert _read(first) == b'{"n": 0}\n'
    assert sorted(int(str(r["n"])) for r in read_file_sink(d)) == [0, 1, 2, 3, 4]
    # A crash after the roll batch was written but before its commit: the tablet reopens on
    # the previous meta, keeps the earlier files whole and cuts only what was not committed.
    g = CommittedFile(d, "sink/0", ".jsonl", metas[3], roll_bytes=5)
    assert g.path.endswith("sink-0.3.jsonl") and _read(g.path) == b'{"n": 3}\n'
    meta = g.append(b'{"n": 4}\n')
    assert meta.decode().endswith(" sink-0.4.jsonl run")  # the uncommitted file is reused, not skipped
    assert sorted(int(str(r["n"])) for r in read_file_sink(d)) == [0, 1, 2, 3, 4]


def test_an_older_owner_cannot_write_output_its_successor_claimed(tmp_path: object) -> None:
    """A tablet's old primary still finishing a batch while the new one opens (a move, a
    failover): the chaos suite saw torn lines in the shared output before output was fenced."""
    import pytest

    from runtime.errors import StaleTokenError

    d = str(tmp_path)
    old = CommittedFile(d, "sink/0", ".jsonl", None, token=3)
    meta = old.append(b'{"n": 1}\n')
    new = CommittedFile(d, "sink/0", ".jsonl", meta, token=4)  # the next owner claims the file
    with pytest.raises(StaleTokenError, match="claimed by token 4, newer than this tablet's"):
        old.append(b'{"n": 2}\n')
    new.append(b'{"n": 3}\n')
    assert [int(str(r["n"])) for r in read_file_sink(d)] == [1, 3]
    with pytest.raises(StaleTokenError):  # nor may an older owner reopen (and cut) it
        CommittedFile(d, "sink/0", ".jsonl", meta, token=3)
    assert [int(str(r["n"])) for r in read_file_sink(d)] == [1, 3]


def test_a_merged_range_cuts_the_other_range_s_file_back_and_fences_it(tmp_path: object) -> None:
    import pytest

    from runtime.errors import StaleTokenError
    from runtime.sinks import FileSink

    d = str(tmp_path)
    right = CommittedFile(d, "sink/1", ".jsonl", None, token=1)
    meta = right.append(b"one\n")
    right.append(b"two\n")  # the right range's last batch: written, its commit failed; then merged
    merged = FileSink()
    merged.setup({"path": d})
    for _ in range(2):  # a reopen settles again, the same way
        merged.restore("sink/2", None, token=2, absorbed=[meta])
        assert _read(right.path) == b"one\n"  # the merged range writes "two" again, once
    with pytest.raises(StaleTokenError):
        right.append(b"three\n")  # the right range's old owner can write there no more


def test_a_committed_first_batch_loses_its_marker_so_a_later_cluster_leaves_it_alone(tmp_path: object) -> None:
    """Review of the sinks: the marker that says "this file holds only my uncommitted first
    batch" went only with a second batch; a tablet whose input was one batch kept it beside
    committed output, and a later cluster writing to the same directory (fresh state) took
    that file for its own and cut it to nothing. The worker now calls ``committed()`` once the
    commit is durable and replicated, and the marker goes then."""
    d = str(tmp_path)
    f = CommittedFile(d, "sink/0", ".jsonl", None)
    f.append(b"the only batch\n")
    assert os.path.exists(os.path.join(d, ".sink-0.uncommitted"))
    f.committed()
    assert not os.path.exists(os.path.join(d, ".sink-0.uncommitted"))
    later = CommittedFile(d, "sink/0", ".jsonl", None)  # a new cluster, the same directory
    assert later.path != f.path and _read(f.path) == b"the only batch\n"


def test_the_worker_tells_a_sink_its_commit_is_safe(tmp_path: object) -> None:
    """Through the worker (a TestRun is the real one): a FileSink, classic and fused into a
    flow, has no marker left once its one batch committed."""
    from runtime import Dataflow, Topology
    from runtime.sinks import FileSink
    from runtime.testing import TestRun

    classic = Topology("t").add_computation("out", FileSink, inputs={"in": None},
                                             params={"path": os.path.join(str(tmp_path), "classic")})
    flow = Dataflow("f")
    flow.input("in", keyed=True).sink(FileSink, name="f.out", path=os.path.join(str(tmp_path), "flow"))
    for job, where in ((classic, "classic"), (flow, "flow")):
        with TestRun(job) as run:
            run.inject("in", b"k", b"v", 1_700_000_000_000_000)
            run.run_until_idle()
        d = os.path.join(str(tmp_path), where)
        written = [n for n in os.listdir(d) if n.endswith(".jsonl") and os.path.getsize(os.path.join(d, n))]
        assert len(written) == 1, written  # (the other ranges' files are empty: theirs to reuse)
        assert not os.path.exists(os.path.join(d, "." + written[0].removesuffix(".jsonl") + ".uncommitted"))


def test_a_restore_removes_what_the_run_rolled_to_after_the_commit_it_goes_back_to(tmp_path: object) -> None:
    """Review of the sinks: a savepoint restore cut the file the savepoint committed back, but
    files the old job rolled to after it stayed, and the restored job wrote the same records
    again beside them (duplicates). Every file of a run past its committed one is removed;
    an earlier run's files in the directory are not (review E4)."""
    d = str(tmp_path)
    with open(os.path.join(d, "sink-0.jsonl"), "wb") as out:  # an earlier cluster's output
        out.write(b'{"n": -1}\n')
    f = CommittedFile(d, "sink/0", ".jsonl", None, roll_bytes=5, token=1)
    assert f.prefix == "sink-0.g1"
    savepoint = f.append(b'{"n": 0}\n')
    f.append(b'{"n": 1}\n')  # after the savepoint: rolled to sink-0.g1.1.jsonl, then .2
    f.append(b'{"n": 2}\n')
    restored = CommittedFile(d, "sink/0", ".jsonl", savepoint, roll_bytes=5, token=1 + (1 << 20))
    assert sorted(int(str(r["n"])) for r in read_file_sink(d)) == [-1, 0]
    restored.append(b'{"n": 1}\n')  # the restored job goes on from the savepoint
    assert sorted(int(str(r["n"])) for r in read_file_sink(d)) == [-1, 0, 1]


def test_an_older_owner_cannot_roll_to_a_file_its_successor_has_not_reached(tmp_path: object) -> None:
    """Review of the sinks: the fence was per file and the new owner claimed only its current
    one, so an old owner that woke after the new one had rolled, and rolled too, took a file
    nobody had claimed and wrote its batch there. One fence per run now."""
    import pytest

    from runtime.errors import StaleTokenError

    d = str(tmp_path)
    old = CommittedFile(d, "sink/0", ".jsonl", None, roll_bytes=5, token=3)  # its next batch rolls
    meta = old.append(b'{"n": 1}\n')
    new = CommittedFile(d, "sink/0", ".jsonl", meta, roll_bytes=15, token=4)
    for n in range(2, 7):  # two files further on, each with a second batch (their first committed)
        new.append(b'{"n": %d}\n' % n)
    with pytest.raises(StaleTokenError):
        old.append(b'{"n": 7}\n')  # it rolls too
    assert sorted(int(str(r["n"])) for r in read_file_sink(d)) == [1, 2, 3, 4, 5, 6]


def test_a_run_left_by_an_earlier_cluster_s_idle_range_does_not_stop_a_new_tablet_opening(tmp_path: object) -> None:
    """Review of the runs: an earlier cluster's range that opened (reaching token 4) but never
    ran a batch left its marker and fence; a new cluster's tablet (token 1) took the marked
    prefix as its own and its claim failed (StaleTokenError): it could never open."""
    d = str(tmp_path)
    CommittedFile(d, "sink/3", ".jsonl", None, token=4)  # opened, never wrote
    f = CommittedFile(d, "sink/3", ".jsonl", None, token=1)
    assert f.prefix == "sink-3.g1"
    f.append(b"new\n")


def test_a_committed_file_gone_leaves_no_marker_behind(tmp_path: object) -> None:
    """Review of the runs: a tablet that crashed between its first commit and committed(), its
    file then moved away, went on in the next file with the marker still there: a later
    cluster would have taken the run for its own uncommitted output and removed it."""
    d = str(tmp_path)
    f = CommittedFile(d, "sink/0", ".jsonl", None, token=1)
    meta = f.append(b"one\n")  # committed; committed() never came (a crash)
    os.rename(f.path, f.path + ".rotated")
    again = CommittedFile(d, "sink/0", ".jsonl", meta, token=2)
    assert again.name == "sink-0.1.jsonl" and not os.path.exists(os.path.join(d, ".sink-0.uncommitted"))
    again.append(b"two\n")
    later = CommittedFile(d, "sink/0", ".jsonl", None, token=1)  # a new cluster, the same directory
    assert later.prefix == "sink-0.g1" and _read(again.path) == b"two\n"


def test_a_file_named_by_an_older_meta_keeps_other_clusters_files_and_goes_on_in_a_run_of_its_own(
        tmp_path: object) -> None:
    """Before runs, a tablet's next file was the first free number of its name, so one name's
    numbers could hold two clusters' files: an older meta removes nothing after its file, and
    the tablet's next file starts a run of its own. An older version's marker beside committed
    output is not taken for a run's own either."""
    d = str(tmp_path)
    for name, text in (("sink-3.jsonl", b"ours\n"), ("sink-3.1.jsonl", b"another cluster's\n")):
        with open(os.path.join(d, name), "wb") as out:
            out.write(text)
    f = CommittedFile(d, "sink/3", ".jsonl", b"5 sink-3.jsonl", roll_bytes=1, token=2)
    assert _read(os.path.join(d, "sink-3.1.jsonl")) == b"another cluster's\n"
    meta = f.append(b"next\n")
    assert meta == b"5 sink-3.g1.jsonl run" and _read(os.path.join(d, "sink-3.1.jsonl")) == b"another cluster's\n"
    open(os.path.join(d, "sink-3.jsonl.uncommitted"), "ab").close()  # left by an older version
    assert CommittedFile(d, "sink/3", ".jsonl", None, token=1).prefix == "sink-3.g2"
    assert _read(os.path.join(d, "sink-3.jsonl")) == b"ours\n"


def test_a_run_begun_from_an_older_meta_whose_batch_failed_is_taken_back(tmp_path: object) -> None:
    """Review of the runs: a tablet whose meta predates runs began a run of its own at a roll
    with no marker; the roll's batch failing, the tablet reopened on the older meta, and its
    next roll began yet another run: the failed batch's lines stayed (read twice)."""
    d = str(tmp_path)
    with open(os.path.join(d, "sink-3.jsonl"), "wb") as out:
        out.write(b'{"n": 0}\n')
    older = b"9 sink-3.jsonl"  # as the version before runs committed it
    f = CommittedFile(d, "sink/3", ".jsonl", older, roll_bytes=1, token=2)
    f.append(b'{"n": 1}\n')  # rolls into a run of its own; its commit never happens
    again = CommittedFile(d, "sink/3", ".jsonl", older, roll_bytes=1, token=3)
    assert sorted(int(str(r["n"])) for r in read_file_sink(d)) == [0]  # taken back at the open
    again.append(b'{"n": 1}\n')
    assert sorted(int(str(r["n"])) for r in read_file_sink(d)) == [0, 1]


def test_a_merged_range_s_marker_goes_with_its_settling(tmp_path: object) -> None:
    """Review of the runs: a range whose first commit's committed() never came (a crash), then
    merged away, kept its marker beside committed output for good; a later cluster's tablet of
    that name would have taken the run for uncommitted output and removed it."""
    from runtime.sinks import FileSink

    d = str(tmp_path)
    right = CommittedFile(d, "sink/1", ".jsonl", None, token=1)
    meta = right.append(b"one\n")  # committed; committed() never came
    merged = FileSink()
    merged.setup({"path": d})
    merged.restore("sink/2", None, token=2, absorbed=[meta])
    assert not os.path.exists(os.path.join(d, ".sink-1.uncommitted"))
    later = CommittedFile(d, "sink/1", ".jsonl", None, token=3)  # a later cluster
    assert later.prefix == "sink-1.g1" and _read(right.path) == b"one\n"


def test_a_replaced_range_that_never_committed_has_its_output_taken_back(tmp_path: object) -> None:
    """Review: a range's first batch written, its commit failed, and the range split (or merged)
    before it opened again: nothing committed, so no meta went to the range that goes on, and
    the lines stayed in the file, to be written again by that range (read twice)."""
    import pytest

    from runtime.errors import StaleTokenError
    from runtime.sinks import FileSink

    d = str(tmp_path)
    parent = CommittedFile(d, "sink/1", ".jsonl", None, token=1)
    parent.append(b'{"key": "k", "value": "lost", "timestamp": 1}\n')  # its commit failed
    neighbour = CommittedFile(d, "sink/10", ".jsonl", None, token=1)  # another range's first batch, in flight
    neighbour.append(b'{"key": "k", "value": "neighbour", "timestamp": 1}\n')
    # A run of the same name that an owner newer than the parent's last token claimed (another
    # cluster writing here, its first commit's committed() never came): not the replaced range's.
    newer = CommittedFile(d, "sink/7", ".jsonl", None, token=3)
    newer.append(b'{"key": "k", "value": "newer", "timestamp": 1}\n')
    child = FileSink()
    child.setup({"path": d})
    for _ in range(2):  # every open takes back the same way
        child.restore("sink/2", None, token=5, absorbed=[], uncommitted={"sink/1": 1, "sink/7": 2, "sink/5": 1})
        assert not os.path.exists(parent.path) and not os.path.exists(os.path.join(d, ".sink-1.uncommitted"))
        assert sorted(r["value"] for r in read_file_sink(d)) == ["neighbour", "newer"]
    with pytest.raises(StaleTokenError):
        parent.append(b"more\n")  # the parent's old owner, still finishing its batch, writes nothing more
    child.process_batch(None, [Record(b"k", b"again", 1, bytes(16))])  # type: ignore[arg-type]
    child.prepare_commit()
    assert sorted(r["value"] for r in read_file_sink(d)) == ["again", "neighbour", "newer"]


def test_committed_is_called_only_for_a_sink_that_defines_it() -> None:
    """The worker hands a tablet's thread a hop per batch only for a Sink that overrides
    committed() (or a flow's stage that fused one); a computation written before Sink may
    hold anything under that name, and is left alone."""
    from runtime.computation import Computation
    from runtime.sinks import FileSink, Sink, committed_hook

    class Legacy(Computation):
        committed = 5  # not a hook

    class Plain(Sink):
        pass

    class Stage(Computation):
        def __init__(self, sink: Sink) -> None:
            self.fused_sink = sink

    sink = FileSink()
    assert committed_hook(Legacy()) is None and committed_hook(Plain()) is None
    assert committed_hook(sink) == sink.committed and committed_hook(Stage(sink)) == sink.committed
    assert committed_hook(Stage(Plain())) is None


def test_a_new_file_and_a_marker_gone_are_synced_into_their_directory(tmp_path: object, monkeypatch: object) -> None:
    """Review of the sinks: FileSink never synced its directory. After a power cut a file made
    just before (a roll whose commit then named it) could be missing, its lines lost; and a
    marker removed could come back beside committed output."""
    import runtime.outputfiles as outputfiles

    synced: list[str] = []
    monkeypatch.setattr(outputfiles, "sync_dir", synced.append)  # type: ignore[attr-defined]
    d = str(tmp_path)
    f = CommittedFile(d, "sink/0", ".jsonl", None, roll_bytes=1)
    assert synced == [d]  # the run's marker and first file
    f.append(b"one\n")
    f.committed()
    assert synced == [d, d]  # the marker gone
    f.append(b"two\n")  # rolls: the new file is synced in before the commit that names it
    assert synced == [d, d, d]
