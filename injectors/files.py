"""The file-directory injector: every line of every file in a directory is a record.

Record ids come from (injector name, file name, line number), so injecting the
same directory again after a crash is exactly-once. The key is the file name;
the timestamp the file's modification time.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from injectors.injector import Injector
from runtime.errors import InjectionError
from runtime.record import derived_id


def inject_directory(directory: str, masters: str | Iterable[str], stream: str,
                     name: str | None = None) -> int:
    """Inject every line of the regular files under ``directory``; returns the line count."""
    if not os.path.isdir(directory):
        raise InjectionError(f"{directory!r} is not a directory; pass the folder holding the files")
    name = name or "files:" + os.path.abspath(directory)
    files = sorted(f for f in os.listdir(directory) if os.path.isfile(os.path.join(directory, f)))
    n = 0
    with Injector(masters, stream, name) as inj:
        for fname in files:
            path = os.path.join(directory, fname)
            ts = int(os.stat(path).st_mtime * 1_000_000)
            with open(path, "rb") as f:
                for lineno, line in enumerate(f):
                    rid = derived_id(name.encode(), fname.encode(), str(lineno).encode())
                    inj.send(fname.encode(), line.rstrip(b"\n"), ts, id=rid)
                    n += 1
    return n
