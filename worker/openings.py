"""Tablets that failed to open on a worker (worker/core.py): the last error, for status and
the leader; and when to try again.

A failed opening is tried again at the next two reconciles (every 200 ms, and at every
routing change: the previous owner typically still holds the storage for a moment), then after 0.2 s, 0.4 s, ... up to
:data:`OPEN_RETRY_MAX_S`, counted from the start again under a new token (a move, a
failover). Each try reopens the tablet's storage and runs its code's ``setup``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from runtime.errors import ConfigError, TopologyError
from runtime.wire import millstream_pb2 as pb

log = logging.getLogger(__name__)

OPEN_RETRY_MAX_S = 2.0


@dataclass
class _Failure:
    error: str          # the last one, on one line
    attempts: int       # failures in a row, whatever the token
    since: float        # time.monotonic() of the first
    lasting: bool       # a reason a retry cannot fix: code that does not load, an option that does not parse
    token: int          # of the last try
    tries: int          # failures in a row under that token
    retry_ms: float     # not tried again before this (the worker's clock)


class OpenFailures:
    def __init__(self, now_ms: Callable[[], float]) -> None:
        self.now_ms = now_ms
        self._failures: dict[tuple[str, int], _Failure] = {}

    def failed(self, key: tuple[str, int], token: int, error: BaseException) -> None:
        text = " ".join(str(error).split()) or type(error).__name__
        old = self._failures.get(key)
        attempts = old.attempts + 1 if old else 1
        tries = old.tries + 1 if old and old.token == token else 1
        wait_s = 0.0 if tries < 3 else min(OPEN_RETRY_MAX_S, 0.1 * 2 ** (tries - 2))
        self._failures[key] = _Failure(text, attempts, old.since if old else time.monotonic(),
                                       isinstance(error, (TopologyError, ConfigError)), token, tries,
                                       self.now_ms() + wait_s * 1000)
        # A failure that lasts (code that does not load, a full disk) is logged at 1, 10, 100,
        # ... attempts and reported to the leader for status.
        level = logging.WARNING if str(attempts).rstrip("0") == "1" else logging.DEBUG
        log.log(level, "tablet %s/%d cannot open (attempt %d): %s", key[0], key[1], attempts, text)

    def opened(self, key: tuple[str, int]) -> None:
        self._failures.pop(key, None)

    def keep(self, wanted: Iterable[tuple[str, int]]) -> None:
        """Forget the tablets no longer assigned here."""
        keep = set(wanted)
        for key in [k for k in self._failures if k not in keep]:
            del self._failures[key]

    def may_try(self, key: tuple[str, int], token: int) -> bool:
        f = self._failures.get(key)
        return f is None or f.token != token or self.now_ms() >= f.retry_ms

    def errors(self) -> dict[str, str]:
        """By ``computation/range``: the last error."""
        return {f"{c}/{r}": f.error for (c, r), f in self._failures.items()}

    def problem(self, key: tuple[str, int], now: float) -> pb.TabletProblem | None:
        """What status shows of ``key``'s failures (``now``: time.monotonic()). A first retry is
        routine (a lock); code or options that do not load are not going to load: those are
        reported from the first failure."""
        f = self._failures.get(key)
        if f is None or (f.attempts < 3 and not f.lasting):
            return None
        return pb.TabletProblem(computation=key[0], key_range=key[1], error=f.error, attempts=f.attempts,
                                seconds=now - f.since)
