"""What the leader's commands need of it (master/core.py is the one that has it): its image,
its lock, the one way to change a durable fact, placement and the clock. Modules that the
core itself calls (the watermark tick, worker membership) depend on this, not on the core,
so the imports point one way."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Protocol

from master.change import Change
from master.config import MasterConfig
from master.image import ClusterImage
from master.scheduler import TabletKey


class Leader(Protocol):
    image: ClusterImage
    config: MasterConfig
    now_ms: Callable[[], float]

    @property
    def lock(self) -> asyncio.Lock: ...

    async def commit(self, change: Change) -> None: ...

    async def rebalance(self, reason: str, more: Iterable[TabletKey] = ()) -> None: ...
