"""What the console plots: a bounded history, per computation, of throughput, watermark lag, low
watermark and backlog over the last minutes.

Sampled from the status document (the one `/status.json` serves) by a task of the web server
(:func:`sample`, started in master/web.py), so the master's core knows nothing of it. Only a
leader answers with a document: a follower keeps no history, and a new leader starts its own.
Bounded: ``keep_s / every_s`` samples per computation, at most ``max_computations`` of them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from runtime.record import END_OF_TIME, MIN_TIME

log = logging.getLogger(__name__)

MIN = MIN_TIME
StatusFn = Callable[[], Awaitable[dict[str, Any] | None]]


@dataclass
class _Series:
    """One computation's samples, oldest first; every deque has the same length."""

    size: int
    t_ms: deque[int] = field(init=False)
    processed: deque[int] = field(init=False)
    rate: deque[float | None] = field(init=False)
    lag_ms: deque[int | None] = field(init=False)
    watermark_ms: deque[float | None] = field(init=False)
    backlog: deque[int] = field(init=False)

    def __post_init__(self) -> None:
        for name in ("t_ms", "processed", "rate", "lag_ms", "watermark_ms", "backlog"):
            setattr(self, name, deque(maxlen=self.size))


class History:
    """Samples of the status document, ``every_s`` apart, kept for ``keep_s``."""

    def __init__(self, every_s: float = 2.0, keep_s: float = 900.0, max_computations: int = 200) -> None:
        if every_s <= 0 or keep_s < every_s:
            raise ValueError(f"history every {every_s} s for {keep_s} s: need 0 < every_s <= keep_s")
        self.every_s = every_s
        self.keep_s = keep_s
        self.max_computations = max_computations
        self._series: dict[str, _Series] = {}

    def add(self, at_s: float, doc: dict[str, Any]) -> None:
        """One sample of every computation in ``doc`` (a status document) taken at ``at_s``
        (seconds since the epoch). Records per second come from the change of ``processed``
        since the previous sample; none when the count went back (a new leader counts anew)."""
        t_ms = round(at_s * 1000)
        for name, c in doc.get("computations", {}).items():
            s = self._series.get(name)
            if s is None:
                s = self._series[name] = _Series(int(self.keep_s / self.every_s) + 1)
            processed = int(c.get("processed", 0))
            rate = None
            if s.t_ms and t_ms > s.t_ms[-1] and processed >= s.processed[-1]:
                rate = (processed - s.processed[-1]) * 1000 / (t_ms - s.t_ms[-1])
            wm = c.get("low_watermark", MIN)
            s.t_ms.append(t_ms)
            s.processed.append(processed)
            s.rate.append(None if rate is None else round(rate, 1))
            s.lag_ms.append(c.get("lag_ms"))
            s.watermark_ms.append(None if wm in (MIN, END_OF_TIME) else wm / 1000)
            s.backlog.append(int(c.get("backlog", 0)))
        self._forget(t_ms)

    def _forget(self, now_ms: int) -> None:
        """Drop computations not seen for ``keep_s`` (their job went), then the least recently
        seen ones beyond ``max_computations``."""
        for name in [n for n, s in self._series.items() if now_ms - s.t_ms[-1] > self.keep_s * 1000]:
            del self._series[name]
        if len(self._series) > self.max_computations:
            by_age = sorted(self._series, key=lambda n: self._series[n].t_ms[-1])
            for name in by_age[:len(self._series) - self.max_computations]:
                del self._series[name]

    def document(self) -> dict[str, Any]:
        """What ``/history.json`` serves: per computation, parallel lists of sample times (ms
        since the epoch), records/s, lag (ms), low watermark (ms since the epoch; null at the
        start or end of time) and backlog."""
        return {"every_s": self.every_s, "keep_s": self.keep_s, "computations": {
            name: {"t": list(s.t_ms), "rate": list(s.rate), "lag_ms": list(s.lag_ms),
                   "watermark": list(s.watermark_ms), "backlog": list(s.backlog)}
            for name, s in sorted(self._series.items())}}


async def sample(status: StatusFn, history: History, clock: Callable[[], float] = time.time) -> None:
    """Add a sample of ``status()`` to ``history`` every ``history.every_s`` until cancelled.
    A status that fails is logged and skipped: the console must never take the master down."""
    while True:
        try:
            doc = await status()
            if doc is not None:
                history.add(clock(), doc)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the status of a core in the middle of a change: next time
            log.debug("console history: no sample (%s)", e)
        await asyncio.sleep(history.every_s)
