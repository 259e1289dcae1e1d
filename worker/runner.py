"""Where a tablet's user code and commits run: its own thread, off the event loop.

The worker's event loop serves gRPC (deliveries, answering BUSY when a queue is full),
heartbeats, lease renewal and routing. None of that may wait behind user code or a
RocksDB commit (docs/architecture.md, "Liveness"), so each tablet hands its batches to
a :class:`TabletThread`. One thread per tablet keeps processing serialised per key range
(and so per key) and lets a record that sleeps, calls out or never returns hold up only
its own key range. The threads are daemons: a worker that must exit is never held by
user code that does not return.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from runtime.errors import UserCodeError

log = logging.getLogger(__name__)
T = TypeVar("T")

_STOP = object()

# How long the event loop may wait for a call before going back to its other work (see
# TabletThread.run): never longer than this per call, and not at all for a tablet whose
# calls take longer (slow user code never holds the loop).
HANDOFF_WAIT_MAX_S = 0.025


class _Call:
    """One call handed to a tablet's thread, and how its outcome gets back."""

    __slots__ = ("fn", "args", "lock", "done", "finished", "result", "error", "fut", "loop")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn = fn
        self.args = args
        self.lock = threading.Lock()
        self.done = threading.Event()  # the loop need wait no longer: finished, or released it
        self.finished = False
        self.result: Any = None
        self.error: BaseException | None = None
        self.fut: asyncio.Future[Any] | None = None   # set if the loop stopped waiting
        self.loop: asyncio.AbstractEventLoop | None = None


def _settle(fut: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if fut.done():
        return  # its waiter was cancelled: nobody wants the outcome
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


def _claim(call: _Call, fut: asyncio.Future[Any], loop: asyncio.AbstractEventLoop) -> None:
    """Settle ``fut`` with the call's outcome if it has one, else leave that to its thread."""
    with call.lock:
        if not call.finished:
            call.fut, call.loop = fut, loop  # the thread settles it when the call returns
            return
    _settle(fut, call.result, call.error)


class _Waits:
    """The short calls one turn of an event loop handed to tablet threads, waited for
    together at the start of the next turn, each at most for its own bound."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.calls: list[tuple[_Call, float, asyncio.Future[Any]]] = []

    def add(self, call: _Call, bound_s: float, fut: asyncio.Future[Any]) -> None:
        if not self.calls:
            self.loop.call_soon(self._wait)
        self.calls.append((call, bound_s, fut))

    def _wait(self) -> None:
        calls, self.calls = self.calls, []
        started = time.monotonic()
        for call, bound_s, fut in calls:
            left = started + bound_s - time.monotonic()
            if left > 0:
                call.done.wait(left)
            _claim(call, fut, self.loop)


_LOCAL = threading.local()  # a loop runs on one thread: its waits live there


def _waits(loop: asyncio.AbstractEventLoop) -> _Waits:
    w: _Waits | None = getattr(_LOCAL, "waits", None)
    if w is None or w.loop is not loop:
        w = _LOCAL.waits = _Waits(loop)
    return w


class TabletThread:
    """Runs the calls given to :meth:`run` one at a time, in order, on one daemon thread."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.typical_s = 0.0  # moving average of the CPU time of this thread's calls
        self._current: _Call | None = None
        self._given = self._finished = 0  # calls given (by the loop) and finished (by the thread)
        self._thread = threading.Thread(target=self._main, name=f"tablet {name}", daemon=True)
        self._thread.start()

    def run(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Schedule ``fn(*args)`` on the thread; the future resolves on the calling loop.

        If this tablet's calls typically use little CPU, the loop waits for the call, with
        the GIL released, for about twice their typical CPU time (at most
        :data:`HANDOFF_WAIT_MAX_S`): the thread takes the GIL at once instead of after the
        interpreter's switch interval, and the outcome needs no second handoff back to a
        busy loop. The wait is not taken here but once the loop has run everything else
        that was ready in this turn (:class:`_Waits`), so the calls of several tablets
        handed over in one turn (one delivery's batches, a commit's local productions) run
        side by side and are waited for together: their fsyncs overlap. A tablet whose
        calls run longer gets no wait at all, and any call that outlasts the wait resolves
        through ``call_soon_threadsafe``: user code never holds the loop for longer than
        that bound.
        """
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        call = _Call(fn, args)
        self._given += 1
        self._calls.put(call)
        typical = self.typical_s
        if typical < HANDOFF_WAIT_MAX_S:
            _waits(loop).add(call, min(HANDOFF_WAIT_MAX_S, 2 * typical + 0.001), fut)
        else:
            _claim(call, fut, loop)
        return fut

    def release_loop(self) -> None:
        """From the call running on this thread: the loop is not to wait for it (see
        :meth:`run`) but to go on at once, its outcome coming through
        ``call_soon_threadsafe``. A commit of a replicated tablet calls this right before
        its write: the loop then sends the commit to the followers meanwhile."""
        call = self._current
        if call is not None:
            call.done.set()

    def stop(self) -> None:
        """Let the thread end once the calls already given have run."""
        self._calls.put(_STOP)

    @property
    def idle(self) -> bool:
        """Whether every call given to it has finished (one whose caller was cancelled may not)."""
        return self._finished == self._given

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _main(self) -> None:
        while True:
            call = self._calls.get()
            if call is _STOP:
                return
            started = time.thread_time()
            self._current = call
            try:
                call.result = call.fn(*call.args)
            except Exception as e:  # handed to the awaiting coroutine, never lost here
                call.error = e
            except BaseException as e:
                # sys.exit() in user code (setup, a sink's hook): an error of that call, not
                # of the worker. Raised as is on the event loop, it would end the process.
                call.error = UserCodeError(f"user code raised {type(e).__name__}: {e}")
            # CPU time, not wall time: waiting out an fsync would only hold the loop.
            self.typical_s = 0.8 * self.typical_s + 0.2 * (time.thread_time() - started)
            self._current = None
            self._finished += 1
            with call.lock:
                call.finished = True
                fut, loop = call.fut, call.loop
            call.done.set()
            if fut is None or loop is None:
                continue  # the loop was still waiting: it takes the outcome itself
            try:
                loop.call_soon_threadsafe(_settle, fut, call.result, call.error)
            except RuntimeError:  # the loop is closed: the worker is exiting
                log.debug("tablet %s: a call finished after its event loop closed", self.name)
                return
