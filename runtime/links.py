"""A process's gRPC links to workers, on asyncio: the sending end of a frame stream
(``DeliverStream``, ``ReplicateStream``; the protocol is runtime/streams.py's), and the
delivery links both delivery shells use (a worker's, worker/sender.py through
worker/peers.py; an injector's, injectors/tablets.py).

A turn of the event loop's deliveries to one worker leave together in one frame (up to
``delivery.BUNDLE_BYTES``) of the stream to that worker: one frame instead of a call per
tablet, and the receiver runs their batches side by side. The frame asks to be answered in
parts (``answer_each``): each delivery as soon as its tablet is done with it, so a slow
tablet holds only its own deliveries, not the frame's others and the lanes behind them.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Generic, Protocol, TypeVar

import grpc

from runtime import delivery
from runtime.framesclient import Opener
from runtime.security import Security
from runtime.streams import FRAME_TIMEOUT_S, AnswerFrame, SenderWindow, StreamError, is_part, refusal
from runtime.wire import millstream_pb2 as pb
from runtime.wire import millstream_pb2_grpc as rpc

log = logging.getLogger(__name__)

PING_TIMEOUT_S = 5.0  # asking a worker for its frames port

Req = TypeVar("Req")
Ans = TypeVar("Ans")


class _Call(Protocol):
    async def write(self, message: Any) -> None: ...
    async def read(self) -> Any: ...
    def cancel(self) -> bool: ...


class Unsent(StreamError):
    """The stream broke before the frame went out: it may go on a new stream at once."""


def settle(fut: asyncio.Future[Any], value: Any) -> None:
    """Resolve ``fut`` with ``value``, unless its waiter was cancelled."""
    if not fut.done():
        fut.set_result(value)


def call_back(then: Callable[[Any], None], value: Any) -> None:
    """Hand ``value`` to what takes a frame's answer: a failure there is logged, never the reader's."""
    try:
        then(value)
    except Exception:
        log.exception("taking a frame's answer failed")


class FrameStream(Generic[Req, Ans]):
    """One long-lived stream to a worker: frames go within the credit it grants (first fit),
    answers come back in any order, matched by id. Once broken, it fails every frame that went
    out on it with the stream's error, raises :class:`Unsent` for those that had not gone out
    yet (waiting for credit or for another frame's write), and takes no more (the caller opens
    a new one).

    ``open()`` starts the call; ``frame(id, payload)`` makes a frame; ``answers(answer)`` is
    what :meth:`send` returns of an answer frame; ``timeout``: how long a frame waits for
    credit, and then for its answer. ``replace_late``: for a receiver that may hold a frame
    for ever, the credit of frames not answered in time counts as lost, and a frame that needs
    it breaks the stream (the caller opens a new one, and sends it there: :class:`Unsent`)."""

    def __init__(self, open: Callable[[], _Call], frame: Callable[[int, Req], Any],
                 answers: Callable[[Any], Ans], what: str, timeout: float = FRAME_TIMEOUT_S,
                 replace_late: bool = False) -> None:
        self.window = SenderWindow()
        self.timeout = timeout  # a frame not answered by then fails
        self.replace_late = replace_late
        self.broken: grpc.RpcError | None = None
        self.what = what
        self._frame = frame
        self._answers = answers
        self._call = open()
        # What takes each frame's answer, or the stream's error (never raised into a caller
        # that may have stopped waiting); when each written frame's time for it runs out (in
        # the order they were written: one timer, for the oldest, serves them all).
        self._waiting: dict[int, Callable[[AnswerFrame | grpc.RpcError], None]] = {}
        self._deadlines: dict[int, float] = {}
        self._expiry: asyncio.TimerHandle | None = None
        self._sending = 0  # send() calls whose frames are not written yet
        self._parts: dict[int, Callable[[Any], None]] = {}  # frame id -> what takes its answer's parts
        self._woken: list[asyncio.Future[None]] = []  # frames waiting for credit: woken when it comes back
        self._late: set[int] = set()    # frames not answered in time, their credit still out (replace_late)
        self._writing = asyncio.Lock()
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def send(self, payload: Req, on_part: Callable[[Any], None] | None = None) -> Ans:
        """The answers to ``payload`` as one frame; raises :class:`grpc.RpcError` where the
        unary call would: refused, the stream broken, no answer in time. ``on_part``: takes
        each part of the answer but the last (runtime/streams.py), as it comes."""
        self._sending += 1  # (no frame is posted past it: post)
        try:
            answer = await self._write(payload, on_part)
        finally:
            self._sending -= 1
        out = self._outcome(await answer)  # (an answer, the stream's error, or no answer in time: _expire)
        if isinstance(out, grpc.RpcError):
            raise out
        return out

    async def _write(self, payload: Req, on_part: Callable[[Any], None] | None
                     ) -> asyncio.Future[AnswerFrame | grpc.RpcError]:
        """Write ``payload`` as one frame within the credit; the future of its answer."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        frame, size = self.window.next(lambda i: self._frame(i, payload))
        while self.broken is None and not self.window.fits(size):
            late = sum(self.window.in_flight.get(i, 0) for i in self._late) if self._late else 0
            if late and size > self.window.granted - late:
                # Credit held by frames not answered in time may never come back (a tablet stuck
                # in user code): a new stream starts with the whole grant, and this frame goes
                # there (Unsent). What was in flight on this one fails as unreachable and is
                # sent again; the receiver cancels what it held of it (a delivery already queued
                # still commits).
                self._replace(f"{late} B of its credit are held by frames not answered within "
                              f"{self.timeout:.0f} s")
                break
            woken = loop.create_future()  # its own: no waiter can miss a wake-up another took
            self._woken.append(woken)
            try:
                await asyncio.wait_for(woken, deadline - loop.time())
            except TimeoutError:
                if self.broken is None and self.window.fits(size):
                    break  # its credit came back as its time ran out
                if not self.replace_late:
                    raise StreamError(grpc.StatusCode.DEADLINE_EXCEEDED, f"no credit on the {self.what} stream "
                                      f"within {self.timeout:.0f} s") from None
                # The frames holding the credit have been out as long as this one waited (late,
                # or about to be; or smaller frames kept taking it): as above.
                self._replace(f"no credit for {self.timeout:.0f} s")
            finally:
                if woken.cancelled() and woken in self._woken:  # timed out or cancelled: not kept
                    self._woken.remove(woken)  # (on a stream nothing answers, nothing would clear it)
        if self.broken is not None:
            raise Unsent(self.broken.code(), self.broken.details() or "")
        self.window.sent(frame.id, size)
        answer: asyncio.Future[AnswerFrame | grpc.RpcError] = loop.create_future()
        self._expect(frame.id, functools.partial(settle, answer), on_part)
        try:
            async with self._writing:
                unsent = self.broken  # broken while this frame waited to be written: it never went
                if unsent is None:
                    await self._call.write(frame)
        except (grpc.RpcError, asyncio.InvalidStateError) as e:
            self._break(e if isinstance(e, grpc.RpcError) else StreamError(grpc.StatusCode.UNAVAILABLE, str(e)))
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # our caller's
            # The call was cancelled under the write (the stream broke meanwhile): as broken.
            self._break(StreamError(grpc.StatusCode.UNAVAILABLE, f"the {self.what} stream was cancelled"))
        else:
            if unsent is not None:  # so it may go on a new stream at once
                raise Unsent(unsent.code(), unsent.details() or "")
        finally:  # a frame's answer has the whole timeout from its write (waits for credit and the lock aside)
            self._clock(frame.id)
        return answer

    def post(self, payload: Req, then: Callable[[Ans | grpc.RpcError], None],
             on_part: Callable[[Any], None] | None = None) -> bool:
        """Send ``payload`` as one frame now, where that needs no wait: credit at hand, no
        :meth:`send` under way (waiting for credit or for the write: frames keep their order),
        the connection open and its buffer not full.
        ``then`` takes the answers (or the error :meth:`send` would raise) as the stream's
        reader reads them, in that turn of the loop: no task waits on the way (``on_part``
        as :meth:`send`'s). False: not sent (:meth:`send` it)."""
        write_nowait = getattr(self._call, "write_nowait", None)
        if write_nowait is None or self.broken is not None or self._sending:
            return False
        frame, size = self.window.next(lambda i: self._frame(i, payload))
        try:
            if not self.window.fits(size) or not write_nowait(frame):
                self.window.unmake(frame.id)
                return False
        except grpc.RpcError as e:  # the connection broke: what went out on it fails, this goes anew
            self.window.unmake(frame.id)
            self._break(e)
            return False
        self.window.sent(frame.id, size)
        self._expect(frame.id, lambda done: then(self._outcome(done)), on_part)
        self._clock(frame.id)
        return True

    def _outcome(self, done: AnswerFrame | grpc.RpcError) -> Ans | grpc.RpcError:
        if isinstance(done, grpc.RpcError):
            return done
        refused = refusal(done)
        return refused if refused is not None else self._answers(done)

    def _expect(self, frame_id: int, then: Callable[[AnswerFrame | grpc.RpcError], None],
                on_part: Callable[[Any], None] | None = None) -> None:
        """Frame ``frame_id`` is going out: ``then`` takes its answer, or the stream's error, or
        that none came in time (:meth:`_clock`)."""
        self._waiting[frame_id] = then
        if on_part is not None:
            self._parts[frame_id] = on_part

    def _clock(self, frame_id: int) -> None:
        """Frame ``frame_id`` is written: its time for an answer starts now."""
        loop = asyncio.get_running_loop()
        deadline = self._deadlines[frame_id] = loop.time() + self.timeout
        if self._expiry is None:
            self._expiry = loop.call_at(deadline, self._expire)

    def _expire(self) -> None:
        """The oldest frames' time ran out: each not answered fails, no answer within the timeout."""
        self._expiry = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        late = False
        while self._deadlines:
            frame_id, deadline = next(iter(self._deadlines.items()))
            if deadline > now:
                self._expiry = loop.call_at(deadline, self._expire)
                break
            del self._deadlines[frame_id]
            then = self._waiting.pop(frame_id, None)
            if then is None:  # answered, or failed with the stream
                continue
            self._parts.pop(frame_id, None)
            if self.replace_late and frame_id in self.window.in_flight:
                # Its credit comes back only with its answer, which may never come: once a
                # frame needs that credit, the stream is replaced (send).
                self._late.add(frame_id)
                late = True
            call_back(then, StreamError(grpc.StatusCode.DEADLINE_EXCEEDED, f"no answer within {self.timeout:.0f} s"))
        if late:
            self._wake()  # a frame waiting for credit may need a late one's: it looks again

    def _wake(self) -> None:
        """Credit came back, a frame became late, or the stream broke: every frame waiting for
        credit looks again."""
        woken, self._woken = self._woken, []
        for w in woken:
            if not w.done():
                w.set_result(None)

    def _replace(self, why: str) -> None:
        log.warning("replacing the %s stream: %s", self.what, why)
        self._break(StreamError(grpc.StatusCode.UNAVAILABLE, f"the {self.what} stream was replaced: {why}"))

    async def _read(self) -> None:
        error: grpc.RpcError
        try:
            while True:
                answer = await self._call.read()
                if answer is grpc.aio.EOF:
                    error = StreamError(grpc.StatusCode.UNAVAILABLE, f"the worker ended the {self.what} stream")
                    break
                if answer is None:  # (grpc.aio's read of an answer it could not parse: logged, not raised)
                    error = StreamError(grpc.StatusCode.INTERNAL, f"an answer on the {self.what} stream did not parse")
                    break
                self.window.answered(answer)
                if answer.credit:
                    self._wake()
                if is_part(answer):  # its frame is still in flight
                    on_part = self._parts.get(answer.id)
                    if on_part is not None:
                        on_part(answer)
                    continue
                self._late.discard(answer.id)
                self._parts.pop(answer.id, None)
                self._deadlines.pop(answer.id, None)
                then = self._waiting.pop(answer.id, None)
                if then is not None:
                    call_back(then, answer)
        except grpc.RpcError as e:
            error = e
        except ValueError as e:  # an answer to no frame of ours: this stream cannot be trusted
            error = StreamError(grpc.StatusCode.INTERNAL, str(e))
        except Exception as e:  # a bug: the stream is replaced, never left to look healthy with no reader
            log.exception("the %s stream's reader failed", self.what)
            error = StreamError(grpc.StatusCode.INTERNAL, f"{type(e).__name__}: {e}")
        self._break(error)

    def _break(self, error: grpc.RpcError) -> None:
        if self.broken is None:
            self.broken = error
        self._call.cancel()
        self._wake()
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        waiting, self._waiting = self._waiting, {}
        self._deadlines.clear()
        self._parts.clear()
        for then in waiting.values():
            call_back(then, self.broken)

    async def close(self) -> None:
        self._break(StreamError(grpc.StatusCode.CANCELLED, f"the {self.what} stream was closed"))
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)


def delivery_stream(stub: rpc.WorkerStub, open: Callable[[], _Call] | None = None
                    ) -> FrameStream[pb.DeliverManyRequest, pb.DeliverAnswerFrame]:
    """A ``DeliverStream`` to the worker of ``stub`` (``open``: how it opens, where not on
    gRPC: :meth:`Channels.streams`), its frames answered in parts; replaced when a frame needs
    the credit of frames not answered in time (a delivery waits on its tablet's commit, which
    user code can hold for ever)."""
    return FrameStream(open or stub.DeliverStream,
                       lambda i, d: pb.DeliverFrame(id=i, deliveries=d, answer_each=True, credit_each=True),
                       lambda a: a, "delivery", FRAME_TIMEOUT_S, replace_late=True)


class Channels:
    """One asyncio channel (and stub) per worker address, and the streams to each worker: on
    its frames port where it has one (runtime/framesclient.py), else on gRPC."""

    def __init__(self, security: Security, frames: bool = True) -> None:
        self.security = security
        self._stubs: dict[str, rpc.WorkerStub] = {}
        self._channels: list[grpc.aio.Channel] = []
        self.opener = Opener(security, self._ping) if frames else None

    async def _ping(self, address: str) -> pb.PingResponse:
        return await self.stub(address).Ping(pb.PingRequest(), timeout=PING_TIMEOUT_S)

    def streams(self, address: str, method: str, answer: type[Any]) -> Callable[[], _Call]:
        """What opens a stream of ``method`` (``DeliverStream``, ``ReplicateStream``) to ``address``."""
        grpc_call = getattr(self.stub(address), method)
        if self.opener is None:
            return grpc_call  # type: ignore[no-any-return]
        return functools.partial(self.opener.stream, address, method, answer, grpc_call)

    def stub(self, address: str) -> rpc.WorkerStub:
        stub = self._stubs.get(address)
        if stub is None:
            ch = self.security.aio_channel(address)
            self._channels.append(ch)
            stub = self._stubs[address] = rpc.WorkerStub(ch)
        return stub

    async def close(self) -> None:
        for ch in self._channels:
            await ch.close()
        self._channels.clear()
        self._stubs.clear()


_Waiting = tuple[pb.DeliverRequest, int, "asyncio.Future[delivery.Outcome]"]


class DeliveryLinks:
    """Deliveries to workers, one :func:`delivery_stream` per worker; what one turn of the
    loop gives a worker leaves in one frame (up to ``delivery.BUNDLE_BYTES``), each of its
    deliveries answered as soon as it is done."""

    def __init__(self, channels: Channels, *, owns_channels: bool = False) -> None:
        self.channels = channels
        self._owns_channels = owns_channels  # close() closes them too (an injector's own)
        self._streams: dict[str, FrameStream[pb.DeliverManyRequest, pb.DeliverAnswerFrame]] = {}
        self._warned: set[tuple[str, grpc.StatusCode]] = set()
        self._bundles: dict[str, list[_Waiting]] = {}
        self._calls: set[asyncio.Task[None]] = set()
        self._closing = False

    def post(self, address: str, request: pb.DeliverRequest) -> asyncio.Future[delivery.Outcome]:
        """Send ``request`` to the worker at ``address`` (in this turn's frame to it); the
        future of what became of it (never an exception: a failure is an outcome)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[delivery.Outcome] = loop.create_future()
        bundle = self._bundles.setdefault(address, [])
        if not bundle:
            loop.call_soon(self._send, address)
        bundle.append((request, request.ByteSize(), fut))
        return fut

    def _send(self, address: str) -> None:
        """Send what this turn gave ``address``: on its stream at once where that needs no
        wait (the answers are taken as they are read), else from a task."""
        waiting = [b for b in self._bundles.pop(address, []) if not b[2].done()]
        if self._closing:  # (nothing new starts: close() has cancelled what it will wait for)
            self._left(address, waiting)
            return
        for part in delivery.bundles([b[1] for b in waiting]):
            bundle = waiting[part.start:part.stop]
            futs = [b[2] for b in bundle]
            if not self.stream(address).post(pb.DeliverManyRequest(deliveries=[b[0] for b in bundle]),
                                              functools.partial(self._done, address, bundle),
                                              functools.partial(self._answered, address, futs)):
                self._spawn(self._call(address, bundle))

    def _spawn(self, call: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(call)
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)

    async def _call(self, address: str, bundle: list[_Waiting]) -> None:
        request = pb.DeliverManyRequest(deliveries=[b[0] for b in bundle])
        on_part = functools.partial(self._answered, address, [b[2] for b in bundle])
        last: pb.DeliverAnswerFrame | grpc.RpcError
        try:
            try:
                last = await self.stream(address).send(request, on_part)
            except Unsent:  # its stream broke before it went (replaced, say): a new one, at once
                last = await self.stream(address).send(request, on_part)
        except grpc.RpcError as e:
            last = e
        except asyncio.CancelledError:  # closing
            self._left(address, bundle)
            raise
        except Exception as e:  # noqa: BLE001 (a failure this version does not know: retried, as unreachable)
            log.warning("deliveries to %s failed: %r", address, e)
            self._left(address, bundle)
            return
        self._done(address, bundle, last)

    def _done(self, address: str, bundle: list[_Waiting], last: pb.DeliverAnswerFrame | grpc.RpcError) -> None:
        """The frame of ``bundle`` is answered (``last``: its answer's last part), or failed."""
        if isinstance(last, grpc.RpcError):
            out = self._failed(address, last)
            # (UNAUTHENTICATED is the caller's token or credential, never one delivery's.)
            if (out.refused is not None and len(bundle) > 1 and last.code() != grpc.StatusCode.UNAUTHENTICATED
                    and not self._closing):
                # One delivery the receiver refuses for good refuses the frame: the others go
                # alone, so only that one waits (it is retried, as any failed delivery).
                for b in bundle:
                    if not b[2].done():
                        self._spawn(self._call(address, [b]))
                return
            for _, _, fut in bundle:
                if not fut.done():
                    fut.set_result(out)
            return
        self._answered(address, [b[2] for b in bundle], last)
        self._left(address, bundle)

    @staticmethod
    def _left(address: str, bundle: list[_Waiting]) -> None:
        for _, _, fut in bundle:  # none may wait for ever: what no answer told is unreachable (retried)
            if not fut.done():
                log.debug("a delivery to %s was left unanswered: sent again", address)
                fut.set_result(delivery.Outcome(delivery.Status.UNREACHABLE))

    @staticmethod
    def _answered(address: str, futs: list[asyncio.Future[delivery.Outcome]], answer: pb.DeliverAnswerFrame) -> None:
        """Settle the deliveries an answer (or a part of one) answers: ``answer.indexes``, or
        every one of them in order (a receiver that answers frames whole)."""
        answers = answer.answers.answers
        indexes = list(answer.indexes) if answer.indexes else range(len(answers))
        if len(indexes) != len(answers) or (not answer.indexes and len(answers) != len(futs)) or any(
                i >= len(futs) for i in indexes):  # not ours to trust: as unreachable (each is retried)
            log.warning("worker %s answered %d of %d deliveries", address, len(answers), len(futs))
            indexes, answers = range(len(futs)), [None] * len(futs)  # type: ignore[assignment,list-item]
        for i, a in zip(indexes, answers, strict=True):
            if futs[i].done():
                continue
            try:
                out = delivery.Outcome(delivery.Status.UNREACHABLE) if a is None else delivery.answered(a)
            except Exception as e:  # noqa: BLE001 (an answer this version cannot read: no delivery may wait for ever)
                log.warning("worker %s answered a delivery in a way this version cannot read: %r", address, e)
                out = delivery.Outcome(delivery.Status.UNREACHABLE)
            futs[i].set_result(out)

    def _failed(self, address: str, e: grpc.RpcError) -> delivery.Outcome:
        code = e.code()
        # Unavailable / deadline: a worker restarting or busy, retried quietly. Anything
        # else (too large, unauthenticated, ...) will not heal by itself: say so, once.
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            log.debug("delivery to %s failed: %s", address, code)
        elif (address, code) not in self._warned:
            self._warned.add((address, code))
            log.warning("delivery to %s failed: %s (%s); retrying", address, code.name, e.details())
        return delivery.failed(e)

    def stream(self, address: str) -> FrameStream[pb.DeliverManyRequest, pb.DeliverAnswerFrame]:
        """The stream to ``address``: a new one if there is none or it broke."""
        stream = self._streams.get(address)
        if stream is None or stream.broken is not None:
            stream = self._streams[address] = delivery_stream(
                self.channels.stub(address), self.channels.streams(address, "DeliverStream", pb.DeliverAnswerFrame))
        return stream

    async def close(self) -> None:
        self._closing = True
        for t in list(self._calls):
            t.cancel()
        await asyncio.gather(*self._calls, return_exceptions=True)
        for stream in self._streams.values():
            await stream.close()
        self._streams.clear()
        if self._owns_channels:
            await self.channels.close()
