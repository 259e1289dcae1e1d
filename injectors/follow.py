"""Following a directory: ``millstream inject-files DIR --follow`` sends the files in DIR and
every file that comes into it later, each once, until it is stopped (Spark's file stream
source, Flink's ``FileSource`` monitoring a directory).

**Which files.** Regular files whose name does not start with a dot. A file is taken once it
is complete: once its size, modification time and inode are what they were one poll before
(so a file still being written waits, and every file waits one poll after it is first seen),
but the safe way, as for Spark and Flink, is to write a file elsewhere (or under a dot name)
and move it in whole. A file taken is not read again: lines appended to it later are not
sent (a new file is). A file renamed within the directory is still the file it was.

**Exactly once**, as ``inject-files`` without ``--follow`` (injectors/files.py): each file is a
producer of its own, known by its identity (device, inode and first line), its line number
the record's place in it. Stopped and run again under the same name, the follower reads the
directory again and its readers drop what they already have.

**Times and the watermark.**
- With ``--timestamp-field``: each record's time is its line's; the watermark trails the
  latest time sent by ``max_delay_us`` (``--max-delay-s``: Flink's bounded out-of-orderness,
  Spark's ``withWatermark``), so a record that much older than one before it is late to its
  readers (counted, and handled as their ``late_records`` says).
- Without: a file's records are stamped with the time the follower took it (ingestion time),
  and the watermark follows the follower's scans: no record is late.

**A bad line** (not JSON, no such field, a time in another unit): nothing of its file is
sent; the follower logs which file and line and what to fix, and goes on with the others. The
file is tried again once it changes.

**Stopping** (Ctrl-C, SIGTERM): what was sent is flushed, and the stream is *not* finished:
the injector's watermark holds its readers where it stopped until the follower runs again
under the same name (or the master releases a silent injector, ``--injector-expiry-s``).
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Sequence

from injectors.files import Sink, check_unit, created_us, file_identity, line_fields
from injectors.injector import Injector
from runtime.errors import InjectionError
from runtime.record import MIN_TIME
from runtime.security import Security

log = logging.getLogger(__name__)

Line = tuple[int, bytes, bytes, int | None]  # line number, key, value, time (None: the file's)
Signature = tuple[int, int, int]  # a file's size, modification time (ns) and inode


def check_follow(time_field: str | None, unit: str | None, max_delay_us: int | None, poll_s: float) -> None:
    """The flags of a follower, refused before anything starts."""
    if unit is not None and time_field is None:
        raise InjectionError(f"--timestamp-unit {unit} says the unit of --timestamp-field's numbers; give the field too")
    if time_field is not None and max_delay_us is None:
        raise InjectionError("--follow with --timestamp-field needs --max-delay-s: how far (seconds) a record's time may "
                             "be behind the latest one sent before it is late (the watermark trails by that much)")
    if time_field is None and max_delay_us is not None:
        raise InjectionError("--max-delay-s is the lateness allowed to --timestamp-field's times; without that field "
                             "records are stamped as they are taken, and none is late")
    if max_delay_us is not None and max_delay_us < 0:
        raise InjectionError(f"--max-delay-s must be 0 or more, not {max_delay_us / 1e6:g}")
    if not poll_s > 0:
        raise InjectionError(f"--poll-s must be more than 0, not {poll_s:g}")


def read_file(path: str, name: str, key_field: str | None, time_field: str | None, unit: str | None) -> list[Line]:
    """Every line of a file as a record, each checked (raises InjectionError naming the line)."""
    lines: list[Line] = []
    biggest = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            value = raw.rstrip(b"\n")
            key, ts = name.encode(), None
            if key_field is not None or time_field is not None:
                if not raw.strip():
                    continue  # (a blank line among JSON lines: no record)
                k, ts, numeric = line_fields(value, f"{name}, line {lineno}", key_field, time_field, unit=unit or "us")
                key = k if k is not None else key
                biggest = max(biggest, abs(ts or 0) if numeric else 0)
            lines.append((lineno, key, value, ts))
    if time_field is not None and unit is None:
        check_unit(biggest, time_field, f"file {name!r}", "nothing of it was sent")
    return lines


def follow_files(sink: Sink, directory: str, *, key_field: str | None = None, time_field: str | None = None,
                 unit: str | None = None, max_delay_us: int | None = None, poll_s: float = 1.0,
                 wait: Callable[[float], bool] = threading.Event().wait,
                 now_us: Callable[[], int] = lambda: time.time_ns() // 1000) -> int:
    """Send the files of ``directory`` as they come (module doc), scanning it every ``poll_s``
    seconds until ``wait(poll_s)`` returns True; returns the lines sent."""
    check_follow(time_field, unit, max_delay_us, poll_s)
    if not os.path.isdir(directory):
        raise InjectionError(f"{directory!r} is not a directory; pass the folder the files come into")
    before: dict[str, Signature] = {}    # name -> what it was at the last scan
    refused: dict[str, Signature] = {}   # name -> what it was when it could not be sent
    done: dict[str, Signature] = {}      # name -> what it was when it was sent (or found sent)
    taken: set[str] = set()              # identities of the files sent
    latest, watermark, sent = MIN_TIME, MIN_TIME, 0
    while True:
        scanned = max(now_us(), watermark)  # (a clock set back stamps no record behind the watermark)
        listing = _listing(directory)
        ready = sorted((created, name, sig) for name, (sig, created) in listing.items()
                       if before.get(name) == sig and refused.get(name) != sig and done.get(name) != sig)
        before = {name: sig for name, (sig, _) in listing.items()}
        for _, name, sig in ready:  # oldest first
            path = os.path.join(directory, name)
            try:
                identity = file_identity(path)
                lines = [] if identity in taken else read_file(path, name, key_field, time_field, unit)
            except FileNotFoundError:
                continue  # (moved away since the scan: the next scan sees where to)
            except (InjectionError, OSError) as e:
                refused[name] = sig
                log.error("%s; %s was not sent: fix or replace it, and it is tried again once it changes", e, name)
                continue
            if identity not in taken:
                for lineno, key, value, ts in lines:
                    when = scanned if ts is None else ts
                    sink.send_sequenced(identity, lineno, key, value, when)
                    latest = max(latest, when)
                sink.flush()
                taken.add(identity)
                sent += len(lines)
            done[name] = sig
            refused.pop(name, None)
        if time_field is None:
            mark = scanned  # this scan's files are flushed, and the next ones are stamped later
        else:
            mark = latest - max_delay_us if latest > MIN_TIME and max_delay_us is not None else MIN_TIME
        if mark > watermark:
            sink.advance_watermark(mark)
            watermark = mark
        if wait(poll_s):
            return sent


def _listing(directory: str) -> dict[str, tuple[Signature, int]]:
    """Each regular file not named with a leading dot: its signature, and its creation time
    (µs; :func:`injectors.files.created_us`), the order files are sent in."""
    out = {}
    for name in os.listdir(directory):
        if name.startswith("."):
            continue
        try:
            st = os.stat(os.path.join(directory, name))
        except FileNotFoundError:
            continue
        if stat.S_ISREG(st.st_mode):
            out[name] = ((st.st_size, st.st_mtime_ns, st.st_ino), created_us(st))
    return out


def follow_directory(directory: str, masters: str | Iterable[str], stream: str, name: str | None = None,
                     security: Security = Security(), allow_code: str | Sequence[str] = (), *,
                     key_field: str | None = None, time_field: str | None = None, unit: str | None = None,
                     max_delay_us: int | None = None, poll_s: float = 1.0,
                     stop: threading.Event | None = None, started: Callable[[], object] = lambda: None) -> int:
    """:func:`follow_files` through an :class:`Injector` until ``stop`` is set; then flush and
    close it without finishing the stream (module doc, "Stopping"). Returns the lines sent.
    ``started`` is called once the flags are checked and the injector is made."""
    check_follow(time_field, unit, max_delay_us, poll_s)
    if not os.path.isdir(directory):
        raise InjectionError(f"{directory!r} is not a directory; pass the folder the files come into")
    stop = stop or threading.Event()
    inj = Injector(masters, stream, name or "files:" + os.path.abspath(directory), security=security,
                   allow_code=allow_code)
    try:
        started()
        n = follow_files(inj, directory, key_field=key_field, time_field=time_field, unit=unit,
                         max_delay_us=max_delay_us, poll_s=poll_s, wait=stop.wait)
        inj.flush()
        return n
    finally:
        inj.close()
