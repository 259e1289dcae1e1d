"""A fault hook tests switch on and off while a cluster runs (never used in production).

A worker started with ``MILLSTREAM_FAULTS=PATH`` reads PATH (when it changes, at most
every 50 ms) for one fault per line:

    block ADDRESS       replication from this worker to ADDRESS fails, as if the network
                        between them were cut
    ignore-lease        a batch commits even when the lease has lapsed (plays a zombie
                        whose batch in flight missed its self-fencing, to show that its
                        followers refuse it); closing and opening tablets still follow
                        the real lease
    delay-injector MS   a delivery from an injector waits MS milliseconds (without CPU)
                        before the worker takes it: the round trip of a network between
                        the injector's host and the cluster (bench/overhead.py inflight)
    busy PERCENT        that share of deliveries (from injectors and from other tablets)
                        is answered BUSY at once, as by a full tablet: backpressure and
                        retries without a slow computation (tests/e2e/test_key_order.py)

Without the variable nothing is read and every check is false.
"""

from __future__ import annotations

import os
import random
import time


class Faults:
    def __init__(self, path: str | None) -> None:
        self.path = path
        self._lines: frozenset[str] = frozenset()
        self._mtime = 0.0
        self._checked = 0.0

    @classmethod
    def from_env(cls) -> Faults:
        return cls(os.environ.get("MILLSTREAM_FAULTS") or None)

    def _current(self) -> frozenset[str]:
        if self.path is None:
            return self._lines
        now = time.monotonic()
        if now - self._checked >= 0.05:
            self._checked = now
            try:
                mtime = os.stat(self.path).st_mtime
            except OSError:
                self._lines, self._mtime = frozenset(), 0.0
            else:
                if mtime != self._mtime:
                    self._mtime = mtime
                    with open(self.path) as f:
                        self._lines = frozenset(" ".join(line.split()) for line in f if line.strip())
        return self._lines

    def blocked(self, address: str) -> bool:
        return f"block {address}" in self._current()

    def ignore_lease(self) -> bool:
        return "ignore-lease" in self._current()

    def injector_delay_s(self) -> float:
        for line in self._current():
            if line.startswith("delay-injector "):
                return float(line.split()[1]) / 1000
        return 0.0

    def busy(self) -> bool:
        """Whether to answer this delivery BUSY (``busy PERCENT``)."""
        for line in self._current():
            if line.startswith("busy "):
                return random.random() * 100 < float(line.split()[1])
        return False
