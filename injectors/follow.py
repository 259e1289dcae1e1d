"""Following a directory: ``millstream inject-files DIR --follow`` sends the files in DIR and
every file that comes into it later, each once, until it is stopped (Spark's file stream
source, Flink's ``FileSource`` monitoring a directory).

**Which files.** Regular files whose name does not start with a dot. A file is taken once it
is complete: its size, times and inode what they were one poll before (every file waits one
poll after it is first seen), not empty, and its last byte a newline (a file whose writer
paused mid-line waits for its last line; one paused at a line's end for longer than a poll
is taken as it is: write files whole). The safe way, as for Spark and Flink, is
to write a file elsewhere (or under a dot name) and move it in whole. Within a run a file
taken is not read again: a rename is the file it was, and lines appended to it wait for the
next run (which sends them after the others: the file continues its line numbers). With
``done_dir`` each file is moved there once its records are committed.

**Exactly once**, as ``inject-files`` without ``--follow`` (injectors/files.py): each file is a
producer of its own, known by its identity (device, inode and first line), its line number
the record's place in it. Stopped and run again under the same name (the same injector
incarnation: its hold on the stream is replaced, not added to), the follower reads the
directory again and its readers drop what they already have, for as long as they keep a
file's mark: ``producer_expiry_s``, 7 days after its last line. A file left in the directory
longer than that, and read by a run started after it, counts again: move files out once sent
(``done_dir``), which also keeps their inodes from being reused by new files (a new file on a
deleted one's inode, starting with the same line, a CSV header say, would be taken for it).

**Times and the watermark.**
- With ``--timestamp-field``: each record's time is its line's; after each scan the watermark
  moves to the latest time sent less ``max_delay_us`` (``--max-delay-s``: Flink's bounded
  out-of-orderness, Spark's ``withWatermark``), so a record further behind than that, in a
  later file, is late to its readers (counted, and handled as their ``late_records`` says).
- Without: a file's records are stamped with the time the follower took it (ingestion time,
  this host's clock), and the watermark follows the follower's scans: no record is late.
- It never promises the end of time: the stream is never finished by a follower.

**A bad file** (a line that is not JSON, lacks a field, holds a time in another unit, or is
too large to be a record; a file that cannot be read): nothing of it is sent; the follower
logs which file and line and what to fix, and goes on with the others. The file is tried
again once it changes (its contents, or its permissions).

**A cluster that cannot take the records** (down, or a round failing past the injector's
timeout), or a master that cannot take a watermark: the follower logs it and tries again at
each poll; nothing is lost. A stream closed for good (its job drained or cancelled) ends it.

**Stopping** (Ctrl-C, SIGTERM): the follower stops between files and retires its injector
(``Injector.retire``: what it sent committed, its promise final), and the stream is *not*
finished: the name holds its readers where it stopped, without expiring, until the follower
runs again. A run that crashed instead holds them until it runs again, or until the master
releases it as silent (``--injector-expiry-s``, a day). A second Ctrl-C stops without
waiting for that; what was not committed is sent again by the next run.

**One follower per name at a time**: runs under a name share one injector incarnation, so
two at once would overwrite each other's watermark. A second follower of the same directory
on the same host is refused (a lock on the directory); on several hosts, give each its own
``--name``.
"""

from __future__ import annotations

import fcntl
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import BinaryIO

from injectors.files import (
    Sink,
    check_file,
    check_unit,
    created_us,
    identity_of,
    line_fields,
    raw_lines,
    warn_if_finished,
)
from injectors.injector import Injector
from runtime.errors import (
    InjectionError,
    InvalidRecordError,
    MasterUnavailableError,
    MillstreamError,
    StreamClosedError,
)
from runtime.record import END_OF_TIME, MIN_TIME
from runtime.security import Security

log = logging.getLogger(__name__)

Signature = tuple[int, int, int, int]  # a file's size, modification and change times (ns), inode
IDENTITY = "follow"  # the injector incarnation of every run under a name (module doc)


def check_follow(time_field: str | None, unit: str | None, max_delay_us: int | None, poll_s: float,
                 directory: str, done_dir: str | None = None) -> None:
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
    if not os.path.isdir(directory):
        raise InjectionError(f"{directory!r} is not a directory; pass the folder the files come into")
    if done_dir is not None:
        if not os.path.isdir(done_dir):
            raise InjectionError(f"--done-dir {done_dir!r} is not a directory; make it first")
        if os.path.samefile(done_dir, directory):
            raise InjectionError("--done-dir is the followed directory itself; give another one")
        if os.stat(done_dir).st_dev != os.stat(directory).st_dev:
            raise InjectionError(f"--done-dir {done_dir!r} is on another file system than {directory!r}: files are "
                                 "moved there by a rename, which keeps their inodes; give one on the same file system")
        for d in (directory, done_dir):
            if not os.access(d, os.W_OK | os.X_OK):
                raise InjectionError(f"--done-dir: files cannot be moved out of {directory!r} into {done_dir!r}: "
                                     f"{d!r} is not writable by this user")


def _check(f: BinaryIO, size: int, name: str, key_field: str | None, time_field: str | None,
           unit: str | None) -> None:
    """Every line of an open file checked as a record (raises InjectionError naming the line)."""
    biggest = check_file(f, size, name, key_field, time_field, unit)
    if time_field is not None and unit is None:
        check_unit(biggest, time_field, f"file {name!r}", "nothing of it was sent")


def _lines(f: BinaryIO, size: int, name: str, key_field: str | None, time_field: str | None,
           unit: str | None) -> Iterator[tuple[int, bytes, bytes, int | None]]:
    """The records of an open file already checked: line number, key, value, time (None: the
    follower's stamp)."""
    for lineno, raw in raw_lines(f, size):
        value, key, ts = raw.rstrip(b"\n"), os.fsencode(name), None  # (a name os.listdir gave: any bytes)
        if key_field is not None or time_field is not None:
            if not raw.strip():
                continue
            k, ts, _ = line_fields(value, f"{name}, line {lineno}", key_field, time_field, unit=unit or "us")
            key = k if k is not None else key
        yield lineno, key, value, ts


def _ends_with_newline(f: BinaryIO, size: int) -> bool:
    if size == 0:
        return True
    f.seek(size - 1)
    last = f.read(1)
    f.seek(0)
    return last == b"\n"


class _Unsent(MillstreamError):
    """A file's records could not all be queued (stopped while the cluster could not take
    them): the follower ends, and the next run sends the file again."""

    def __init__(self, error: InjectionError) -> None:
        super().__init__(str(error))
        self.error = error


class Follower:
    """One run of a follower over a directory (module doc): what it has seen, taken and
    refused, by file name and identity."""

    def __init__(self, sink: Sink, directory: str, *, key_field: str | None, time_field: str | None,
                 unit: str | None, max_delay_us: int | None, done_dir: str | None,
                 stopping: Callable[[], bool], wait: Callable[[float], bool], poll_s: float) -> None:
        self.sink, self.directory, self.done_dir = sink, directory, done_dir
        self.key_field, self.time_field, self.unit, self.max_delay_us = key_field, time_field, unit, max_delay_us
        self.stopping, self.wait, self.poll_s = stopping, wait, poll_s
        self.before: dict[str, Signature] = {}   # name -> its signature at the last scan
        self.refused: dict[str, Signature] = {}  # name -> its signature when it could not be sent
        self.waiting: dict[str, Signature] = {}  # name -> ... when it was found without its last newline
        self.done: dict[str, Signature] = {}     # name -> ... when it was sent (or found sent)
        self.taken: dict[str, tuple[int, int]] = {}  # identity of each file sent (from its first record) -> size, mtime
        self.unmoved: dict[str, tuple[int, int]] = {}  # name -> (device, inode) of a file sent whose move failed
        self.unreported = False                  # the last watermark promised is not reported yet
        self.unlisted: set[str] = set()          # names whose stat failed (warned once)
        self.latest = self.watermark = MIN_TIME
        self.sent = 0

    def scan(self, now_us: int) -> None:
        """One look at the directory: each complete file not sent yet is sent, oldest first."""
        scanned = max(now_us, self.watermark)  # (a clock set back stamps no record behind the watermark)
        try:
            listing = _listing(self.directory, self.unlisted)
        except OSError as e:
            log.error("cannot list %r (%s); looking again in a poll", self.directory, e)
            return
        for name, inode in list(self.unmoved.items()):
            self._move(name, inode)
        ready = sorted((created, name, sig) for name, (sig, created) in listing.items()
                       if self.before.get(name) == sig and sig not in (self.refused.get(name), self.done.get(name),
                                                                       self.waiting.get(name)))
        self.before = {name: sig for name, (sig, _) in listing.items()}
        for table in (self.refused, self.done, self.waiting):  # (names gone: forgotten)
            for name in [n for n in table if n not in listing]:
                del table[name]
        for _, name, sig in ready:
            if self.stopping():
                return
            self._take(name, sig, scanned)
        if self.time_field is None:
            mark = scanned  # this scan's files are flushed, and the next ones are stamped later
        elif self.latest > MIN_TIME and self.max_delay_us is not None:
            mark = min(self.latest - self.max_delay_us, END_OF_TIME - 1)  # (never the end: not finished)
        else:
            mark = MIN_TIME
        if mark > self.watermark or self.unreported:
            self.watermark = max(mark, self.watermark)  # promised from here on: no stamp goes below it
            try:
                self.sink.advance_watermark(self.watermark)
                self.unreported = False
            except MasterUnavailableError as e:  # (the promise is kept, and reported again next scan)
                log.warning("the watermark could not be reported yet (%s); trying again in a poll", e)
                self.unreported = True

    def _take(self, name: str, sig: Signature, scanned: int) -> None:
        path = os.path.join(self.directory, name)
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                if _signature(st) != sig:
                    return  # (changed since the scan: it waits until it holds still)
                if st.st_size == 0 or not _ends_with_newline(f, st.st_size):
                    if st.st_size:
                        log.warning("%s does not end with a newline: it is taken once it does (end each file's last "
                                    "line with one, and move files in whole)", name)
                    self.waiting[name] = sig  # (an empty file: nothing to send, and perhaps not written yet)
                    return
                identity = identity_of(f, st)
                if identity in self.taken:
                    if self.taken[identity] != (st.st_size, st.st_mtime_ns):
                        log.warning("%s has the identity of a file sent before (its inode and first line) but other "
                                    "contents since: it is not sent again in this run (lines appended to a file sent "
                                    "go with the next run; a new file on a deleted file's inode, with the same first "
                                    "line, is taken for it: keep sent files, --done-dir)", name)
                    self.done[name] = sig
                    return
                _check(f, st.st_size, name, self.key_field, self.time_field, self.unit)
                self.taken[identity] = (st.st_size, st.st_mtime_ns)  # (from its first record on: never again)
                n = self._send(identity, _lines(f, st.st_size, name, self.key_field, self.time_field, self.unit),
                               scanned)  # (read again: nothing of a file is held)
        except FileNotFoundError:
            return  # (moved away since the scan: the next scan sees where to)
        except (InjectionError, OSError) as e:
            self.refused[name] = sig
            log.error("%s; %s was not sent: fix or replace it, and it is tried again once it changes", e, name)
            return
        self._flush()
        self.done[name] = sig
        self.sent += n
        if self.done_dir is not None:
            self._move(name, (st.st_dev, st.st_ino))

    def _send(self, identity: str, records: Iterable[tuple[int, bytes, bytes, int | None]], scanned: int) -> int:
        """Queue a checked file's records; a cluster that cannot take them (a failed round,
        reported when the queue is full) is waited out as in :meth:`_flush`, each record
        queued once (a refused ``send_sequenced`` leaves the injector as it was)."""
        n = 0
        for lineno, key, value, ts in records:
            when = scanned if ts is None else ts
            while True:
                try:
                    self.sink.send_sequenced(identity, lineno, key, value, when)
                    break
                except InjectionError as e:
                    if isinstance(e, (InvalidRecordError, StreamClosedError)):
                        raise _Unsent(e) from None
                    log.warning("the records sent could not be committed yet (%s); trying again in a poll", e)
                    if self.stopping() or self.wait(self.poll_s):
                        raise _Unsent(e) from None
            self.latest = max(self.latest, when)
            n += 1
        return n

    def _flush(self) -> None:
        """The file's records committed; a cluster that cannot take them is tried again each
        poll (the injector keeps them queued), until stopped (then its error is raised)."""
        while True:
            try:
                self.sink.flush()
                return
            except StreamClosedError as e:
                raise _Unsent(e) from None
            except InjectionError as e:
                log.warning("the records sent could not be committed yet (%s); trying again in a poll", e)
                if self.stopping() or self.wait(self.poll_s):
                    raise

    def _move(self, name: str, inode: tuple[int, int]) -> None:
        """A committed file out to ``done_dir``, if ``name`` is still that file (``inode``:
        its device and inode; a file put under the name since stays, to be sent); a move that
        fails is tried again at each scan."""
        assert self.done_dir is not None
        path = os.path.join(self.directory, name)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            self.unmoved.pop(name, None)  # (moved or removed by someone else)
            return
        if (st.st_dev, st.st_ino) != inode:
            self.unmoved.pop(name, None)  # (another file under the name now: not this one to move)
            return
        target = os.path.join(self.done_dir, name)
        n = 0
        while os.path.lexists(target):
            n += 1
            target = os.path.join(self.done_dir, f"{name}.{n}")
        try:
            os.rename(path, target)
        except OSError as e:
            if name not in self.unmoved:
                log.error("%s was sent but could not be moved to %r (%s); it is not sent again, and the move is tried "
                          "again at each scan", name, self.done_dir, e)
            self.unmoved[name] = inode
        else:
            self.unmoved.pop(name, None)


def follow_files(sink: Sink, directory: str, *, key_field: str | None = None, time_field: str | None = None,
                 unit: str | None = None, max_delay_us: int | None = None, poll_s: float = 1.0,
                 done_dir: str | None = None, wait: Callable[[float], bool] = threading.Event().wait,
                 stopping: Callable[[], bool] = lambda: False,
                 now_us: Callable[[], int] = lambda: time.time_ns() // 1000) -> int:
    """Send the files of ``directory`` as they come (module doc), scanning it every ``poll_s``
    seconds until ``wait(poll_s)`` returns True (``stopping``: whether it will, checked
    between files); returns the lines sent."""
    check_follow(time_field, unit, max_delay_us, poll_s, directory, done_dir)
    follower = Follower(sink, directory, key_field=key_field, time_field=time_field, unit=unit,
                        max_delay_us=max_delay_us, done_dir=done_dir, stopping=stopping, wait=wait, poll_s=poll_s)
    while True:
        try:
            follower.scan(now_us())
        except _Unsent as e:
            raise e.error from None
        if wait(poll_s):
            return follower.sent


def _signature(st: os.stat_result) -> Signature:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def _listing(directory: str, unlisted: set[str]) -> dict[str, tuple[Signature, int]]:
    """Each regular file not named with a leading dot: its signature, and its creation time
    (µs; :func:`injectors.files.created_us`), the order files are sent in. An entry that
    cannot be looked at is warned about once (in ``unlisted``) and left out."""
    out = {}
    for name in os.listdir(directory):
        if name.startswith("."):
            continue
        try:
            st = os.stat(os.path.join(directory, name))
        except FileNotFoundError:
            continue
        except OSError as e:
            if name not in unlisted:
                unlisted.add(name)
                log.warning("%s in %r cannot be looked at (%s); it is left until it can", name, directory, e)
            continue
        unlisted.discard(name)
        if stat.S_ISREG(st.st_mode):
            out[name] = (_signature(st), created_us(st))
    return out


def follow_directory(directory: str, masters: str | Iterable[str], stream: str, name: str | None = None,
                     security: Security = Security(), allow_code: str | Sequence[str] = (), *,
                     key_field: str | None = None, time_field: str | None = None, unit: str | None = None,
                     max_delay_us: int | None = None, poll_s: float = 1.0, done_dir: str | None = None,
                     stop: threading.Event | None = None, started: Callable[[], object] = lambda: None) -> int:
    """:func:`follow_files` through an :class:`Injector` (its incarnation the same in every
    run: :data:`IDENTITY`) until ``stop`` is set; then retire it (its records committed, its
    promise held while no run is live) without finishing the stream (module doc, "Stopping").
    Returns the lines sent. ``started`` is called once the flags are checked, the directory
    is locked (one follower per directory on a host) and the injector is made."""
    check_follow(time_field, unit, max_delay_us, poll_s, directory, done_dir)
    stop = stop or threading.Event()
    lock = os.open(directory, os.O_RDONLY)
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InjectionError(f"another follower on this host follows {directory!r}: two under one name would "
                                 "overwrite each other's watermark; run one per directory") from None
        except OSError as e:  # (a file system that cannot lock a directory: NFS, say)
            log.warning("cannot lock %r (%s): a second follower of it on this host would not be refused", directory, e)
        inj = Injector(masters, stream, name or "files:" + os.path.abspath(directory), security=security,
                       allow_code=allow_code, incarnation=IDENTITY)
        inj.check_units = False  # (follow_files checks them, or --timestamp-unit said)
        try:
            warn_if_finished(inj)  # (a one-shot run of the directory finished its stream: all late)
            started()
            n = follow_files(inj, directory, key_field=key_field, time_field=time_field, unit=unit,
                             max_delay_us=max_delay_us, poll_s=poll_s, done_dir=done_dir, wait=stop.wait,
                             stopping=stop.is_set)
            _retire(inj)
            return n
        finally:
            inj.close()
    finally:
        os.close(lock)


def _retire(inj: Injector, attempts: int = 3, pause: Callable[[float], object] = time.sleep) -> None:
    """``inj.retire()``: what it sent committed, its promise held while no run is live (never
    expired); a master away is tried again a few times, a second apart, before it raises (the
    run then holds the stream until the next one, or until the master expires it)."""
    for attempt in range(attempts):
        try:
            inj.retire()
            return
        except MasterUnavailableError:
            if attempt == attempts - 1:
                raise
            pause(1.0)
