"""Sinks: :class:`Sink`, the base class (and contract) of computations that write a stream
out of millstream exactly once, and the built-in :class:`FileSink`.

:class:`FileSink` appends one JSON line per record to its tablet's current file, and commits
the file's name and length atomically with the batch; its files roll at ``roll_bytes`` (a run:
:class:`CommittedFile`), and a reopened tablet cuts back what no commit covers, which the
redelivery writes again. Subscribe it with ``params={"path": "/some/dir"}``.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import inspect
import json
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence

from runtime.computation import Computation, Context
from runtime.durable import sync_dir
from runtime.errors import StaleTokenError, TopologyError
from runtime.record import Record

log = logging.getLogger(__name__)


class Sink(Computation):
    """Base class of sink computations: computations that write their input out of millstream
    (files, a database, a service) exactly once, by committing a little *meta* of their own
    (bytes: a file length, a row count, an offset) atomically with each batch.

    The worker calls two hooks besides :meth:`process_record` and :meth:`process_timer`, both
    on the tablet's own thread, the thread that runs ``process_record``: never concurrently
    with user code of the same tablet or with each other. It calls them because the class
    derives from ``Sink`` (a plain :class:`Computation` written before ``Sink`` that defines
    methods of these names still has them called, with a warning: :func:`is_sink`).

    :meth:`restore` ``(tablet, meta, token, absorbed)``: once each time the tablet opens on
    a worker (first start, restart, move, failover, a split or merge, and again after any
    failed batch), after :meth:`setup` and before any record or timer of that open.

    - ``tablet`` names the tablet: ``"<computation>/<range>"``, e.g. ``"orders_sink/3"``.
    - ``meta`` is what the last *committed* :meth:`prepare_commit` returned, or ``None`` if
      none has been committed (a new tablet, or every call returned ``None``).
    - ``token`` is the tablet's sequencer token: it goes up every time the tablet changes
      owner (a split's halves and a merge's result get a token above their parents'), so
      the newest owner of a piece of output holds the highest token. The same token is
      ``ctx.sequencer_token`` during this open.
    - ``absorbed`` holds the last committed metas of ranges merged into this one: their
      output is this tablet's to settle (cut back, finish), as they never run again. The
      same metas come on every later open of the merged range.

    It must be **idempotent**: the tablet may open again with the same ``meta`` and
    ``absorbed`` (a batch failed, the worker restarted). Output a batch wrote after ``meta``
    was committed belongs to a batch whose commit never happened: its records are delivered
    again, so undo that output (or make the rewrite overwrite it); never undo what ``meta``
    covers. Claim the output under ``token`` first (see :class:`OutputFence`), so an older
    owner still finishing a batch (a zombie whose lease ran out) can write nothing more. An
    exception fails the opening: the tablet processes nothing, the worker tries to open it
    again on its next reconcile, and ``millstream status`` lists it as a tablet that cannot
    run, with the error.

    :meth:`prepare_commit` ``() -> bytes | None``: once per batch, after the batch's
    ``process_record`` and ``process_timer`` calls returned and right before its atomic
    commit, and only while the worker's lease holds (checked just before). Write the batch's
    output durably here and return the meta that covers it; the meta is committed in the
    same atomic write as the batch's state, timers, productions and input ids, so a
    committed meta and the committed input always agree. ``None`` keeps the last committed
    meta. An exception fails the batch: nothing of it is committed or acknowledged, the
    tablet closes and opens again from storage (:meth:`restore` with the last committed
    meta), and the batch's records are delivered again. The commit itself can also fail
    after :meth:`prepare_commit` returned; that looks the same to the sink. A call after a
    first one means the previous batch committed: a failed batch ends the instance.

    :meth:`committed` ``()``, optional: once a batch's commit is durable and on every in-sync
    copy of the tablet (a takeover cannot lose it), on the tablet's thread, before its next
    batch (Flink's ``notifyCheckpointComplete``). For what the sink may let go of only once
    the meta is safe (a marker saying output is not committed yet). It is not called for a
    batch whose commit failed, nor after a crash: what it would do must be safe to redo on
    the next :meth:`restore` (which has the meta). An exception is logged and ignored.

    The hooks default to doing nothing (``prepare_commit`` returns ``None``). User code
    that writes outside millstream from ``process_record`` can fence it the same way with
    ``ctx.sequencer_token`` and ``ctx.tablet`` (docs/guide.md, "Writing a sink").

    ``process_batch(ctx, records)``, optional: a sink that defines it gets a batch's records
    in one call, in their order, in place of a ``process_record`` call per record (Bytewax's
    ``write_batch``, Kafka Connect's ``put``); ``ctx.key`` is ``b""``, as the batch holds many
    keys. If it raises, what it did through ``ctx`` is taken back and the records go one by
    one: to ``process_record``, or, for a class without one, to ``process_batch`` with one
    record each, so a bad record is retried and dead-lettered alone. Its own attributes are
    not taken back: add to them only once nothing can raise (build the lines, then append).
    A subclass that overrides ``process_record`` of a sink with ``process_batch`` (of
    :class:`FileSink`, say, to check each record) has its records go one by one.
    """

    #: The params that name a local file or directory: a relative one is made absolute where
    #: the job is defined (against the submitting process's working directory), not resolved
    #: by each worker against its own.
    local_paths: tuple[str, ...] = ()

    def restore(self, tablet: str, meta: bytes | None, token: int, absorbed: Sequence[bytes]) -> None:
        """The tablet opened under ``token``; ``meta`` is the last committed one (see the class).

        On a replicated tablet taken over from another copy, called only once every in-sync
        copy holds this copy's last commit (one that does not has been removed from the set):
        no copy with a different last commit (and output) can be promoted back after this
        cuts the output."""

    def prepare_commit(self) -> bytes | None:
        """Make the batch's output durable; returns the meta to commit with it, or ``None``."""
        return None

    def committed(self) -> None:
        """The last batch's commit is durable and replicated (see the class)."""


def absolute_paths(cls: object, params: dict[str, str]) -> dict[str, str]:
    """``params`` of computation class ``cls`` with the relative paths of its
    :attr:`Sink.local_paths` made absolute against this process's working directory."""
    if not (isinstance(cls, type) and issubclass(cls, Sink)):
        return params
    relative = [p for p in cls.local_paths if isinstance(params.get(p), str) and params[p]
                and not os.path.isabs(params[p])]
    return {**params, **{p: os.path.abspath(params[p]) for p in relative}} if relative else params


def committed_hook(comp: Computation) -> Callable[[], None] | None:
    """The :meth:`Sink.committed` the worker calls after each commit: the sink's own (or that
    of the sink a flow's stage fused, ``fused_sink``), or None where it does nothing."""
    sink = getattr(comp, "fused_sink", comp)
    if not isinstance(sink, Sink) or type(sink).committed is Sink.committed:
        return None  # (a sink written before Sink may hold anything under that name)
    return sink.committed


def call_restore(restore: Callable[..., None], tablet: str, meta: bytes | None, token: int,
                 absorbed: Sequence[bytes]) -> None:
    """Call a sink's ``restore`` with what its signature takes (a sink written before
    :class:`Sink` may take neither ``token`` nor ``absorbed``)."""
    accepts = inspect.signature(restore).parameters
    extra: dict[str, object] = {}
    if "token" in accepts:
        extra["token"] = token
    if "absorbed" in accepts:
        extra["absorbed"] = absorbed
    restore(tablet, meta, **extra)


_WARNED: set[str] = set()


def is_sink(comp: Computation, code: str = "") -> bool:
    """Whether the worker calls ``comp``'s sink hooks: a :class:`Sink`, or a computation
    written before it that defines ``prepare_commit`` or ``restore`` (still called, with a
    warning once per class: derive it from Sink)."""
    if isinstance(comp, Sink):
        return True
    legacy = hasattr(comp, "prepare_commit") or hasattr(comp, "restore")
    if legacy and code not in _WARNED:
        _WARNED.add(code)
        log.warning("%s defines sink hooks but does not derive from runtime.Sink; they are called, but "
                    "derive it from runtime.Sink (docs/guide.md, 'Writing a sink')", code or type(comp).__name__)
    return legacy


def sink_batch_fn(comp: Computation) -> Callable[[Context, list[Record]], None] | None:
    """A sink's ``process_batch``, or None where its records must go one by one: it has
    none, or a subclass overrides ``process_record`` below the class that defines it (a
    :class:`FileSink` that checks each record): that ``process_record`` must see each one."""
    fn = getattr(comp, "process_batch", None)
    if fn is None:
        return None
    mro = type(comp).__mro__
    batch = next((c for c in mro if "process_batch" in c.__dict__), None)
    one = next((c for c in mro if "process_record" in c.__dict__), None)
    if batch is not None and one is not None and one is not batch and issubclass(one, batch):
        return None
    return fn  # type: ignore[no-any-return]


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


DEFAULT_ROLL_BYTES = 128 << 20


class FileSink(Sink):
    """Writes ``{"key", "value", "timestamp"}`` JSON lines to ``<path>/<tablet>[.<n>].jsonl``;
    ``params``: ``path``, and ``roll_bytes`` (a file is closed once it holds that many)."""

    local_paths = ("path",)

    def setup(self, params: Mapping[str, str]) -> None:
        super().setup(params)
        if "path" not in params:
            raise TopologyError("FileSink needs params={'path': DIRECTORY}")
        self.dir = params["path"]
        try:
            self.roll_bytes = int(params.get("roll_bytes", str(DEFAULT_ROLL_BYTES)))
        except ValueError:
            raise TopologyError(f"FileSink: roll_bytes={params['roll_bytes']!r} is not a number of bytes") from None
        if self.roll_bytes < 1:
            raise TopologyError(f"FileSink: roll_bytes={self.roll_bytes} must be at least 1")
        self._pending: list[str] = []

    def restore(self, tablet: str, meta: bytes | None, token: int = 0, absorbed: Sequence[bytes] = ()) -> None:
        """Called when the tablet opens: claim its output, cut the file back to its committed
        length (and the files of ranges merged into this one to theirs)."""
        self.file = CommittedFile(self.dir, tablet, ".jsonl", meta, self.roll_bytes, token)
        for other in absorbed:
            CommittedFile.settle(self.dir, other, token)

    def process_record(self, ctx: Context, record: Record) -> None:
        self._pending.append(_json_line(record))

    def process_batch(self, ctx: Context, records: Sequence[Record]) -> None:
        self._pending += [_json_line(r) for r in records]  # (built first: all of them or none)

    def prepare_commit(self) -> bytes:
        """Make the batch's lines durable; returns the length to commit."""
        data = "".join(self._pending).encode()
        self._pending.clear()
        return self.file.append(data)

    def committed(self) -> None:
        self.file.committed()


def _json_line(record: Record) -> str:
    return json.dumps({
        "key": record.key.decode("utf-8", "backslashreplace"),
        "value": record.value.decode("utf-8", "backslashreplace"),
        "timestamp": record.timestamp,
    }) + "\n"


def read_file_sink(path: str) -> Iterator[dict[str, object]]:
    """Every record a :class:`FileSink` has written under ``path``.

    Safe to call while the job runs: a line still being written (no newline yet) is not
    returned. A batch is visible as soon as it is written, shortly before its commit; if
    that commit fails, the tablet cuts the file back and the redelivery writes it again.
    """
    for name in sorted(glob.glob(os.path.join(path, "*.jsonl"))):
        with open(name) as f:
            for line in f:
                if not line.endswith("\n"):
                    break  # the writer is mid-line
                yield json.loads(line)
