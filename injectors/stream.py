"""An injector's delivery stream to one worker (``Worker.DeliverStream``; the protocol is
runtime/streams.py's), for blocking callers on several threads: :meth:`DeliveryStream.send`
puts a frame on the wire within the stream's credit and returns a future of its answer.

gRPC's blocking API takes the frames from an iterator over a queue (its own thread sends
them); a thread of ours reads the answers and resolves each frame's future by id.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any, TypeAlias

import grpc

from runtime.streams import FRAME_TIMEOUT_S, SenderWindow, StreamError, refusal
from runtime.wire import millstream_pb2 as pb
from runtime.wire import millstream_pb2_grpc as rpc

# A frame's answers, or the error a DeliverMany call would have raised.
Answer: TypeAlias = "pb.DeliverManyResponse | grpc.RpcError"


class DeliveryStream:
    """One long-lived stream to a worker. Once broken it fails every frame in flight with the
    stream's error and takes no more: the caller opens a new one."""

    def __init__(self, stub: rpc.WorkerStub, name: str) -> None:
        self.window = SenderWindow()
        self.broken: grpc.RpcError | None = None
        self._lock = threading.Condition()  # the window, the waiting futures, ``broken``
        self._waiting: dict[int, Future[Answer]] = {}
        self._frames: queue.SimpleQueue[pb.DeliverFrame | None] = queue.SimpleQueue()  # None: the end
        self._answers: Any = stub.DeliverStream(self._outgoing())
        threading.Thread(target=self._read, name=f"{name} answers", daemon=True).start()

    def send(self, deliveries: pb.DeliverManyRequest) -> Future[Answer]:
        """Put ``deliveries`` on the wire as one frame once the credit allows (waiting for it,
        up to :data:`FRAME_TIMEOUT_S`); the future of its answers or error."""
        out: Future[Answer] = Future()
        deadline = time.monotonic() + FRAME_TIMEOUT_S
        with self._lock:
            frame, size = self.window.frame(deliveries)
            while self.broken is None and not self.window.fits(size):
                left = deadline - time.monotonic()
                if left <= 0:
                    out.set_result(StreamError(grpc.StatusCode.DEADLINE_EXCEEDED, "no credit on the delivery "
                                               f"stream within {FRAME_TIMEOUT_S:.0f} s"))
                    return out
                self._lock.wait(left)
            if self.broken is not None:
                out.set_result(self.broken)
                return out
            self.window.sent(frame.id, size)
            self._waiting[frame.id] = out
            self._frames.put(frame)
        return out

    def _outgoing(self) -> Iterator[pb.DeliverFrame]:
        while (frame := self._frames.get()) is not None:
            yield frame

    def _read(self) -> None:
        error: grpc.RpcError
        try:
            for answer in self._answers:
                with self._lock:
                    self.window.answered(answer)
                    waiter = self._waiting.pop(answer.id, None)
                    self._lock.notify_all()
                if waiter is not None:
                    refused = refusal(answer)
                    waiter.set_result(refused if refused is not None else answer.answers)
            error = StreamError(grpc.StatusCode.UNAVAILABLE, "the worker ended the delivery stream")
        except grpc.RpcError as e:
            error = e
        except ValueError as e:  # an answer to no frame of ours: this stream cannot be trusted
            error = StreamError(grpc.StatusCode.INTERNAL, str(e))
        self._break(error)

    def _break(self, error: grpc.RpcError) -> None:
        with self._lock:
            if self.broken is None:
                self.broken = error
            waiting, self._waiting = self._waiting, {}
            self._lock.notify_all()
        self._frames.put(None)
        self._answers.cancel()
        for waiter in waiting.values():
            waiter.set_result(self.broken)

    def close(self) -> None:
        self._break(StreamError(grpc.StatusCode.CANCELLED, "the delivery stream was closed"))
