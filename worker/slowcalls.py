"""What a tablet's user code is doing now, and its slowest recent calls.

A call of user code that runs long delays its key range, never the worker (see
worker/runner.py); this makes it visible. The tablet's thread brackets every call with
:meth:`CallWatch.begin` / :meth:`CallWatch.end`; the event loop reads :meth:`snapshot`
for the progress report (status and the web page show it) and calls :meth:`check`, which
warns, naming computation, key range and key, once a call has run past ``warn_after``
seconds, and again each time its running time doubles.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from runtime.status import show_key

log = logging.getLogger(__name__)

SlowCall = tuple[bytes, float, bool]  # (key, seconds, still running)


class CallWatch:
    """Times user-code calls of one tablet (thread-safe: one writer thread, loop readers)."""

    def __init__(self, tablet: str, *, warn_after: float = 1.0, window: float = 60.0, keep: int = 5,
                 record_above: float = 0.005, clock: Callable[[], float] = time.monotonic,
                 on_slow: Callable[[float], None] = lambda seconds: None) -> None:
        self.tablet = tablet
        self.warn_after = warn_after
        self.window = window
        self.keep = keep
        self.record_above = record_above
        self.clock = clock
        self.on_slow = on_slow
        # (key, started) of the call running now: set and cleared by the tablet's thread
        # around each call (begin/end, or inline on the record path, worker/batch.py).
        self.running_call: tuple[bytes, float] | None = None
        self._next_warning = warn_after
        self._recent: list[tuple[float, bytes, float]] = []  # (seconds, key, ended at)
        self._lock = threading.Lock()

    def begin(self, key: bytes) -> None:
        self.running_call = (key, self.clock())

    def end(self) -> float:
        """The call returned (or raised); returns how long it ran."""
        running = self.running_call
        if running is None:
            return 0.0
        return self.ended(self.clock())

    def ended(self, now: float) -> float:
        """The running call ended at ``now``; returns how long it ran."""
        running = self.running_call
        self.running_call = None
        if running is None:
            return 0.0
        seconds = now - running[1]
        if seconds >= self.record_above:
            self.slow(running[0], seconds, now)
        return seconds

    def slow(self, key: bytes, seconds: float, now: float) -> None:
        """A call for ``key`` that ended at ``now`` took ``seconds``, at least ``record_above``."""
        with self._lock:
            self._next_warning = self.warn_after
            self._recent.append((seconds, key, now))
            self._recent = sorted((c for c in self._recent if now - c[2] <= self.window),
                                  reverse=True)[:self.keep]
        if seconds >= self.warn_after:
            self.on_slow(seconds)
            log.warning("tablet %s: user code for key %r took %.1f s", self.tablet, show_key(key), seconds)

    def running(self) -> tuple[bytes, float] | None:
        """The key whose call is running now, and for how long (None when idle)."""
        running = self.running_call
        if running is None:
            return None
        return running[0], self.clock() - running[1]

    def check(self) -> None:
        """Warn about a call running past ``warn_after`` (then at 2x, 4x, ... that time)."""
        now = self.running()
        if now is None or now[1] < self._next_warning:
            return
        with self._lock:
            if now[1] < self._next_warning:
                return
            self._next_warning = max(self._next_warning * 2, now[1])
        log.warning("tablet %s: user code for key %r has been running for %.1f s; its key range "
                    "waits (other tablets go on). If it never returns, see docs/operations.md",
                    self.tablet, show_key(now[0]), now[1])

    def snapshot(self) -> list[SlowCall]:
        """The running call (if it has run long enough to matter) and the slowest recent ones."""
        out: list[SlowCall] = []
        now = self.running()
        if now is not None and now[1] >= self.record_above:
            out.append((now[0], now[1], True))
        t = self.clock()
        with self._lock:
            out += [(key, seconds, False) for seconds, key, ended in self._recent if t - ended <= self.window]
        return out
