"""Sinks: :class:`Sink`, the base class (and contract) of computations that write a stream
out of millstream exactly once, and the built-in :class:`FileSink`.

:class:`FileSink` appends one JSON line per record to its tablet's current file, and commits
the file's name and length atomically with the batch; its files roll at ``roll_bytes`` (a run:
:class:`CommittedFile`), and a reopened tablet cuts back what no commit covers, which the
redelivery writes again. Subscribe it with ``params={"path": "/some/dir"}``.
"""

from __future__ import annotations

import glob
import inspect
import json
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence

from runtime.computation import Computation, Context
from runtime.errors import TopologyError
from runtime.outputfiles import CommittedFile
from runtime.outputfiles import OutputFence as OutputFence  # (re-exported: sink authors' import)
from runtime.outputfiles import fence_token as fence_token
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
    - ``uncommitted`` (only to a ``restore`` that takes it: a keyword beside the four above)
      maps the tablets this one replaced (split or merged) that never committed a meta to
      the token each last held: what they wrote (a first batch written, its commit failed,
      the range split or merged before it opened again) is uncommitted output nobody else
      undoes. Undo it as an open of that tablet with no meta would (what a newer owner
      than that token claimed is not its); the records are delivered here again. It comes
      on every open until this tablet commits a meta.

    It must be **idempotent**: the tablet may open again with the same ``meta`` and
    ``absorbed`` (a batch failed, the worker restarted). Output a batch wrote after ``meta``
    was committed belongs to a batch whose commit never happened: its records are delivered
    again, so undo that output (or make the rewrite overwrite it); never undo what ``meta``
    covers. Claim the output under ``token`` first (see :class:`runtime.outputfiles.OutputFence`), so an older
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
                 absorbed: Sequence[bytes], uncommitted: Mapping[str, int] | None = None) -> None:
    """Call a sink's ``restore`` with what its signature takes (a sink written before
    :class:`Sink` may take neither ``token`` nor ``absorbed``, one written before splits told
    it of uncommitted parents not ``uncommitted``)."""
    accepts = inspect.signature(restore).parameters
    extra: dict[str, object] = {}
    for name, value in (("token", token), ("absorbed", absorbed), ("uncommitted", uncommitted or {})):
        if name in accepts:
            extra[name] = value
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

    def restore(self, tablet: str, meta: bytes | None, token: int = 0, absorbed: Sequence[bytes] = (),
                uncommitted: Mapping[str, int] | None = None) -> None:
        """Called when the tablet opens: claim its output, cut the file back to its committed
        length (and the files of ranges merged into this one to theirs, and remove what
        replaced ranges that never committed wrote)."""
        for other, last in (uncommitted or {}).items():
            CommittedFile.take_back(self.dir, other, ".jsonl", last, token)
        self.file = CommittedFile(self.dir, tablet, ".jsonl", meta, self.roll_bytes, token)
        for settled in absorbed:
            CommittedFile.settle(self.dir, settled, token)

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
