"""``inject-files --follow`` (injectors/follow.py) without a network: which files it takes and
when, each once, their ids, times and the watermark, bad files, and its flags. Each poll of the
follower runs the next step of a script instead of waiting."""

from __future__ import annotations

import errno
import json
import logging
import os
from collections.abc import Callable
from typing import Any

import pytest

from injectors import follow as follow_module
from injectors.files import file_identity
from injectors.follow import Follower, follow_files
from runtime.errors import InjectionError, MasterUnavailableError, StreamClosedError, TopologyError
from tests.unit.test_file_injector import Recorder

T0 = 1_704_067_200_000_000  # 2024-01-01T00:00:00Z


def script(*steps: Callable[[], object]) -> Callable[[float], bool]:
    """A ``wait`` that runs one step per poll and stops the follower after the last."""
    todo = list(steps)

    def wait(_: float) -> bool:
        if not todo:
            return True
        todo.pop(0)()
        return False
    return wait


def clock() -> Callable[[], int]:
    """A scan's time: 1 s later at each scan."""
    now = [T0]

    def now_us() -> int:
        now[0] += 1_000_000
        return now[0]
    return now_us


def put(d: str, name: str, lines: list[str]) -> None:
    """A file written elsewhere and moved in whole (as the follower's docs say to)."""
    tmp = os.path.join(d, "." + name + ".part")
    with open(tmp, "w") as f:
        f.write("".join(line + "\n" for line in lines))
    os.rename(tmp, os.path.join(d, name))


def sends(r: Recorder) -> list[Any]:
    return [v for k, v in r.events if k == "send"]


def values(r: Recorder) -> list[bytes]:
    return [v[1] for v in sends(r)]


def follow(r: Recorder, d: str, *steps: Callable[[], object], **kw: Any) -> int:
    return follow_files(r, d, poll_s=0.01, wait=script(*steps), now_us=clock(), **kw)


def test_files_are_taken_one_poll_after_they_are_seen_each_once_stamped_as_taken(tmp_path: Any) -> None:
    d = str(tmp_path)
    put(d, "a.log", ["a1", "a2"])
    r = Recorder()
    seen: list[list[bytes]] = []
    n = follow(r, d, lambda: seen.append(values(r)), lambda: put(d, "b.log", ["b1"]),
               lambda: seen.append(values(r)), lambda: seen.append(values(r)))
    assert seen == [[], [b"a1", b"a2"], [b"a1", b"a2", b"b1"]] and n == 3
    # (scan 1 saw a.log; scan 2 took it; scan 3 saw b.log; scan 4 took it; scan 5 found nothing new)
    stamps = {v[1]: v[2] for v in sends(r)}
    assert stamps == {b"a1": T0 + 2_000_000, b"a2": T0 + 2_000_000, b"b1": T0 + 4_000_000}
    assert {v[0] for v in sends(r)} == {b"a.log", b"b.log"}  # keyed by file name, as without --follow
    marks = [v for k, v in r.events if k == "watermark"]
    assert marks == [T0 + i * 1_000_000 for i in range(1, 6)]  # every scan's time, once its files are flushed
    last_mark = -1
    for kind, v in r.events:  # no record behind the watermark
        if kind == "watermark":
            last_mark = v  # type: ignore[assignment]
        elif kind == "send":
            assert v[2] >= last_mark  # type: ignore[index, operator]


def test_a_file_still_growing_waits_and_hidden_files_wait_to_be_moved_in(tmp_path: Any) -> None:
    d = str(tmp_path)
    path = os.path.join(d, "slow.log")
    r = Recorder()

    def grow(line: str) -> Callable[[], None]:
        def step() -> None:
            with open(path, "a") as f:
                f.write(line + "\n")
        return step

    with open(os.path.join(d, ".hidden.log"), "w") as f:
        f.write("h1\n")
    follow(r, d, grow("s1"), grow("s2"), grow("s3"), lambda: None,
           lambda: os.rename(os.path.join(d, ".hidden.log"), os.path.join(d, "shown.log")), lambda: None)
    assert values(r) == [b"s1", b"s2", b"s3", b"h1"]  # slow.log whole, once it stopped changing


def test_a_file_renamed_or_appended_to_after_it_was_sent_is_not_sent_again(tmp_path: Any) -> None:
    d = str(tmp_path)
    put(d, "app.log", ["l1", "l2"])
    r = Recorder()

    def append() -> None:
        with open(os.path.join(d, "app.log.1"), "a") as f:
            f.write("l3\n")
    follow(r, d, lambda: None, lambda: os.rename(os.path.join(d, "app.log"), os.path.join(d, "app.log.1")),
           lambda: None, append, lambda: None, lambda: None)
    assert values(r) == [b"l1", b"l2"]


def test_a_restarted_follower_sends_the_same_places_so_its_readers_drop_them(tmp_path: Any) -> None:
    d = str(tmp_path)
    put(d, "a.log", ["x", "x"])
    first, again = Recorder(), Recorder()
    follow(first, d, lambda: None)
    follow(again, d, lambda: None)
    a = file_identity(os.path.join(d, "a.log"))
    assert [v[3] for v in sends(first)] == [(a, 1), (a, 2)] == [v[3] for v in sends(again)]


def test_with_a_time_field_the_watermark_trails_the_latest_time_by_the_delay(tmp_path: Any) -> None:
    d = str(tmp_path)
    put(d, "a.jsonl", [json.dumps({"u": "x", "ts": T0 + 5_000_000}), json.dumps({"u": "y", "ts": T0 + 1_000_000})])
    r = Recorder()
    follow(r, d, lambda: None,
           lambda: put(d, "b.jsonl", [json.dumps({"u": "x", "ts": T0 + 2_000_000})]),  # late: still sent
           lambda: None, key_field="u", time_field="ts", max_delay_us=2_000_000)
    assert [(v[0], v[2]) for v in sends(r)] == [(b"x", T0 + 5_000_000), (b"y", T0 + 1_000_000),
                                                (b"x", T0 + 2_000_000)]
    assert [v for k, v in r.events if k == "watermark"] == [T0 + 3_000_000]  # 5 s - 2 s, and never back


def test_a_bad_file_is_not_sent_the_others_are_and_it_is_tried_again_once_fixed(tmp_path: Any, caplog: Any) -> None:
    d = str(tmp_path)
    put(d, "bad.jsonl", [json.dumps({"u": "x", "ts": T0}), "not json"])
    put(d, "good.jsonl", [json.dumps({"u": "y", "ts": T0})])
    r = Recorder()
    with caplog.at_level(logging.ERROR):
        follow(r, d, lambda: None, lambda: None,
               lambda: put(d, "bad.jsonl", [json.dumps({"u": "x", "ts": T0}), json.dumps({"u": "z", "ts": T0})]),
               lambda: None, key_field="u", time_field="ts", max_delay_us=0)
    assert [v[0] for v in sends(r)] == [b"y", b"x", b"z"]
    [message] = [m for m in caplog.messages if "bad.jsonl" in m]
    assert "bad.jsonl, line 2: not JSON" in message and "tried again once it changes" in message


def test_numbers_that_look_like_seconds_refuse_their_file(tmp_path: Any, caplog: Any) -> None:
    d = str(tmp_path)
    put(d, "s.jsonl", [json.dumps({"u": "x", "ts": 1_704_067_200})])
    r = Recorder()
    with caplog.at_level(logging.ERROR):
        follow(r, d, lambda: None, key_field="u", time_field="ts", max_delay_us=0)
    assert not sends(r) and any("looks like seconds" in m and "--timestamp-unit s" in m for m in caplog.messages)
    follow(r, d, lambda: None, key_field="u", time_field="ts", unit="s", max_delay_us=0)
    assert [v[2] for v in sends(r)] == [T0]


@pytest.mark.parametrize(("kw", "message"), [
    ({"time_field": "ts"}, "needs --max-delay-s"),
    ({"max_delay_us": 5}, "--max-delay-s is the lateness allowed to --timestamp-field"),
    ({"unit": "ms"}, "give the field too"),
    ({"time_field": "ts", "max_delay_us": -1}, "must be 0 or more"),
    ({"poll_s": 0}, "--poll-s must be more than 0"),
])
def test_flags_that_cannot_work_are_refused_before_anything_is_sent(tmp_path: Any, kw: dict[str, Any],
                                                                      message: str) -> None:
    r = Recorder()
    with pytest.raises(InjectionError, match=message):
        follow_files(r, str(tmp_path), wait=script(), **kw)
    with pytest.raises(InjectionError, match="is not a directory"):
        follow_files(r, os.path.join(str(tmp_path), "missing"), wait=script())
    assert not r.events


def test_a_file_without_its_last_newline_waits_for_it(tmp_path: Any, caplog: Any) -> None:
    d = str(tmp_path)
    path = os.path.join(d, "w.log")
    with open(path, "w") as f:
        f.write("w1\nw2")  # a writer that paused mid-line, longer than a poll

    def finish() -> None:
        with open(path, "a") as f:
            f.write("-end\n")
    r = Recorder()
    with caplog.at_level(logging.WARNING):
        follow(r, d, lambda: None, lambda: None, finish, lambda: None)
    assert values(r) == [b"w1", b"w2-end"]
    assert len([m for m in caplog.messages if "does not end with a newline" in m]) == 1


def test_a_new_file_taken_for_one_sent_before_is_named_in_a_warning(tmp_path: Any, caplog: Any,
                                                                     monkeypatch: Any) -> None:
    """A new file on a deleted file's inode, with the same first line (a CSV header), has its
    identity: it is not sent, and the log says why and what avoids it."""
    d = str(tmp_path)
    put(d, "a.csv", ["id,name", "1,x"])
    r = Recorder()
    identity = file_identity(os.path.join(d, "a.csv"))
    monkeypatch.setattr("injectors.follow.identity_of", lambda f, st: identity)  # (as a reused inode gives)
    with caplog.at_level(logging.WARNING):
        follow(r, d, lambda: None, lambda: put(d, "b.csv", ["id,name", "2,y", "3,z"]), lambda: None)
    assert values(r) == [b"id,name", b"1,x"]
    assert any("b.csv has the identity of a file sent before" in m and "--done-dir" in m for m in caplog.messages)


def test_a_line_too_large_for_a_record_refuses_its_file(tmp_path: Any, caplog: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr("injectors.files.MAX_VALUE_BYTES", 8)
    d = str(tmp_path)
    put(d, "big.log", ["short", "far too long for it"])
    put(d, "ok.log", ["fine"])
    r = Recorder()
    with caplog.at_level(logging.ERROR):
        follow(r, d, lambda: None)
    assert values(r) == [b"fine"]
    assert any("big.log, line 2: over the 8 bytes a record's value may have" in m for m in caplog.messages)


def test_done_dir_takes_each_file_once_it_is_committed(tmp_path: Any) -> None:
    d, done = str(tmp_path / "in"), str(tmp_path / "done")
    os.makedirs(d)
    os.makedirs(done)
    put(done, "a.log", ["old"])  # a name already there: the new one goes beside it
    put(d, "a.log", ["a1"])
    class Checking(Recorder):
        def flush(self) -> None:  # the file is moved only once its records are committed
            assert os.listdir(d) == ["a.log"]
            super().flush()
    r = Checking()
    follow(r, d, lambda: None, done_dir=done)
    assert values(r) == [b"a1"] and os.listdir(d) == []
    assert sorted(os.listdir(done)) == ["a.log", "a.log.1"]
    assert open(os.path.join(done, "a.log.1")).read() == "a1\n"
    with pytest.raises(InjectionError, match="is the followed directory itself"):
        follow_files(r, d, done_dir=d, wait=script())
    with pytest.raises(InjectionError, match="--done-dir .* is not a directory"):
        follow_files(r, d, done_dir=os.path.join(done, "missing"), wait=script())


def test_a_cluster_that_cannot_commit_is_tried_again_each_poll(tmp_path: Any, caplog: Any) -> None:
    d = str(tmp_path)
    put(d, "a.log", ["a1"])

    class Flaky(Recorder):
        failures = 2

        def flush(self) -> None:
            if self.failures:
                self.failures -= 1
                raise InjectionError("round failed: no tablet answered")
            super().flush()
    r = Flaky()
    with caplog.at_level(logging.WARNING):
        follow(r, d, lambda: None, lambda: None, lambda: None, lambda: None)
    assert values(r) == [b"a1"] and ("flush", None) in r.events
    assert sum("could not be committed yet" in m for m in caplog.messages) == 2
    r = Flaky()
    stopped = [False]
    with pytest.raises(InjectionError, match="no tablet answered"):  # stopped while it cannot: the error
        follow_files(r, d, poll_s=0.01, wait=script(lambda: None, lambda: stopped.__setitem__(0, True)),
                     stopping=lambda: stopped[0], now_us=clock())


def test_a_follower_stops_between_files_and_outlives_its_directory_going_away(tmp_path: Any, caplog: Any) -> None:
    d = str(tmp_path / "in")
    os.makedirs(d)
    put(d, "a.log", ["a1"])
    put(d, "b.log", ["b1"])
    r = Recorder()
    follow_files(r, d, poll_s=0.01, wait=script(lambda: None), stopping=lambda: bool(sends(r)), now_us=clock())
    assert len(sends(r)) == 1  # the second file waits for the next run
    r = Recorder()
    with caplog.at_level(logging.ERROR):
        follow(r, d, lambda: None, lambda: [os.remove(os.path.join(d, n)) for n in os.listdir(d)] and os.rmdir(d),
               lambda: None)
    assert values(r) == [b"a1", b"b1"] and any("cannot list" in m for m in caplog.messages)


def test_the_trailing_watermark_never_finishes_the_stream(tmp_path: Any) -> None:
    d = str(tmp_path)
    put(d, "far.jsonl", [json.dumps({"u": "x", "ts": 2**63 - 1})])
    r = Recorder()
    follow(r, d, lambda: None, key_field="u", time_field="ts", unit="us", max_delay_us=0)
    assert [v for k, v in r.events if k == "watermark"] == [2**63 - 2]


def test_a_file_is_read_up_to_the_size_it_was_checked_at(tmp_path: Any) -> None:
    d = str(tmp_path)
    put(d, "a.log", ["l1", "l2"])

    class Appending(Recorder):  # a writer that goes on while the file is being sent
        def send_sequenced(self, producer: str, seq: int, key: bytes, value: bytes, timestamp: int) -> None:
            with open(os.path.join(d, "a.log"), "a") as f:
                f.write("par")
            super().send_sequenced(producer, seq, key, value, timestamp)
    r = Appending()
    follow(r, d, lambda: None)
    assert values(r) == [b"l1", b"l2"]


def test_an_empty_file_waits_for_its_lines(tmp_path: Any) -> None:
    d = str(tmp_path)
    open(os.path.join(d, "e.log"), "w").close()
    r = Recorder()

    def write() -> None:
        with open(os.path.join(d, "e.log"), "w") as f:
            f.write("e1\n")
    follow(r, d, lambda: None, write, lambda: None)
    assert values(r) == [b"e1"]


def test_a_cluster_or_master_away_mid_file_is_waited_out_each_record_queued_once(tmp_path: Any, caplog: Any) -> None:
    d = str(tmp_path)
    put(d, "a.log", ["a1", "a2", "a3"])

    class Away(Recorder):
        send_failures, watermark_failures = 1, 1

        def send_sequenced(self, producer: str, seq: int, key: bytes, value: bytes, timestamp: int) -> None:
            if seq == 2 and self.send_failures:  # (a full queue reports a failed round)
                self.send_failures -= 1
                raise InjectionError("round failed: no tablet answered")
            super().send_sequenced(producer, seq, key, value, timestamp)

        def advance_watermark(self, timestamp: int) -> None:
            if self.watermark_failures:
                self.watermark_failures -= 1
                raise MasterUnavailableError("no master answered")
            super().advance_watermark(timestamp)
    r = Away()
    with caplog.at_level(logging.WARNING):
        follow(r, d, lambda: None, lambda: None, lambda: None)
    assert values(r) == [b"a1", b"a2", b"a3"]
    assert [v[3][1] for v in sends(r)] == [1, 2, 3]
    assert any("could not be reported yet" in m for m in caplog.messages)
    assert [v for k, v in r.events if k == "watermark"]  # (reported at a later scan)


def test_a_move_that_fails_is_tried_again_and_an_entry_that_cannot_be_looked_at_is_named_once(
        tmp_path: Any, caplog: Any, monkeypatch: Any) -> None:
    d, done = str(tmp_path / "in"), str(tmp_path / "done")
    os.makedirs(d)
    os.makedirs(done)
    put(d, "a.log", ["a1"])
    os.symlink("loop", os.path.join(d, "loop"))  # (stat: too many levels of symbolic links)
    real_rename, failures = os.rename, [1]

    def rename(src: str, dst: str) -> None:
        if failures[0]:
            failures[0] -= 1
            raise PermissionError(13, "Permission denied")
        real_rename(src, dst)
    monkeypatch.setattr(os, "rename", rename)
    r = Recorder()
    with caplog.at_level(logging.WARNING):
        follow(r, d, lambda: None, lambda: None, lambda: None, done_dir=done)
    assert values(r) == [b"a1"] and os.listdir(done) == ["a.log"]
    assert sum("could not be moved" in m for m in caplog.messages) == 1
    assert sum("loop in" in m and "cannot be looked at" in m for m in caplog.messages) == 1


def test_a_name_taken_by_another_file_after_a_failed_move_is_sent_not_moved(tmp_path: Any, monkeypatch: Any) -> None:
    d, done = str(tmp_path / "in"), str(tmp_path / "done")
    os.makedirs(d)
    os.makedirs(done)
    put(d, "b.log", ["old"])
    real_rename, failing = os.rename, [True]

    def rename(src: str, dst: str) -> None:
        if failing[0] and dst.startswith(done):
            raise PermissionError(13, "Permission denied")
        real_rename(src, dst)
    monkeypatch.setattr(os, "rename", rename)

    def replace() -> None:
        put(d, "b.log", ["new"])  # (mv new b.log, over the sent one that could not move)
        failing[0] = False
    r = Recorder()
    follow(r, d, lambda: None, replace, lambda: None, lambda: None, done_dir=done)
    assert values(r) == [b"old", b"new"]
    assert open(os.path.join(done, "b.log")).read() == "new\n" and os.listdir(d) == []


def test_a_sent_file_that_comes_back_is_not_sent_again_and_stops_nothing(tmp_path: Any, caplog: Any) -> None:
    d, done = str(tmp_path / "in"), str(tmp_path / "done")
    os.makedirs(d)
    os.makedirs(done)
    put(d, "a.log", ["a1"])
    r = Recorder()
    with caplog.at_level(logging.WARNING):
        follow(r, d, lambda: None, lambda: os.rename(os.path.join(done, "a.log"), os.path.join(d, "a.log")),
               lambda: None, lambda: None, done_dir=done)
    assert values(r) == [b"a1"]  # (the injector would refuse its line 1 again: it is not tried)


def test_a_closed_stream_ends_the_follower_with_its_error(tmp_path: Any) -> None:
    d = str(tmp_path)
    put(d, "a.log", ["a1"])

    class Closed(Recorder):
        def flush(self) -> None:
            raise StreamClosedError("injector 'files': the job of stream 'lines' was drained (nothing was sent)")
    with pytest.raises(StreamClosedError, match="was drained"):
        follow(Closed(), d, lambda: None, lambda: None)


def test_a_master_refusing_the_watermark_ends_the_follower_only_a_master_away_is_waited_out(tmp_path: Any) -> None:
    d = str(tmp_path)
    put(d, "a.log", ["a1"])

    class Refused(Recorder):
        def advance_watermark(self, timestamp: int) -> None:
            raise TopologyError("injector 'files' may not report on stream 'lines'")
    with pytest.raises(TopologyError, match="may not report"):
        follow(Refused(), d, lambda: None, lambda: None)


def test_a_done_dir_gone_keeps_the_sent_file_until_it_is_back(tmp_path: Any, caplog: Any) -> None:
    d, done = str(tmp_path / "in"), str(tmp_path / "done")
    os.makedirs(d)
    os.makedirs(done)
    put(d, "a.log", ["a1"])

    class Vanishing(Recorder):
        def flush(self) -> None:
            os.rmdir(done)  # (removed while the file is being sent)
            super().flush()
    r = Vanishing()
    with caplog.at_level(logging.ERROR):
        follow(r, d, lambda: None, lambda: os.makedirs(done), lambda: None, done_dir=done)
    assert values(r) == [b"a1"]  # sent once, kept in place meanwhile
    assert os.listdir(d) == [] and open(os.path.join(done, "a.log")).read() == "a1\n"
    assert sum("could not be moved" in m for m in caplog.messages) == 1


def test_a_file_that_could_not_be_read_is_tried_again_once_its_mode_changes(
        tmp_path: Any, caplog: Any, monkeypatch: Any) -> None:
    d = str(tmp_path)
    put(d, "a.log", ["a1"])
    path = os.path.join(d, "a.log")
    os.chmod(path, 0o600)

    def open_as_another_user(p: str, mode: str = "r", *a: Any, **kw: Any) -> Any:  # (root reads any file)
        if not os.stat(p).st_mode & 0o004:
            raise PermissionError(errno.EACCES, "Permission denied", p)
        return open(p, mode, *a, **kw)
    monkeypatch.setattr(follow_module, "open", open_as_another_user, raising=False)
    r = Recorder()
    with caplog.at_level(logging.ERROR):
        follow(r, d, lambda: None, lambda: None, lambda: os.chmod(path, 0o644), lambda: None, lambda: None)
    assert values(r) == [b"a1"]
    assert sum("Permission denied" in m and "a.log was not sent" in m for m in caplog.messages) == 1


def test_names_gone_from_the_directory_are_forgotten(tmp_path: Any) -> None:
    d = str(tmp_path)
    put(d, "sent.log", [json.dumps({"u": "k"})])
    with open(os.path.join(d, "waiting.log"), "w") as f:
        f.write("no newline yet")
    put(d, "bad.jsonl", ["not json"])
    f = Follower(Recorder(), d, key_field="u", time_field=None, unit=None, max_delay_us=None, done_dir=None,
                 stopping=lambda: False, wait=lambda _: False, poll_s=0.01)
    f.scan(T0)
    f.scan(T0 + 1)
    assert (set(f.done), set(f.waiting), set(f.refused)) == ({"sent.log"}, {"waiting.log"}, {"bad.jsonl"})
    for name in os.listdir(d):
        os.remove(os.path.join(d, name))
    f.scan(T0 + 2)
    assert (f.done, f.waiting, f.refused, f.before) == ({}, {}, {}, {})
