"""An injector's watermark: its promise, the holds of committed deliveries, its reports.

The injector promises to send nothing older than its watermark (``advance_watermark``).
What it reports to the leader is never later than its oldest record not yet committed,
nor than the oldest record of a committed delivery whose receiver's progress report the
leader does not hold yet (the delivery's *receipt*): until then the leader's view of that
tablet may not reflect the records, and the stream's watermark must not pass them.

Reports go to the leader from the caller's thread when the caller asks (registration,
``advance_watermark``, ``finish``) and otherwise from one background thread per injector
(the *confirmer*). A promise made while the confirmer is asking anyway (receipts held) is
left to its next ask, within ``CONFIRM_EVERY_S``: one master call per 20 ms, however often
the source promises. While receipts are held it asks the leader every 20 ms which of them it
holds now, and reports each rise. With none held it sleeps (a keep-alive report every
``KEEPALIVE_S``), and the first receipt held, or a round's rise, wakes it. Whether it
sleeps is decided under the lock that adds receipts, and it does not sleep if anything
woke it since its last report began: a receipt added as it decides is never missed (issue
28: once a round held one while it went to sleep, a source that then went quiet never had
its promise published). A round never waits for a master round trip, nor for a report in
flight: it only wakes the sleeping confirmer, once.

An injector may be *idle* (Flink's ``withIdleness``): asked to (``mark_idle``) or silent
for ``idle_after`` seconds, and with nothing queued or unconfirmed, it says so in its
reports, and the leader does not let it hold its stream below the other injectors on it
(master/watermarks.py, ``with_idleness``). Its next round tells the leader it is active
again before it delivers anything (docs/time.md, "Idle sources").
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from runtime.client import Client
from runtime.delivery import Receipt
from runtime.errors import ConfigError, InjectionError, MasterUnavailableError, MillstreamError, RoleError
from runtime.receipts import HeldReceipts
from runtime.record import END_OF_TIME, MIN_TIME
from runtime.wire import millstream_pb2 as pb

log = logging.getLogger(__name__)

MIN, END = MIN_TIME, END_OF_TIME
CONFIRM_EVERY_S = 0.02  # how often the confirmer asks while receipts are held
# A live injector reports at least this often, idle or not: the leader counts a registration
# silent for long as gone (MasterConfig.injector_expiry_s), and a new leader learns its idleness.
KEEPALIVE_S = 10.0
RETRY_MAX_S = 1.0       # the longest wait between two attempts while the leader cannot be reached


class Watermark:
    """The watermark side of one :class:`~injectors.injector.Injector`."""

    def __init__(self, name: str, stream: str, incarnation: str, client: Client,
                 queued_min: Callable[[], int], closed: threading.Event,
                 confirm_timeout: float = 5.0, idle_after: float | None = None) -> None:
        self.name = name
        self.stream = stream
        self.incarnation = incarnation
        self.client = client
        self._queued_min = queued_min  # oldest timestamp queued or in flight (MAX: none)
        self._closed = closed
        self.confirm_timeout = confirm_timeout
        self.idle_after = idle_after
        self.promised = MIN
        self.reported: int | None = None
        self.reported_idle = False  # what the leader was last told
        self._idle_asked = False    # mark_idle() since the last round or promise
        self._going_idle = False    # an idle report is being made (a round starting waits for it)
        self._maybe_idle = False    # an idle report was made, and no active one since (its answer may be lost)
        self._active_at = time.monotonic()
        self._sent_at = time.monotonic()
        self._held: HeldReceipts[None] = HeldReceipts()  # the oldest timestamp of each committed delivery
        self._held_lock = threading.Lock()
        # Under _held_lock: how often something woke the confirmer, and whether it sleeps.
        self._nudges = 0
        self._sleeping = False
        self._lock = threading.Lock()  # one report at a time
        self._due = threading.Event()  # wakes the confirmer
        self._confirmer: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._stopped = False  # released: nothing more goes to the leader from here
        self._unread = False   # a round found no computation reading the stream (orphan)
        self._delivered = False  # a delivery of this injector's was committed
        self._failing = False  # the confirmer's last report failed (it backs off, then retries)
        self.forked: str | None = None  # in a fork's child: why nothing may be reported (injectors/forks.py)

    def promise(self, timestamp: int) -> None:
        self._check_fork()
        self.promised = max(self.promised, timestamp)
        self._active()

    def hold(self, oldest: int, receipt: Receipt) -> None:
        """A delivery was committed: its timestamps hold the watermark until the leader holds
        the receiver's report named by ``receipt``. (Under its own lock, never behind a report
        in flight: a round calls this before it finishes.) Wakes a sleeping confirmer."""
        self._delivered = True
        with self._held_lock:
            self._held.hold(receipt, oldest, None)
            self._nudge()

    def _nudge(self) -> None:
        """Under ``_held_lock``: something may have changed what to report."""
        self._nudges += 1
        if self._sleeping:
            self._sleeping = False
            self._due.set()

    @property
    def effective(self) -> int:
        """min(the promise, the oldest record not committed, the oldest record whose
        receiving tablet's progress report the leader does not hold yet)."""
        return self._state()[0]

    def _state(self) -> tuple[int, bool]:
        """The effective watermark, and whether nothing is queued, in flight or held.

        The rounds in flight are read before the holds (review N6): a round adds its holds
        before it leaves the flight, so one that commits and leaves between the two reads
        is seen in the second. (Read the other way round, it was in neither.)"""
        queued = self._queued_min()
        with self._held_lock:
            oldest = self._held.oldest()
            held = END if oldest is None else oldest
        return min(self.promised, queued, held), queued == END and held == END

    # ------------------------------------------------------------------ idleness

    def mark_idle(self) -> None:
        """Idle from now on (once nothing is queued or unconfirmed), until the next round or
        promise."""
        self._idle_asked = True

    def _active(self) -> None:
        self._idle_asked = False
        self._active_at = time.monotonic()

    def _idle(self, nothing_pending: bool) -> bool:
        if not nothing_pending or self.reported == END:
            return False
        return self._idle_asked or (self.idle_after is not None
                                    and time.monotonic() - self._active_at >= self.idle_after)

    def resume(self) -> None:
        """A round is about to deliver: the injector is active. If the leader holds it idle,
        it hears otherwise first, from this thread: the round's records must hold their stream
        before any of them reaches a tablet (raises what the master call raised)."""
        self._active()
        if self.reported_idle or self._going_idle or self._maybe_idle:
            with self._lock:
                self._report_locked(wait=False)

    # ------------------------------------------------------------------ reports

    def report(self, wait: bool = False) -> None:
        """Report the effective watermark if it rose (a lower one could only come from records
        below our own promise: those are late whatever we say). With ``wait``, until no
        committed record holds it back (bounded by ``confirm_timeout``). Raises what the
        master call raised."""
        self._check_fork()  # (before any lock: one the parent's threads held at the fork stays held)
        with self._lock:
            self._report_locked(wait)
        if self._held:
            # Receipts not confirmed yet: asked for in the background until they are, so that
            # neither a paced sender waits for it nor a quiet injector holds its stream back.
            self.report_later()
        else:
            # From the first report (the registration) on: an injector that never sends still
            # goes idle (idle_after) and keeps its name alive (KEEPALIVE_S) from that thread.
            self._start_confirmer()

    def report_promise(self) -> None:
        """The promise rose (``advance_watermark``): report it now, unless the confirmer
        will within ``CONFIRM_EVERY_S`` anyway (receipts are held, so it is asking the leader
        at that pace, and each ask reports the effective watermark, the promise included).
        A source promising every few hundred records would otherwise make a master call of
        its own for each promise, on its own thread, beside the confirmer's. Raises what the
        master call raised when it is made here."""
        with self._held_lock:
            asking = bool(self._held) and not self._sleeping
        confirmer = self._confirmer
        if asking and not self._failing and confirmer is not None and confirmer.is_alive():
            return
        self.report()

    def report_later(self) -> None:
        """Have the confirmer report what the last round let rise; never blocks. While
        receipts are held it asks within ``CONFIRM_EVERY_S`` anyway, and reports any rise
        then: it is only woken when it sleeps (a paced sender's rounds would otherwise wake
        it a hundred times a second, each a thread switch in the sender's process)."""
        self._active_at = time.monotonic()
        with self._held_lock:
            self._nudge()
        self._start_confirmer()

    def _start_confirmer(self) -> None:
        if self._confirmer is None:
            with self._start_lock:
                if self._confirmer is None and not self._closed.is_set():
                    self._confirmer = threading.Thread(target=self._confirm, name=f"injector {self.name}",
                                                       daemon=True)
                    self._confirmer.start()

    def stop(self, last: Callable[[], object]) -> None:
        """Make ``last`` (the release of the name: ``Injector.release``), then report nothing
        more (a keep-alive would register the name again), with no report in between. Also
        if ``last`` raises, unless it was refused or reached no master: its answer may be what
        was lost, the release done."""
        self._check_fork()
        with self._lock:
            try:
                last()
            except (RoleError, ConfigError, MasterUnavailableError):
                raise  # not released: reports go on
            except BaseException:
                self._stopped = True
                raise
            finally:
                self._due.set()
            self._stopped = True

    @property
    def stopped(self) -> bool:
        return self._stopped

    def orphan(self) -> None:
        """A round found no computation reading the stream: nothing was sent, and the hold
        this injector registered protects nothing. Left, it would hold the stream, for a job
        submitted on it later, at this injector's watermark until it expired (a day), long after
        a refused `inject-files` exited, even once other injectors fed it: :meth:`close` reports
        this incarnation idle, unless it delivered something or finished since. Idle, it holds
        nothing while another injector feeds the stream, and the stream no higher than it
        promised while none does (master/watermarks.py ``with_idleness``): its own report,
        which the injector role may make, and no other incarnation's hold is touched."""
        self._unread = True

    def close(self, timeout: float = 5.0) -> None:
        """After the injector's ``closed`` is set: an orphan (:meth:`orphan`) says it is idle,
        and the confirmer ends."""
        if self._unread and not self._delivered and not self._stopped and self.reported != END:
            try:
                with self._lock:
                    self._send(self.reported if self.reported is not None else MIN, idle=True)
            except MillstreamError as e:
                log.warning("injector %s: could not tell the leader it is idle on %r, which no computation read "
                            "(%s); it holds the stream until it expires, or `millstream release-injector %s "
                            "--stream %s`", self.name, self.stream, e, self.name, self.stream)
        self._due.set()
        if self._confirmer is not None and self._confirmer.is_alive():
            self._confirmer.join(timeout)

    def _rest(self, now: float) -> float | None:
        """How long the confirmer may sleep with nothing held: until the next keep-alive, or
        until ``idle_after`` makes the injector idle (None: until woken)."""
        if self.reported is None or self.reported == END:
            return None  # not registered yet, or finished: nothing to keep alive
        until = self._sent_at + KEEPALIVE_S
        if self.idle_after is not None and not self.reported_idle and not self._idle_asked:
            until = min(until, self._active_at + self.idle_after)
        return max(until - now, CONFIRM_EVERY_S)

    def _confirm(self) -> None:
        """Report what each round let rise; while receipts are held, ask every
        ``CONFIRM_EVERY_S`` which of them the leader holds now, however often rounds wake it
        (rounds every few milliseconds must not put the asking off for ever)."""
        failing = 0.0  # the wait before the next attempt while the leader cannot be reached
        next_ask = time.monotonic() + CONFIRM_EVERY_S
        seen = -1
        while not self._closed.is_set() and not self._stopped:
            now = time.monotonic()
            with self._held_lock:
                held = bool(self._held)
                # Asleep only if nothing woke it since its last report began (a receipt held
                # or a rise then may not be in what that report read).
                self._sleeping = sleep = not held and not failing and self._nudges == seen
            if sleep:
                self._due.wait(self._rest(now))
                self._sleeping = False  # (a nudge from now on sets _due once more: harmless)
                next_ask = time.monotonic() + CONFIRM_EVERY_S
            elif failing:
                self._closed.wait(failing)
            elif held:
                self._due.wait(max(0.0, next_ask - now))
            self._due.clear()
            if self._closed.is_set() or self._stopped:
                return
            with self._held_lock:
                seen = self._nudges
            now = time.monotonic()
            ask = (bool(self._held) and now >= next_ask) or (
                self.reported is not None and self.reported != END and now >= self._sent_at + KEEPALIVE_S)
            try:
                with self._lock:
                    if self._stopped or self._closed.is_set():
                        return  # (retired, released or closed while it waited for the lock)
                    self._report_locked(wait=False, ask=ask)
                failing = 0.0
                self._failing = False
                if ask:
                    next_ask = time.monotonic() + CONFIRM_EVERY_S
            except MillstreamError as e:  # the next user call reports (and raises) again
                log.log(logging.DEBUG if failing else logging.INFO,
                        "injector %s: could not confirm its watermark: %s", self.name, e)
                failing = min(RETRY_MAX_S, 2 * failing or CONFIRM_EVERY_S)
                self._failing = True

    def settled(self) -> bool:
        """Whether nothing it sent is queued, in flight or unconfirmed (as ``finish`` waits for)."""
        return self._state()[1]

    def retire(self) -> bool:
        """Report the watermark reached as this incarnation's final promise
        (``Injector.retire``), if nothing it sent is pending (else False: the caller waits);
        nothing is reported after it, with no report in between (one after it would take the
        retirement back). If the report raises, reports go on and it may be made again."""
        self._check_fork()
        with self._lock:
            wm, settled = self._state()
            if not settled:
                return False
            self._send(wm if self.reported is None else max(wm, self.reported), False, retired=True)
            self._stopped = True
        self._due.set()
        return True

    def in_fork_child(self, why: str) -> None:
        """This is a fork's child (injectors/forks.py): fresh locks (the parent's threads may
        have held these), and ``why`` raised by every report from now on."""
        self._held_lock, self._lock, self._start_lock = threading.Lock(), threading.Lock(), threading.Lock()
        self.forked = why

    def _check_fork(self) -> None:
        if self.forked is not None:  # the parent's name and incarnation: its reports, not ours
            raise InjectionError(self.forked)

    def _send(self, wm: int, idle: bool, retired: bool = False) -> dict[str, int]:
        self._check_fork()
        report = pb.InjectorReport(name=self.name, stream=self.stream, watermark=wm,
                                   incarnation=self.incarnation, idle=idle, retired=retired)
        if idle:  # applied but unanswered, it would leave the leader holding us idle unbeknown
            self._maybe_idle = True
        resp = self.client.call(lambda s: s.ReportInjector(report, timeout=self.client.timeout))
        self.reported = wm
        self.reported_idle = self._maybe_idle = idle
        self._sent_at = time.monotonic()
        return dict(resp.reported)

    def _report_locked(self, wait: bool, ask: bool = False) -> None:
        if self._stopped:
            return  # retired or released: a report now would take that back
        deadline = time.monotonic() + self.confirm_timeout
        while True:
            wm, nothing_pending = self._state()
            idle = self._idle(nothing_pending)
            if idle and not self.reported_idle:
                # Flag first, then look again: a round taken before the second look is seen
                # by it (nothing idle is said); one taken after it finds the flag in resume(),
                # waits for this report and says it is active before it delivers.
                self._going_idle = True
                wm, nothing_pending = self._state()
                idle = self._idle(nothing_pending)
            try:
                if (self.reported is None or wm > self.reported or ask or idle != self.reported_idle
                        or (self._maybe_idle and not idle)):
                    reported = self._send(max(wm, self.reported) if self.reported is not None else wm, idle)
                else:
                    reported = None
            finally:
                self._going_idle = False
            if reported is not None:
                # Receipts whose report the leader holds (or whose worker it does not know).
                with self._held_lock:
                    self._held.release(reported)
                ask = False
                after, nothing_pending = self._state()
                if after > wm or self._idle(nothing_pending) != idle:
                    continue  # released holds let it rise (or go idle): report that at once
            if not wait or not self._held or time.monotonic() > deadline:
                return
            time.sleep(0.01)  # waiting for receivers' next progress report (every 50 ms)
            ask = True
