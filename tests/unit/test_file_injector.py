"""The file-directory injector's order, ids and watermark (injectors/files.py)."""

from __future__ import annotations

import os

import pytest

from injectors.files import file_identity, inject_files, line_fields
from runtime.errors import InjectionError

T0 = 1_704_067_200_000_000  # 2024-01-01T00:00:00Z


class Recorder:
    """Records what the injector does, in order (a plain list, no network)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []

    def send_sequenced(self, producer: str, seq: int, key: bytes, value: bytes, timestamp: int) -> None:
        self.events.append(("send", (key, value, timestamp, (producer, seq))))

    def advance_watermark(self, timestamp: int) -> None:
        self.events.append(("watermark", timestamp))

    def flush(self) -> None:
        self.events.append(("flush", None))


def _file(d: str, name: str, lines: list[str], created_s: int) -> None:
    path = os.path.join(d, name)
    with open(path, "w") as f:
        f.write("".join(line + "\n" for line in lines))
    os.utime(path, (created_s, created_s))


def test_the_watermark_is_the_oldest_unfinished_file(tmp_path: object) -> None:
    d = str(tmp_path)
    _file(d, "b.log", ["b1"], 2000)
    _file(d, "a.log", ["a1", "a2"], 1000)
    _file(d, "c.log", ["c1"], 3000)
    r = Recorder()
    assert inject_files(r, d, "src") == 4
    kinds = [(k, v if k != "send" else v[1]) for k, v in r.events]  # type: ignore[index]
    assert kinds == [
        ("watermark", 1000 * 10**6), ("send", b"a1"), ("send", b"a2"), ("flush", None),
        ("watermark", 2000 * 10**6), ("send", b"b1"), ("flush", None),
        ("watermark", 3000 * 10**6), ("send", b"c1"), ("flush", None),
    ]
    sends = [v for k, v in r.events if k == "send"]
    assert all(v[2] >= 1000 * 10**6 for v in sends)  # type: ignore[index]


def test_each_file_is_a_producer_and_its_line_numbers_its_order(tmp_path: object) -> None:
    """Re-reading a directory sends every line at the same place (file, line), so a re-run
    is dropped by the receivers' per-producer marks; equal lines stay distinct records."""
    d = str(tmp_path)
    _file(d, "a.log", ["x", "x"], 1000)
    _file(d, "b.log", ["y"], 2000)
    first, again = Recorder(), Recorder()
    inject_files(first, d, "src")
    inject_files(again, d, "src")
    places = [v[3] for k, v in first.events if k == "send"]  # type: ignore[index]
    a, b = file_identity(os.path.join(d, "a.log")), file_identity(os.path.join(d, "b.log"))
    assert places == [(a, 1), (a, 2), (b, 1)]
    assert places == [v[3] for k, v in again.events if k == "send"]  # type: ignore[index]


def test_not_a_directory(tmp_path: object) -> None:
    with pytest.raises(InjectionError, match="is not a directory"):
        inject_files(Recorder(), os.path.join(str(tmp_path), "missing"), "src")


def test_e3_a_rotated_file_is_the_file_it_was_and_the_new_one_under_its_name_is_new(tmp_path: object) -> None:
    """Review E3: files were producers by name, so after ``app.log`` was rotated to
    ``app.log.1`` and a new ``app.log`` began, a re-run sent the new file's lines at the old
    one's places (dropped as duplicates, up to the old file's length) and the old file's
    lines under a new producer (counted again where they reached another tablet)."""
    d = str(tmp_path)
    _file(d, "app.log", ["old 1", "old 2"], 1000)
    first = Recorder()
    inject_files(first, d, "src")
    os.rename(os.path.join(d, "app.log"), os.path.join(d, "app.log.1"))
    _file(d, "app.log", ["new 1", "new 2", "new 3"], 2000)
    again = Recorder()
    inject_files(again, d, "src")
    before = {v[1]: v[3] for k, v in first.events if k == "send"}  # type: ignore[index]
    after = {v[1]: v[3] for k, v in again.events if k == "send"}  # type: ignore[index]
    assert after[b"old 1"] == before[b"old 1"] and after[b"old 2"] == before[b"old 2"]  # the same places
    new_producer = after[b"new 1"][0]
    assert new_producer != before[b"old 1"][0] and [after[b"new %d" % i] for i in (1, 2, 3)] == [
        (new_producer, 1), (new_producer, 2), (new_producer, 3)]


def test_e3_a_file_appended_to_between_runs_continues_its_line_numbers(tmp_path: object) -> None:
    """A live log grows between two runs: its first lines are at the same places (dropped by
    the receivers' marks), the lines added since come after them under the same producer."""
    d = str(tmp_path)
    _file(d, "app.log", ["l1", "l2"], 1000)
    first = Recorder()
    inject_files(first, d, "src")
    with open(os.path.join(d, "app.log"), "a") as f:
        f.write("l3\n")
    again = Recorder()
    inject_files(again, d, "src")
    before = {v[1]: v[3] for k, v in first.events if k == "send"}  # type: ignore[index]
    after = {v[1]: v[3] for k, v in again.events if k == "send"}  # type: ignore[index]
    producer = before[b"l1"][0]
    assert after == {b"l1": (producer, 1), b"l2": (producer, 2), b"l3": (producer, 3)}


def test_json_lines_give_each_record_its_key_and_event_time_and_the_watermark_waits(tmp_path: object) -> None:
    """--key-field / --timestamp-field: a record's key and time come from its line; the
    watermark does not follow the files' creation times (they are not the data's)."""
    d = str(tmp_path)
    _file(d, "a.jsonl", ['{"user": "ann", "ts": 1704067200000005}', "",
                         '{"user": 7, "ts": "2024-01-01T00:00:01+00:00"}'], 1000)
    _file(d, "b.jsonl", ['{"user": "bob", "ts": "1704067200000003"}'], 2000)
    r = Recorder()
    assert inject_files(r, d, "src", key_field="user", time_field="ts") == 3  # (a blank line is no record)
    assert [k for k, _ in r.events] == ["send", "send", "flush", "send", "flush"]
    assert [(v[0], v[2], v[3][1]) for k, v in r.events if k == "send"] == [  # type: ignore[index]
        (b"ann", T0 + 5, 1), (b"7", T0 + 1_000_000, 3), (b"bob", T0 + 3, 1)]
    r = Recorder()
    inject_files(r, d, "src", key_field="user")  # the files' times, and the watermark with them
    assert [v for k, v in r.events if k == "watermark"] == [1000 * 10**6, 2000 * 10**6]


@pytest.mark.parametrize("line, says", [
    ("not json", "b.jsonl, line 2: not JSON"),
    ('["a"]', "b.jsonl, line 2: a JSON list, not an object"),
    ('{"user": "x"}', "b.jsonl, line 2: no field 'ts' in this line"),
    ('{"user": "x", "ts": true}', r"b.jsonl, line 2: field 'ts' is true: give a number of microseconds"),
    ('{"user": "x", "ts": null}', r"field 'ts' is null: give a number"),
    ('{"user": "x", "ts": "2024-01-01T00:00:00"}', "with no time zone, so its instant is not known: add one"),
    ('{"user": "x", "ts": 18446744073709551616}', "outside the signed 64 bits of microseconds"),
    ('{"user": "x", "ts": 1704067200000000000}', r"field 'ts' in the files of .* looks like nanoseconds since the "
                                                 r"epoch, not microseconds \(its largest value is "
                                                 r"1,704,067,200,000,000,000\); nothing was sent. Say so with "
                                                 r"--timestamp-unit ns"),
    ('{"user": "x", "ts": "--5"}', r"field 'ts' is '--5': give a number"),
])
def test_a_bad_line_is_named_before_anything_is_sent(tmp_path: object, line: str, says: str) -> None:
    d = str(tmp_path)
    _file(d, "a.jsonl", ['{"user": "ann", "ts": 1704067200000005}'], 1000)
    _file(d, "b.jsonl", ['{"user": "bob", "ts": 1704067200000003}', line], 2000)
    r = Recorder()
    with pytest.raises(InjectionError, match=says):
        inject_files(r, d, "src", key_field="user", time_field="ts")
    assert r.events == []


def test_a_line_that_is_not_utf8_is_named_as_such(tmp_path: object) -> None:
    d = str(tmp_path)
    with open(os.path.join(d, "a.jsonl"), "wb") as f:
        f.write(b'{"ts": 1704067200000000}\n\xff\xfe{"ts": 1}\n')
    with pytest.raises(InjectionError, match=r"a.jsonl, line 2: not UTF-8 text \(invalid start byte at byte 0\)"):
        inject_files(Recorder(), d, "src", time_field="ts")


def test_numeric_times_in_seconds_are_refused_unless_their_unit_is_given(tmp_path: object) -> None:
    """Seconds taken for microseconds would stamp every record in 1970 (the Spark bridge
    refuses them too); --timestamp-unit s converts them, --timestamp-unit us takes them as they are."""
    d = str(tmp_path)
    _file(d, "a.jsonl", ['{"ts": 1704067200}', '{"ts": "1704067201"}', '{"ts": "2024-01-01T00:00:02Z"}'], 1000)
    with pytest.raises(InjectionError, match=r"field 'ts' in .* looks like seconds .* largest value is 1,704,067,201\)"):
        inject_files(Recorder(), d, "src", time_field="ts")
    r = Recorder()
    inject_files(r, d, "src", time_field="ts", unit="s")
    assert [v[2] for k, v in r.events if k == "send"] == [T0, T0 + 1_000_000, T0 + 2_000_000]  # type: ignore[index]
    r = Recorder()
    inject_files(r, d, "src", time_field="ts", unit="us")
    assert [v[2] for k, v in r.events if k == "send"] == [1704067200, 1704067201, T0 + 2_000_000]  # type: ignore[index]
    r = Recorder()  # time.time()'s fractional seconds
    _file(d, "a.jsonl", ['{"ts": 1704067200.25}'], 1000)
    inject_files(r, d, "src", time_field="ts", unit="s")
    assert [v[2] for k, v in r.events if k == "send"] == [T0 + 250_000]  # type: ignore[index]
    with pytest.raises(InjectionError, match=r"--timestamp-unit s says the unit of --timestamp-field's numbers"):
        inject_files(Recorder(), d, "src", key_field="ts", unit="s")


@pytest.mark.parametrize("ts, unit, says", [
    ("1e303", "s", "outside the signed 64 bits"),
    ("1e308", "s", "outside the signed 64 bits"),
    ("NaN", "us", "field 'ts' is NaN: give a number of microseconds"),
    ("Infinity", "ms", "field 'ts' is Infinity: give a number of milliseconds"),
])
def test_floats_past_any_time_are_named_not_a_traceback(tmp_path: object, ts: str, unit: str, says: str) -> None:
    d = str(tmp_path)
    _file(d, "a.jsonl", ['{"ts": ' + ts + '}'], 1000)
    with pytest.raises(InjectionError, match=says):
        inject_files(Recorder(), d, "src", time_field="ts", unit=unit)


def test_fractions_and_decimal_strings_in_a_unit_and_nanoseconds_below_as_integers_are(tmp_path: object) -> None:
    d = str(tmp_path)
    _file(d, "a.jsonl", ['{"ts": "1704067200.25"}', '{"ts": 1704067200.000001}'], 1000)
    r = Recorder()
    inject_files(r, d, "src", time_field="ts", unit="s")
    assert [v[2] for k, v in r.events if k == "send"] == [T0 + 250_000, T0 + 1]  # type: ignore[index]
    _file(d, "a.jsonl", ['{"ts": 1999}', '{"ts": 1999.0}', '{"ts": -1}', '{"ts": -1.0}'], 1000)  # (as given)
    r = Recorder()
    inject_files(r, d, "src", time_field="ts", unit="ns")
    assert [v[2] for k, v in r.events if k == "send"] == [1, 1, -1, -1]  # type: ignore[index]


def test_decimal_strings_and_floats_are_taken_exactly_in_their_unit(tmp_path: object) -> None:
    """A decimal string is exact (its digits, not the nearest float); nanoseconds floor as
    whole ones do, however large; an integer past any float is named, not a traceback."""
    d = str(tmp_path)
    _file(d, "a.jsonl", ['{"ts": "1704067200123456999.0"}', '{"ts": 1704067200123456999}',
                         '{"ts": 1152921504606846976.0}', '{"ts": "0.0000004999"}'], 1000)
    r = Recorder()
    inject_files(r, d, "src", time_field="ts", unit="ns")
    assert [v[2] for k, v in r.events if k == "send"] == [  # type: ignore[index]
        1704067200123456, 1704067200123456, 1152921504606846, 0]
    _file(d, "a.jsonl", ['{"ts": ' + "9" * 400 + '}'], 1000)
    with pytest.raises(InjectionError, match="outside the signed 64 bits of microseconds a time is kept in once in "
                                             "nanoseconds"):
        inject_files(Recorder(), d, "src", time_field="ts", unit="ns")


def test_a_number_is_the_same_time_written_as_a_number_or_as_its_digits(tmp_path: object) -> None:
    """The decimal the line wrote, not the float nearest it; digits of any length (a 25-digit
    string was parsed as a date and told to add a time zone)."""
    d = str(tmp_path)
    _file(d, "a.jsonl", ['{"ts": 1704067200000.0005}', '{"ts": "1704067200000.0005"}', '{"ts": 1.7040672e12}'], 1000)
    r = Recorder()
    inject_files(r, d, "src", time_field="ts", unit="ms")
    assert [v[2] for k, v in r.events if k == "send"] == [T0 + 1, T0 + 1, T0]  # type: ignore[index]
    _file(d, "a.jsonl", ['{"ts": 1e400}'], 1000)
    with pytest.raises(InjectionError, match="line 1: field 'ts' is 1E.400, outside the signed 64 bits"):
        inject_files(Recorder(), d, "src", time_field="ts", unit="ms")
    _file(d, "a.jsonl", ['{"ts": "10000000000000000000"}', '{"ts": 10000000000000000000}', '{"ts": "' + "1" * 25 + '"}'],
          1000)
    with pytest.raises(InjectionError, match="line 3: field 'ts' is 1111111111111111111111111, outside the signed 64"):
        inject_files(Recorder(), d, "src", time_field="ts", unit="ns")
    _file(d, "a.jsonl", ['{"ts": "10000000000000000000"}', '{"ts": 10000000000000000000}'], 1000)
    r = Recorder()
    inject_files(r, d, "src", time_field="ts", unit="ns")
    assert [v[2] for k, v in r.events if k == "send"] == [10**16, 10**16]  # type: ignore[index]
    _file(d, "a.jsonl", ['{"ts": "' + "1" * 400 + '"}'], 1000)
    with pytest.raises(InjectionError, match=r"line 1: field 'ts' is 1{40}\.\.\., outside the signed 64 bits"):
        inject_files(Recorder(), d, "src", time_field="ts", unit="ns")


@pytest.mark.parametrize("ts, expected", [
    ("1e-999999999", 0),  # (a Fraction of it would build a 400 MB number)
    ("1." + "9" * 100_000, 2_000_000),
    ("0e100", 0),
    ("-0.0", 0),
    ('"1704067200.123456789012345678901234567890"', T0 + 123_457),
    ('"0.' + "0" * 3_000 + '1"', 0),
])
def test_decimals_of_any_shape_are_exact_and_quick(ts: str, expected: int) -> None:
    assert line_fields(b'{"ts": ' + ts.encode() + b"}", "x", None, "ts", unit="s")[1] == expected


def test_a_time_that_is_an_object_with_floats_is_named_and_float_keys_keep_their_json() -> None:
    with pytest.raises(InjectionError, match=r"field 'ts' is \{\"a\": 1.5\}: give a number of seconds"):
        line_fields(b'{"ts": {"a": 1.5}}', "x", None, "ts", unit="s")
    assert line_fields(b'{"u": {"a": [1.5, 2e3]}, "ts": 1}', "x", "u", "ts", unit="s")[0] == b'{"a": [1.5, 2000.0]}'


def test_a_link_to_a_file_in_the_directory_sends_its_lines_once(tmp_path: object) -> None:
    """Review of the file injectors: a log directory with ``current.log -> app.log`` sent the
    file under both names with the same producer, and the second name's line 1 was refused
    (its sequence not above the last one sent) halfway through the run, on every re-run."""
    d = str(tmp_path)
    _file(d, "app.log", ["a1", "a2"], 1000)
    os.symlink("app.log", os.path.join(d, "current.log"))
    r = Recorder()
    assert inject_files(r, d, "src") == 2
    sent = [e[1] for e in r.events if e[0] == "send"]
    assert [(v, seq) for _, v, _, (_, seq) in sent] == [(b"a1", 1), (b"a2", 2)]  # type: ignore[misc]


def test_a_file_whose_name_is_not_utf8_is_sent_with_its_name_as_bytes(tmp_path: object) -> None:
    """Review of the file injectors: a name os.listdir gives with surrogates (Latin-1 ``café``)
    raised UnicodeEncodeError when made the records' key: the run stopped halfway (the
    follower on every restart)."""
    d = str(tmp_path)
    name = os.fsdecode(b"caf\xe9.log")
    _file(d, name, ["x"], 1000)
    _file(d, "good.log", ["y"], 2000)
    r = Recorder()
    assert inject_files(r, d, "src") == 2
    assert sorted(e[1][0] for e in r.events if e[0] == "send") == [b"caf\xe9.log", b"good.log"]  # type: ignore[index]


def test_a_line_over_a_records_limit_is_refused_before_anything_is_sent(tmp_path: object) -> None:
    """Review of the file injectors: without --key-field or --timestamp-field nothing was read
    first, so a line over 16 MiB (or, with them, a key over 64 KiB) failed halfway through the
    run, naming no file or line."""
    from runtime.record import MAX_KEY_BYTES, MAX_VALUE_BYTES

    d = str(tmp_path)
    _file(d, "a.log", ["fine"], 1000)
    with open(os.path.join(d, "b.log"), "wb") as f:
        f.write(b"x" * (MAX_VALUE_BYTES + 1) + b"\n")
    r = Recorder()
    with pytest.raises(InjectionError, match=r"b.log, line 1: over the 16,777,216 bytes"):
        inject_files(r, d, "src")
    assert r.events == []
    k = os.path.join(str(tmp_path), "keys")
    os.makedirs(k)
    _file(k, "c.jsonl", ['{"k": "%s", "ts": 1}' % ("y" * (MAX_KEY_BYTES + 1))], 1000)
    with pytest.raises(InjectionError, match=r"c.jsonl, line 1: field 'k' is 65,537 bytes"):
        inject_files(r, k, "src", key_field="k", time_field="ts", unit="us")
    assert r.events == []


def test_lines_appended_while_a_run_sends_wait_for_the_next_run(tmp_path: object) -> None:
    """After review: each file was checked up to its size, then sent to its end: a line added
    in between was sent unchecked (one over a record's limit failed the run halfway)."""
    d = str(tmp_path)
    _file(d, "a.log", ["a1", "a2"], 1000)

    class Appending(Recorder):
        def send_sequenced(self, producer: str, seq: int, key: bytes, value: bytes, timestamp: int) -> None:
            if seq == 1:
                with open(os.path.join(d, "a.log"), "a") as f:
                    f.write("added while sending\n")
            super().send_sequenced(producer, seq, key, value, timestamp)

    r = Appending()
    assert inject_files(r, d, "src") == 2
    assert [e[1][1] for e in r.events if e[0] == "send"] == [b"a1", b"a2"]  # type: ignore[index]
    again = Recorder()
    assert inject_files(again, d, "src") == 3  # the next run sends it (its receivers drop the first two)
