"""The receiving end of a frame stream (``Worker.DeliverStream``, ``Worker.ReplicateStream``;
the protocol is runtime/streams.py's): the stream's grant first, then its frames handled side
by side (one may wait for a commit or for room in a full tablet while later ones go on), each
answered as soon as it is done, within the grant."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from runtime.streams import ReceiverWindow, StreamError, refused
from runtime.wire import millstream_pb2 as pb

log = logging.getLogger(__name__)

# What answers one frame (of the given size in bytes): the servicer's DeliverMany (or
# ReplicateMany), as an answer frame, whose credit serve_frames sets; it may send parts of
# that answer first, through the callable it is given, each with the credit it gives back
# (a delivery frame's ``answer_each`` and ``credit_each``: runtime/streams.py).
FrameHandler = Callable[[Any, int, Callable[[Any], None]], Awaitable[Any]]


async def serve_frames(frames: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any],
                       handle: FrameHandler, grant: int,
                       kind: Callable[..., Any] = pb.DeliverAnswerFrame) -> AsyncIterator[Any]:
    """The answers (``kind``: ``DeliverAnswerFrame``, ``ReplicateAnswerFrame``) of one
    stream, as they are ready. Ends once the sender has closed its side and every frame is
    answered; ends the stream with RESOURCE_EXHAUSTED if the sender overdraws its credit.
    Frames still in flight when the stream ends are cancelled, as the calls of a sender that
    went away are."""
    window = ReceiverWindow(grant)
    # (an answer and whether it is its frame's last), the stream's failure, or None: its end.
    # An answer's credit is given back as it goes out, not as it is queued: a sender that
    # reads no answers gets no credit back, so what waits here stays within its grant.
    answers: asyncio.Queue[Any] = asyncio.Queue()
    tasks: set[asyncio.Task[None]] = set()
    # Where the connection allows (the frames port: runtime/frames.py), an answer is written
    # as it is made, no turn of the loop later: unless answers are queued before it (a
    # frame's last part must not overtake its others).
    write_nowait: Callable[[Any], bool] | None = getattr(context, "write_nowait", None)

    def send(answer: Any, last: bool) -> None:
        if write_nowait is not None and answers.empty() and write_nowait(answer):
            if last:
                window.answered(answer.credit)
            else:
                window.released(answer.credit)
        else:
            answers.put_nowait((answer, last))

    async def answer(frame: Any, size: int) -> None:
        given = 0  # bytes of the frame its parts gave back (credit_each)

        def part(answer: Any) -> None:
            nonlocal given
            given += answer.credit
            send(answer, False)

        try:
            out = await handle(frame, size, part)
        except Exception as e:  # a bug: the frame fails (UNKNOWN, as the call would), not the stream
            log.exception("frame %d failed", frame.id)
            why = f"{type(e).__name__}: {e}".encode("utf-8", "backslashreplace").decode()  # (a lone surrogate)
            out = refused(frame.id, size, grpc.StatusCode.UNKNOWN, why, kind)
        out.credit = size - given  # the rest of the frame: never nothing (its id and framing)
        send(out, True)

    async def read() -> None:
        try:
            async for frame in frames:
                size = frame.ByteSize()
                if not window.admit(size):
                    answers.put_nowait(StreamError(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"frame {frame.id} of {size} B overdraws the stream's credit ({window.outstanding} B "
                        f"of {window.grant} B unanswered); a sender waits for credit before sending"))
                    return
                task = asyncio.get_running_loop().create_task(answer(frame, size))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        except grpc.RpcError as e:  # the sender's side broke: what is in flight is cancelled
            answers.put_nowait(StreamError(e.code(), e.details() or "the stream broke"))
            return
        while tasks:
            await asyncio.wait(set(tasks))
        answers.put_nowait(None)

    yield kind(credit=grant)
    reader = asyncio.get_running_loop().create_task(read())
    try:
        while True:
            item = await answers.get()
            if item is None:
                return
            if isinstance(item, StreamError):
                await context.abort(item.code(), item.details())
            out, last = item
            if last:
                window.answered(out.credit)
            else:
                window.released(out.credit)
            yield out
    finally:
        reader.cancel()
        for task in list(tasks):
            task.cancel()
