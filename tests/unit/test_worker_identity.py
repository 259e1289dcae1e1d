"""A worker's state directory: one process at a time, locks that hold, and the secret of its
id (worker/statedir.py, master/membership.py)."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from master import membership
from runtime.errors import ConfigError, WorkerIdentityError
from runtime.wire import millstream_pb2 as pb
from tests.masterkit import MemoryStore, leader
from worker import statedir
from worker.seen import SeenTablets
from worker.session import MasterSession
from worker.statedir import claim_state_dir, keep_secret, locks_work, read_secret
from worker.storage import TabletStore


def test_a_state_directory_serves_one_worker_at_a_time(tmp_path: Path) -> None:
    wid, lock = claim_state_dir(str(tmp_path))
    try:
        assert len(wid) == 12
        with pytest.raises(ConfigError, match="in use by another worker"):
            claim_state_dir(str(tmp_path))
        assert locks_work(lock.name)  # another process is refused the lock we hold
    finally:
        lock.close()
    again, lock = claim_state_dir(str(tmp_path))
    lock.close()
    assert again == wid  # the same identity on the same disk


def test_the_probe_sees_a_lock_nobody_holds(tmp_path: Path) -> None:
    path = tmp_path / "free"
    path.write_text("")
    assert not locks_work(str(path))  # the probe got the lock: as on a filesystem ignoring locks


def test_a_filesystem_whose_locks_do_not_hold_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(statedir, "locks_work", lambda path: False)
    with pytest.raises(ConfigError, match="file locks do not hold"):
        claim_state_dir(str(tmp_path))


def test_the_issued_secret_is_kept_for_this_user_only(tmp_path: Path) -> None:
    assert read_secret(str(tmp_path)) == ""
    keep_secret(str(tmp_path), "s3cret")
    assert read_secret(str(tmp_path)) == "s3cret"
    assert os.stat(tmp_path / "worker.secret").st_mode & 0o777 == 0o600


def test_claiming_a_state_directory_sweeps_what_a_crashed_process_left_half_done(tmp_path: Path) -> None:
    """Review 3 N16: checkpoints (hard links pinning old SSTs), snapshots or restore loads
    being received, and split builds interrupted by a crash stayed on disk for ever."""
    TabletStore(str(tmp_path / "c" / "0"), 1, sync=False).close()
    leftovers = [tmp_path / ".checkpoints" / "c-0-5e55104a", tmp_path / ".checkpoints" / "savepoint-c-0-abc",
                 tmp_path / ".incoming" / "c-0-5e55104a", tmp_path / ".incoming" / "0f3a",
                 tmp_path / "c" / "3.building"]
    for d in leftovers:
        d.mkdir(parents=True)
        (d / "000009.sst").write_bytes(b"x")
    os.link(next((tmp_path / "c" / "0").glob("*.log")), tmp_path / ".checkpoints" / "c-0-5e55104a" / "1.log")
    wid, lock = claim_state_dir(str(tmp_path))
    lock.close()
    assert not any(d.exists() for d in leftovers)
    assert sorted(os.listdir(tmp_path / "c")) == ["0"]
    TabletStore(str(tmp_path / "c" / "0"), 2, sync=False, must_exist=True).close()  # the tablet is intact


def test_only_a_new_worker_id_starts_a_trusted_record_of_the_tablets_seen(tmp_path: Path) -> None:
    """Review 3 N19: a worker may make the empty copy of a tablet it never held only if it
    knows every tablet it ever held (worker/seen.py): a record started with its identity."""
    wid, lock = claim_state_dir(str(tmp_path / "new"))
    lock.close()
    assert SeenTablets(str(tmp_path / "new")).trusted
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "worker.id").write_text("0123456789ab\n")  # a worker from before the record
    wid, lock = claim_state_dir(str(tmp_path / "old"))
    lock.close()
    assert wid == "0123456789ab" and not SeenTablets(str(tmp_path / "old")).trusted


def test_a_registration_whose_answer_was_lost_is_repeated_with_the_secret_the_worker_made(tmp_path: Path) -> None:
    """CI, chaos seed 107: a new worker registered, the leader wrote its id and then was
    killed before answering. The worker had no secret, so it could never show the one issued
    it: every later registration was refused and it never joined. Now the worker makes its
    secret, keeps it, and only then registers with it; the leader adopts it."""
    wid, lock = claim_state_dir(str(tmp_path))
    lock.close()
    core = SimpleNamespace(secret="")

    async def main() -> None:
        MasterSession(core, None, wid, state_dir=str(tmp_path))  # type: ignore[arg-type]
        assert re.fullmatch(r"[0-9a-f]{32}", core.secret) and read_secret(str(tmp_path)) == core.secret
        store = MemoryStore()
        old = leader(store)
        await old.become_leader()
        assert await membership.register(old, "127.0.0.1:1", wid, secret=core.secret) == (wid, core.secret)
        new = leader(store)  # the old leader died before its answer reached the worker
        await new.become_leader()
        assert await membership.register(new, "127.0.0.1:1", wid, secret=core.secret) == (wid, core.secret)
        assert set(new.image.workers) == {wid}
        for other in ("", "0" * 32):  # the id is still this worker's alone
            with pytest.raises(WorkerIdentityError, match="was issued another secret"):
                await membership.register(new, "127.0.0.1:1", wid, secret=other)
        with pytest.raises(ConfigError, match="not 32 to 128 hex digits"):
            await membership.register(new, "127.0.0.1:2", "0123456789ab", secret="guess")
        # A worker that shows no secret (made before workers made their own) is issued one.
        _, issued = await membership.register(new, "127.0.0.1:3", "ba9876543210")
        assert re.fullmatch(r"[0-9a-f]{32}", issued)
        again = SimpleNamespace(secret="")
        MasterSession(again, None, wid, state_dir=str(tmp_path))  # type: ignore[arg-type]
        assert again.secret == core.secret  # back on its disk: the kept secret, not a new one

    asyncio.run(main())


def test_a_worker_whose_reports_the_leader_holds_newer_numbers_on_from_them() -> None:
    """Review of the stale-heartbeat guard: a worker restarted within its lease with a clock
    behind its earlier run's numbered its reports below the one the leader held; the leader
    took every one as stale (for hours: numbers rise by one a heartbeat, set from the clock
    once), and its tablets stayed held. It now numbers on from the leader's newest."""
    sent: list[int] = []

    class _Stub:
        async def Heartbeat(self, request: pb.HeartbeatRequest, timeout: float) -> pb.HeartbeatResponse:
            sent.append(request.report_seq)
            if len(sent) == 1:  # the leader holds report 1,000 of ours (from the earlier run)
                return pb.HeartbeatResponse(known=True, reported={"w": 1_000})
            return pb.HeartbeatResponse(known=False)  # ends the loop

    core = SimpleNamespace(report_seq=5, worker_id="w", secret="s", routing=SimpleNamespace(version=1),
                           limits=SimpleNamespace(progress_ms=1), now_ms=lambda: 0.0, problems=lambda: [],
                           renewed=lambda *a: None, release=lambda r: None, set_watermarks=lambda w, v: None,
                           lease_held=lambda: True)
    def next_report() -> tuple[int, list[object]]:  # (numbered as the worker's core does)
        seq = core.report_seq
        core.report_seq += 1
        return seq, []

    core.next_report = next_report
    masters = SimpleNamespace(stub=lambda: _Stub(), follow=lambda e: None)

    async def main() -> None:
        await MasterSession(core, masters, "w")._heartbeat()  # type: ignore[arg-type]

    asyncio.run(main())
    assert sent == [5, 1_001]
