"""CPU seconds of the benchmark's own process tree, and of everything else on the machine.

A figure is only worth quoting from a quiet machine. :class:`CpuMeter` samples ``/proc``
while a run lasts and reports the CPU time the benchmark's processes used (this process,
every descendant — etcd, masters, workers, a Spark or Flink JVM — and every process in a
session one of them started, so a JVM re-parented to init still counts) and the CPU time the
whole machine used; the difference is *foreign* CPU: other work that competed with the run.
Apart from both, *stolen* CPU: the time the hypervisor ran other guests while this machine's
CPUs wanted to run (``steal`` in ``/proc/stat``). This machine is a VM on a shared host; a
run with stolen seconds had less CPU than its wall time says, whatever its load average.
Processes are sampled every ``interval_s``; CPU a process spends after its last sample and
before it exits is missed (a slight under-count of ours, never an over-count). The meter's
own sampling (reading ``/proc`` ten times a second: ~8 % of the injector's process in a
Nexmark q0 run) is not the benchmark's work: its thread's CPU is taken out of this process's
and reported apart (``meter_cpu_s``).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class CpuFigures:
    wall_s: float
    ours_s: float      # CPU seconds of the benchmark's process tree
    machine_s: float   # CPU seconds of the whole machine (all cores)
    foreign_s: float   # machine - ours: other work during the run
    loadavg_start: tuple[float, float, float]
    loadavg_end: tuple[float, float, float]
    by_role: dict[str, float] = field(default_factory=dict)  # ours_s split: "bench" (this process), etcd, ...
    stolen_s: float = 0.0  # CPU the hypervisor gave other guests meanwhile (not in machine_s)
    meter_s: float = 0.0   # the meter's own sampling thread (taken out of ours_s)

    def as_dict(self) -> dict[str, object]:
        return {"wall_s": round(self.wall_s, 2), "cpu_s": round(self.ours_s, 2),
                "machine_cpu_s": round(self.machine_s, 2), "foreign_cpu_s": round(self.foreign_s, 2),
                "stolen_cpu_s": round(self.stolen_s, 2), "meter_cpu_s": round(self.meter_s, 2),
                "loadavg_start": [round(x, 2) for x in self.loadavg_start],
                "loadavg_end": [round(x, 2) for x in self.loadavg_end],
                "cpu_s_by_role": {k: round(v, 2) for k, v in sorted(self.by_role.items())}}


def _stat(pid: str) -> tuple[int, int, int] | None:
    """(ppid, session id, utime + stime in ticks) of one process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2:].split()
    return int(fields[1]), int(fields[3]), int(fields[11]) + int(fields[12])


def role(pid: int, root: int) -> str:
    """What a process of the tree is: ``bench`` (the meter's root: the benchmark itself, its
    injectors included), ``etcd``, ``master``, ``worker``, or ``other`` (a peer's JVM...)."""
    if pid == root:
        return "bench"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return "other"
    if os.path.basename(argv[0]) == b"etcd":
        return "etcd"
    if b"-m" in argv:  # runtime/cluster.py starts them as python -m cli master|worker ...
        i = argv.index(b"-m")
        if argv[i + 1:i + 2] == [b"cli"] and argv[i + 2:i + 3] in ([b"master"], [b"worker"]):
            return argv[i + 2].decode()
    return "other"


def _machine_ticks() -> tuple[int, int]:
    with open("/proc/stat") as f:
        return cpu_ticks(f.readline())


def cpu_ticks(line: str) -> tuple[int, int]:
    """(CPU ticks the machine ran anything, ticks the hypervisor stole from it) of the ``cpu``
    line of ``/proc/stat``: user nice system idle iowait irq softirq steal ..."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in line.split()[1:9])
    return user + nice + system + irq + softirq, steal


def _processes() -> dict[int, tuple[int, int, int]]:
    procs: dict[int, tuple[int, int, int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := _stat(name)) is not None:
            procs[int(name)] = st
    return procs


def session(leader: int) -> list[int]:
    """The live processes of the session ``leader`` started (it may have exited itself)."""
    return [pid for pid, (_, sid, _) in _processes().items() if sid == leader]


def tree_ticks(root: int, leaders: set[int] | None = None) -> dict[int, int]:
    """CPU ticks so far of ``root``, its descendants and the sessions they lead (or led:
    ``leaders`` remembers them across calls, so a session outlives its leader)."""
    procs = _processes()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    ours: set[int] = set()
    stack = [root]
    while stack:
        pid = stack.pop()
        if pid not in ours and pid in procs:
            ours.add(pid)
            stack += children.get(pid, [])
    own_session = procs.get(root, (0, -1, 0))[1]
    leaders = set() if leaders is None else leaders
    leaders |= {pid for pid in ours if procs[pid][1] == pid and pid != own_session}
    ours |= {pid for pid, (_, sid, _) in procs.items() if sid in leaders}
    return {pid: procs[pid][2] for pid in ours if pid in procs}


class CpuMeter:
    """``with CpuMeter() as m: ...`` then ``m.figures``."""

    def __init__(self, root: int | None = None, interval_s: float = 0.1) -> None:
        self.root = os.getpid() if root is None else root
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu meter", daemon=True)
        self._base: dict[int, int] = {}
        self._last: dict[int, int] = {}
        self._leaders: set[int] = set()
        self._roles: dict[int, str] = {}
        self._started = False
        self._meter_s = 0.0  # CPU of the sampling thread, which runs in this process
        self.figures: CpuFigures | None = None

    def _sample(self) -> None:
        for pid, ticks in tree_ticks(self.root, self._leaders).items():
            self._base.setdefault(pid, 0 if self._started else ticks)
            self._last[pid] = ticks
            if self._roles.get(pid, "other") == "other":  # a launcher may exec a daemon later
                self._roles[pid] = role(pid, self.root)

    def _run(self) -> None:
        started = time.thread_time()
        while not self._stop.wait(self.interval_s):
            self._sample()
        self._meter_s = time.thread_time() - started

    @property
    def started(self) -> bool:
        return self._started

    def __enter__(self) -> CpuMeter:
        self._sample()
        self._started = True
        self._t0, self._machine0, self._load0 = time.monotonic(), _machine_ticks(), os.getloadavg()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        by_role: dict[str, float] = {}
        for pid, t in self._last.items():
            r = self._roles.get(pid, "other")
            by_role[r] = by_role.get(r, 0.0) + (t - self._base[pid]) / TICK
        # The sampling thread's CPU is in this process's ticks: it is the meter's, not ours.
        meter = self._meter_s if self.root == os.getpid() and self.root in self._roles else 0.0
        if meter:
            root_role = self._roles[self.root]
            by_role[root_role] = max(0.0, by_role.get(root_role, 0.0) - meter)
        ours = sum(by_role.values())
        busy, steal = _machine_ticks()
        machine, stolen = (busy - self._machine0[0]) / TICK, (steal - self._machine0[1]) / TICK
        self.figures = CpuFigures(time.monotonic() - self._t0, ours, machine, max(0.0, machine - ours - meter),
                                  self._load0, os.getloadavg(), by_role, stolen, meter)
