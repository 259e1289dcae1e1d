"""An injector's watermark: its promise, the holds of committed deliveries, its reports.

The injector promises to send nothing older than its watermark (``advance_watermark``).
What it reports to the leader is never later than its oldest record not yet committed,
nor than the oldest record of a committed delivery whose receiver's progress report the
leader does not hold yet (the delivery's *receipt*): until then the leader's view of that
tablet may not reflect the records, and the stream's watermark must not pass them.

Reports go to the leader from the caller's thread when the caller asks (registration,
``advance_watermark``, ``finish``) and otherwise from one background thread per injector
(the *confirmer*): woken after every committed round (a round never waits for a master
round trip, nor for a report in flight), and every 20 ms while receipts are held, asking
the leader which of them it holds now.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from runtime.client import Client
from runtime.errors import MillstreamError
from runtime.wire import millstream_pb2 as pb

log = logging.getLogger(__name__)

MIN = -(1 << 63)
CONFIRM_EVERY_S = 0.02  # how often the confirmer asks while receipts are held
Receipt = tuple[str, int]  # (worker id, its report sequence) that reflects a commit


class Watermark:
    """The watermark side of one :class:`~injectors.injector.Injector`."""

    def __init__(self, name: str, stream: str, incarnation: str, client: Client,
                 queued_min: Callable[[], int], closed: threading.Event,
                 confirm_timeout: float = 5.0) -> None:
        self.name = name
        self.stream = stream
        self.incarnation = incarnation
        self.client = client
        self._queued_min = queued_min  # oldest timestamp queued or in flight (MAX: none)
        self._closed = closed
        self.confirm_timeout = confirm_timeout
        self.promised = MIN
        self.reported: int | None = None
        self._held: list[tuple[int, Receipt]] = []  # (oldest timestamp, receipt) of committed deliveries
        self._held_lock = threading.Lock()
        self._lock = threading.Lock()  # one report at a time
        self._due = threading.Event()  # wakes the confirmer
        self._confirmer: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def promise(self, timestamp: int) -> None:
        self.promised = max(self.promised, timestamp)

    def hold(self, oldest: int, receipt: Receipt) -> None:
        """A delivery was committed: its timestamps hold the watermark until the leader holds
        the receiver's report named by ``receipt``. (Under its own lock, never behind a report
        in flight: a round calls this before it finishes.)"""
        with self._held_lock:
            self._held.append((oldest, receipt))

    @property
    def effective(self) -> int:
        """min(the promise, the oldest record not committed, the oldest record whose
        receiving tablet's progress report the leader does not hold yet)."""
        with self._held_lock:
            held = min((ts for ts, _ in self._held), default=self.promised)
        return min(self.promised, self._queued_min(), held)

    def report(self, wait: bool = False) -> None:
        """Report the effective watermark if it rose (a lower one could only come from records
        below our own promise: those are late whatever we say). With ``wait``, until no
        committed record holds it back (bounded by ``confirm_timeout``). Raises what the
        master call raised."""
        with self._lock:
            self._report_locked(wait)
        if self._held:
            # Receipts not confirmed yet: asked for in the background until they are, so that
            # neither a paced sender waits for it nor a quiet injector holds its stream back.
            self.report_later()

    def report_later(self) -> None:
        """Have the confirmer report what the last round let rise; never blocks. While
        receipts are held it asks within ``CONFIRM_EVERY_S`` anyway, and reports any rise
        then: it is not woken (a paced sender's rounds would wake it a hundred times a
        second, each a thread switch in the sender's process)."""
        if not self._held:
            self._due.set()
        if self._confirmer is None:
            with self._start_lock:
                if self._confirmer is None and not self._closed.is_set():
                    self._confirmer = threading.Thread(target=self._confirm, name=f"injector {self.name}",
                                                       daemon=True)
                    self._confirmer.start()

    def close(self, timeout: float = 5.0) -> None:
        """After the injector's ``closed`` is set: let the confirmer end."""
        self._due.set()
        if self._confirmer is not None and self._confirmer.is_alive():
            self._confirmer.join(timeout)

    def _confirm(self) -> None:
        """Report what each round let rise; while receipts are held, ask every
        ``CONFIRM_EVERY_S`` which of them the leader holds now, however often rounds wake it
        (rounds every few milliseconds must not put the asking off for ever)."""
        failing = False
        next_ask = time.monotonic() + CONFIRM_EVERY_S
        while not self._closed.is_set():
            if self._held:
                self._due.wait(max(0.0, next_ask - time.monotonic()))
            else:
                self._due.wait()
                next_ask = time.monotonic() + CONFIRM_EVERY_S
            self._due.clear()
            if self._closed.is_set():
                return
            ask = bool(self._held) and time.monotonic() >= next_ask
            try:
                with self._lock:
                    self._report_locked(wait=False, ask=ask)
                failing = False
                if ask:
                    next_ask = time.monotonic() + CONFIRM_EVERY_S
            except MillstreamError as e:  # the next user call reports (and raises) again
                log.log(logging.DEBUG if failing else logging.INFO,
                        "injector %s: could not confirm its watermark: %s", self.name, e)
                failing = True
                self._closed.wait(CONFIRM_EVERY_S)

    def _send(self, wm: int) -> dict[str, int]:
        report = pb.InjectorReport(name=self.name, stream=self.stream, watermark=wm,
                                   incarnation=self.incarnation)
        resp = self.client.call(lambda s: s.ReportInjector(report, timeout=self.client.timeout))
        self.reported = wm
        return dict(resp.reported)

    def _report_locked(self, wait: bool, ask: bool = False) -> None:
        deadline = time.monotonic() + self.confirm_timeout
        while True:
            wm = self.effective
            if self.reported is None or wm > self.reported or ask:
                reported = self._send(max(wm, self.reported) if self.reported is not None else wm)
                # Receipts whose report the leader holds (or whose worker it does not know).
                with self._held_lock:
                    self._held = [(ts, r) for ts, r in self._held if reported.get(r[0], r[1]) < r[1]]
                ask = False
                if self.effective > wm:
                    continue  # released holds let it rise: report that at once
            if not wait or not self._held or time.monotonic() > deadline:
                return
            time.sleep(0.01)  # waiting for receivers' next progress report (every 50 ms)
            ask = True
