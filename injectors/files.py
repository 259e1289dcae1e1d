"""The file-directory injector (the MillWheel paper's example): every line of every file is a record.

Files are read oldest first. The injector's watermark is the minimum creation
time of the files not yet fully read, so a file still being injected holds its
readers back; after the last file it moves to the end of time. Each file is a
producer of its own and its line number the record's place in it
(:meth:`Injector.send_sequenced`), so injecting the same directory again after a
crash, however late, is exactly-once, and receivers keep one number per file. The key is the file name; the timestamp the
file's creation time (its modification time, where the file system keeps no
birth time).

A file is known by its inode and a digest of its first line, not by its name
(:func:`file_identity`; review E3): a log rotated from ``app.log`` to ``app.log.1`` is
still the file it was, a file appended to between runs too, and the new ``app.log`` is a
new file. By name, the new file's first lines were dropped as duplicates of the old one's,
up to the old one's length.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from typing import Protocol

from injectors.injector import Injector
from runtime.errors import InjectionError
from runtime.security import Security


class Sink(Protocol):
    def send_sequenced(self, producer: str, seq: int, key: bytes, value: bytes, timestamp: int) -> None: ...
    def advance_watermark(self, timestamp: int) -> None: ...
    def flush(self) -> None: ...


def created_us(path: str) -> int:
    st = os.stat(path)
    birth = getattr(st, "st_birthtime", None)
    return int((birth if birth is not None else st.st_mtime) * 1_000_000)


def file_identity(path: str) -> str:
    """What a file is, whatever its name: its device and inode, and a BLAKE2b digest of its
    first line (at most 4 KiB). A rename (a log rotated from ``app.log`` to ``app.log.1``)
    keeps all three; lines appended later keep them too, so a re-run continues the file's
    line numbers; a new file under an old name has another inode, and one that reuses a
    deleted file's inode almost surely another first line. A copy (a backup restored onto
    another disk) is a new file: its lines count again."""
    st = os.stat(path)
    with open(path, "rb") as f:
        first = f.readline(4096)
    digest = hashlib.blake2b(first, digest_size=8).hexdigest()
    return f"{st.st_dev}:{st.st_ino}:{digest}"


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


def inject_files(sink: Sink, directory: str, name: str) -> int:
    """Send every line of every file, advancing the watermark file by file; returns lines sent."""
    files = pending_files(directory)
    n = 0
    for ts, fname in files:
        sink.advance_watermark(ts)  # the oldest unfinished file is now this one
        path = os.path.join(directory, fname)
        producer = file_identity(path)
        with open(path, "rb") as f:
            for lineno, line in enumerate(f, start=1):
                sink.send_sequenced(producer, lineno, fname.encode(), line.rstrip(b"\n"), ts)
                n += 1
        sink.flush()  # this file is done: only then may the watermark pass it
    return n


def inject_directory(directory: str, masters: str | Iterable[str], stream: str,
                     name: str | None = None, security: Security = Security(),
                     allow_code: str | Sequence[str] = ()) -> int:
    """Inject every line of the regular files under ``directory``, then finish
    (``allow_code``: where the stream's key extractors may come from, as for ``Injector``)."""
    name = name or "files:" + os.path.abspath(directory)
    pending_files(directory)  # a bad directory fails before anything registers
    with Injector(masters, stream, name, security=security, allow_code=allow_code) as inj:
        return inject_files(inj, directory, name)
