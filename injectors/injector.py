"""The injector client: brings external records into a stream, exactly once.

``send`` only queues (``send_many`` queues records already in lists, in one step, at a
fraction of the cost). A background thread delivers what is queued in *rounds*: a round
starts when ``batch_size`` records are waiting, when the oldest has waited ``linger_ms``
(like Kafka's ``linger.ms`` or Flink's buffer timeout), or when :meth:`Injector.flush` asks;
it takes up to ``batch_size`` of the oldest records, sends them in one delivery per
destination tablet (cut at 16 MiB), as columns (runtime/columns.py: no object per record
from the queue to the wire; one producer's records as its prefix and their sequences), all
destinations at once, and retries each until its tablet has committed it. Up to ``max_in_flight`` rounds are in flight at once (like Kafka's
``max.in.flight.requests.per.connection``): a round leaves without waiting for the one
before it to be acknowledged, each delivery chained after the previous one to its tablet so
that tablets still commit every producer's records in order (injectors/rounds.py). So a
paced loop of ``send`` calls gets its records committed within a few milliseconds without
calling ``flush()``, and a fast one keeps the receivers busy while it routes the next
round. ``flush()`` waits until every record queued before it is committed; when a round
may start it delivers it itself, on the caller's thread (a flush per tick then costs no
hand-off to the round thread and back). A round that fails for good (a stream closed by a
drain, a cluster that stays unreachable for ``timeout``) puts its records back in the queue,
with those of any later round still in flight, in order, and stops the rounds; the next
``flush()`` (or ``finish()``, or a ``send`` that finds the queue full) raises the error, and
the ``flush()`` after that tries again: nothing is lost.

Ids default to (injector name, position of the record in this injector's sequence), so
re-running the same injection after a crash sends the same ids and receivers drop what they
already have: each receiving tablet keeps only the highest position it committed from this
injector (worker/dedup.py), so that holds however late the re-run comes. Ids given by the
caller are opaque and deduplicated for the receiving computation's ``dedup_retention``.
The protocol itself (statuses, orders, cutting) is runtime/delivery.py's.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from injectors import checks, forks
from injectors.buffer import END_OF_TIME, Buffer
from injectors.checks import PLAUSIBLE_MAX, PLAUSIBLE_MIN, check_record, check_settings, check_time, plain
from injectors.rounds import Interrupted, Round
from injectors.tablets import Tablets
from injectors.watermark import Watermark
from runtime.client import Client
from runtime.columns import Columns
from runtime.errors import InjectionError, InvalidRecordError, MillstreamError
from runtime.imports import CodePolicy
from runtime.record import ID_BYTES, MAX_KEY_BYTES, MAX_VALUE_BYTES, Timestamp, producer_prefix
from runtime.security import Security

log = logging.getLogger(__name__)

# Records a round takes at most. Each tablet's share of a round is one delivery, one batch and
# commit, one copy to its follower: per batch, not per record. 4,000 (1,000 per tablet of a
# 4-range stream) measured 1.2-1.9x the events per CPU-second of 1,000 on Nexmark q0, and
# 8,000 (a flow stage's batch bound) 1.22x the rec/s of 4,000 on W2 on a flow
# (docs/performance.md); a paced sender's rounds leave after linger_ms, far below either.
DEFAULT_BATCH_SIZE = 8000


class Injector:
    """Sends records to ``stream`` under the name ``name``.

    >>> with Injector("127.0.0.1:7070", "lines", "my-source") as inj:   # doctest: +SKIP
    ...     inj.send(b"k", b"hello world", timestamp=1_700_000_000_000_000)
    ...     inj.send_many([b"a", b"b"], [b"one", b"two"], [1_700_000_000_000_001, 1_700_000_000_000_002])

    :meth:`send` queues one record; :meth:`send_many` queues records already in lists
    (keys, values, timestamps) as that many ``send`` calls would, checking every one first
    (a bad one raises :class:`InvalidRecordError` naming its index, and nothing is queued);
    :meth:`send_sequenced` queues a record of a source with its own order.

    ``allow_code``: module prefixes (a list, or comma-separated) the stream's key extractors
    may be loaded from besides millstream's own, like ``millstream worker --allow-code``;
    the injector refuses to import any other code the routing names (review N10).

    ``idle_after``: seconds without a round or a promise after which the injector counts as
    idle (once nothing it sent is unconfirmed), as with Flink's ``withIdleness``: an idle
    injector does not hold its stream below the other injectors on it. :meth:`mark_idle`
    does the same at once. See docs/time.md, "Idle sources".

    :attr:`accepted` and :attr:`duplicates` count what the receivers did with the records this
    object delivered (once per reading computation a record reached): committed, or dropped as
    already committed under the same id (by exactly-once readers). If the first deliveries come
    back all duplicates, one WARNING is logged: the re-run of a crashed injection looks like
    that, and so does a new injection under a name used before for other data (docs/guide.md).
    """

    _finishing = False  # finish() or retire() began: a send from another thread is refused (under the lock)
    check_units = True  # warn of an int timestamp that looks like s, ms or ns (a source that checked it: False)

    def __init__(self, masters: str | Iterable[str], stream: str, name: str, *,
                 batch_size: int = DEFAULT_BATCH_SIZE, linger_ms: float = 5.0, max_queued: int | None = None,
                 max_in_flight: int = 4, timeout: float = 60.0, security: Security = Security(),
                 incarnation: str | None = None, allow_code: str | Sequence[str] = (),
                 idle_after: float | None = None) -> None:
        if not isinstance(name, str) or not name:
            raise InjectionError("an injector needs a non-empty name (it seeds its record ids)")
        # Key extractors come from the routing, which operators write: loaded from millstream's
        # own modules and those the caller allows only, as on workers (review N10).
        code_policy = CodePolicy.parse(allow_code if isinstance(allow_code, str) else ",".join(allow_code),
                                       where="injector")
        self.stream = stream
        self.name = name
        # Tells this object's registration apart from any other live injector under the same
        # name: the master holds the stream at the minimum of them (review W4).
        # ``incarnation`` given: a stable identity, so a restarted copy (a retried Spark task)
        # replaces the hold of the one it restarts instead of adding its own.
        self.incarnation = uuid.uuid4().hex if incarnation is None else incarnation
        max_queued = check_settings(linger_ms, batch_size, max_queued, max_in_flight, idle_after)
        self.batch_size = int(batch_size)
        self.max_in_flight = int(max_in_flight)
        self.linger_s = float(linger_ms) / 1000
        self.max_queued = max_queued
        self.timeout = timeout
        checks.check_credential(name, security)
        self.security = security
        self.client = Client(masters, timeout=min(timeout, 10.0), security=security)
        self._prefix = producer_prefix("injector/" + name)
        self.position = 0
        # Producer -> last sequence queued (the injector's own: 0, ``position`` is its last).
        self._sequenced: dict[bytes, int] = {self._prefix: 0}
        self._last_producer: tuple[str | None, bytes] = (None, b"")  # send_sequenced's, and its prefix
        # The queue, shared with the round threads under _cond: records waiting (_buffer, the
        # oldest queued at _first_at), the rounds in flight in take order (_flight) and those
        # that failed for good, kept until the others are done (_returned), how many records
        # were ever queued, taken and committed (flush waits on those), a round's error not
        # yet raised.
        self._mutex = threading.RLock()
        self._cond = threading.Condition(self._mutex)
        self._buffer = Buffer()
        self._first_at = 0.0
        self._flight: deque[Round] = deque()
        self._returned: list[Round] = []
        self._rounds_taken = 0
        self._places = 0  # records ever taken: the place of the next one in the send order
        self.peak_in_flight = 0  # the most rounds ever in flight at once
        self._queued = self._committed = self._flushing = 0
        self._error: MillstreamError | None = None
        self._rounds: threading.Thread | None = None
        self._round_pool: ThreadPoolExecutor | None = None  # rounds started by the round thread
        self.finished = False
        self._closed = threading.Event()
        self._marks = Watermark(name, stream, self.incarnation, self.client, self._queued_min, self._closed,
                                idle_after=idle_after)
        try:
            self._tablets = Tablets(name, stream, self.client, security, self._sequenced, self._closed,
                                    window=self.max_in_flight, committed=self._marks.hold, code_policy=code_policy,
                                    unread=self._marks.orphan)
            checks.check_code(self._tablets.routing, name, stream)  # (before it registers: nothing to undo)
            self._marks.report()  # registers: from now on this injector holds its stream's watermark
        except BaseException:
            self.client.close()
            raise
        forks.watch(self)

    @property
    def accepted(self) -> int:
        """Records the receivers committed as new (per reading computation)."""
        return self._tablets.accepted

    @property
    def duplicates(self) -> int:
        """Records the receivers dropped as already committed (per reading computation)."""
        return self._tablets.duplicates

    # --------------------------------------------------------------- sending

    def send(self, key: bytes, value: bytes, timestamp: Timestamp, id: bytes | None = None) -> bytes:
        """Queue one record; it leaves within ``linger_ms`` (sooner when ``batch_size`` are
        waiting). Returns its id. Blocks while ``max_queued`` records wait (raising a failed
        round's error if that is why). Records already in lists go cheaper through
        :meth:`send_many`."""
        if self.finished or self._closed.is_set():
            self._refuse()
        if (type(key) is not bytes or type(value) is not bytes or type(timestamp) is not int or not
                PLAUSIBLE_MIN <= timestamp <= PLAUSIBLE_MAX or len(value) > MAX_VALUE_BYTES or len(key) > MAX_KEY_BYTES):
            timestamp = check_record(key, value, timestamp, units=self.check_units)  # (the common case: one test)
        if id is not None and (not isinstance(id, bytes) or len(id) != ID_BYTES):
            raise InvalidRecordError(f"id must be {ID_BYTES} bytes, got {id!r}")
        # Checked before anything changes: a refused record leaves the injector as it was,
        # and so does one that finds the queue full and a failed round to report. One
        # acquisition of the lock per record: a paced sender queues a tick's records while
        # a round thread may be taking the previous ones.
        with self._mutex:  # _cond's lock, entered without the Condition's Python-level wrapper
            buffer = self._buffer
            if buffer.size >= self.max_queued:
                self._wait_room()
            if self._finishing:
                self._refuse()
            self.position = position = self.position + 1
            if id is None:
                n = buffer.add(key, value, timestamp, self._prefix, position)
                id = self._prefix + position.to_bytes(8, "big")  # sequence_id, inline
            else:
                n = buffer.add_id(key, value, timestamp, id)
            self._queued += 1
            if n == 1 or n == self.batch_size:  # a linger starts, or a round is full
                if n == 1:
                    self._first_at = time.monotonic()
                self._start_rounds()  # (again, if it died: flush and a full queue check too)
                self._cond.notify_all()
        return id

    def send_many(self, keys: Sequence[bytes], values: Sequence[bytes], timestamps: Sequence[Timestamp]) -> None:
        """Queue records given as columns: record i is ``(keys[i], values[i], timestamps[i])``,
        with this injector's next ids, as that many :meth:`send` calls would, at a fraction
        of their cost. Every record is checked first, as ``send`` checks one: a bad one
        raises :class:`InvalidRecordError` naming its index, and then nothing is queued.
        Blocks while ``max_queued`` records wait, then queues them all at once."""
        if self.finished or self._closed.is_set():
            self._refuse()
        keys, values, timestamps = list(keys), list(values), list(timestamps)
        n = len(keys)
        if len(values) != n or len(timestamps) != n:
            raise InvalidRecordError(f"send_many got {n} keys, {len(values)} values and {len(timestamps)} "
                                     "timestamps; pass one of each per record")
        if not n:
            return
        if not plain(keys, values, timestamps):
            checks.check_columns(keys, values, timestamps, self.check_units)
        with self._mutex:
            buffer = self._buffer
            if buffer.size >= self.max_queued:
                self._wait_room()
            if self._finishing:
                self._refuse()
            first = self.position + 1
            self.position += n
            if not buffer.size:
                self._first_at = time.monotonic()
            buffer.extend(Columns(keys, values, timestamps, self._prefix, list(range(first, first + n))))  # type: ignore[arg-type]
            self._queued += n
            self._start_rounds()
            self._cond.notify_all()

    def send_sequenced(self, producer: str, seq: int, key: bytes, value: bytes, timestamp: Timestamp) -> None:
        """Queue one record of a source with its own order: ``seq`` is its place in
        ``producer`` (a file's line number, a partition's offset), rising with every call for
        that producer. Its id is (producer, seq), so a re-send of the same place, by this
        injector or a later one, is dropped however late it comes; dedup costs the receivers
        one number per producer."""
        if self.finished or self._closed.is_set():
            self._refuse()
        timestamp = check_record(key, value, timestamp, units=self.check_units)
        last_producer, prefix = self._last_producer
        if producer != last_producer:  # a file's lines, a partition's rows: one digest per producer
            if not isinstance(producer, str):
                raise InjectionError(f"producer must be a str (a file's, a partition's name), not {producer!r}")
            prefix = producer_prefix("source\x00" + self.name + "\x00" + producer)
            self._last_producer = (producer, prefix)
        # The check, the new last sequence and the queueing under one hold of the lock, or two
        # threads feeding one producer could both pass the check and queue n+1 before n, and
        # the receiver would drop n as a duplicate (review N18).
        with self._mutex:
            if self._buffer.size >= self.max_queued:
                self._wait_room()  # (it lets go of the lock: before the check, not between it and the queueing)
            if self._finishing:
                self._refuse()
            last = self._sequenced.get(prefix, 0)
            if isinstance(seq, bool) or not isinstance(seq, int) or not last < seq < (1 << 64):
                raise InvalidRecordError(f"producer {producer!r}: seq {seq!r} must be an int above the last "
                                         f"one sent for it ({last}) and below 2**64")
            # Known as a producer before its record can be in a round (else it would go out
            # with no order, deduplicated as an opaque id).
            self._sequenced[prefix] = seq
            self.position += 1
            n = self._buffer.add(key, value, timestamp, prefix, seq)
            self._queued += 1
            if n == 1 or n == self.batch_size:
                if n == 1:
                    self._first_at = time.monotonic()
                self._start_rounds()
                self._cond.notify_all()

    def _refuse(self) -> None:
        if self._marks.forked is not None:
            raise InjectionError(self._marks.forked)
        raise InjectionError(f"injector {self.name!r} is " + ("finished" if self.finished or self._finishing else
                             "closed (what it had not flushed was dropped)") + "; create a new one to send more")

    def _forked(self) -> None:
        """In a fork's child: new locks (the parent's threads' may stay held); nothing sent or reported."""
        self._mutex = threading.RLock()
        self._cond = threading.Condition(self._mutex)
        self._marks.in_fork_child(f"injector {self.name!r} was made in process {os.getppid()}, which forked this "
                                  "one: an injector does not survive fork(); make one in the process that sends")
        self._closed.set()

    def _wait_room(self) -> None:
        """Under ``_cond``: block while ``max_queued`` records wait (raising a failed round's
        error, or if the injector is closed)."""
        while len(self._buffer) >= self.max_queued:
            self._raise_error()
            if self._closed.is_set():
                self._refuse()
            self._start_rounds()
            self._cond.wait(0.1)

    def _start_rounds(self) -> None:
        """Start the round thread (again, if it ever died)."""
        if (self._rounds is None or not self._rounds.is_alive()) and not self._closed.is_set():
            self._rounds = threading.Thread(target=self._run_rounds, name=f"injector {self.name} rounds",
                                            daemon=True)
            self._rounds.start()

    def _raise_error(self) -> None:
        """Raise (once) the error that stopped the rounds; the next round retries."""
        if self._error is not None:
            err, self._error = self._error, None
            self._cond.notify_all()
            raise err

    def _may_take(self) -> bool:
        """Under ``_cond``: whether a round may start now. Something is queued, no error waits
        to be raised, nothing failed waits to be queued again, and either nothing is in flight
        or fewer than ``max_in_flight`` rounds are (the delivery core keeps them in order at
        every tablet: injectors/rounds.py)."""
        if not self._buffer or self._error is not None or self._returned:
            return False
        flight = self._flight
        if not flight:
            return True
        # Only a full round joins others in flight: at a paced sender's rate, rounds one at a
        # time carry more records each and cost the receivers fewer deliveries, and that
        # measured faster on two cores shared with them (docs/performance.md); a bulk load
        # keeps the receivers busy while it routes the next round.
        return len(flight) < self.max_in_flight and len(self._buffer) >= self.batch_size

    def _take_round(self) -> Round | None:
        """Under ``_cond``: the next round, if one may start now (handed to the delivery
        shell here, so rounds reach it in take order)."""
        if not self._may_take():
            return None
        before = self._buffer.min_timestamp
        records = self._buffer.take(self.batch_size)
        # The rest waited as long: it goes in the next round at once.
        min_ts = min(records.timestamps) if self._buffer else before
        rnd = Round(self._rounds_taken, records, min_ts, self._places)
        self._rounds_taken += 1
        self._places += len(records)
        self._flight.append(rnd)
        self.peak_in_flight = max(self.peak_in_flight, len(self._flight))
        self._tablets.enqueue(rnd)
        return rnd

    def _next_round(self) -> Round | None:
        """Wait until a round is due and take it (None: closing)."""
        with self._cond:
            while not self._closed.is_set():
                if self._may_take():
                    wait = self._first_at + self.linger_s - time.monotonic()
                    if len(self._buffer) >= self.batch_size or self._flushing or wait <= 0:
                        return self._take_round()
                    self._cond.wait(wait)
                else:
                    self._cond.wait()
        return None

    def _run_rounds(self) -> None:
        while (rnd := self._next_round()) is not None:
            if self.max_in_flight == 1 or len(rnd.records) < self.batch_size:
                # A paced sender's round (only full rounds join others in flight): run it
                # here, sparing it a hand-off to a pool thread, as with one round in flight.
                self._run_round(rnd)
                continue
            if self._round_pool is None:
                self._round_pool = ThreadPoolExecutor(self.max_in_flight,
                                                      thread_name_prefix=f"injector {self.name} round")
            try:
                self._round_pool.submit(self._run_round, rnd)
            except RuntimeError:  # the pool was shut down: the injector is closing
                self._run_round(rnd)

    def _run_round(self, rnd: Round) -> None:
        """Deliver a round taken by :meth:`_take_round`, on whichever thread took it; it
        finishes in take order (each round waits for the ones before it)."""
        error: MillstreamError | None = None
        interrupted: BaseException | None = None
        try:
            self._deliver(rnd)
        except Exception as e:  # kept for the caller; the records go back in the queue
            error = e if isinstance(e, MillstreamError) else InjectionError(
                f"injector {self.name!r}: delivering failed: {e!r} (the records are still queued)")
        except BaseException as e:  # Ctrl-C in a flush: the round fails (with those in flight), then it goes on
            interrupted, error = e, Interrupted(f"injector {self.name!r}: interrupted ({type(e).__name__}); "
                                                "the records are still queued")
            self._tablets.abandon(rnd, error)
        if error is not None:
            try:
                with self._cond:
                    # Failures finish in take order too: the caller hears of this one once every
                    # round before it is committed (or failed), as with one round in flight.
                    while self._flight[0] is not rnd and not self._closed.is_set():
                        self._cond.wait(0.1)
            except BaseException as e:  # interrupted (again) meanwhile: the round is still let go of
                interrupted = interrupted or e
        with self._cond:
            rnd.done = True
            if error is not None:
                rnd.returned = True
                self._returned.append(rnd)
                if self._error is None and not isinstance(error, Interrupted):  # (the caller knows of that)
                    if not (self._closed.is_set() and isinstance(error, InjectionError)):
                        log.warning("injector %s: %s", self.name, error)
                    self._error = error
            while self._flight and self._flight[0].done:
                head = self._flight.popleft()
                if not head.returned:
                    self._committed += len(head.records)
            if self._returned and not self._flight:
                # Back at the front of the queue in their order (a later round's records first
                # would reach a tablet before earlier ones of the same producer).
                self._buffer.put_back([back.records for back in sorted(self._returned, key=lambda x: x.index)])
                self._returned = []
                self._first_at = time.monotonic()
                self._tablets.resume()  # before any round taken from now on is handed over
            self._cond.notify_all()
        if interrupted is not None:
            raise interrupted
        if error is None:
            # The watermark this round let rise goes to the leader from the confirmer thread,
            # not on the rounds' path: a master round trip per round would be paid by every
            # round after it (a paced sender's flush waits for this one).
            self._marks.report_later()

    def advance_watermark(self, ts: Timestamp) -> None:
        """Promise to send nothing older than ``ts`` (never moves backwards). Reported
        at once, or, while earlier deliveries wait to be confirmed, by the background thread
        that asks for their confirmation every 20 ms (one master call per 20 ms however often
        a source promises, like Flink's periodic watermarks). The effective watermark is never
        later than the oldest record not yet confirmed (:attr:`effective_watermark`)."""
        self._marks.promise(check_time(ts, "watermark"))
        self._marks.report_promise()

    def mark_idle(self) -> None:
        """Flush, then mark this injector idle (Flink's ``withIdleness``): until it sends or
        promises again, it does not hold its stream below the other injectors on it. Reported
        at once (or as soon as the last records' receipts are confirmed). Its next records
        count as late wherever they are older than the watermark its readers reached
        meanwhile (docs/time.md, "Idle sources")."""
        self.flush()
        self._marks.mark_idle()
        self._marks.report()

    @property
    def idle(self) -> bool:
        """Whether the leader was last told this injector is idle."""
        return self._marks.reported_idle

    @property
    def watermark(self) -> int:
        """What this injector promised (``advance_watermark``; the end of time once finished)."""
        return self._marks.promised

    @property
    def queued(self) -> int:
        """Records sent and not committed yet (waiting, in a round in flight, or failed and
        about to be queued again)."""
        with self._cond:
            rounds = {id(r): len(r.records) for r in (*self._flight, *self._returned)}
            return len(self._buffer) + sum(rounds.values())

    @property
    def effective_watermark(self) -> int:
        """min(the promised watermark, the oldest record not flushed, the oldest record whose
        receiving tablet's progress report the leader does not hold yet)."""
        return self._marks.effective

    def _queued_min(self) -> int:
        with self._cond:
            return min([self._buffer.min_timestamp, *(r.min_ts for r in (*self._flight, *self._returned))])

    def flush(self) -> None:
        """Block until every record queued before this call is committed by its tablet (or
        raise the error that stopped the rounds; the records stay queued and the next flush
        tries again)."""
        with self._cond:
            self._raise_error()
            target = self._queued
            if self._committed >= target:
                return
            self._flushing += 1
        try:
            while True:
                with self._cond:
                    if self._committed >= target:
                        return
                    self._raise_error()
                    if self._closed.is_set():
                        self._refuse()
                    # A round may start: deliver it on this thread, sparing the hand-offs to
                    # the round thread and back (a flush per tick pays them).
                    rnd = self._take_round()
                    if rnd is None:
                        self._start_rounds()
                        self._cond.notify_all()
                        self._cond.wait(0.1)
                        continue
                self._run_round(rnd)
        finally:
            with self._cond:
                self._flushing -= 1

    def _deliver(self, rnd: Round) -> None:
        """One round: deliver its records to their tablets, retried until each is committed
        (or raise once ``timeout`` passes; :meth:`_run_round` queues them again). The delivery
        shell (injectors/tablets.py) sends it as soon as the rounds taken before it are sent,
        and keeps it in order behind them at every tablet."""
        try:
            self._marks.resume()  # an idle injector tells the leader it is active before it sends
        except MillstreamError as e:
            self._tablets.abandon(rnd, e)
            raise
        self._tablets.deliver(rnd, self.timeout)

    def finish(self) -> None:
        """Send everything, then move the watermark to the end of time; returns once the
        leader holds that promise (raises :class:`InjectionError` if it cannot within the
        injector's ``timeout``: the stream would otherwise stay held, silently; review W5).
        Nothing after :meth:`retire` or :meth:`release` (it would take their word back)."""
        if self.finished:
            return
        self._stop_sends()
        self._marks.promise(END_OF_TIME)
        deadline = time.monotonic() + self.timeout
        while True:
            self._marks.report(wait=True)  # bounded by its confirm_timeout
            if self._marks.reported == END_OF_TIME:
                break
            if time.monotonic() > deadline:
                raise InjectionError(
                    f"injector {self.name!r}: the end of its input on {self.stream!r} was not "
                    f"confirmed within {self.timeout:.0f}s (its last records' receivers have not "
                    "reported them); call finish() again once the cluster is healthy")
        self.finished = True

    def _stop_sends(self) -> None:
        """Refuse sends from here on (another thread's, which passed the first check already,
        too: under the lock), then send what is queued: nothing can follow the last promise."""
        self.flush()
        with self._mutex:
            self._finishing = True
        self.flush()

    def retire(self) -> None:
        """End this run, keeping its promise (later loads under the name follow): send it all,
        wait until it is confirmed (as :meth:`finish`), then tell the leader the watermark is
        final: it holds the stream while no other run of the name is live (:meth:`close` keeps
        holding: a run may be re-run). Raises InjectionError if not confirmed in time."""
        deadline = time.monotonic() + self.timeout
        if not self.finished:
            self._stop_sends()
        while not self.finished:
            self.flush()  # (raises a round's error)
            self._marks.report(wait=True)  # bounded by its confirm_timeout
            try:
                self.finished = self._marks.settled() and self._marks.retire()
            except MillstreamError:  # (a leader lost meanwhile, say: its successor takes the retry)
                if time.monotonic() > deadline:
                    raise
            if not self.finished and time.monotonic() > deadline:
                raise InjectionError(f"injector {self.name!r}: what it sent was not confirmed in {self.timeout:.0f}s; "
                                     "call retire() again once the cluster is healthy")

    def release(self) -> None:
        """Drop every hold on this stream under this injector's name, this object's and those of
        other (crashed, stale) injectors of the name, unconfirmed; an operator's way out."""
        try:
            self._marks.stop(lambda: self.client.release_injector(self.name, self.stream))
        finally:
            self.finished = self._marks.stopped  # (also if it may have happened: call it again)

    def close(self) -> None:
        """Stop sending (records not flushed are dropped: :meth:`finish` or :meth:`flush` first)."""
        self._closed.set()
        with self._cond:
            self._cond.notify_all()
        self._tablets.close()  # a round in flight fails at once and ends
        if self._round_pool is not None:
            self._round_pool.shutdown(wait=False, cancel_futures=True)
        if self._rounds is not None and self._rounds.is_alive():
            self._rounds.join(5)
        self._marks.close()
        self.client.close()

    def __enter__(self) -> Injector:
        return self

    def __exit__(self, exc_type: Any, *rest: object) -> None:
        try:
            if exc_type is None:
                self.finish()
        finally:
            self.close()
