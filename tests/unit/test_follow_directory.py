"""``follow_directory`` (injectors/follow.py), the run around the follower, without a
network: one follower per directory on a host, and a stopped run retiring its injector (its
promise kept, the stream never finished), waiting out a master that is away."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

import pytest

from injectors import follow as follow_module
from injectors.follow import _retire, follow_directory
from runtime.errors import InjectionError, MasterUnavailableError
from tests.unit.test_file_follow import put, script
from tests.unit.test_file_injector import Recorder


def test_a_second_follower_of_a_directory_on_this_host_is_refused(tmp_path: Any) -> None:
    d = str(tmp_path)
    held = os.open(d, os.O_RDONLY)
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(InjectionError, match="another follower on this host follows"):
            follow_directory(d, "127.0.0.1:1", "s", stop=threading.Event())
    finally:
        os.close(held)


class ScriptedStop(threading.Event):
    """``follow_directory``'s stop event, each wait running the next step of a script
    (:func:`script`) and set after the last."""

    def __init__(self, *steps: Callable[[], object]) -> None:
        super().__init__()
        self._script = script(*steps)

    def wait(self, timeout: float | None = None) -> bool:
        if self._script(timeout or 0.0):
            self.set()
        return self.is_set()


def test_a_stopped_follower_retires_its_injector_and_an_unlockable_directory_is_warned_about(
        tmp_path: Any, caplog: Any, monkeypatch: Any) -> None:
    d = str(tmp_path)
    put(d, "a.log", ["a1"])
    made: list[Any] = []

    class Injector(Recorder):
        def __init__(self, masters: str, stream: str, name: str, **kw: Any) -> None:
            super().__init__()
            self.made = (masters, stream, name, kw)
            made.append(self)

        def retire(self) -> None:
            self.events.append(("retire", None))

        def close(self) -> None:
            self.events.append(("close", None))

        class client:  # noqa: N801 (no master: the warning about a finished stream says nothing)
            @staticmethod
            def routing() -> Any:
                raise MasterUnavailableError("no master in this test")

    def no_lock(fd: int, op: int) -> None:  # (NFS: a directory cannot be locked)
        raise OSError(errno.ENOLCK, "No locks available")
    monkeypatch.setattr(follow_module, "Injector", Injector)
    monkeypatch.setattr(fcntl, "flock", no_lock)
    with caplog.at_level(logging.WARNING):
        assert follow_directory(d, "127.0.0.1:1", "lines", stop=ScriptedStop(lambda: None), poll_s=0.01) == 1
    [inj] = made
    assert inj.made[:3] == ("127.0.0.1:1", "lines", "files:" + os.path.abspath(d))
    assert inj.made[3]["incarnation"] == follow_module.IDENTITY  # (the same in every run)
    assert [k for k, _ in inj.events if k != "watermark"] == ["send", "flush", "retire", "close"]
    assert max(v for k, v in inj.events if k == "watermark") < 2**62  # (scan times: never finished)
    assert any("cannot lock" in m and "would not be refused" in m for m in caplog.messages)


def test_retiring_waits_out_a_master_away_a_few_times_then_raises() -> None:
    class Away:
        def __init__(self, failures: int) -> None:
            self.failures, self.calls = failures, 0

        def retire(self) -> None:
            self.calls += 1
            if self.calls <= self.failures:
                raise MasterUnavailableError("no master answered")
    pauses: list[float] = []
    inj = Away(2)
    _retire(inj, pause=pauses.append)  # type: ignore[arg-type]
    assert inj.calls == 3 and pauses == [1.0, 1.0]
    inj, pauses[:] = Away(3), []
    with pytest.raises(MasterUnavailableError):
        _retire(inj, pause=pauses.append)  # type: ignore[arg-type]
    assert inj.calls == 3 and pauses == [1.0, 1.0]
