"""A delivery shell's one wake-up on its event loop (the worker's sender, worker/sender.py; an
injector's, injectors/tablets.py), at the time its delivery core (runtime/courier.py) asks for."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Alarm:
    """One wake-up on the running loop, at the time a delivery core (runtime/courier.py) asks
    for (its ``wake_at``): re-arming at the same time keeps it, a new time replaces it, None
    clears it. The worker's sender and the injector's shell each hold one."""

    def __init__(self, ring: Callable[[], None]) -> None:
        self._ring = ring
        self._handle: asyncio.TimerHandle | None = None
        self._at: float | None = None

    def arm(self, at: float | None) -> None:
        if at == self._at:
            return
        self.cancel()
        self._at = at
        if at is not None:
            self._handle = asyncio.get_running_loop().call_at(at, self._rang)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = self._at = None

    def _rang(self) -> None:
        self._handle = self._at = None
        self._ring()
