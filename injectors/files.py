"""The file-directory injector (the MillWheel paper's example): every line of every file is a record.

Files are read oldest first. The injector's watermark is the minimum creation
time of the files not yet fully read, so a file still being injected holds its
readers back; after the last file it moves to the end of time. Each file is a
producer of its own and its line number the record's place in it
(:meth:`Injector.send_sequenced`), so injecting the same directory again after a
crash, however late, is exactly-once, and receivers keep one number per file. The key is the file name; the timestamp the
file's creation time (its modification time, where the file system keeps no
birth time). With ``key_field`` / ``time_field``, each line is a JSON object whose fields
give its key and event time instead (:func:`line_fields`), every line is checked before
anything is sent, and the watermark waits for the last file.

A file is known by its inode and a digest of its first line, not by its name
(:func:`file_identity`; review E3): a log rotated from ``app.log`` to ``app.log.1`` is
still the file it was, a file appended to between runs too, and the new ``app.log`` is a
new file. By name, the new file's first lines were dropped as duplicates of the old one's,
up to the old one's length.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import math
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from decimal import ROUND_FLOOR, Context, Decimal
from fractions import Fraction
from typing import BinaryIO, Protocol

from injectors.injector import Injector
from runtime.errors import InjectionError, MillstreamError
from runtime.record import END_OF_TIME, MAX_KEY_BYTES, MAX_VALUE_BYTES, MIN_TIME, time_unit
from runtime.routing import RoutingTable
from runtime.security import Security

log = logging.getLogger(__name__)


class Sink(Protocol):
    def send_sequenced(self, producer: str, seq: int, key: bytes, value: bytes, timestamp: int) -> None: ...
    def advance_watermark(self, timestamp: int) -> None: ...
    def flush(self) -> None: ...


def created_us(path: str | os.stat_result) -> int:
    """A file's creation time (its modification time where the file system keeps no birth
    time, as on Linux), in microseconds; of a path, or of its ``os.stat``."""
    st = os.stat(path) if isinstance(path, str) else path
    birth = getattr(st, "st_birthtime", None)
    return int((birth if birth is not None else st.st_mtime) * 1_000_000)


def file_identity(path: str) -> str:
    """What a file is, whatever its name: its device and inode, and a BLAKE2b digest of its
    first line (at most 4 KiB). A rename (a log rotated from ``app.log`` to ``app.log.1``)
    keeps all three; lines appended later keep them too, so a re-run continues the file's
    line numbers; a new file under an old name has another inode, and one that reuses a
    deleted file's inode almost surely another first line. A copy (a backup restored onto
    another disk) is a new file: its lines count again."""
    with open(path, "rb") as f:
        return identity_of(f, os.fstat(f.fileno()))


def identity_of(f: BinaryIO, st: os.stat_result) -> str:
    """:func:`file_identity` of a file open for reading, ``st`` its ``fstat`` (left at its start)."""
    f.seek(0)
    first = f.readline(4096)
    f.seek(0)
    return f"{st.st_dev}:{st.st_ino}:{hashlib.blake2b(first, digest_size=8).hexdigest()}"


def pending_files(directory: str) -> list[tuple[int, str]]:
    """(creation time, name) of the regular files in ``directory``, oldest first."""
    if not os.path.isdir(directory):
        raise InjectionError(f"{directory!r} is not a directory; pass the folder holding the files")
    out = []
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            out.append((created_us(path), name))
    return sorted(out)


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_UNIT_NAMES = {"s": "seconds", "ms": "milliseconds", "us": "microseconds", "ns": "nanoseconds"}


def _how(unit: str) -> str:
    return f"give a number of {_UNIT_NAMES[unit]} since the epoch or an ISO 8601 time with a zone (2024-01-01T00:00:00Z)"


_NUMBER = re.compile(r"-?[0-9]+(\.[0-9]+)?")  # a number written as a string (its digits, and a fraction)
_GRID, _CONTEXT = Decimal("1E-12"), Context(prec=80)
_LONGEST = 40  # digits a time in any unit can have: past them it is out of range (int() refuses 4,300)
UNITS = {"s": 1_000_000, "ms": 1_000, "us": 1, "ns": -1_000}  # to microseconds: times, or (negative) // by


def line_fields(value: bytes, where: str, key_field: str | None, time_field: str | None,
                error: type[Exception] = InjectionError, unit: str = "us") -> tuple[bytes | None, int | None, bool]:
    """The key and the event time a JSON line gives in its fields ``key_field`` and
    ``time_field`` (None where not asked for), and whether the time was a number: the key as
    UTF-8 (a field that is not a string: its JSON), the time as a number of ``unit`` since the
    epoch (or its digits) or an ISO 8601 time with a zone, in microseconds. ``error`` names
    ``where`` (file and line) and what to fix."""
    try:
        text = value.decode("utf-8")
        doc = json.loads(text, parse_float=Decimal)  # (a time's digits as written, not the float nearest them)
    except UnicodeDecodeError as e:
        raise error(f"{where}: not UTF-8 text ({e.reason} at byte {e.start}); JSON lines are UTF-8") from None
    except ValueError as e:
        raise error(f"{where}: not JSON ({e}); key and timestamp fields are read from JSON lines") from None
    if not isinstance(doc, dict):
        raise error(f"{where}: a JSON {type(doc).__name__}, not an object; each line must be one object")
    key = ts = None
    numeric = False
    for field in (key_field, time_field):
        if field is not None and field not in doc:
            raise error(f"{where}: no field {field!r} in this line; every line needs it")
    if key_field is not None:
        k = doc[key_field]
        key = k.encode("utf-8", "surrogatepass") if isinstance(k, str) else json.dumps(json.loads(text)[key_field]).encode()
    if time_field is not None:
        given = v = doc[time_field]
        if isinstance(v, str) and _NUMBER.fullmatch(v):
            whole = v.lstrip("-").split(".")[0].lstrip("0")
            if len(whole) > _LONGEST or len(v) > 4_000:
                raise error(f"{where}: field {time_field!r} is {v:.40}..., outside the signed 64 bits of "
                            f"microseconds a time is kept in once in {_UNIT_NAMES[unit]}")
            v = Decimal(v) if "." in v else int(v)  # (exactly as written)
        if isinstance(v, str):
            try:
                when = datetime.datetime.fromisoformat(v)
            except ValueError:
                raise error(f"{where}: field {time_field!r} is {v!r:.60}: {_how(unit)}") from None
            if when.tzinfo is None or when.utcoffset() is None:
                raise error(f"{where}: field {time_field!r} is {v!r}, with no time zone, so its instant is not "
                            "known: add one (Z, or +01:00)")
            ts = (when - _EPOCH) // datetime.timedelta(microseconds=1)
        elif isinstance(v, bool) or not isinstance(v, (int, Decimal)):  # (NaN and Infinity: floats)
            raise error(f"{where}: field {time_field!r} is {json.dumps(json.loads(text)[time_field]):.60}: {_how(unit)}")
        else:
            factor, numeric = UNITS[unit], True
            if isinstance(v, int):
                ts = v * factor if factor > 0 else v // -factor
            else:  # a fraction (time.time()'s seconds, say), exactly as the line wrote it: to the nearest
                # microsecond, half up; in nanoseconds floored, as whole ones are
                if not v.is_finite() or (v != 0 and v.adjusted() > _LONGEST):
                    raise error(f"{where}: field {time_field!r} is {str(given):.40}, outside the signed 64 bits of "
                                f"microseconds a time is kept in once in {_UNIT_NAMES[unit]}")
                # Down to 10^-12 first (exact: every boundary of the rounding below is on that grid),
                # so that 1e-999999999 or a million decimals cost nothing.
                q = Fraction(v.quantize(_GRID, rounding=ROUND_FLOOR, context=_CONTEXT))
                ts = math.floor(q * factor + Fraction(1, 2)) if factor > 0 else math.floor(q / -factor)
        if not MIN_TIME <= ts <= END_OF_TIME:
            raise error(f"{where}: field {time_field!r} is {str(given):.40}, outside the signed 64 bits of "
                        f"microseconds a time is kept in once in {_UNIT_NAMES[unit]}")
    return key, ts, numeric


def check_unit(biggest: int, time_field: str, where: str, undone: str, error: type[Exception] = InjectionError) -> None:
    """Refuse numeric times (their largest absolute value ``biggest``, in microseconds) that
    look like another unit (runtime/record.py ``time_unit``, as the Spark bridge checks);
    ``where``: what holds them; ``undone``: what was therefore not done."""
    unit = time_unit(biggest)
    if unit is not None:
        flag = {"seconds": "s", "milliseconds": "ms", "nanoseconds": "ns"}[unit]
        raise error(f"field {time_field!r} in {where} looks like {unit} since the epoch, not microseconds (its "
                    f"largest value is {biggest:,}); {undone}. Say so with --timestamp-unit {flag} (or "
                    "--timestamp-unit us to take the numbers as microseconds as they are)")


def raw_lines(f: BinaryIO, size: int) -> Iterator[tuple[int, bytes]]:
    """The lines of an open file up to ``size`` bytes (what was checked: a writer that goes on
    meanwhile adds nothing), each read at most a byte past a record's largest value (a longer
    one comes as a piece without its newline, and is refused)."""
    f.seek(0)
    pos = lineno = 0
    while pos < size:
        raw = f.readline(min(MAX_VALUE_BYTES + 2, size - pos))
        if not raw:
            return
        pos += len(raw)
        lineno += 1
        yield lineno, raw


def check_file(f: BinaryIO, size: int, name: str, key_field: str | None, time_field: str | None,
               unit: str | None) -> int:
    """Every line of an open file (up to ``size`` bytes) checked as a record: raises
    InjectionError naming the line; returns the largest numeric time's size (``check_unit``)."""
    biggest = 0
    for lineno, raw in raw_lines(f, size):
        value = raw.rstrip(b"\n")
        where = f"{name}, line {lineno}"
        if len(value) > MAX_VALUE_BYTES:
            raise InjectionError(f"{where}: over the {MAX_VALUE_BYTES:,} bytes a record's value may have; split it")
        if key_field is None and time_field is None:
            continue
        if not raw.strip():
            continue  # (a blank line among JSON lines: no record)
        key, ts, numeric = line_fields(value, where, key_field, time_field, unit=unit or "us")
        if key is not None and len(key) > MAX_KEY_BYTES:
            raise InjectionError(f"{where}: field {key_field!r} is {len(key):,} bytes, over the {MAX_KEY_BYTES:,} a "
                                 "key may have")
        biggest = max(biggest, abs(ts or 0) if numeric else 0)
    return biggest


def check_lines(directory: str, key_field: str | None, time_field: str | None,
                unit: str | None = None) -> list[tuple[int, str, int]]:
    """:func:`pending_files` with the size each was checked at, every line of each checked
    (:func:`check_file`): a bad line raises before anything is sent or registered, and so do
    numeric times that look like another unit than microseconds when ``unit`` is not given
    (:func:`check_unit`). What is sent is what was checked: each file up to that size."""
    if unit is not None and time_field is None:
        raise InjectionError(f"--timestamp-unit {unit} says the unit of --timestamp-field's numbers; give the field too")
    files = []
    biggest = 0
    for ts, fname in pending_files(directory):  # (each line's size too: one over a record's limit would fail halfway)
        with open(os.path.join(directory, fname), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            biggest = max(biggest, check_file(f, size, fname, key_field, time_field, unit))
        files.append((ts, fname, size))
    if time_field is not None and unit is None:
        check_unit(biggest, time_field, f"the files of {directory!r}", "nothing was sent")
    return files


def inject_files(sink: Sink, directory: str, name: str, key_field: str | None = None,
                 time_field: str | None = None, unit: str | None = None,
                 files: list[tuple[int, str, int]] | None = None) -> int:
    """Send every line of every file, advancing the watermark file by file; returns lines sent.

    ``key_field`` / ``time_field``: each line is a JSON object whose field gives the record's
    key / event time (:func:`line_fields`), instead of the file's name / creation time. Every
    line of every file is read and checked before anything is sent, so a bad line loses
    nothing and sends nothing. With ``time_field`` the watermark does not move while the files
    are read (their times are the data's, not the files'): it is left where it is until the
    caller finishes the injection. ``unit``: the unit of numeric times (``UNITS``);
    None: microseconds, refused if they look like another unit (:func:`check_unit`).
    ``files``: what :func:`check_lines` returned (else it is called here)."""
    files = check_lines(directory, key_field, time_field, unit) if files is None else files
    n = 0
    sent: dict[str, str] = {}  # identity -> the name it was sent under
    for ts, fname, size in files:
        if time_field is None:
            sink.advance_watermark(ts)  # the oldest unfinished file is now this one
        path = os.path.join(directory, fname)
        producer = file_identity(path)
        if producer in sent:  # a link to a file sent under another name: the same lines
            log.info("%s is %s (a link to the same file): its lines are sent once", fname, sent[producer])
            continue
        sent[producer] = fname
        with open(path, "rb") as f:
            for lineno, line in raw_lines(f, size):  # (what was checked: lines added since wait for a next run)
                value, key, when = line.rstrip(b"\n"), os.fsencode(fname), ts
                if key_field is not None or time_field is not None:
                    if not line.strip():
                        continue  # (a blank line among JSON lines: no record, as check_lines passed it)
                    k, t, _ = line_fields(value, f"{fname}, line {lineno}", key_field, time_field,
                                          unit=unit or "us")
                    key, when = k if k is not None else key, t if t is not None else when
                sink.send_sequenced(producer, lineno, key, value, when)
                n += 1
        sink.flush()  # this file is done: only then may the watermark pass it
    return n


def inject_directory(directory: str, masters: str | Iterable[str], stream: str,
                     name: str | None = None, security: Security = Security(),
                     allow_code: str | Sequence[str] = (), key_field: str | None = None,
                     time_field: str | None = None, unit: str | None = None) -> int:
    """Inject every line of the regular files under ``directory``, then finish
    (``allow_code``: where the stream's key extractors may come from, as for ``Injector``;
    ``key_field``, ``time_field``, ``unit``: as for :func:`inject_files`)."""
    name = name or "files:" + os.path.abspath(directory)
    files = check_lines(directory, key_field, time_field, unit)  # a bad directory or line fails before anything registers
    with Injector(masters, stream, name, security=security, allow_code=allow_code) as inj:
        inj.check_units = False  # (check_lines did, or --timestamp-unit said)
        warn_if_finished(inj)
        return inject_files(inj, directory, name, key_field, time_field, unit, files)


def warn_if_finished(inj: Injector) -> None:
    """Warn, once, before sending into a stream whose readers' watermark is at the end of time
    (every injector of it finished: a run without ``--follow`` finishes its stream): every
    record sent now is late (counted as late; a window sends it to its ``.late`` stream)."""
    try:
        readers = RoutingTable(inj.client.routing()).readers(inj.stream)
        computations = inj.client.status()["computations"]
    except MillstreamError:  # (a leader that cannot answer now: no warning; the injection says what failed)
        return
    done = sorted(c for c in readers if computations.get(c, {}).get("low_watermark") == END_OF_TIME)
    if done:
        log.warning("the watermark of %s, reading %r, is at the end of time (every injector of the stream finished: "
                    "a run without --follow finishes it): the records sent now arrive late (counted as late; a "
                    "window sends them to its .late stream). Keep a stream open for more files with "
                    "inject-files --follow, or submit the job again", ", ".join(map(repr, done)), inj.stream)
