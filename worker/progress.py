"""What a tablet reports of its progress, tracked cheaply: its oldest pending timestamp (for
the low watermark) and where its load divides evenly (for splits, docs/rescaling.md)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence

from runtime.keyspace import key_hash


class KeySample:
    """The hashes of every ``every``-th key a tablet received, the last ``keep`` of them: their
    median is where a split would give each half about as many records."""

    MIN_SAMPLES = 32

    def __init__(self, every: int = 16, keep: int = 512, refresh_s: float = 1.0) -> None:
        self.every = every
        self._hashes: deque[int] = deque(maxlen=keep)
        self._seen = 0
        self._refresh_s = refresh_s
        self._median = 0
        self._computed_at = -1e18

    def add(self, keys: Sequence[bytes]) -> None:
        start = -self._seen % self.every
        self._hashes.extend(map(key_hash, keys[start::self.every]))
        self._seen += len(keys)

    def median(self) -> int:
        """The median sampled hash (0 while there are too few samples); recomputed at most
        once per ``refresh_s``."""
        now = time.monotonic()
        if now - self._computed_at >= self._refresh_s:
            self._computed_at = now
            if len(self._hashes) >= self.MIN_SAMPLES:
                ordered = sorted(self._hashes)
                self._median = ordered[len(ordered) // 2]
        return self._median


