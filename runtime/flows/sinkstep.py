"""A ``sink`` step: a :class:`~runtime.Sink` fused into the stage before it (runtime/flows/stage.py).

It gets the call's records only in ``finish``, once everything else in the call succeeded,
and never raises from there: a record it fails on is tried, then dead-lettered, each failed
try's state and timers taken back (:class:`_Attempt`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from runtime.codecs import Codec
from runtime.computation import Computation, Context, TimeDomain
from runtime.errors import UsageError
from runtime.flows.ops import Item
from runtime.flows.steps import Process, StepContext, _StepState
from runtime.record import Record, Timestamp
from runtime.sinks import sink_batch_fn
from runtime.state import TTL_TAG, bind
from runtime.topology import dead_letter

log = logging.getLogger(__name__)


class _Attempt:
    """The stage's context as one attempt of a fused sink's call sees it: it forwards
    everything, noting what each change to typed state and timers replaced, so
    :meth:`undo` takes back an attempt that raised. (The worker undoes a whole call of the
    stage; a sink's attempts are per record, inside one.)"""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self._undo: list[Callable[[], None]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)

    def state_of(self, spec: Any) -> Any:
        return bind(spec, self)  # type: ignore[arg-type]

    def _keep_cells(self, skeys: list[bytes]) -> None:
        eff = self._ctx.effects  # type: ignore[attr-defined]
        cells = eff.cells
        saved = [(s, s in cells, cells.get(s)) for s in skeys]

        def undo() -> None:
            for s, had, old in saved:
                if had:
                    cells[s] = old
                else:
                    cells.pop(s, None)
                    if eff.pending is not None:
                        eff.pending.forget()
        self._undo.append(undo)

    def _keep_timer(self, tag: str) -> None:
        eff = self._ctx.effects  # type: ignore[attr-defined]
        tk = (self._ctx.key, tag)
        was_set, was_deleted = eff.timers_set.get(tk), tk in eff.timers_deleted

        def undo() -> None:
            eff.timers_set.pop(tk, None)
            if was_set is not None:
                eff.timers_set[tk] = was_set
            (eff.timers_deleted.add if was_deleted else eff.timers_deleted.discard)(tk)
        self._undo.append(undo)

    def cell_put(self, skey: bytes, stored: bytes) -> None:
        self._keep_cells([skey])
        self._ctx.cell_put(skey, stored)  # type: ignore[attr-defined]

    def cell_delete(self, skey: bytes) -> None:
        self._keep_cells([skey])
        self._ctx.cell_delete(skey)  # type: ignore[attr-defined]

    def cell_write(self, writes: dict[bytes, bytes | None]) -> None:
        self._keep_cells(list(writes))
        self._ctx.cell_write(writes)  # type: ignore[attr-defined]

    def cell_clear(self, prefix: bytes) -> None:
        """The stage's clear (entry by entry within its budgets, else one range delete: a
        sink's clear of a million entries made a million point deletes, past what a
        replication frame holds), noting what it replaced so :meth:`undo` takes it back."""
        ctx: Any = self._ctx
        eff = ctx.effects
        before = ctx.cell_pending(prefix)
        ranges, points = len(eff.cleared), ctx.cleared_points
        ctx.cell_clear(prefix)

        def undo() -> None:
            cells = eff.cells
            for s in ctx.cell_pending(prefix):
                if s in before:
                    cells[s] = before[s]
                else:
                    del cells[s]
            del eff.cleared[ranges:]
            ctx.cleared_points = points
            if eff.pending is not None:
                eff.pending.forget()
        self._undo.append(undo)

    def expire_at(self, name: str, time: int, domain: TimeDomain = TimeDomain.EVENT_TIME) -> None:
        self._keep_timer(TTL_TAG + name)
        self._ctx.expire_at(name, time, domain)  # type: ignore[attr-defined]

    def set_timer(self, tag: str, time: Timestamp, domain: TimeDomain = TimeDomain.EVENT_TIME) -> None:
        self._keep_timer(tag)
        self._ctx.set_timer(tag, time, domain)

    def delete_timer(self, tag: str) -> None:
        self._keep_timer(tag)
        self._ctx.delete_timer(tag)

    def undo(self) -> None:
        while self._undo:
            self._undo.pop()()

    def keep(self) -> None:
        self._undo.clear()


class _SinkContext(StepContext):
    def produce(self, stream: str, value: Any, *, key: bytes | None = None, timestamp: Timestamp | None = None) -> None:
        raise UsageError(f"sink step {self.op.name!r} produced to {stream!r}; a sink writes out of millstream, "
                         "it cannot produce (use a process step before it)")


class SinkStep(Process):
    """A ``sink`` fused into the stage before it (Flink chains its sinks the same way): the
    user's :class:`~runtime.Sink` runs in the stage's tablet, so its output commits with the
    stage's batch, with no hop, delivery or commit of its own.

    The stage's call only collects the items, encoded by ``codec`` (an item whose value the
    codec refuses fails the call: the worker retries it, then dead-letters it, as for any
    step). The sink gets them in :meth:`finish`, once the rest of the call succeeded, so a
    call the worker undoes and runs again never hands the sink a record twice; and
    :meth:`finish` never raises. A sink that defines ``process_batch`` gets them in one call;
    if that raises, what it did is taken back and they go one by one. A record the sink's
    ``process_record`` (or ``process_batch`` of that one record) raises on is tried
    ``attempts`` times (the worker's ``max_attempts``), each failed attempt's state and
    timers taken back, then goes to the stage's ``<stage>.dead_letter`` stream (counted and
    logged by ``on_dead_letter``), and the others go on."""

    state_kind = _StepState  # its ctx.state: written through at once (a sink's own state)

    def __init__(self, name: str, comp: Computation, codec: Codec, dead_letters: str, attempts: int = 3,
                 on_dead_letter: Callable[[bytes, BaseException, int], None] | None = None) -> None:
        super().__init__(name, comp)
        self.step_ctx = _SinkContext(self)
        self.encode = codec.encode
        self.dead_letters = dead_letters
        self.attempts = attempts
        self.on_dead_letter = on_dead_letter
        self._batch_fn = sink_batch_fn(comp)
        self._pending: list[Item] = []

    def push(self, ctx: Context, items: list[Item], side: int = 0) -> None:
        encode = self.encode
        encoded = [(k, encode(v), t) for k, v, t in items]
        for _, v, _ in encoded:
            if type(v) is not bytes:  # refused here, where it dead-letters its record, not in finish
                raise UsageError(f"sink step {self.name!r}: its codec's encode returned {type(v).__name__}, "
                                 "not bytes; give the sink a codec whose encode returns bytes")
        self._pending += encoded


    def finish(self, ctx: Context) -> None:
        pending, self._pending = self._pending, []
        if not pending:
            return
        sc = self.step_ctx
        if self._batch_fn is not None and len(pending) > 1 and self._in_one_call(ctx, pending):
            return
        sc.ctx = attempt = _Attempt(ctx)  # type: ignore[assignment]
        fn = self._one
        rebind = ctx.rebind  # type: ignore[attr-defined]
        for k, v, t in pending:
            rebind(k, t)
            sc.key = k
            sc.timestamp = t
            error: BaseException | None = None
            for _ in range(self.attempts):
                try:
                    fn(sc, Record(k, v, t, b""))
                except BaseException as e:  # user code: anything may happen, sys.exit() included
                    error = e
                    attempt.undo()
                    continue
                attempt.keep()
                error = None
                break
            if error is not None:
                self._dead_letter(ctx, k, v, t, error)

    def _in_one_call(self, ctx: Context, pending: list[Item]) -> bool:
        """The call's records in one ``process_batch`` (``ctx.key`` is ``b""`` and the
        timestamp the lowest: the batch has many keys). False if it raised: what it did is
        taken back, and the records go one by one."""
        assert self._batch_fn is not None
        sc = self.step_ctx
        sc.ctx = attempt = _Attempt(ctx)  # type: ignore[assignment]
        low = min(t for _, _, t in pending)
        ctx.rebind(b"", low)  # type: ignore[attr-defined]
        sc.key = b""
        sc.timestamp = low
        try:
            self._batch_fn(sc, [Record(k, v, t, b"") for k, v, t in pending])
        except BaseException as e:  # user code: anything may happen, sys.exit() included
            attempt.undo()
            log.info("sink step %r: a batch of %d records failed in one call (%s: %s); running them one by one",
                     self.name, len(pending), type(e).__name__, e)
            return False
        attempt.keep()
        return True

    def _dead_letter(self, ctx: Context, key: bytes, value: bytes, t: int, error: BaseException) -> None:
        # Straight onto the batch's productions, as the worker writes its own dead letters
        # (worker/batch.py): produce() could refuse it (a value near the size limit).
        ctx.out.append((self.dead_letters, key, dead_letter(error, self.name, value), t))  # type: ignore[attr-defined]
        if self.on_dead_letter is not None:
            self.on_dead_letter(key, error, self.attempts)

    def abort(self) -> None:
        self._pending = []
