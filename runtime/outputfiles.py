"""The exactly-once file machinery of the built-in sinks: which owner of a tablet may write a
piece of its output (:class:`OutputFence`), and an append-only file whose name and committed
length travel in the tablet's commit (:class:`CommittedFile`, FileSink's runs of files).
ParquetSink (spark_bridge/parquet_sink.py) shares the fence and :func:`uncommitted_runs`."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
from collections.abc import Iterator

from runtime.durable import sync_dir
from runtime.errors import StaleTokenError

log = logging.getLogger(__name__)


class OutputFence:
    """Which owner of a tablet may write a piece of its output: a hidden ``.<name>.fence`` file
    beside it holds the newest tablet token that claimed it, under a file lock.

    Output lives outside the tablet's storage, on a directory every worker writes, and a
    tablet's old primary may still finish a batch while its new one opens (a move, a failover,
    a split): the new owner *claims* the output first, and every write holds the fence and
    checks that no newer token has claimed it. An older owner's write is refused with
    :class:`StaleTokenError` (its batch fails; nothing of it was acknowledged).
    Token 0 (a sink opened without one) does not fence.
    """

    def __init__(self, directory: str, name: str, token: int) -> None:
        self.path = os.path.join(directory, f".{name}.fence")
        self.name = name
        self.token = token

    @contextlib.contextmanager
    def hold(self, claim: bool = False) -> Iterator[None]:
        if not self.token:
            yield
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            seen = int(os.pread(fd, 32, 0) or b"0")
            if seen > self.token:
                raise StaleTokenError(
                    f"sink output {self.name} was claimed by token {seen}, newer than this tablet's "
                    f"({self.token}): the tablet has a newer owner, which writes it now")
            if claim and seen < self.token:
                os.ftruncate(fd, 0)
                os.pwrite(fd, str(self.token).encode(), 0)
                os.fsync(fd)
            yield
        finally:
            os.close(fd)  # releases the lock


def fence_token(directory: str, name: str) -> int:
    """The newest token that claimed output ``name`` (its :class:`OutputFence`; 0: none)."""
    try:
        with open(os.path.join(directory, f".{name}.fence"), "rb") as f:
            return int(f.read(32) or b"0")
    except (FileNotFoundError, ValueError):
        return 0


def uncommitted_runs(directory: str, base: str, token: int) -> list[str]:
    """The prefixes of tablet file-name ``base`` (``base``, ``base.g<n>``) that hold a run's
    uncommitted first output: its hidden ``.<prefix>.uncommitted`` marker, under a fence no
    owner newer than ``token`` claimed (one a newer owner claimed is that owner's to settle)."""
    marker = re.compile(r"\." + re.escape(base) + r"(\.g\d+)?\.uncommitted")
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    prefixes = sorted(name[1:-len(".uncommitted")] for name in names if marker.fullmatch(name))
    return [p for p in prefixes if not token or fence_token(directory, p) <= token]


class CommittedFile:
    """An append-only file whose name and committed length travel in the tablet's atomic
    commit (meta ``b"<length> <file name>"``).

    A tablet's files form a *run*: ``<prefix><suffix>``, then ``<prefix>.1<suffix>``,
    ``<prefix>.2<suffix>``, ... as it rolls. The prefix is the tablet's name
    (``<computation>-<range>``), or, where an earlier run already wrote there (a new cluster
    writing into an old directory, a lost state directory: review E4), ``<name>.g<n>``, the
    first free one. Everything under a run's prefix is that run's own, so on open:

    - with a committed meta, the committed file is cut back to its length and the run's
      files after it are removed: output no commit covers (a batch written after a roll whose
      commit failed, or what the old job wrote after the savepoint a restore goes back to);
    - the committed file gone or shorter than committed (moved, rotated, compressed by an
      operator): the run goes on in its next file and says so in the log; no gap is filled;
    - nothing committed: a prefix holding only this run's uncommitted first output (a hidden
      ``.<prefix>.uncommitted`` marker says so) is taken back and cut; one holding anything
      else is left alone and the next free prefix is used. The marker goes once the worker
      says the first commit is durable and replicated (:meth:`committed`), or a later batch
      proves it.

    One fence per run (:class:`OutputFence` on the prefix), claimed on open: an older owner
    of the tablet can write none of the run's files, including ones it would roll to.
    """

    def __init__(self, directory: str, tablet: str, suffix: str, meta: bytes | None,
                 roll_bytes: int | None = None, token: int = 0) -> None:
        os.makedirs(directory, exist_ok=True)
        self.directory = directory
        self.token = token  # the tablet's: an older owner may not write what this one claimed
        self.roll_bytes = roll_bytes  # a batch starts a new file once the current one holds this
        self.base = tablet.replace("/", "-")
        self.suffix = suffix
        self._prepared = False
        self._marked = False  # the run's marker is there: nothing of it is committed yet
        if meta:
            size, *rest = meta.decode().split(" ")
            self.size, self.name = int(size), (rest[0] if rest and rest[0] else self.base + suffix)
            # A meta of this version ends in "run"; an older one names a file among, perhaps,
            # other clusters' files of the same name: nothing after it is removed, and the
            # tablet goes on in a run of its own at its next file.
            self.run = rest[1:] == ["run"]
            self.prefix, index = self._split(self.name)
            with self._fence().hold(claim=True):
                if self.run:
                    self._remove_after(index)
                on_disk = self._size_on_disk(self.name)
                if on_disk >= self.size:
                    self._truncate(self.size)
                    self._unmark()  # committed: whatever it says is ours now
                    if not self.run:
                        self._take_back_begun_run()
                    return
                log.warning("sink file %s is %s; leaving it and going on in a new file",
                            self._path(self.name), "missing" if on_disk < 0 else
                            f"shorter ({on_disk} bytes) than committed ({self.size})")
                self._unmark()
            self._next_file(index)
            return
        self._begin_run()

    def _begin_run(self) -> None:
        """Start a run of this tablet's own: under the first prefix free, or holding only its
        own uncommitted first output (taken back), marked until its first commit is safe."""
        self.size, self.run = 0, True
        self.prefix = self._free_prefix()
        self.name = self._file(0)
        with self._fence().hold(claim=True):
            open(self._path(f".{self.prefix}.uncommitted"), "ab").close()
            self._marked = True
            self._remove_after(-1)  # this run's own uncommitted first output, if it crashed
            self._truncate(0)
            sync_dir(self.directory)  # the marker and the file are there after a power cut too

    def _take_back_begun_run(self) -> None:
        """Opened with an older meta whose file is whole: a run this tablet began after that
        file (a roll) whose first commit never came is its own uncommitted output: removed now,
        not left (read as output) until the tablet rolls again."""
        name, prefix = self.name, self.prefix
        begun = self._free_prefix()
        if os.path.exists(self._path(f".{begun}.uncommitted")):
            with self._fence().hold(claim=True):
                self._remove_after(-1)
                self._unmark()
        self.name, self.prefix = name, prefix

    def _fence(self) -> OutputFence:
        return OutputFence(self.directory, self.prefix, self.token)

    def _file(self, index: int) -> str:
        return self.prefix + (f".{index}" if index else "") + self.suffix

    def _split(self, name: str) -> tuple[str, int]:
        """A run's file name as (its prefix, its place in the run)."""
        stem = name[:-len(self.suffix)] if name.endswith(self.suffix) else name
        head, _, last = stem.rpartition(".")
        return (head, int(last)) if head and last.isdigit() else (stem, 0)

    def _run_files(self, names: list[str] | None = None) -> dict[str, int]:
        """The files of this run on disk: name -> place."""
        out = {}
        for name in os.listdir(self.directory) if names is None else names:
            if name.startswith(self.prefix) and name.endswith(self.suffix) and self._split(name)[0] == self.prefix:
                out[name] = self._split(name)[1]
        return out

    def _remove_after(self, index: int) -> None:
        for name, i in self._run_files().items():
            if i > index:
                log.info("sink file %s: removed (its run's commit does not cover it)", self._path(name))
                os.remove(self._path(name))

    def _free_prefix(self) -> str:
        """The tablet's name, or ``<name>.g<n>``: the first prefix that no run ever claimed or
        wrote, or that holds only this tablet's own uncommitted first output: its marker, under
        a fence no newer owner claimed (an earlier cluster's range that never committed leaves
        a marker and a fence of its own tokens: skipped). Markers of versions before runs count
        for nothing: they stayed beside committed output."""
        names = os.listdir(self.directory)
        n = 0
        while True:
            self.prefix = self.base + (f".g{n}" if n else "")
            fence = fence_token(self.directory, self.prefix) if f".{self.prefix}.fence" in names else None
            if f".{self.prefix}.uncommitted" in names and (fence is None or not self.token or fence <= self.token):
                return self.prefix
            if fence is None and not any(self._size_on_disk(f) > 0 for f in self._run_files(names)):
                return self.prefix
            n += 1

    def _next_file(self, index: int) -> None:
        """Go on in the run's file after ``index`` (claimed and empty); a file of an older
        meta goes on in a run of its own instead (marked until its first commit is safe, so a
        failed batch's output there is taken back by the next open or roll)."""
        if not self.run:
            self._begin_run()
            return
        self.name, self.size = self._file(index + 1), 0
        with self._fence().hold(claim=True):
            self._truncate(0)
            sync_dir(self.directory)  # before a commit names it: a power cut must not lose the file

    @staticmethod
    def settle(directory: str, meta: bytes, token: int) -> None:
        """The committed file of a range merged into this one (its meta): claim its run, cut
        the file back to its committed length and remove the run's files after it (what a
        batch that failed after writing left there is written again by the merged range);
        never extended, never written after."""
        size, *rest = meta.decode().split(" ")
        if not rest or not rest[0]:
            return  # (a meta of a version that committed no file name: nothing to find)
        name, run = rest[0], rest[1:]
        other = CommittedFile.__new__(CommittedFile)
        other.directory, other.token, other.suffix = directory, token, "." + name.rpartition(".")[2]
        other.prefix, index = other._split(name)
        path = os.path.join(directory, name)
        with other._fence().hold(claim=True):
            with contextlib.suppress(FileNotFoundError):  # committed: its marker says nothing true any more
                os.remove(other._path(f".{other.prefix}.uncommitted"))
            if run == ["run"]:
                other._remove_after(index)
            if os.path.exists(path) and os.path.getsize(path) > int(size):
                log.info("sink file %s: cut back to its committed %s bytes (its range was merged)", path, size)
                with open(path, "r+b") as f:
                    f.truncate(int(size))
                    os.fsync(f.fileno())

    @staticmethod
    def take_back(directory: str, tablet: str, suffix: str, last: int, token: int) -> None:
        """A range this one replaced that never committed (a first batch written, its commit
        failed, then split or merged before it opened again; ``last``: the token it last held):
        its marked first output, as its own reopen would take it back, is removed under its
        fence claimed with this tablet's ``token``, so the old owner, were it still finishing
        that batch, can write nothing more. Its records come here again."""
        for prefix in uncommitted_runs(directory, tablet.replace("/", "-"), last):
            other = CommittedFile.__new__(CommittedFile)
            other.directory, other.token, other.suffix, other.prefix = directory, token, suffix, prefix
            other.name = other._file(0)
            with other._fence().hold(claim=True):
                other._remove_after(-1)
                other._unmark()

    def _path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    @property
    def path(self) -> str:
        return self._path(self.name)

    def _size_on_disk(self, name: str) -> int:
        try:
            return os.path.getsize(self._path(name))
        except FileNotFoundError:
            return -1

    def _truncate(self, size: int) -> None:
        with open(self.path, "a+b") as f:
            f.truncate(size)

    def _unmark(self) -> None:
        markers = [m for m in (f".{self.prefix}.uncommitted", self.name + ".uncommitted")  # (an older version's)
                   if os.path.exists(self._path(m))]
        for marker in markers:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self._path(marker))
        if markers:
            sync_dir(self.directory)  # a marker back after a power cut would say committed output is not
        self._marked = False

    def committed(self) -> None:
        """The last append's meta is committed and replicated: the run is no longer only this
        tablet's uncommitted output. Its marker goes now, not with the next batch (which may
        never come): a marker left beside committed output made a later cluster writing to
        the same directory take that output for its own first batch, and cut it."""
        if self._marked and self._prepared:
            self._unmark()

    def append(self, data: bytes, fsync: bool = True) -> bytes:
        """Write a batch; returns the meta to commit with it."""
        if self._prepared and self._marked:
            self._unmark()  # a second batch runs only after the first one's commit
        self._prepared = True
        if data and self.roll_bytes is not None and self.size >= self.roll_bytes:
            # Roll into the run's next file (a crash before its commit: removed at the reopen).
            self._next_file(self._split(self.name)[1])
        if data:
            with self._fence().hold():
                with open(self.path, "ab") as f:
                    f.write(data)
                    if fsync:
                        f.flush()
                        os.fsync(f.fileno())
            self.size += len(data)
        return b"%d %s" % (self.size, self.name.encode()) + (b" run" if self.run else b"")
