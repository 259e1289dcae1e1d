"""An injector's threads and its delivery loop do not survive ``fork()``: a child's copies of
the injectors its parent made are told (``_forked``), and refuse to send with an error that
says so, instead of queueing records no thread will ever send."""

from __future__ import annotations

import os
import weakref
from typing import Protocol


class _Forkable(Protocol):
    def _forked(self) -> None: ...


_LIVE: weakref.WeakSet[_Forkable] = weakref.WeakSet()  # this process's injectors


def watch(injector: _Forkable) -> None:
    """Tell ``injector`` when this process forks, in the child."""
    _LIVE.add(injector)


def _after_fork() -> None:
    for injector in list(_LIVE):
        injector._forked()


os.register_at_fork(after_in_child=_after_fork)
