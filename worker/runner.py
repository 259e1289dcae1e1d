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
from collections.abc import Callable
from typing import Any, TypeVar

from runtime.errors import UserCodeError

log = logging.getLogger(__name__)
T = TypeVar("T")

_STOP = object()


def _settle(fut: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if fut.done():
        return  # its waiter was cancelled: nobody wants the outcome
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


class TabletThread:
    """Runs the calls given to :meth:`run` one at a time, in order, on one daemon thread."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, name=f"tablet {name}", daemon=True)
        self._thread.start()

    def run(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Schedule ``fn(*args)`` on the thread; the future resolves on the calling loop."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self._calls.put((loop, fut, fn, args))
        return fut

    def stop(self) -> None:
        """Let the thread end once the calls already given have run."""
        self._calls.put(_STOP)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _main(self) -> None:
        while True:
            item = self._calls.get()
            if item is _STOP:
                return
            loop, fut, fn, args = item
            result: Any = None
            error: BaseException | None = None
            try:
                result = fn(*args)
            except Exception as e:  # handed to the awaiting coroutine, never lost here
                error = e
            except BaseException as e:
                # sys.exit() in user code (setup, a sink's hook): an error of that call, not
                # of the worker. Raised as is on the event loop, it would end the process.
                error = UserCodeError(f"user code raised {type(e).__name__}: {e}")
            try:
                loop.call_soon_threadsafe(_settle, fut, result, error)
            except RuntimeError:  # the loop is closed: the worker is exiting
                log.debug("tablet %s: a call finished after its event loop closed", self.name)
                return
